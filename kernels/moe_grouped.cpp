// The grouped MoE pipeline's steps (moe_grouped.h): each launches the CUDA
// kernel of kernels/cuda/moe_grouped.cu, or records its CPU twin through
// gk::hostrt, computing every element with the same scalar code
// (moe_common.h).
#include "moe_grouped.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/runtime/host_stream.h>

#include "cuda/moe_common.h"
#include "cuda/moe_launch.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace gk::kernels::grouped {
namespace {

using hostrt::reads;
using hostrt::writes;
namespace mc = gk::kernels::moe;

// --- CPU twins ------------------------------------------------------------------

void route_cpu(const float* logits, int32_t* ids, float* gates, int32_t* offsets, int32_t* perm, int32_t* inv,
               int64_t T, int64_t E, int64_t topk) {
  for (int64_t t = 0; t < T; ++t) mc::route_token(logits + t * E, E, topk, ids + t * topk, gates + t * topk);
  mc::sort_by_expert(ids, T * topk, E, offsets, perm, inv);
}

void route_softmax_cpu(const float* logits, float* probs, int32_t* order, int32_t* ids, float* gates,
                       int32_t* offsets, int32_t* perm, int32_t* inv, int64_t T, int64_t E, int64_t topk,
                       bool renormalize) {
  for (int64_t t = 0; t < T; ++t)
    mc::route_token_softmax(logits + t * E, E, topk, renormalize, probs + t * E, order + t * E, ids + t * topk,
                            gates + t * topk);
  mc::sort_by_expert(ids, T * topk, E, offsets, perm, inv);
}

void gather_cpu(const float* x, const int32_t* perm, float* out, int64_t M, int64_t K, int64_t topk) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c) out[r * K + c] = x[(perm[r] / topk) * K + c];
}

template <class W>
void grouped_gemm_cpu(const float* a, const typename W::type* b, float* c, const int32_t* offsets,
                      const int64_t* as, const int64_t* bs, const int64_t* cs, int64_t E, int64_t ncols,
                      int64_t kdim) {
  for (int64_t g = 0; g < E; ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    const int64_t lda = as[g], ldb = bs[g], ldc = cs[g];  // per group, from the stride arrays
    const float* ag = a + r0 * kdim;
    const typename W::type* bg = b + g * ncols * kdim;
    float* cg = c + r0 * ncols;
    for (int64_t n = 0; n < ncols; ++n)
      for (int64_t r = 0; r < r1 - r0; ++r) cg[r * ldc + n] = mc::dot_w<W>(ag + r * lda, bg + n * ldb, kdim);
  }
}

// The weights' storage type picks the instantiation; c10::BFloat16 and
// c10::Half are standard-layout wrappers of their uint16_t bits.
void grouped_gemm_cpu(cuda::MoeWeightType type, const float* a, const void* b, float* c, const int32_t* offsets,
                      const int64_t* as, const int64_t* bs, const int64_t* cs, int64_t E, int64_t ncols,
                      int64_t kdim) {
  switch (type) {
    case cuda::MoeWeightType::f32:
      grouped_gemm_cpu<mc::F32Weight>(a, static_cast<const float*>(b), c, offsets, as, bs, cs, E, ncols, kdim);
      break;
    case cuda::MoeWeightType::bf16:
      grouped_gemm_cpu<mc::Bf16Weight>(a, static_cast<const std::uint16_t*>(b), c, offsets, as, bs, cs, E, ncols,
                                       kdim);
      break;
    case cuda::MoeWeightType::f16:
      grouped_gemm_cpu<mc::F16Weight>(a, static_cast<const std::uint16_t*>(b), c, offsets, as, bs, cs, E, ncols,
                                      kdim);
      break;
  }
}

// h[r, n] = Act(gate, up) = Act(c1[r, n], c1[r, N + n]).
template <float (*Act)(float, float)>
void act_cpu(const float* c1, float* h, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) h[r * N + n] = Act(c1[r * 2 * N + n], c1[r * 2 * N + N + n]);
}

void finalize_cpu(const float* c2, const float* gates, const int32_t* inv, float* y, int64_t T, int64_t K,
                  int64_t topk) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < K; ++c) y[t * K + c] = mc::combine_rows(c2, gates, inv, t, c, K, topk);
}

