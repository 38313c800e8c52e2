#include "ops.h"

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

namespace demo::ops {

at::Tensor aten_op(const char* name, const std::vector<at::Tensor>& inputs, at::IntArrayRef out_shape,
                   const at::TensorOptions& options, gk::hostrt::AtenBody body) {
  at::Tensor out = gk::runtime::empty(out_shape, options);
  if (out.is_cuda()) {
    std::vector<at::Tensor> in = inputs, outs{out};
    body(in, outs);
  } else {
    gk::hostrt::launch_aten(name, inputs, {out}, std::move(body));
  }
  return out;
}

at::Tensor embedding(const at::Tensor& table, const at::Tensor& ids) {
  return aten_op("embedding", {table, ids}, {ids.size(0), table.size(1)}, table.options(),
                 [](auto& in, auto& out) { at::index_select_out(out[0], in[0], 0, in[1]); });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  return aten_op("linear", {x, w}, {x.size(0), w.size(0)}, x.options(),
                 [](auto& in, auto& out) { at::mm_out(out[0], in[0], in[1].t()); });
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
  return aten_op("add", {a, b}, a.sizes(), a.options(), [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  return aten_op("rms_norm", {x, gamma}, x.sizes(), x.options(), [eps](auto& in, auto& out) {
    at::Tensor r = at::rsqrt(in[0].pow(2).mean(-1, /*keepdim=*/true) + eps);
    at::mul_out(out[0], in[0] * r, in[1]);
  });
}

at::Tensor argmax(const at::Tensor& logits) {
  return aten_op("argmax", {logits}, {logits.size(0)}, logits.options().dtype(at::kLong),
                 [](auto& in, auto& out) { at::argmax_out(out[0], in[0], -1); });
}

}  // namespace demo::ops
