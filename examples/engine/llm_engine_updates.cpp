// LlmEngine's weight updates: reloads, stages and commits (of directories,
// sources, patches and LoRA adapters), each on the engine's streams, and the
// stage's pacing (LlmEngineOptions::stage_device_share).
#include "llm_engine.h"

#include "checkpoint_dir.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/make_patch.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <thread>

namespace demo {
namespace {

// `stage()` on a stream of its own on a CUDA device (the decode graphs keep
// running on theirs meanwhile), waited for: commit() reads the staged
// tensors from another stream.
template <class Stage>
gk::StagedReload on_side_stream(c10::Device device, Stage&& stage) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    c10::cuda::CUDAStreamGuard guard(side);
    gk::StagedReload staged = stage();
    side.synchronize();
    return staged;
  }
#endif
  (void)device;
  return stage();
}

}  // namespace

gk::ReloadReport LlmEngine::reload(const std::string& dir) { return reload(dir, engine_->options().defaults); }

gk::ReloadReport LlmEngine::reload(const std::string& dir, const gk::ReloadOptions& options) {
  check_same_architecture(model_->config(), read_hf_config(dir), dir, options_.max_len);
  auto src = open_checkpoint(dir, *model_);
  return reload(*with_served_adapter(*src), options);
}

gk::ReloadReport LlmEngine::reload(gk::WeightSource& weights, const gk::ReloadOptions& options) {
  const auto guard = serving();
  gk::ReloadReport r = engine_->reload(weights, options);
  wait_serving();
  return r;
}

gk::ReloadReport LlmEngine::reload(const gk::Patch& patch) {
  const auto guard = serving();
  gk::ReloadReport r = engine_->reload(patch);
  wait_serving();
  return r;
}

gk::StagedReload LlmEngine::stage(const gk::Patch& patch) {
  return on_side_stream(model_->device(), [&] { return engine_->stage(patch, paced_patch_options()); });
}

gk::StagedReload LlmEngine::stage(const std::string& dir) {
  check_same_architecture(model_->config(), read_hf_config(dir), dir, options_.max_len);
  auto src = open_checkpoint(dir, *model_);
  return stage(*with_served_adapter(*src));
}

gk::StagedReload LlmEngine::stage(gk::WeightSource& src) {
  return on_side_stream(model_->device(), [&] { return engine_->stage(src, paced_stage_options()); });
}

std::function<void(const std::string&)> LlmEngine::stage_pacer() const {
  const double share = options_.stage_device_share;
  GK_CHECK(gk::StateError, share > 0 && share <= 1, "LlmEngineOptions::stage_device_share is ", share,
           "; it must be in (0, 1]");
  if (share >= 1) return {};
  const c10::Device device = model_->device();
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  return [device, share, last](const std::string&) {
    // The calling thread's current stream is the stage's (stage() sets it).
    c10::impl::VirtualGuardImpl(device.type()).getStream(device).synchronize();
    const auto busy = std::chrono::steady_clock::now() - *last;
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(busy * (1.0 / share - 1.0)));
    *last = std::chrono::steady_clock::now();
  };
}

gk::StageOptions LlmEngine::paced_stage_options() const {
  gk::StageOptions o = engine_->options().defaults.stage();
  if (auto pace = stage_pacer()) o.after_layer = std::move(pace);
  return o;
}

gk::PatchOptions LlmEngine::paced_patch_options() const {
  gk::PatchOptions o = engine_->options().patch;
  if (auto pace = stage_pacer()) o.after_layer = std::move(pace);
  return o;
}

gk::ReloadReport LlmEngine::commit(gk::StagedReload&& staged) {
  const auto guard = serving();
  gk::ReloadReport r = engine_->commit(std::move(staged));
  wait_serving();
  return r;
}

gk::StagedReload LlmEngine::stage_adapter(const std::string& dir) {
  GK_CHECK(gk::WeightError, config().adapter.has_value(), dir, ": the engine serves no adapter (its graphs were "
           "captured without LoRA parameters); start it with LlmEngineOptions::adapter");
  LoraAdapter next = read_lora_adapter(dir);
  if (const std::string why = lora_mismatch(*config().adapter, next.config, dir); !why.empty())
    GK_THROW(gk::WeightError, why);
  const c10::Device device = model_->device();
  const std::vector<gk::NamedTensor> base = model_->adapter_tensors();  // what the graphs read now
  std::map<std::string, const gk::NamedTensor*> served;
  for (const gk::NamedTensor& t : base) served.emplace(t.name, &t);
  for (gk::NamedTensor& t : next.tensors) {
    const auto it = served.find(t.name);
    GK_CHECK(gk::WeightError, it != served.end(), dir, "/adapter_model.safetensors: tensor '", t.name,
             "' adapts a module the served adapter does not (", served.size(), " tensors served)");
    GK_CHECK(gk::WeightError, t.value.sizes().equals(it->second->value.sizes()) &&
             t.value.scalar_type() == it->second->value.scalar_type(), dir, "/adapter_model.safetensors: tensor '",
             t.name, "' is ", t.value.scalar_type(), " ", t.value.sizes(), " but the served one is ",
             it->second->value.scalar_type(), " ", it->second->value.sizes());
    t.value = t.value.to(device);
    served.erase(it);
  }
  GK_CHECK(gk::WeightError, served.empty(), dir, "/adapter_model.safetensors: tensor '",
           served.empty() ? std::string() : served.begin()->first, "' is missing (", served.size(),
           " of the served adapter's tensors are)");
  gk::MakePatchOptions o;
  o.base_version = engine_->served() != nullptr ? engine_->served()->label() : std::string();
  o.target_version = "adapter '" + dir + "'";
  o.record_unchanged = true;  // every base hash checked against what is served
  return stage(gk::make_patch(base, next.tensors, o));
}

gk::ReloadReport LlmEngine::reload_adapter(const std::string& dir) { return commit(stage_adapter(dir)); }

}  // namespace demo
