// gk-hf-check: checks the example engine against Hugging Face transformers.
//
// tests/hf/make_reference.py builds a model in transformers, saves its
// checkpoints DIR/step0, DIR/step1, ... (an RL-style update between steps)
// and the logits transformers computes for fixed token sequences
// (DIR/reference.safetensors). This tool serves DIR/step0 with the engine,
// compares its logits with transformers' (prefill eagerly, then decode
// through the captured graphs, teacher-forced), then reloads each next step
// *without recapture* and compares again. It also compares the engine's
// rotary tables with transformers', bitwise (the served model's, and each
// rope_scaling preset's: DIR/rope/<name>/config.json).
//
//   gk-hf-check --ref DIR [--format dense|fp8|w4a16] [--device cpu|cuda] [--prefill P] [--tol X]
//               [--unprotect SLOT] [--bad-reload DIR]... [--patch]
//
// --patch applies the steps as weight patches and checks them bitwise
// against full reloads (Note [Patch exactness against the oracle] below).
//
// --bad-reload tries to reload DIR after step 0, expects it to be refused
// (printing "refused: <the error>"), and then goes on: the served model must
// be unchanged and every later step must still pass.
//
// --unprotect disables one slot's copy-back in the reloads (as an engine
// without graphkeep would leave it) and replays without asking the reload
// engine: the manifest reports the drift, and the replayed logits leave the
// tolerance (the negative check).
//
// A step passes when max |engine - reference| <= tol * max(1, max |reference|)
// over every compared logit, and every logit on both sides is finite (a NaN
// or Inf fails the step: demo::MaxDiff, examples/engine/compare.h). Prints one line per step and "HF-CHECK PASS" or
// "HF-CHECK FAIL"; the exit status is 0 only on a pass.
#include "engine/compare.h"
#include "engine/llm_engine.h"

#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/reload/errors.h>
#include <graphkeep/reload/testing.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string ref;
  std::string format = "dense";
  std::string device = "auto";
  std::int64_t prefill = 4;
  double tol = -1;  // default per dtype and format, see main()
  std::string unprotect;
  std::vector<std::string> bad_reloads;
  bool allow_non_finite = false;  // serve NaN/inf weights (ReloadOptions::allow_non_finite)
  bool separate_pools = false;  // a memory pool per decode graph instead of one shared pool
  bool patch = false;           // the steps as weight patches (Note [Patch exactness against the oracle])
  std::int64_t max_batch = 0;   // > 0: capture only the decode graphs of at most this many rows
};

std::map<std::string, at::Tensor> read_reference(const std::string& path) {
  gk::SafetensorsSource src(path);
  std::map<std::string, at::Tensor> out;
  while (auto t = src.next()) out[t->name] = t->value.clone();
  return out;
}

at::Tensor need(const std::map<std::string, at::Tensor>& ref, const std::string& name) {
  auto it = ref.find(name);
  if (it == ref.end()) throw std::runtime_error("reference file lacks " + name);
  return it->second;
}

// The logits of one phase of a step against the reference: the largest
// difference (NaN-aware: a NaN or Inf on either side fails the step) and how
// many argmaxes agree.
struct Compare {
  demo::MaxDiff diff;
  std::int64_t argmax_equal = 0, argmax_total = 0;
  void add(const at::Tensor& got, const at::Tensor& want) {
    diff.add(got, want);
    argmax_equal += got.argmax(-1).eq(want.argmax(-1)).sum().item<std::int64_t>();
    argmax_total += got.size(0);
  }
  // "max|diff| X (rel Y), argmax A/B", and ", N non-finite" when there are any.
  std::string summary() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "max|diff| %.3g (rel %.3g), argmax %lld/%lld", diff.max_abs(), diff.rel(),
                  static_cast<long long>(argmax_equal), static_cast<long long>(argmax_total));
    std::string out = buf;
    if (diff.nonfinite() > 0) out += ", " + std::to_string(diff.nonfinite()) + " non-finite";
    return out;
  }
};

