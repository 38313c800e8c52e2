// graphkeep/quant/marlin.h
//
// Failure sites 5 and 6: the Marlin family's split-K lock workspace.
//
// Marlin-style GEMMs split K across several thread blocks per output tile and
// reduce the partial sums in turn: the block of slice s waits until
// locks[tile] == s, adds its partial sum, sets locks[tile] = s + 1, and the
// last slice resets the lock to 0 (see quant/cuda/marlin_splitk.h). The
// workspace that holds the locks is built in PWAL, and every lock must be 0
// when a kernel launches: a captured graph that reads a workspace which a
// reload freed (or which holds garbage) waits forever in vLLM (the seed RFC's
// livelock). Here the GPU spin is bounded: a block that does not get its turn
// within ~2^20 loads gives up and writes NaN into its outputs, and the CPU
// twin simulates the same protocol (a lock that does not hold the slice index
// the block expects is a timeout: NaN outputs, lock left alone). The
// workspace is declared gk::workspace(gk::Init::zero): a reload zeroes the
// captured locks in place.
//
// Site 5, MarlinW4A16Kernel: int4 weights (8 per int32) with group scales and
// act-order: g_idx gives each input channel its group; PWAL computes
// g_idx_sort_indices = argsort(g_idx) (gk::permutation), repacks the weights
// in sorted-K order, and the kernel gathers the activations through it.
//
// Site 6, the siblings sharing the lock protocol (one kernel template on the
// GPU, one CPU simulation), each owning its own workspace built in PWAL:
//   MarlinFp8Kernel  fp8 e4m3 weights x per-channel scale;
//   MarlinFp4Kernel  fp4 e2m1 weights x fp8 block scale (16 channels) x global scale;
//   MarlinMoeKernel  int4 experts, one lock per (expert, column tile); a router
//                    (the layer's gate) picks one expert per token.
//
//   gk::quant::MarlinW4A16Linear lin(/*in=*/128, /*out=*/48, /*group_size=*/16, at::kCPU);
//   ... gk::load_weights(...)  (qweight [in/8, out] int32, scales [in/gs, out], g_idx [in] int32)
//   at::Tensor y = lin.forward(x);   // x: [M, in] float32 -> [M, out]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string_view>

namespace gk::quant {

// Marlin sizes its workspace for the largest grid it may launch (one counter
// per possible thread block); graphkeep's kernels use at least this many
// int32 counters (16 KiB).
inline constexpr int64_t kMarlinMinLocks = 4096;

// A zeroed lock workspace of max(locks, kMarlinMinLocks) int32 counters.
at::Tensor marlin_make_workspace(int64_t locks, c10::Device device);

// Packs vals [R, N] (integers in [0, 2^bits)) along dim 0 into [R / per_word, N]
// int32: row r is bits [bits * (r % per_word), +bits) of word r / per_word
// (GPTQ packs int4 this way with per_word 8, bits 4). unpack_int_rows is the
// inverse, returning int64.
at::Tensor pack_int_rows(const at::Tensor& vals, int64_t per_word, int64_t bits);
at::Tensor unpack_int_rows(const at::Tensor& words, int64_t per_word, int64_t bits);

// The kernels' constructors take `name`, optional: the checkpoint tensor
// (or module path) they are built from, which their refusals name
// ("model.layers.0.mlp.down_proj.weight"); without it they name the kernel
// and its arguments only.

// Split-K shape: output column tiles of `tile_n`, K cut into `slices`.
struct MarlinSplitK {
  int64_t tile_n = 16;
  int64_t slices = 4;
  friend bool operator==(const MarlinSplitK&, const MarlinSplitK&) = default;
};

// ---------------------------------------------------------------------------
// Site 5: W4A16 with act-order
// ---------------------------------------------------------------------------

class MarlinW4A16Kernel {
 public:
  MarlinW4A16Kernel() = default;
  // PWAL: qweight [K/8, N] int32 (GPTQ: input channel k is nibble k % 8 of
  // row k / 8, stored as value + 8), g_idx [K] int32.
  MarlinW4A16Kernel(const at::Tensor& qweight, const at::Tensor& g_idx, MarlinSplitK split,
                    std::string_view name = {});

  // x: [M, K] float32; scales [G, N] and g_idx [K] are the layer's parameters.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& g_idx) const;

  const at::Tensor& workspace() const { return workspace_; }
  const at::Tensor& g_idx_sort_indices() const { return g_idx_sort_indices_; }
  const at::Tensor& qweight() const { return qweight_; }

