// reload/batched_loads.h: gk::default_load's copies for one layer, as a few
// batched-copy launches. Internal to the reload layer.
//
// Note [Default loads in one launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter that concatenates many checkpoint tensors is filled by one
// gk::default_load per tensor: a narrow and a copy_. A Qwen3-MoE layer's
// w13 holds 256 of them and its w2 128; on a GPU each copy_ is a dispatch
// and a launch, several microseconds of host work, 384 times per layer and
// 18,000 times per reload of the 30B-A3B. BatchedLoads computes the bytes
// default_load would write as one range of the freshly materialized
// parameter (tensor i starts at the dim-0 sizes of tensors 0..i-1, shard s
// of a dim-0 split at s rows of its shard further) and queues the copy in a
// ByteCopies (reload/byte_copies.h): a layer's loads become one launch per
// 1,536 chunks of 512 KiB. On a CPU the same range is copied at once with
// memcpy (no dispatch, no TensorIterator), so the CPU suites check the
// offsets against default_load's layout: every oracle test that loads a
// fused or stacked parameter on a CPU goes through them.
//
// add() refuses, queuing nothing, what is not one contiguous range on one
// device with the parameter's dtype and the slice's exact shape: a shard
// along a later dimension, a strided source, a dtype to cast. The caller
// then flushes and runs default_load, so every byte is written in the
// order of the loads, as before; a refused load keeps default_load's own
// behaviour and errors. A layer's own load_weight() may write anywhere in
// its parameter, so before calling one the caller launches the copies
// queued for that parameter; a layer that does not override it (a stacked
// experts layer, say) keeps its whole batch (overrides_load_weight below).
//
//   gk::detail::BatchedLoads loads;
//   for (...) if (!loads.add(request)) { loads.flush(); gk::default_load(request); }
//   loads.flush();   // before anything reads the parameters
#pragma once

#include <graphkeep/model/layer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace gk::detail {

class ByteCopies;
class CopiedFrom;

// Whether `layer` overrides ReloadableLayer::load_weight(): only then can
// a call write a parameter that has copies queued, and only then does
// process() launch them before the call. Told apart through GCC's bound
// member function pointers; true (flush before every call, exact either
// way) with another compiler, or where the layer's code carries its own
// copy of the base class's function (a library built with hidden symbols).
bool overrides_load_weight(ReloadableLayer& layer);

// Whether dst.copy_(src) moves bytes and nothing else: two plain strided
// tensors on one device (CUDA or CPU) of one dtype, the source neither
// quantized nor a conjugate or negative view. Contiguity and shapes are the
// caller's to check.
bool copy_moves_bytes(const at::Tensor& dst, const at::Tensor& src);

class BatchedLoads {
 public:
  BatchedLoads();
  ~BatchedLoads();
  BatchedLoads(const BatchedLoads&) = delete;
  BatchedLoads& operator=(const BatchedLoads&) = delete;

  // Copies r.value into its place if that is one contiguous byte range of
  // r.target: on a CPU at once, on a CUDA device queued (nothing launched
  // yet; r.value must stay alive until flush() has launched the copy).
  // Returns false, nothing done, otherwise. `copied`, if given, records the
  // copy (Note [Hashes of verbatim copies] in copied_from.h).
  bool add(const LoadRequest& r, CopiedFrom* copied = nullptr);
  // Launches what is queued, on the current stream of its device.
  void flush();
  // Whether a copy into `target` is queued and not launched.
  bool queued_into(const at::Tensor& target) const noexcept;

 private:
  // Row offset of each of a parameter's tensors: the sums of the dim-0
  // sizes before it, computed once per parameter and layer.
  const std::vector<std::int64_t>& starts(const CheckpointParam& p);

  std::vector<std::pair<const CheckpointParam*, std::vector<std::int64_t>>> starts_;
  std::vector<const void*> queued_;  // targets' data pointers with a queued copy
#if defined(GRAPHKEEP_WITH_CUDA)
  std::unique_ptr<ByteCopies> copies_;
#endif
};

}  // namespace gk::detail