// The engine's rotary tables against transformers' (make_reference.py's
// rope.* tensors), bitwise: the served model's (its first max_len
// positions), and those the engine computes for each rope_scaling preset
// (ref/rope/<name>/config.json). One line; `ok` false when any differs.
std::string check_rope(const demo::LlmEngine& eng, const std::map<std::string, at::Tensor>& ref,
                       const std::filesystem::path& dir, bool& ok) {
  if (!ref.count("rope.cos")) return "rope: the reference has no rotary tables (made by an older make_reference.py)";
  auto same = [&](const demo::RopeTables& got, const std::string& prefix) {
    const at::Tensor cos = need(ref, prefix + ".cos"), sin = need(ref, prefix + ".sin");
    const std::int64_t n = got.cos.size(0);
    return n <= cos.size(0) && demo::bitwise_equal(got.cos.to(at::kCPU), cos.narrow(0, 0, n)) &&
           demo::bitwise_equal(got.sin.to(at::kCPU), sin.narrow(0, 0, n));
  };
  std::vector<std::string> good, bad;
  (same(eng.rope_tables(), "rope") ? good : bad).push_back("the served model's (" + eng.config().rope_scaling.type + ", " +
                                                           std::to_string(eng.rope_tables().cos.size(0)) + " positions)");
  std::vector<std::filesystem::path> presets;
  if (std::filesystem::is_directory(dir / "rope"))
    for (const auto& e : std::filesystem::directory_iterator(dir / "rope")) presets.push_back(e.path());
  std::sort(presets.begin(), presets.end());
  for (const auto& p : presets) {
    const std::string name = p.filename().string();
    const std::int64_t n = need(ref, "rope." + name + ".cos").size(0);
    const demo::RopeTables t = demo::make_rope_tables(demo::read_hf_config(p.string()), n, c10::kCPU);
    (same(t, "rope." + name) ? good : bad).push_back(name + " (" + std::to_string(n) + " positions)");
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  ok = bad.empty();
  if (ok) return "rope: tables bitwise equal to transformers': " + join(good);
  return "rope: tables DIFFER from transformers': " + join(bad) + " | OUT OF TOLERANCE";
}

// `text` followed by `rel` as "%.3g" prints it.
std::string concat_rel(const std::string& text, double rel) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", rel);
  return text + buf;
}

// --- --patch ------------------------------------------------------------------
// Note [Patch exactness against the oracle]
// The checkpoints' steps go to the engine as weight patches: the patch from
// step k-1 to step k is made from the two directories (gk::make_patch over
// every tensor, bitwise), written to a file and read back. Engine P applies
// it by reload(patch), engine S by stage(patch) + commit(), and engine F
// reloads step k in full. P and S must serve what F serves bit for bit:
// every captured slot (weights, and the tensors PWAL derives from them), the
// served content version, and the logits the decode graphs compute; and F's
// logits are within tolerance of transformers' as in the plain mode. After
// step 1, the patch from step 1 to step 2 is first applied to an engine that
// still serves step 0: it must be refused, naming its base, changing nothing.

// Every tensor of a checkpoint directory (the rotary tables some carry are
// not the model's: open_checkpoint skips them too).
std::vector<gk::NamedTensor> read_checkpoint(const std::string& dir) {
  gk::HfCheckpointSource src(dir);
  std::vector<gk::NamedTensor> out;
  while (auto t = src.next())
    if (!t->name.ends_with(".rotary_emb.inv_freq")) out.push_back(std::move(*t));
  return out;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto bytes = [](const at::Tensor& t) { return t.to(at::kCPU).contiguous().view(-1).view(at::kByte); };
  return at::equal(bytes(a), bytes(b));
}

// The captured slots of two engines of one model that differ in bits, by name.
std::vector<std::string> differing_slots(demo::LlmEngine& a, demo::LlmEngine& b, std::size_t& compared) {
  std::vector<std::string> out;
  const auto& la = a.reload_engine().plan().layers();
  const auto& lb = b.reload_engine().plan().layers();
  for (std::size_t l = 0; l < la.size() && l < lb.size(); ++l)
    for (std::size_t i = 0; i < la[l].slots.size() && i < lb[l].slots.size(); ++i) {
      const gk::PlannedSlot& x = la[l].slots[i];
      const gk::PlannedSlot& y = lb[l].slots[i];
      if (!x.defined() || x.role.effective_init() != gk::Init::copy_new) continue;
      ++compared;
      if (x.name != y.name || !same_bits(x.captured, y.captured)) out.push_back(x.name);
    }
  return out;
}