 private:
  at::Tensor qweight_;             // [K/8, N] int32: int4 in sorted-K order (row i: channel perm[i])
  at::Tensor g_idx_sort_indices_;  // [K] int32: argsort(g_idx), gathers the activations
  at::Tensor workspace_;           // split-K locks, 0 at launch
  int64_t size_k_ = 0, size_n_ = 0;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE(MarlinW4A16Kernel, (qweight_, gk::derived_weight), (g_idx_sort_indices_, gk::permutation),
                     (workspace_, gk::workspace(gk::Init::zero)), size_k_, size_n_, split_)
};

// The W4A16 GEMM alone, for a class that holds its own members (the example
// engine's W4A16 weights, whose packed weights a patch recomputes by blocks
// of a group, declare each one): y = x W^T with W[n, k] = (q[k, n] - 8) *
// scales[g_idx[k], n], q packed as MarlinW4A16Kernel's qweight_ (input
// channel perm[i] is nibble i % 8 of row i / 8). Shapes as for
// MarlinW4A16Kernel; `workspace` from marlin_make_workspace, 0 at launch.
at::Tensor marlin_w4a16_apply(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                              const at::Tensor& g_idx, const at::Tensor& perm, const at::Tensor& workspace,
                              MarlinSplitK split);

class MarlinW4A16Linear : public torch::nn::Module, public DescribedLayer<MarlinW4A16Linear> {
 public:
  MarlinW4A16Linear(int64_t in, int64_t out, int64_t group_size, c10::Device device, MarlinSplitK split = {});

  void process_weights_after_loading() override;

  // x: [M, in] float32 on the layer's device -> [M, out]
  at::Tensor forward(const at::Tensor& x);

  const MarlinW4A16Kernel& kernel() const { return *kernel_; }

 private:
  at::Tensor qweight_;  // [in/8, out] int32, checkpoint format
  at::Tensor scales_;   // [in/group_size, out] float32
  at::Tensor g_idx_;    // [in] int32
  std::unique_ptr<MarlinW4A16Kernel> kernel_;
  int64_t in_, out_, group_size_;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE_DERIVED(MarlinW4A16Linear, (torch::nn::Module, DescribedLayer<MarlinW4A16Linear>),
                             (qweight_, gk::parameter), (scales_, gk::parameter), (g_idx_, gk::parameter), kernel_, in_,
                             out_, group_size_, split_)
};

// ---------------------------------------------------------------------------
// Site 6: FP8
// ---------------------------------------------------------------------------
class MarlinFp8Kernel {
 public:
  MarlinFp8Kernel() = default;
  // PWAL: weight [N, K] float8_e4m3fn, weight_scale [N] float32.
  MarlinFp8Kernel(const at::Tensor& weight, const at::Tensor& weight_scale, MarlinSplitK split,
                  std::string_view name = {});
  at::Tensor apply(const at::Tensor& x) const;  // [M, K] -> [M, N]
  const at::Tensor& workspace() const { return workspace_; }

 private:
  at::Tensor qweight_;    // [K/4, N] int32: the e4m3 bytes, 4 per word along K
  at::Tensor scales_;     // [N] float32
  at::Tensor workspace_;  // split-K locks, 0 at launch
  int64_t size_k_ = 0, size_n_ = 0;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE(MarlinFp8Kernel, (qweight_, gk::derived_weight), (scales_, gk::scale),
                     (workspace_, gk::workspace(gk::Init::zero)), size_k_, size_n_, split_)
};

class MarlinFp8Linear : public torch::nn::Module, public DescribedLayer<MarlinFp8Linear> {
 public:
  MarlinFp8Linear(int64_t in, int64_t out, c10::Device device, MarlinSplitK split = {});
  void process_weights_after_loading() override;
  at::Tensor forward(const at::Tensor& x);
  const MarlinFp8Kernel& kernel() const { return *kernel_; }

 private:
  at::Tensor weight_;        // [out, in] float8_e4m3fn
  at::Tensor weight_scale_;  // [out] float32
  std::unique_ptr<MarlinFp8Kernel> kernel_;
  int64_t in_, out_;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE_DERIVED(MarlinFp8Linear, (torch::nn::Module, DescribedLayer<MarlinFp8Linear>),
                             (weight_, gk::parameter), (weight_scale_, gk::parameter), kernel_, in_, out_, split_)
};

// ---------------------------------------------------------------------------
// Site 6: FP4 (NVFP4 layout: two e2m1 values per byte, an fp8 scale per 16)
// ---------------------------------------------------------------------------
class MarlinFp4Kernel {
 public:
  static constexpr int64_t kBlock = 16;
  MarlinFp4Kernel() = default;
  // PWAL: weight [N, K/2] uint8 (channel 2j in the low nibble of byte j),
  // weight_scale [N, K/16] float8_e4m3fn, weight_scale_2 [1] float32.
  MarlinFp4Kernel(const at::Tensor& weight, const at::Tensor& weight_scale, const at::Tensor& weight_scale_2,
                  MarlinSplitK split, std::string_view name = {});
  at::Tensor apply(const at::Tensor& x) const;  // [M, K] -> [M, N]
  const at::Tensor& workspace() const { return workspace_; }

