// graphkeep/kernels/padded_moe.h
//
// Failure site 3: MoE weights whose PWAL swaps the parameter's storage for a
// padded one (vLLM's ROCm MoE padding, VLLM_ROCM_MOE_PADDING:
// `param.data = F.pad(param, (0, pad))[..., :-pad]`). The C++ equivalent is
// `w13_weight_.set_data(padded)`: the parameter keeps its shape but now lives
// in a new, larger storage whose rows are 128 bytes longer, and the kernel
// reads rows with that padded stride.
//
// Every PWAL allocates a new padded storage. The captured graph burned in the
// first one, so the reload must copy into the captured (padded) storage and
// set the parameter back onto it: the reload's PWAL pads again to the same
// layout (same shape, strides and storage size), which the engine checks.
//
// The computation, per token t (x_t of size K), top-1 routing by the router
// `gate` [E, K], then a gated MLP of expert e:
//   e      = argmax_e gate[e] . x_t
//   h[m]   = w13[e, m, :] . x_t                    m < 2N   (rows of stride K + pad)
//   a[n]   = relu(h[n]) * h[N + n]                 n < N
//   y[t,k] = w2[e, k, :] . a                       k < K    (rows of stride N + pad)
//
//   gk::kernels::PaddedMoe moe(/*experts=*/4, /*hidden=*/32, /*inter=*/16, at::kCPU);
//   at::Tensor y = moe.forward(x);   // x: [T, K] float32 -> y: [T, K]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::kernels {

class PaddedMoe : public torch::nn::Module, public DescribedLayer<PaddedMoe> {
 public:
  // Rows are padded by this many bytes (vLLM's ROCm padding size).
  static constexpr int64_t kPadBytes = 128;

  PaddedMoe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device);

  void process_weights_after_loading() override;

  // x: [T, K] float32 on the layer's device -> [T, K]
  at::Tensor forward(const at::Tensor& x);

  const at::Tensor& w13_weight() const { return w13_weight_; }
  const at::Tensor& w2_weight() const { return w2_weight_; }
  int64_t pad_elements() const { return pad_; }

 private:
  at::Tensor w13_weight_;  // [E, 2N, K]; after PWAL rows of stride K + pad
  at::Tensor w2_weight_;   // [E, K, N];  after PWAL rows of stride N + pad
  at::Tensor gate_;        // [E, K] router
  int64_t experts_, hidden_, inter_;
  int64_t pad_ = 0;            // padding in elements
  int64_t w13_row_stride_ = 0; // set by PWAL, read by the kernel by value
  int64_t w2_row_stride_ = 0;

  GRAPHKEEP_DESCRIBE_DERIVED(PaddedMoe, (torch::nn::Module, DescribedLayer<PaddedMoe>), (w13_weight_, gk::parameter),
                             (w2_weight_, gk::parameter), (gate_, gk::parameter), experts_, hidden_, inter_, pad_,
                             w13_row_stride_, w2_row_stride_)
};

}  // namespace gk::kernels