// perm == nullptr: the rows are the gated activations of c1 [M, 2*len].
void quant_cpu(const float* src, const int32_t* perm, int8_t* aq, float* ascale, int64_t M, int64_t len,
               int64_t topk) {
  std::vector<float> row(static_cast<std::size_t>(len));
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t i = 0; i < len; ++i)
      row[i] = perm == nullptr ? mc::gated_act(src[r * 2 * len + i], src[r * 2 * len + len + i])
                               : src[(perm[r] / topk) * len + i];
    const float scale = mc::int8_row_scale(row.data(), len);
    ascale[r] = scale;
    for (int64_t i = 0; i < len; ++i) aq[r * len + i] = mc::quantize_int8(row[i], scale);
  }
}

void w4a8_gemm_cpu(const int8_t* a, const float* ascale, const int32_t* b, const float* s, float* c,
                   const int32_t* offsets, const int64_t* as, const int64_t* cs, const int64_t* ss, int64_t E,
                   int64_t ncols, int64_t kdim, int64_t group) {
  for (int64_t g = 0; g < E; ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    const int64_t lda = as[g], ldc = cs[g], lds = ss[g];  // per group, from the stride arrays
    const int8_t* ag = a + r0 * kdim;
    const float* sg = s + g * (kdim / group) * ncols;
    float* cg = c + r0 * ncols;
    for (int64_t n = 0; n < ncols; ++n) {
      const int32_t* brow = b + (g * ncols + n) * (kdim / 8);
      for (int64_t r = 0; r < r1 - r0; ++r)
        cg[r * ldc + n] = mc::fmul(mc::w4a8_dot(ag + r * lda, brow, sg, lds, n, kdim, group), ascale[r0 + r]);
    }
  }
}

Routing routing_buffers(const at::Tensor& logits, int64_t E, int64_t topk) {
  const int64_t M = logits.size(0) * topk;
  const auto iopt = logits.options().dtype(at::kInt);
  return {runtime::empty({M}, iopt), runtime::empty({M}, logits.options()), runtime::empty({E + 1}, iopt),
          runtime::empty({M}, iopt), runtime::empty({M}, iopt)};
}

cuda::MoeWeightType weight_type(const at::Tensor& w) {
  switch (w.scalar_type()) {
    case at::kFloat:
      return cuda::MoeWeightType::f32;
    case at::kBFloat16:
      return cuda::MoeWeightType::bf16;
    case at::kHalf:
      return cuda::MoeWeightType::f16;
    default:
      GK_CHECK(WeightError, false, "grouped MoE GEMM: expert weights must be float32, bfloat16 or float16, got ",
               w.scalar_type());
  }
  return cuda::MoeWeightType::f32;  // unreachable
}

}  // namespace

// --- the steps ----------------------------------------------------------------------

namespace {

// Both routers: softsign's top-k (route_token), or with `softmax` Qwen3-MoE's
// (route_token_softmax), whose probs and order are per-token scratch ([T, E],
// from the capture pool like the rest).
Routing route_rows(const at::Tensor& logits, int64_t E, int64_t topk, bool softmax, bool renormalize) {
  const int64_t T = logits.size(0);
  Routing rt = routing_buffers(logits, E, topk);
  at::Tensor probs, order;
  std::vector<hostrt::Access> accesses{reads(logits)};
  if (softmax) {
    probs = runtime::empty({T, E}, logits.options());
    order = runtime::empty({T, E}, logits.options().dtype(at::kInt));
    accesses.push_back(writes(probs));
    accesses.push_back(writes(order));
  }
  for (const at::Tensor* t : {&rt.ids, &rt.gates, &rt.offsets, &rt.perm, &rt.inv}) accesses.push_back(writes(*t));
  const float* lp = logits.data_ptr<float>();
  float* pp = softmax ? probs.data_ptr<float>() : nullptr;
  int32_t* op = softmax ? order.data_ptr<int32_t>() : nullptr;
  int32_t* ids = rt.ids.data_ptr<int32_t>();
  float* gates = rt.gates.data_ptr<float>();
  int32_t* off = rt.offsets.data_ptr<int32_t>();
  int32_t* perm = rt.perm.data_ptr<int32_t>();
  int32_t* inv = rt.inv.data_ptr<int32_t>();
  const char* name = softmax ? "moe_route_softmax" : "moe_route";
  if (logits.is_cuda()) {
    GK_LAUNCH_CUDA(name, logits, {
      void* s = runtime::cuda_stream(logits);
      softmax ? cuda::launch_moe_route_softmax(lp, pp, op, ids, gates, off, perm, inv, T, E, topk, renormalize, s)
              : cuda::launch_moe_route(lp, ids, gates, off, perm, inv, T, E, topk, s);
    });
  } else {
    hostrt::launch(name, std::move(accesses), [=] {
      softmax ? route_softmax_cpu(lp, pp, op, ids, gates, off, perm, inv, T, E, topk, renormalize)
              : route_cpu(lp, ids, gates, off, perm, inv, T, E, topk);
    });
  }
  return rt;
}

}  // namespace