int run_patch_check(const std::string& ref_dir, std::int64_t steps, c10::Device device, demo::WeightFormat format,
                    const demo::LlmEngineOptions& opts, const std::map<std::string, at::Tensor>& ref,
                    const std::string& logits_key, double tol, std::int64_t prefill_len) {
  const std::filesystem::path ref_path(ref_dir);
  auto dir = [&](std::int64_t k) { return (ref_path / ("step" + std::to_string(k))).string(); };
  auto patch_between = [&](std::int64_t from, std::int64_t to) {
    gk::MakePatchOptions o;
    o.base_version = "step" + std::to_string(from);
    o.target_version = "step" + std::to_string(to);
    // Step 1's patch sparse in every entry (every element indexed, whatever
    // the density), later ones as make_patch chooses (dense above 1/3 changed).
    if (to == 1) o.encoding = gk::MakePatchOptions::Encoding::sparse;
    const gk::Patch p = gk::make_patch(read_checkpoint(dir(from)), read_checkpoint(dir(to)), o);
    const std::string file = (ref_path / ("patch-" + std::string(demo::to_string(format)) + "-" + o.base_version +
                                          "-" + o.target_version + ".safetensors")).string();
    gk::write_patch(file, p);
    return gk::read_patch(file);
  };
  demo::LlmEngine full(dir(0), device, format, opts), by_reload(dir(0), device, format, opts),
      by_stage(dir(0), device, format, opts);
  bool pass = true;
  if (steps > 2) {
    const gk::Patch wrong = patch_between(1, 2);
    try {
      by_reload.reload(wrong);
      std::printf("patch step1->step2 on step0: ACCEPTED\n");
      pass = false;
    } catch (const gk::WeightError& e) {
      std::printf("patch step1->step2 on step0: refused: %s\n", e.message().substr(0, e.message().find('\n')).c_str());
    }
  }
  for (std::int64_t k = 1; k < steps; ++k) {
    const std::string s = "step" + std::to_string(k);
    const gk::Patch p = patch_between(k - 1, k);
    std::size_t elements = 0;
    for (const gk::PatchEntry& e : p.entries) elements += static_cast<std::size_t>(e.count());
    const std::size_t served_tensors = full.reload_engine().served()->hashes().size();
    full.reload(dir(k));
    const gk::ReloadReport r = by_reload.reload(p);
    const gk::ReloadReport c = by_stage.commit(by_stage.stage(p));
    std::size_t compared = 0;
    std::vector<std::string> bad = differing_slots(by_reload, full, compared);
    for (const std::string& n : differing_slots(by_stage, full, compared)) bad.push_back("(staged) " + n);
    const bool versions = by_reload.reload_engine().served()->content_version() ==
                              full.reload_engine().served()->content_version() &&
                          by_stage.reload_engine().served()->content_version() ==
                              full.reload_engine().served()->content_version();
    // The decode graphs' logits, teacher-forced, against F's bitwise and
    // transformers' within tolerance.
    const at::Tensor tokens = need(ref, s + ".tokens");
    const at::Tensor want = need(ref, s + "." + logits_key).to(at::kFloat);
    const std::int64_t B = tokens.size(0), T = tokens.size(1);
    Compare vs_ref;
    bool logits_equal = true;
    for (std::int64_t b = 0; b < B; ++b) {
      const at::Tensor pre = tokens[b].narrow(0, 0, prefill_len);
      (void)full.prefill(b, pre), (void)by_reload.prefill(b, pre), (void)by_stage.prefill(b, pre);
    }
    for (std::int64_t t = prefill_len; t < T; ++t) {
      const at::Tensor pos = at::full({B}, t, at::kLong);
      const at::Tensor lf = full.decode_logits(tokens.select(1, t), pos), lr = by_reload.decode_logits(tokens.select(1, t), pos),
                       ls = by_stage.decode_logits(tokens.select(1, t), pos);
      logits_equal = logits_equal && same_bits(lf, lr) && same_bits(lf, ls);
      vs_ref.add(lf, want.select(1, t));
    }
    const bool ok = bad.empty() && versions && logits_equal && vs_ref.diff.within(tol) && r.patch.applied &&
                    c.patch.applied;
    pass = pass && ok;
    std::printf("%s: patch of %zu tensors, %zu elements, %zu bytes (%zu layers scattered, %zu re-run, %zu blocks "
                "recomputed, %zu of %zu "
                "served tensors touched); reload(patch) pause %.2f ms, stage %.2f ms + commit %.2f ms | %zu slots "
                "%s, content version %s, decode logits %s a full reload's | transformers: %s | %s\n",
                s.c_str(), p.entries.size(), elements, p.payload_bytes(), r.patch.layers_scattered, r.patch.layers_rerun,
                r.patch.blocks_recomputed, p.entries.size(), served_tensors, r.times.commit_ms, c.times.stage_ms, c.times.commit_ms, compared,
                bad.empty() ? "bitwise equal" : ("DIFFER (" + bad.front() + ", ...)").c_str(),
                versions ? "equal" : "DIFFERS", logits_equal ? "bitwise equal to" : "DIFFER from",
                vs_ref.summary().c_str(), ok ? "ok" : "FAIL");
  }
  std::printf("HF-CHECK %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(std::string(argv[i]) + " needs a value");
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--ref")) a.ref = val();
    else if (!std::strcmp(argv[i], "--format")) a.format = val();
    else if (!std::strcmp(argv[i], "--device")) a.device = val();
    else if (!std::strcmp(argv[i], "--prefill")) a.prefill = std::stoll(val());
    else if (!std::strcmp(argv[i], "--tol")) a.tol = std::stod(val());
    else if (!std::strcmp(argv[i], "--unprotect")) a.unprotect = val();
    else if (!std::strcmp(argv[i], "--bad-reload")) a.bad_reloads.push_back(val());
    else if (!std::strcmp(argv[i], "--allow-non-finite")) a.allow_non_finite = true;
    else if (!std::strcmp(argv[i], "--separate-pools")) a.separate_pools = true;
    else if (!std::strcmp(argv[i], "--patch")) a.patch = true;
    else if (!std::strcmp(argv[i], "--max-batch")) a.max_batch = std::stoll(val());
    else {
      std::fprintf(stderr, "usage: gk-hf-check --ref DIR [--format dense|fp8|w4a16] [--device cpu|cuda] [--prefill P] "
                           "[--tol X] [--unprotect SLOT] [--bad-reload DIR]... [--allow-non-finite] [--separate-pools] [--max-batch N] [--patch]\n");
      return 2;
    }
  }
  try {
    const c10::Device device = a.device == "cuda" || (a.device == "auto" && gk::runtime::cuda_device_available())
                                   ? c10::Device(c10::kCUDA, 0)
                                   : c10::Device(c10::kCPU);
    const demo::WeightFormat format = demo::parse_weight_format(a.format);
    const auto ref = read_reference((std::filesystem::path(a.ref) / "reference.safetensors").string());
    const std::string logits_key = format == demo::WeightFormat::dense ? "logits"
                                   : "logits_" + std::string(demo::to_string(format));
    std::int64_t steps = 0;
    while (ref.count("step" + std::to_string(steps) + ".tokens")) ++steps;
    if (steps == 0) throw std::runtime_error("reference.safetensors holds no step0.tokens");

    const demo::HfConfig cfg = demo::read_hf_config((std::filesystem::path(a.ref) / "step0").string());
    // Note [Tolerances against transformers]: see tests/hf/README.md.
    const double tol = a.tol > 0                                  ? a.tol
                       : cfg.dtype != at::kFloat                     ? 3e-2
                       : format == demo::WeightFormat::fp8           ? 4e-3  // activations rounded to e4m3
                                                                     : 1e-4;

    demo::LlmEngineOptions opts;
    const at::Tensor tokens0 = need(ref, "step0.tokens");
    const std::int64_t B = tokens0.size(0), T = tokens0.size(1);
    opts.max_len = std::max<std::int64_t>(T, 16);
    opts.shared_pool = !a.separate_pools;
    opts.reload.allow_non_finite = a.allow_non_finite;
    if (a.max_batch > 0) {  // fewer graphs: for large models on the CPU
      if (a.max_batch < B) throw std::runtime_error("--max-batch " + std::to_string(a.max_batch) +
                                                    " is below the reference's " + std::to_string(B) + " sequences");
      std::erase_if(opts.batch_sizes, [&](std::int64_t b) { return b > a.max_batch; });
    }
    std::printf("hf-check: %s %s, %lld layers, format %s, device %s, %lld x %lld tokens, tol %g\n",
                cfg.model_type.c_str(), c10::toString(cfg.dtype), static_cast<long long>(cfg.num_hidden_layers),
                a.format.c_str(), device.str().c_str(), static_cast<long long>(B), static_cast<long long>(T), tol);

    if (a.patch) return run_patch_check(a.ref, steps, device, format, opts, ref, logits_key, tol, a.prefill);

    std::unique_ptr<demo::LlmEngine> eng;
    bool pass = true;
    for (std::int64_t k = 0; k < steps; ++k) {
      const std::string s = "step" + std::to_string(k);
      const std::string dir = (std::filesystem::path(a.ref) / s).string();
      std::string how;
      if (!eng) {
        eng = std::make_unique<demo::LlmEngine>(dir, device, format, opts);
        how = "loaded, " + std::to_string(eng->num_graphs()) + " graphs captured in " +
              std::to_string(static_cast<long long>(eng->capture_ms())) + " ms";
        for (const std::string& bad : a.bad_reloads) {
          try {
            eng->reload(bad);
            std::printf("bad reload %s: ACCEPTED\n", bad.c_str());
            pass = false;
          } catch (const gk::Error& e) {
            std::printf("bad reload %s: refused: %s\n", bad.c_str(), e.message().c_str());
          }
        }
        if (!a.bad_reloads.empty()) how += "; " + std::to_string(a.bad_reloads.size()) + " bad reloads refused";
        bool rope_ok = true;
        std::printf("%s\n", check_rope(*eng, ref, a.ref, rope_ok).c_str());
        pass = pass && rope_ok;
      } else {
        if (!a.unprotect.empty()) gk::testing::set_hooks(eng->reload_engine(), gk::testing::unprotect({a.unprotect}));
        try {
          const gk::ReloadReport r = eng->reload(dir);
          char buf[160];
          std::snprintf(buf, sizeof buf, "reloaded in %.1f ms without recapture, drift %zu, %zu addresses verified",
                        r.times.total_ms, r.drift, r.addresses_verified);
          how = buf;
        } catch (const gk::WeightError& e) {
          // Refused (a non-finite tensor, say): the engine keeps serving the
          // previous step's weights, which this step's logits cannot match.
          std::printf("%s: refused: %s\n", s.c_str(), e.message().c_str());
          pass = false;
          continue;
        } catch (const gk::DriftError& e) {
          if (a.unprotect.empty()) throw;
          pass = false;
          how = "reloaded with " + a.unprotect + " unprotected: drift caught by the capture manifest (" +
                std::string(e.message().substr(0, e.message().find('\n'))) + "); replaying anyway";
        }
      }
      const at::Tensor tokens = need(ref, s + ".tokens");
      const at::Tensor want = need(ref, s + "." + logits_key).to(at::kFloat);
      const bool checked = a.unprotect.empty();  // unprotected: replay anyway, as without graphkeep
      Compare prefill, decode;
      for (std::int64_t b = 0; b < B; ++b)
        prefill.add(eng->prefill(b, tokens[b].narrow(0, 0, a.prefill), checked), want[b].narrow(0, 0, a.prefill));
      for (std::int64_t t = a.prefill; t < T; ++t) {
        const at::Tensor pos = at::full({B}, t, at::kLong);
        decode.add(eng->decode_logits(tokens.select(1, t), pos, checked), want.select(1, t));
      }
      const bool ok = prefill.diff.within(tol) && decode.diff.within(tol);
      // The scale of the comparison, from transformers alone: for the dense
      // format its own rounding error in the checkpoint's dtype (its logits
      // against float32 on the same weights, where the reference recorded
      // them); for a quantized format how far the format itself moves its
      // logits (against the dense ones).
      auto reference_gap = [&](const std::string& other_key, const std::string& label) {
        Compare f;
        const std::int64_t V = want.size(-1);
        f.add(want.reshape({-1, V}), need(ref, s + "." + other_key).to(at::kFloat).reshape({-1, V}));
        return concat_rel(" | transformers " + label + ": rel ", f.diff.rel());
      };
      std::string floor;
      if (format == demo::WeightFormat::dense && ref.count(s + ".logits_f32"))
        floor = reference_gap("logits_f32", std::string(c10::toString(cfg.dtype)) + " vs float32");
      else if (format != demo::WeightFormat::dense)
        floor = reference_gap("logits", a.format + " vs dense");
      pass = pass && ok;
      std::printf("%s: %s | prefill (eager) %s | decode (graphs) %s%s | %s\n", s.c_str(), how.c_str(),
                  prefill.summary().c_str(), decode.summary().c_str(), floor.c_str(), ok ? "ok" : "OUT OF TOLERANCE");
    }
    std::printf("HF-CHECK %s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-hf-check: %s\n", e.what());
    std::printf("HF-CHECK FAIL\n");
    return 1;
  }
}
