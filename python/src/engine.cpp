// graphkeep._C._LlmEngine: the example engine (examples/engine/llm_engine.h)
// from Python, through its public header only. graphkeep/engine.py wraps it
// (argument checks, generate(), docs).
//
// Note [The GIL around the engine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every call into the engine releases the GIL once its arguments are C++
// values (the tensors of a weight dict are unwrapped first, without a copy:
// each at::Tensor shares the Python tensor's TensorImpl, so a trainer's
// device tensors reach ReloadOptions::adopt_source_tensors as they are).
// A trainer thread may then stage() while a serving thread decodes, as the
// engine allows (Note [Online reload threading] in
// reload/staged_reload.cpp); commit() belongs to the serving thread, between
// two decode_logits() calls. The engine is not for two decoding threads at once.
#include "bindings.h"

#include "engine/llm_engine.h"

#include <torch/csrc/autograd/python_variable.h>

#include <graphkeep/core/check.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/reload/report.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/reload/staged_reload.h>
#include <graphkeep/sources/weight_source.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gkpy {
namespace {

class Engine {
 public:
  Engine(const std::string& dir, const std::string& quant, const std::string& device,
         std::optional<std::vector<std::int64_t>> batch_sizes, std::int64_t max_len, bool adopt,
         std::optional<py::dict> weights, const std::string& adapter) {
    const demo::WeightFormat format = demo::parse_weight_format(quant);
    const c10::Device dev(device);
    demo::LlmEngineOptions options;
    if (batch_sizes) options.batch_sizes = *batch_sizes;
    options.max_len = max_len;
    options.reload.adopt_source_tensors = adopt;
    options.adapter = adapter;
    if (weights) {
      gk::InMemorySource source(named_tensors(*weights, "weights"), "weights handed over from Python");
      py::gil_scoped_release nogil;
      const demo::HfConfig cfg = demo::read_hf_config(dir);
      engine_ = std::make_unique<demo::LlmEngine>(cfg, dev, format, source, options);
    } else {
      py::gil_scoped_release nogil;
      engine_ = std::make_unique<demo::LlmEngine>(dir, dev, format, options);
    }
  }

  demo::LlmEngine& get() { return *engine_; }

 private:
  std::unique_ptr<demo::LlmEngine> engine_;
};

py::dict config_dict(const demo::HfConfig& c) {
  py::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["head_dim"] = c.head_dim;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["num_experts"] = c.num_experts;
  d["dtype"] = py::cast(c.dtype);
  return d;
}

}  // namespace