Routing route(const at::Tensor& logits, int64_t E, int64_t topk) { return route_rows(logits, E, topk, false, false); }

Routing route_softmax(const at::Tensor& logits, int64_t E, int64_t topk, bool renormalize) {
  return route_rows(logits, E, topk, true, renormalize);
}

at::Tensor gather(const at::Tensor& x, const Routing& rt, int64_t topk) {
  const int64_t M = rt.perm.size(0), K = x.size(1);
  at::Tensor out = runtime::empty({M, K}, x.options());
  const float* xp = x.data_ptr<float>();
  const int32_t* perm = rt.perm.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_gather", x, cuda::launch_moe_gather_rows(xp, perm, op, M, K, topk, runtime::cuda_stream(x)));
  } else {
    hostrt::launch("moe_gather", {reads(x), reads(rt.perm), writes(out)}, [=] { gather_cpu(xp, perm, op, M, K, topk); });
  }
  return out;
}

at::Tensor grouped_gemm(const char* name, const at::Tensor& a, const at::Tensor& b, const Routing& rt,
                        const at::Tensor& a_strides, const at::Tensor& b_strides, const at::Tensor& c_strides,
                        int64_t E, int64_t ncols, int64_t kdim) {
  const int64_t M = a.size(0);
  at::Tensor c = runtime::empty({M, ncols}, a.options());
  const cuda::MoeWeightType type = weight_type(b);
  const float* ap = a.data_ptr<float>();
  const void* bp = b.data_ptr();
  float* cp = c.data_ptr<float>();
  const int32_t* off = rt.offsets.data_ptr<int32_t>();
  const int64_t* as = a_strides.data_ptr<int64_t>();
  const int64_t* bs = b_strides.data_ptr<int64_t>();
  const int64_t* cs = c_strides.data_ptr<int64_t>();
  if (a.is_cuda()) {
    GK_LAUNCH_CUDA(name, a,
                   cuda::launch_moe_grouped_gemm_nt(ap, bp, type, cp, off, as, bs, cs, E, ncols, kdim,
                                                    runtime::cuda_stream(a)));
  } else {
    std::vector<hostrt::Access> accesses{reads(a), reads(b), writes(c), reads(rt.offsets), reads(a_strides)};
    if (!b_strides.is_same(a_strides)) accesses.push_back(reads(b_strides));
    accesses.push_back(reads(c_strides));
    hostrt::launch(name, std::move(accesses),
                   [=] { grouped_gemm_cpu(type, ap, bp, cp, off, as, bs, cs, E, ncols, kdim); });
  }
  return c;
}

at::Tensor act(Activation kind, const at::Tensor& c1, int64_t N) {
  const int64_t M = c1.size(0);
  at::Tensor h = runtime::empty({M, N}, c1.options());
  const float* cp = c1.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  const bool silu = kind == Activation::silu_gated;
  const char* name = silu ? "moe_silu_act" : "moe_act";
  if (c1.is_cuda()) {
    GK_LAUNCH_CUDA(name, c1, {
      void* s = runtime::cuda_stream(c1);
      silu ? cuda::launch_moe_silu_act_rows(cp, hp, M, N, s) : cuda::launch_moe_act_rows(cp, hp, M, N, s);
    });
  } else {
    hostrt::launch(name, {reads(c1), writes(h)}, [=] { silu ? act_cpu<mc::silu_act>(cp, hp, M, N) : act_cpu<mc::gated_act>(cp, hp, M, N); });
  }
  return h;
}

at::Tensor finalize(const at::Tensor& c2, const Routing& rt, int64_t T, int64_t K, int64_t topk) {
  at::Tensor y = runtime::empty({T, K}, c2.options());
  const float* cp = c2.data_ptr<float>();
  const float* gp = rt.gates.data_ptr<float>();
  const int32_t* ip = rt.inv.data_ptr<int32_t>();
  float* yp = y.data_ptr<float>();
  if (c2.is_cuda()) {
    GK_LAUNCH_CUDA("moe_finalize", c2, cuda::launch_moe_finalize(cp, gp, ip, yp, T, K, topk, runtime::cuda_stream(c2)));
  } else {
    hostrt::launch("moe_finalize", {reads(c2), reads(rt.gates), reads(rt.inv), writes(y)},
                   [=] { finalize_cpu(cp, gp, ip, yp, T, K, topk); });
  }
  return y;
}

