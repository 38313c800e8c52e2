// examples/engine/layer_ops.h: the small ops the example engine's layers and
// weight formats are made of (internal to the engine).
//
//   at::Tensor y = demo::layer_ops::linear("q_proj", x, w);   // y = x w^T, one captured op
#pragma once

#include "ops.h"

#include <ATen/core/Tensor.h>

namespace demo::layer_ops {

// Note [Ops that both backends capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every computation of the forward is one `op`: an ATen body over its input
// and output tensors. On CUDA the body runs at once and the CUDA graph being
// captured records its kernels. On the CPU it becomes a host-graph launch
// (gk::hostrt::launch_aten), which burns in the tensors' pointers exactly as
// a CUDA graph burns in kernel arguments, so a CPU run shows the same
// failures a GPU run would. Outputs come from gk::runtime::empty: the
// capture's private pool while capturing.
inline constexpr auto op = &ops::aten_op;

// transformers' RMSNorm: in float32, then back to the input dtype, times the weight.
at::Tensor rms_norm_math(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor rotate_half(const at::Tensor& x);
at::Tensor linear(const char* name, const at::Tensor& x, const at::Tensor& w);  // x w^T
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor residual(const at::Tensor& a, const at::Tensor& b);                   // a + b
// t in dtype `dt` (t itself when it already is), as an op.
at::Tensor to_dtype(const char* name, const at::Tensor& t, at::ScalarType dt);
// Fused SwiGLU activation: [T, 2I] (gate, then up) -> silu(gate) * up [T, I].
at::Tensor silu_and_mul(const at::Tensor& h);

}  // namespace demo::layer_ops