 private:
  at::Tensor qweight_;       // [K/8, N] int32: e2m1 nibbles, 8 per word along K
  at::Tensor block_scales_;  // [K/16, N] float32 (decoded fp8)
  at::Tensor global_scale_;  // [1] float32
  at::Tensor workspace_;     // split-K locks, 0 at launch
  int64_t size_k_ = 0, size_n_ = 0;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE(MarlinFp4Kernel, (qweight_, gk::derived_weight), (block_scales_, gk::scale), (global_scale_, gk::scale),
                     (workspace_, gk::workspace(gk::Init::zero)), size_k_, size_n_, split_)
};

class MarlinFp4Linear : public torch::nn::Module, public DescribedLayer<MarlinFp4Linear> {
 public:
  MarlinFp4Linear(int64_t in, int64_t out, c10::Device device, MarlinSplitK split = {});
  void process_weights_after_loading() override;
  at::Tensor forward(const at::Tensor& x);
  const MarlinFp4Kernel& kernel() const { return *kernel_; }

 private:
  at::Tensor weight_;          // [out, in/2] uint8
  at::Tensor weight_scale_;    // [out, in/16] float8_e4m3fn
  at::Tensor weight_scale_2_;  // [1] float32 (global)
  std::unique_ptr<MarlinFp4Kernel> kernel_;
  int64_t in_, out_;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE_DERIVED(MarlinFp4Linear, (torch::nn::Module, DescribedLayer<MarlinFp4Linear>),
                             (weight_, gk::parameter), (weight_scale_, gk::parameter), (weight_scale_2_, gk::parameter),
                             kernel_, in_, out_, split_)
};

// ---------------------------------------------------------------------------
// Site 6: MoE (int4 experts, top-1 routing)
// ---------------------------------------------------------------------------
class MarlinMoeKernel {
 public:
  MarlinMoeKernel() = default;
  // PWAL: w [E, K/8, N] int32 (GPTQ packing per expert), scales [E, K/gs, N].
  MarlinMoeKernel(const at::Tensor& w, const at::Tensor& scales, int64_t group_size, MarlinSplitK split,
                  std::string_view name = {});
  // x: [M, K] float32, expert_ids: [M] int32 -> [M, N]
  at::Tensor apply(const at::Tensor& x, const at::Tensor& expert_ids) const;
  const at::Tensor& workspace() const { return workspace_; }

 private:
  at::Tensor qweight_;    // [E, N, K/8] int32 (N-major)
  at::Tensor scales_;     // [E, K/gs, N] float32
  at::Tensor workspace_;  // one lock per (expert, column tile), 0 at launch
  int64_t experts_ = 0, size_k_ = 0, size_n_ = 0, group_size_ = 0;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE(MarlinMoeKernel, (qweight_, gk::derived_weight), (scales_, gk::scale),
                     (workspace_, gk::workspace(gk::Init::zero)), experts_, size_k_, size_n_, group_size_, split_)
};

class MarlinMoeLayer : public torch::nn::Module, public DescribedLayer<MarlinMoeLayer> {
 public:
  MarlinMoeLayer(int64_t experts, int64_t in, int64_t out, int64_t group_size, c10::Device device,
                 MarlinSplitK split = {});
  void process_weights_after_loading() override;
  // x: [M, in] -> [M, out]; the router (gate) picks each token's expert.
  at::Tensor forward(const at::Tensor& x);
  const MarlinMoeKernel& kernel() const { return *kernel_; }

 private:
  at::Tensor gate_;    // [E, in] float32 router
  at::Tensor w_;       // [E, in/8, out] int32
  at::Tensor scales_;  // [E, in/gs, out] float32
  std::unique_ptr<MarlinMoeKernel> kernel_;
  int64_t experts_, in_, out_, group_size_;
  MarlinSplitK split_;

  GRAPHKEEP_DESCRIBE_DERIVED(MarlinMoeLayer, (torch::nn::Module, DescribedLayer<MarlinMoeLayer>),
                             (gate_, gk::parameter), (w_, gk::parameter), (scales_, gk::parameter), kernel_, experts_,
                             in_, out_, group_size_, split_)
};

}  // namespace gk::quant