void bind_engine(py::module_& m) {
  using gk::PhaseTimes;
  using gk::ReloadReport;
  py::class_<PhaseTimes>(m, "PhaseTimes", "Phase times of a reload, in milliseconds (gk::PhaseTimes).")
      .def_readonly("detach_ms", &PhaseTimes::detach_ms)
      .def_readonly("load_ms", &PhaseTimes::load_ms)
      .def_readonly("pwal_ms", &PhaseTimes::pwal_ms)
      .def_readonly("check_ms", &PhaseTimes::check_ms)
      .def_readonly("finite_ms", &PhaseTimes::finite_ms)
      .def_readonly("hash_ms", &PhaseTimes::hash_ms)
      .def_readonly("copy_ms", &PhaseTimes::copy_ms)
      .def_readonly("verify_ms", &PhaseTimes::verify_ms)
      .def_readonly("total_ms", &PhaseTimes::total_ms)
      .def_readonly("stage_ms", &PhaseTimes::stage_ms)
      .def_readonly("commit_ms", &PhaseTimes::commit_ms);
  using Stats = ReloadReport::PatchStats;
  py::class_<Stats::Landing>(m, "PatchLanding", "How a weight patch landed in one layer (gk::ReloadReport::PatchStats::Landing).")
      .def_readonly("layer", &Stats::Landing::layer)
      .def_readonly("rerun", &Stats::Landing::rerun)
      .def_readonly("blocks_recomputed", &Stats::Landing::blocks_recomputed)
      .def_readonly("layout_elements", &Stats::Landing::layout_elements)
      .def_readonly("why", &Stats::Landing::why);
  py::class_<Stats>(m, "PatchStats", "What a weight patch did (gk::ReloadReport::PatchStats).")
      .def_readonly("applied", &Stats::applied)
      .def_readonly("tensors", &Stats::tensors)
      .def_readonly("elements", &Stats::elements)
      .def_readonly("payload_bytes", &Stats::payload_bytes)
      .def_readonly("layers_scattered", &Stats::layers_scattered)
      .def_readonly("layers_rerun", &Stats::layers_rerun)
      .def_readonly("bytes_scattered", &Stats::bytes_scattered)
      .def_readonly("sectors_written", &Stats::sectors_written)
      .def_readonly("sectors_declined", &Stats::sectors_declined)
      .def_readonly("blocks_recomputed", &Stats::blocks_recomputed)
      .def_readonly("layout_elements", &Stats::layout_elements)
      .def_readonly("rerun_why", &Stats::rerun_why)
      .def_readonly("landings", &Stats::landings);
  py::class_<ReloadReport>(m, "ReloadReport", "What a reload, stage or commit did (gk::ReloadReport).")
      .def_property_readonly("mode", [](const ReloadReport& r) {
        return r.mode == gk::ReloadMode::streaming ? "streaming" : "transactional";
      })
      .def_readonly("layers", &ReloadReport::layers)
      .def_readonly("slots_tracked", &ReloadReport::slots_tracked)
      .def_readonly("declared_slots", &ReloadReport::declared_slots)
      .def_readonly("slots_zeroed", &ReloadReport::slots_zeroed)
      .def_readonly("needs_recapture", &ReloadReport::needs_recapture)
      .def_readonly("mismatched", &ReloadReport::mismatched)
      .def_readonly("graphs_destroyed", &ReloadReport::graphs_destroyed)
      .def_property_readonly("served", [](const ReloadReport& r) { return std::const_pointer_cast<gk::ServedWeights>(r.served); })
      .def_readonly("patch", &ReloadReport::patch)
      .def_readonly("tensors_loaded", &ReloadReport::tensors_loaded)
      .def_readonly("bytes_loaded", &ReloadReport::bytes_loaded)
      .def_readonly("bytes_copied", &ReloadReport::bytes_copied)
      .def_readonly("tensors_adopted", &ReloadReport::tensors_adopted)
      .def_readonly("tensors_batched", &ReloadReport::tensors_batched)
      .def_readonly("hashes_from_scan", &ReloadReport::hashes_from_scan)
      .def_readonly("bytes_adopted", &ReloadReport::bytes_adopted)
      .def_readonly("drift", &ReloadReport::drift)
      .def_readonly("addresses_verified", &ReloadReport::addresses_verified)
      .def_readonly("staged", &ReloadReport::staged)
      .def_readonly("weight_version", &ReloadReport::weight_version)
      .def_readonly("times", &ReloadReport::times)
      .def("summary", &ReloadReport::summary)
      .def("__repr__", [](const ReloadReport& r) { return "<ReloadReport " + r.summary() + ">"; });

  py::class_<gk::StagedReload>(m, "_StagedReload")
      .def_property_readonly("pending", &gk::StagedReload::pending)
      .def_property_readonly("base_version", &gk::StagedReload::base_version)
      .def_property_readonly("staged_bytes", &gk::StagedReload::staged_bytes)
      .def_property_readonly("report", &gk::StagedReload::report, py::return_value_policy::copy)
      .def("abort", &gk::StagedReload::abort, py::call_guard<py::gil_scoped_release>());

  py::class_<Engine>(m, "_LlmEngine")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    std::optional<std::vector<std::int64_t>>, std::int64_t, bool, std::optional<py::dict>,
                    const std::string&>(),
           py::arg("model_dir"), py::arg("quant"), py::arg("device"), py::arg("batch_sizes"), py::arg("max_len"),
           py::arg("adopt_source_tensors"), py::arg("weights"), py::arg("adapter"))
      .def("prefill",
           [](Engine& e, std::int64_t seq, const at::Tensor& tokens) {
             py::gil_scoped_release nogil;
             return e.get().prefill(seq, tokens);
           },
           py::arg("seq"), py::arg("tokens"))
      .def("decode_logits",
           [](Engine& e, const at::Tensor& tokens, const at::Tensor& positions, bool checked) {
             py::gil_scoped_release nogil;
             return e.get().decode_logits(tokens, positions, checked);
           },
           py::arg("tokens"), py::arg("positions"), py::arg("checked") = true)
      .def("decode",
           [](Engine& e, const at::Tensor& tokens, const at::Tensor& positions, double temperature, std::int64_t top_k,
              double top_p, std::uint64_t seed, bool checked) {
             const demo::SamplingParams params{temperature, top_k, top_p, seed};
             py::gil_scoped_release nogil;
             return e.get().decode(tokens, positions, params, checked);
           },
           py::arg("tokens"), py::arg("positions"), py::arg("temperature") = 0.0, py::arg("top_k") = 0,
           py::arg("top_p") = 1.0, py::arg("seed") = 0, py::arg("checked") = true)
      .def("decode_eager",
           [](Engine& e, const at::Tensor& tokens, const at::Tensor& positions) {
             py::gil_scoped_release nogil;
             return e.get().decode_eager(tokens, positions);
           },
           py::arg("tokens"), py::arg("positions"))
      .def("stage",
           [](Engine& e, const py::dict& weights) {
             gk::InMemorySource source(named_tensors(weights, "weights"), "weights handed over from Python");
             py::gil_scoped_release nogil;
             return e.get().stage(source);
           },
           py::arg("weights"), py::keep_alive<0, 1>())
      .def("stage",
           [](Engine& e, const std::string& dir) {
             py::gil_scoped_release nogil;
             return e.get().stage(dir);
           },
           py::arg("model_dir"), py::keep_alive<0, 1>())
      .def("commit",
           [](Engine& e, gk::StagedReload& staged) {
             py::gil_scoped_release nogil;
             return e.get().commit(std::move(staged));
           },
           py::arg("staged"))
      .def("reload",
           [](Engine& e, const py::dict& weights) {
             gk::InMemorySource source(named_tensors(weights, "weights"), "weights handed over from Python");
             py::gil_scoped_release nogil;
             return e.get().reload(source);
           },
           py::arg("weights"))
      .def("reload",
           [](Engine& e, const std::string& dir) {
             py::gil_scoped_release nogil;
             return e.get().reload(dir);
           },
           py::arg("model_dir"))
      .def("stage_adapter",
           [](Engine& e, const std::string& dir) {
             py::gil_scoped_release nogil;
             return e.get().stage_adapter(dir);
           },
           py::arg("adapter_dir"), py::keep_alive<0, 1>())
      .def("reload_adapter",
           [](Engine& e, const std::string& dir) {
             py::gil_scoped_release nogil;
             return e.get().reload_adapter(dir);
           },
           py::arg("adapter_dir"))
      .def("stage_patch",
           [](Engine& e, const gk::Patch& patch) {
             py::gil_scoped_release nogil;
             return e.get().stage(patch);
           },
           py::arg("patch"), py::keep_alive<0, 1>())
      .def("reload_patch",
           [](Engine& e, const gk::Patch& patch) {
             py::gil_scoped_release nogil;
             return e.get().reload(patch);
           },
           py::arg("patch"))
      .def_property_readonly("served",
                             [](Engine& e) { return std::const_pointer_cast<gk::ServedWeights>(e.get().reload_engine().served()); })
      .def_property_readonly("weight_version", [](Engine& e) { return e.get().weight_version(); })
      .def_property_readonly("config", [](Engine& e) { return config_dict(e.get().config()); })
      .def_property_readonly("batch_sizes", [](Engine& e) { return e.get().batch_sizes(); })
      .def_property_readonly("num_graphs", [](Engine& e) { return e.get().num_graphs(); })
      .def_property_readonly("capture_ms", [](Engine& e) { return e.get().capture_ms(); });
}

}  // namespace gkpy
