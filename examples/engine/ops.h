// examples/engine/ops.h
//
// The few dense ops the example engine needs besides graphkeep's kernels
// (embedding lookup, linear, residual add, RMS norm, argmax), written so a
// capture records them on both backends: on CUDA they are plain ATen calls
// (the CUDA graph captures them); on CPU they launch through
// gk::hostrt::launch_aten, so the host graph burns in their pointers too.
// aten_op() is that wrapping for any ATen body (the decoder in layers.cpp and
// the sampler in sampler.cpp build every op of theirs with it).
//
//   at::Tensor y = demo::ops::aten_op("scale", {x}, x.sizes(), x.options(),
//                                     [](auto& in, auto& out) { at::mul_out(out[0], in[0], 2); });
#pragma once

#include <graphkeep/runtime/host_stream.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace demo::ops {

// One op both backends capture (Note [Ops that both backends capture] in
// layer_ops.h): `body` writes its one output, allocated here by
// gk::runtime::empty (the capture's pool while capturing); on CUDA it runs
// now, on the CPU it is a host-graph launch.
at::Tensor aten_op(const char* name, const std::vector<at::Tensor>& inputs, at::IntArrayRef out_shape,
                   const at::TensorOptions& options, gk::hostrt::AtenBody body);

at::Tensor embedding(const at::Tensor& table, const at::Tensor& ids);  // [V, D], [T] int64 -> [T, D]
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);           // [T, K] x [N, K]^T -> [T, N]
at::Tensor add(const at::Tensor& a, const at::Tensor& b);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps = 1e-6);
at::Tensor argmax(const at::Tensor& logits);                           // [T, V] -> [T] int64

}  // namespace demo::ops
