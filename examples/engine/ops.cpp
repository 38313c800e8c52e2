#include "ops.h"

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

namespace demo::ops {
namespace {

using Body = gk::hostrt::AtenBody;

at::Tensor run(const char* name, std::vector<at::Tensor> inputs, at::IntArrayRef out_sizes,
               const at::TensorOptions& options, Body body) {
  at::Tensor out = gk::runtime::empty(out_sizes, options);
  if (out.is_cuda()) {
    std::vector<at::Tensor> outs{out};
    body(inputs, outs);
  } else {
    gk::hostrt::launch_aten(name, inputs, {out}, std::move(body));
  }
  return out;
}

}  // namespace

at::Tensor embedding(const at::Tensor& table, const at::Tensor& ids) {
  return run("embedding", {table, ids}, {ids.size(0), table.size(1)}, table.options(),
             [](auto& in, auto& out) { at::index_select_out(out[0], in[0], 0, in[1]); });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  return run("linear", {x, w}, {x.size(0), w.size(0)}, x.options(),
             [](auto& in, auto& out) { at::mm_out(out[0], in[0], in[1].t()); });
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
  return run("add", {a, b}, a.sizes(), a.options(), [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  return run("rms_norm", {x, gamma}, x.sizes(), x.options(), [eps](auto& in, auto& out) {
    at::Tensor r = at::rsqrt(in[0].pow(2).mean(-1, /*keepdim=*/true) + eps);
    at::mul_out(out[0], in[0] * r, in[1]);
  });
}

at::Tensor argmax(const at::Tensor& logits) {
  return run("argmax", {logits}, {logits.size(0)}, logits.options().dtype(at::kLong),
             [](auto& in, auto& out) { at::argmax_out(out[0], in[0], -1); });
}

}  // namespace demo::ops