QuantRows quantize_rows(const at::Tensor& x, const Routing& rt, int64_t topk) {
  const int64_t M = rt.perm.size(0), K = x.size(1);
  QuantRows out{runtime::empty({M, K}, x.options().dtype(at::kChar)), runtime::empty({M}, x.options())};
  const float* xp = x.data_ptr<float>();
  const int32_t* perm = rt.perm.data_ptr<int32_t>();
  int8_t* qp = out.q.data_ptr<int8_t>();
  float* sp = out.scale.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_quant", x, cuda::launch_moe_quant_rows(xp, perm, qp, sp, M, K, topk, runtime::cuda_stream(x)));
  } else {
    hostrt::launch("moe_quant", {reads(x), reads(rt.perm), writes(out.q), writes(out.scale)},
                   [=] { quant_cpu(xp, perm, qp, sp, M, K, topk); });
  }
  return out;
}

QuantRows quantize_act(const at::Tensor& c1, int64_t N) {
  const int64_t M = c1.size(0);
  QuantRows out{runtime::empty({M, N}, c1.options().dtype(at::kChar)), runtime::empty({M}, c1.options())};
  const float* cp = c1.data_ptr<float>();
  int8_t* qp = out.q.data_ptr<int8_t>();
  float* sp = out.scale.data_ptr<float>();
  if (c1.is_cuda()) {
    GK_LAUNCH_CUDA("moe_act_quant", c1, cuda::launch_moe_act_quant_rows(cp, qp, sp, M, N, runtime::cuda_stream(c1)));
  } else {
    hostrt::launch("moe_act_quant", {reads(c1), writes(out.q), writes(out.scale)},
                   [=] { quant_cpu(cp, nullptr, qp, sp, M, N, 1); });
  }
  return out;
}

at::Tensor w4a8_grouped_gemm(const char* name, const QuantRows& a, const at::Tensor& b, const at::Tensor& s,
                             const Routing& rt, const at::Tensor& a_strides, const at::Tensor& c_strides,
                             const at::Tensor& s_strides, int64_t E, int64_t ncols, int64_t kdim, int64_t group) {
  const int64_t M = a.q.size(0);
  at::Tensor c = runtime::empty({M, ncols}, a.scale.options());
  const int8_t* ap = a.q.data_ptr<int8_t>();
  const float* asp = a.scale.data_ptr<float>();
  const int32_t* bp = b.data_ptr<int32_t>();
  const float* sp = s.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  const int32_t* off = rt.offsets.data_ptr<int32_t>();
  const int64_t* as = a_strides.data_ptr<int64_t>();
  const int64_t* cs = c_strides.data_ptr<int64_t>();
  const int64_t* ss = s_strides.data_ptr<int64_t>();
  if (b.is_cuda()) {
    GK_LAUNCH_CUDA(name, b,
                   cuda::launch_moe_w4a8_grouped_gemm(ap, asp, bp, sp, cp, off, as, cs, ss, E, ncols, kdim, group,
                                                      runtime::cuda_stream(b)));
  } else {
    hostrt::launch(name,
                   {reads(a.q), reads(a.scale), reads(b), reads(s), writes(c), reads(rt.offsets), reads(a_strides),
                    reads(c_strides), reads(s_strides)},
                   [=] { w4a8_gemm_cpu(ap, asp, bp, sp, cp, off, as, cs, ss, E, ncols, kdim, group); });
  }
  return c;
}

at::Tensor grouped_mlp(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2, const Routing& rt,
                       const GroupedGemmStrides& s, Activation kind, int64_t E, int64_t K, int64_t N, int64_t topk) {
  const bool silu = kind == Activation::silu_gated;
  const at::Tensor a1 = gather(x, rt, topk);
  const at::Tensor c1 = grouped_gemm(silu ? "moe_swiglu_gemm1" : "moe_grouped_gemm1", a1, w13, rt, s.ab_strides1,
                                     s.ab_strides1, s.c_strides1, E, 2 * N, K);
  const at::Tensor h = act(kind, c1, N);
  const at::Tensor c2 = grouped_gemm(silu ? "moe_swiglu_gemm2" : "moe_grouped_gemm2", h, w2, rt, s.ab_strides2,
                                     s.ab_strides2, s.c_strides2, E, K, N);
  return finalize(c2, rt, x.size(0), K, topk);
}

void check_strides(const at::Tensor& s, int64_t E, const char* name) {
  GK_CHECK(StateError, s.defined() && s.scalar_type() == at::kLong && s.dim() == 1 && s.size(0) == E && s.is_contiguous(),
           "MoE experts: stride array ", name, " must be a contiguous int64 [", E, "]");
}

}  // namespace gk::kernels::grouped
