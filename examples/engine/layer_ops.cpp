// The example engine's small ops (layer_ops.h).
#include "layer_ops.h"

#include <ATen/ATen.h>

namespace demo::layer_ops {

// transformers' RMSNorm: in float32, then back to the input dtype, times the weight.
at::Tensor rms_norm_math(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w * (xf * r).to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

at::Tensor linear(const char* name, const at::Tensor& x, const at::Tensor& w) {
  return op(name, {x, w}, {x.size(0), w.size(0)}, x.options(),
            [](auto& in, auto& out) { at::mm_out(out[0], in[0], in[1].t()); });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return op("rms_norm", {x, w}, x.sizes(), x.options(),
            [eps](auto& in, auto& out) { out[0].copy_(rms_norm_math(in[0], in[1], eps)); });
}

at::Tensor residual(const at::Tensor& a, const at::Tensor& b) {
  return op("add", {a, b}, a.sizes(), a.options(), [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
}

// t in dtype `dt` (t itself when it already is), as an op.
at::Tensor to_dtype(const char* name, const at::Tensor& t, at::ScalarType dt) {
  if (t.scalar_type() == dt) return t;
  return op(name, {t}, t.sizes(), t.options().dtype(dt), [](auto& in, auto& out) { out[0].copy_(in[0]); });
}

// Fused SwiGLU activation: [T, 2I] (gate, then up) -> silu(gate) * up [T, I].
at::Tensor silu_and_mul(const at::Tensor& h) {
  const int64_t i = h.size(1) / 2;
  return op("silu_and_mul", {h}, {h.size(0), i}, h.options(), [i](auto& in, auto& out) {
    at::mul_out(out[0], at::silu(in[0].narrow(1, 0, i)), in[0].narrow(1, i, i));
  });
}

}  // namespace demo::layer_ops
