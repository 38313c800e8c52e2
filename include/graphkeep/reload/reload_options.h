// graphkeep/reload/reload_options.h
//
// How a call runs: each kind of call has its own options, holding only what
// that call honours (a field another call would ignore cannot be set):
//   ReloadOptions  reload(source)          mode, mismatches, adoption, ...
//   StageOptions   stage(source)           the same bar mode (a stage is
//                                          transactional) and mismatches (a
//                                          stage never accepts one)
//   PatchOptions   reload(patch), stage(patch)
//   LoadOptions    gk::load_weights, the first load
// EngineOptions are given to the engine once and hold the options of the
// calls that pass none.
//
//   gk::ReloadOptions o;
//   o.mode = gk::ReloadMode::transactional;   // nothing changes unless all of it loads
//   o.adopt_source_tensors = true;             // a trainer's device tensors, one copy per byte
//   engine.reload(source, o);
//   gk::ReloadEngine engine(model, {.defaults = o});   // reload(source) uses o, stage(source) its stage part
//
// No option switches a protection off. Tests and benchmarks that must (to
// show a failure is real, or to measure what a check costs) set
// gk::testing::EngineHooks (<graphkeep/reload/testing.h>), with the faults
// injected at named stages, the slots left out of copy-back and the members
// treated as undeclared.
#pragma once
#include <graphkeep/reload/report.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace gk {

// Where the engine keeps the checkpoint-format values of the tensors that
// PWAL transforms (an FP8 weight made from bf16, a repacked int4 weight), the
// base a weight patch is applied to before PWAL runs again for the layers it
// touches (Note [Patch landings] in reload/layer_record.h). Tensors that
// land unchanged in captured storage need no kept base: the captured storage
// is their base.
enum class PatchBase : std::uint8_t {
  none,         // keep nothing: a patch touching a layer with such a tensor is refused
  device,       // on the tensor's device (memory: those tensors in checkpoint format, once more)
  pinned_host,  // in pinned host memory (plain host memory where CUDA is absent)
};
std::string_view to_string(PatchBase b) noexcept;

// How a patch's commit writes the changed elements of tensors that land
// unchanged in captured storage (Note [Sector images] in
// reload/cuda/patch_scatter.h). Elements give the shortest update (stage
// plus pause); sectors the shortest pause, for a stage that runs while the
// graphs serve, at the price of a longer stage: their images are allocated
// (gigabytes at 1 % of an 8B model) and filled first (docs/delta.md has
// both, measured).
enum class PatchWrites : std::uint8_t {
  automatic,  // sectors on a CUDA device while their images fit in half of its free memory, else elements
  elements,   // each changed element on its own: staging holds 6 bytes per changed bf16 element (the default)
  sectors,    // whole 32-byte sectors, their images made at staging from the served bytes:
              // a shorter pause on a GPU (no read-back of partial sectors), staging memory
              // 36 bytes per touched sector (docs/performance.md)
};
std::string_view to_string(PatchWrites w) noexcept;

// What gk::load_weights (the first load) honours.
struct LoadOptions {
  bool allow_non_finite = false;           // as StageOptions::allow_non_finite
  std::string version_label;               // as StageOptions::version_label
  PatchBase patch_base = PatchBase::none;  // as StageOptions::patch_base
};

// What a stage(source) honours, and what a reload(source) shares with it.
struct StageOptions {
  // Adopt the source's tensors instead of copying them (Note [Adopting
  // source tensors] in reload/layer_pipeline.cpp). A checkpoint parameter
  // that arrives as one tensor of exactly its shape, dtype and device,
  // contiguous (one unsharded checkpoint tensor the layer does not load
  // itself, or the whole parameter delivered under the parameter's name:
  // weight_source.h) becomes that tensor for the reload: no load copy, no
  // new storage. The commit then copies it straight into the captured
  // storage, so a reload copies each byte once, as a plain load does. The
  // source's tensors must not be written until reload() returns, or until
  // the commit() of a stage(): a stage hashes every adopted tensor when it
  // adopts it and the commit hashes it again before writing anything, so one
  // written since (through .data, a raw pointer or a kernel, which move no
  // version counter) makes the commit stale, refused with nothing changed
  // (Note [Adopted tensors are hashed] in reload/staged_reload.cpp). PWAL
  // that writes a parameter in place would write the source's tensor: the
  // reload throws gk::WeightError naming the weight (caught through the
  // version counter). Tensors not adoptable (another device or dtype,
  // strided, an inference tensor, a view of a captured storage) are copied.
  bool adopt_source_tensors = false;
  // Serve floating-point checkpoint tensors holding NaN or infinity. By
  // default a reload, a stage and the first load refuse them with a
  // gk::WeightError naming the tensor, before PWAL runs (one device read of
  // the layer's bytes; Note [Refusing non-finite weights] in
  // reload/non_finite.cpp).
  bool allow_non_finite = false;
  // Called on the reloading thread after each layer's PWAL and checks, with
  // the layer's prefix. An engine paces a stage() here: waiting in it leaves
  // the device to the serving graphs for a while (the example engine's
  // LlmEngineOptions::stage_device_share). Throwing from it fails the
  // reload or the stage as any error would.
  std::function<void(const std::string& layer)> after_layer;
  // Called once after every layer is loaded, PWAL'd and checked, right
  // before the first commit (reload(), transactional mode: throwing aborts
  // it with a full rollback, every layer keeping its old weights) or last in
  // stage(), once everything is staged and checked (throwing aborts the
  // stage: nothing changed). The exception propagates. The distributed
  // reload votes here (include/graphkeep/distributed/distributed.h). A
  // streaming reload() has no such moment and refuses the option.
  std::function<void()> before_commit;
  // The version id of the weights this load brings (ServedWeights::label()).
  // Empty: the label the engine recorded for the same content before, if any.
  std::string version_label;
  // Where the load keeps the checkpoint-format bases of the tensors PWAL
  // transforms (PatchBase), for later patches. The first load's option
  // counts until the first reload; each full reload records again with its own.
  PatchBase patch_base = PatchBase::none;

  // The options of a first load with the same settings.
  LoadOptions first_load() const { return {allow_non_finite, version_label, patch_base}; }
};

// What a reload(source) honours: a stage's options, and how the reload runs.
struct ReloadOptions : StageOptions {
  ReloadMode mode = ReloadMode::streaming;
  MismatchPolicy on_mismatch = MismatchPolicy::raise;

  // The options a stage(source) takes from these (mode and on_mismatch are
  // a reload's own).
  const StageOptions& stage() const noexcept { return *this; }
};

// What reload(const Patch&) and stage(const Patch&) honour (docs/delta.md).
struct PatchOptions {
  // As StageOptions::allow_non_finite, for the values the patch writes.
  bool allow_non_finite = false;
  // How the commit writes (PatchWrites); the same weights either way.
  PatchWrites patch_writes = PatchWrites::elements;
  // As StageOptions::after_layer, for the layers whose PWAL runs again.
  std::function<void(const std::string& layer)> after_layer;
};

// Given to the ReloadEngine once.
struct EngineOptions {
  // The options of reload(source) and, through defaults.stage(), of
  // stage(source): the calls without options of their own.
  ReloadOptions defaults;
  // The options of reload(patch) and stage(patch) without options.
  PatchOptions patch;
};

}  // namespace gk
