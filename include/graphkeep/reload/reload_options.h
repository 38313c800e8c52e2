// graphkeep/reload/reload_options.h
//
// How a reload runs. ReloadOptions are per call; EngineOptions are given to
// the engine once and hold the options of the calls that pass none.
//
//   gk::ReloadOptions o;
//   o.mode = gk::ReloadMode::transactional;   // nothing changes unless all of it loads
//   o.adopt_source_tensors = true;             // a trainer's device tensors, one copy per byte
//   engine.reload(source, o);
//   gk::ReloadEngine engine(model, {.defaults = o});   // reload(source) uses o
//
// Test and demonstration hooks (faults injected at named stages, slots left
// out of copy-back, members treated as undeclared, graphs reported instead
// of refused) are not options: they live in <graphkeep/reload/testing.h>.
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
// reload/cuda/patch_scatter.h).
enum class PatchWrites : std::uint8_t {
  automatic,  // sectors on a CUDA device while their images fit in half of its free memory, else elements
  elements,   // each changed element on its own: staging holds 6 bytes per changed bf16 element
  sectors,    // whole 32-byte sectors, their images made at staging from the served bytes:
              // a shorter pause on a GPU (0.8x at 1% density, 0.7x at 10%, H200), staging
              // memory 36 bytes per touched sector (about 5.6x the element form at 1%)
};
std::string_view to_string(PatchWrites w) noexcept;

struct ReloadOptions {
  ReloadMode mode = ReloadMode::streaming;
  MismatchPolicy on_mismatch = MismatchPolicy::raise;
  // Verify the capture manifests of tracked graphs after each reload.
  bool verify = true;
  // Treat a configuration value changed by PWAL as a mismatch.
  bool check_configs = true;
  // PWAL may write into captured tensors in place (a declared member it is
  // handed, a buffer it does not load, a view of a parameter's storage).
  // true: before each layer's PWAL, copy those captured storages, and write
  // them back if the layer fails (memory: one layer's such storages in
  // streaming mode, all of them in transactional mode). false: no copy; a
  // layer that fails after its PWAL started marks the model inconsistent
  // (replay refused until a reload succeeds). docs/reload.md, "Modes".
  bool restore_in_place_writes = true;
  // Adopt the source's tensors instead of copying them (Note [Adopting
  // source tensors] in reload/layer_pipeline.cpp). A checkpoint parameter
  // that arrives as one tensor of exactly its shape, dtype and device,
  // contiguous (one unsharded checkpoint tensor the layer does not load
  // itself, or the whole parameter delivered under the parameter's name:
  // weight_source.h) becomes that tensor for the reload: no load copy, no
  // new storage. The commit then copies it straight into the captured
  // storage, so a reload copies each byte once, as a plain load does. The
  // source's tensors must not be written until reload() returns, or until
  // the commit() of a stage(): one written since staging makes the commit
  // stale (see check_adopted_content). PWAL that writes a parameter in place
  // would write the source's tensor: the reload throws gk::WeightError
  // naming the weight (caught through the version counter). Tensors not
  // adoptable (another device or dtype, strided, an inference tensor, a view
  // of a captured storage) are copied.
  bool adopt_source_tensors = false;
  // With adopt_source_tensors, a stage() hashes every adopted tensor when it
  // adopts it, and commit() hashes it again before writing anything: a
  // tensor written since (through .data, a raw pointer or a kernel, which
  // move no version counter) makes the commit stale, refused with nothing
  // changed. The commit's pause grows by one read of the adopted bytes
  // (docs/performance.md). false: no hashing, for trainers that guarantee
  // they write no adopted tensor until the commit returns (a write then is
  // served as a mix of new parameters and stale derived tensors). Note
  // [Adopted tensors are hashed] in reload/staged_reload.cpp.
  bool check_adopted_content = true;
  // Serve floating-point checkpoint tensors holding NaN or infinity. By
  // default a reload, a stage and the first load refuse them with a
  // gk::WeightError naming the tensor, before PWAL runs (one device read of
  // the layer's bytes; Note [Refusing non-finite weights] in
  // reload/non_finite.cpp).
  bool allow_non_finite = false;
  // Called on the reloading thread after each layer's PWAL and checks, with
  // the layer's prefix, in reload() and stage(). An engine paces a stage()
  // here: waiting in it leaves the device to the serving graphs for a while
  // (the example engine's LlmEngineOptions::stage_device_share). Throwing
  // from it fails the reload or the stage as any error would.
  std::function<void(const std::string& layer)> after_layer;
  // Transactional mode only: called once after every layer is loaded, PWAL'd
  // and checked and the completion gate passed, right before the first
  // commit. Throwing from it aborts the reload with a full rollback (every
  // layer keeps its old weights); the exception propagates out of reload().
  // The distributed reload votes here (include/graphkeep/distributed/
  // distributed.h). Not called in streaming mode. stage() calls it last, on
  // the staging thread, once everything is staged and checked: throwing from
  // it aborts the stage (nothing changed).
  std::function<void()> before_commit;

  // --- Content identity and patches (docs/delta.md) --------------------------
  // Hash every checkpoint tensor as it loads (checkpoint format, before PWAL;
  // on its device, one batched gk::content_hashes per layer), and hash the
  // loaded parameters again after PWAL to find those PWAL left bit for bit
  // as loaded (they can then be patched in place: Note [Patch landings]).
  // The hashes are what ReloadEngine::served() reports and what a patch's
  // base hashes are checked against. false: no hashing (times.hash_ms 0); the
  // served content is then unknown and every patch is refused until a load
  // with hashing.
  bool hash_served = true;
  // The version id of the weights this load brings (ServedWeights::label()).
  // Empty: the label the engine recorded for the same content before, if any.
  std::string version_label;
  // Where a full load keeps the checkpoint-format bases of the tensors PWAL
  // transforms (PatchBase). The first load's option counts until the first
  // reload; each full reload records again with its own.
  PatchBase patch_base = PatchBase::none;
  // How a patch's commit writes (PatchWrites); the same weights either way.
  PatchWrites patch_writes = PatchWrites::automatic;
  // After a commit (of a patch or a full reload) wrote the captured storage,
  // hash the served tensors that land unchanged there again and compare with
  // the hashes recorded at staging; a difference is a gk::WeightError (a
  // patch is then rolled back). Costs one read of those tensors (the touched
  // ones for a patch) inside the pause.
  bool verify_served = false;
};

// Given to the ReloadEngine once.
struct EngineOptions {
  // The options of reload(source) and stage(source), the calls without
  // options of their own.
  ReloadOptions defaults;
};

}  // namespace gk
