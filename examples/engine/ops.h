// examples/engine/ops.h
//
// The few dense ops the example engine needs besides graphkeep's kernels
// (embedding lookup, linear, residual add, RMS norm, argmax), written so a
// capture records them on both backends: on CUDA they are plain ATen calls
// (the CUDA graph captures them); on CPU they launch through
// gk::hostrt::launch_aten, so the host graph burns in their pointers too.
#pragma once

#include <ATen/core/Tensor.h>

namespace demo::ops {

at::Tensor embedding(const at::Tensor& table, const at::Tensor& ids);  // [V, D], [T] int64 -> [T, D]
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);           // [T, K] x [N, K]^T -> [T, N]
at::Tensor add(const at::Tensor& a, const at::Tensor& b);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps = 1e-6);
at::Tensor argmax(const at::Tensor& logits);                           // [T, V] -> [T] int64

}  // namespace demo::ops
