// The experts objects of sites 4 and 10, the Qwen3-MoE experts
// (SwigluExperts), and their grouped pipeline: CPU twins
// (recorded through gk::hostrt) of the kernels in kernels/cuda/moe_grouped.cu,
// computing every element with the same scalar code (moe_common.h).
#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/kernels/moe_experts.h>

#include "cuda/moe_common.h"
#include "cuda/moe_launch.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace gk::kernels {
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

void gather_cpu(const float* x, const int32_t* perm, float* out, int64_t M, int64_t K, int64_t topk) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c) out[r * K + c] = x[(perm[r] / topk) * K + c];
}

void grouped_gemm_nt_cpu(const float* a, const float* b, float* c, const int32_t* offsets, const int64_t* as,
                         const int64_t* bs, const int64_t* cs, int64_t E, int64_t ncols, int64_t kdim) {
  for (int64_t g = 0; g < E; ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    const int64_t lda = as[g], ldb = bs[g], ldc = cs[g];  // per group, from the stride arrays
    const float* ag = a + r0 * kdim;
    const float* bg = b + g * ncols * kdim;
    float* cg = c + r0 * ncols;
    for (int64_t n = 0; n < ncols; ++n)
      for (int64_t r = 0; r < r1 - r0; ++r) cg[r * ldc + n] = mc::dot(ag + r * lda, bg + n * ldb, kdim);
  }
}

void act_cpu(const float* c1, float* h, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) h[r * N + n] = mc::gated_act(c1[r * 2 * N + n], c1[r * 2 * N + N + n]);
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

// SwigluExperts' steps.
void route_softmax_cpu(const float* logits, float* probs, int32_t* order, int32_t* ids, float* gates,
                       int32_t* offsets, int32_t* perm, int32_t* inv, int64_t T, int64_t E, int64_t topk,
                       bool renormalize) {
  for (int64_t t = 0; t < T; ++t)
    mc::route_token_softmax(logits + t * E, E, topk, renormalize, probs + t * E, order + t * E, ids + t * topk,
                            gates + t * topk);
  mc::sort_by_expert(ids, T * topk, E, offsets, perm, inv);
}

template <class W>
void grouped_gemm_nt_w_cpu(const float* a, const typename W::type* b, float* c, const int32_t* offsets,
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

void silu_act_cpu(const float* c1, float* h, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) h[r * N + n] = mc::silu_act(c1[r * 2 * N + n], c1[r * 2 * N + N + n]);
}

// --- the steps, on the tensors' device ----------------------------------------------

// The per-call routing metadata (vLLM: topk_ids/topk_weights, expert_offsets,
// a_map/c_map), from the capture pool.
struct Routing {
  at::Tensor ids, gates, offsets, perm, inv;
};

Routing route(const at::Tensor& logits, int64_t E, int64_t topk) {
  const int64_t T = logits.size(0), M = T * topk;
  const auto iopt = logits.options().dtype(at::kInt);
  Routing rt{runtime::empty({M}, iopt), runtime::empty({M}, logits.options()), runtime::empty({E + 1}, iopt),
             runtime::empty({M}, iopt), runtime::empty({M}, iopt)};
  const float* lp = logits.data_ptr<float>();
  int32_t* ids = rt.ids.data_ptr<int32_t>();
  float* gates = rt.gates.data_ptr<float>();
  int32_t* off = rt.offsets.data_ptr<int32_t>();
  int32_t* perm = rt.perm.data_ptr<int32_t>();
  int32_t* inv = rt.inv.data_ptr<int32_t>();
  if (logits.is_cuda()) {
    GK_LAUNCH_CUDA("moe_route", logits, cuda::launch_moe_route(lp, ids, gates, off, perm, inv, T, E, topk, runtime::cuda_stream(logits)));
  } else {
    hostrt::launch("moe_route",
                   {reads(logits), writes(rt.ids), writes(rt.gates), writes(rt.offsets), writes(rt.perm), writes(rt.inv)},
                   [=] { route_cpu(lp, ids, gates, off, perm, inv, T, E, topk); });
  }
  return rt;
}

// SwigluExperts' routing; probs and order are the per-token scratch of the
// softmax and the top-k ([T, E], from the capture pool like the rest).
Routing route_softmax(const at::Tensor& logits, int64_t E, int64_t topk, bool renormalize) {
  const int64_t T = logits.size(0), M = T * topk;
  const auto iopt = logits.options().dtype(at::kInt);
  Routing rt{runtime::empty({M}, iopt), runtime::empty({M}, logits.options()), runtime::empty({E + 1}, iopt),
             runtime::empty({M}, iopt), runtime::empty({M}, iopt)};
  const at::Tensor probs = runtime::empty({T, E}, logits.options());
  const at::Tensor order = runtime::empty({T, E}, iopt);
  const float* lp = logits.data_ptr<float>();
  float* pp = probs.data_ptr<float>();
  int32_t* op = order.data_ptr<int32_t>();
  int32_t* ids = rt.ids.data_ptr<int32_t>();
  float* gates = rt.gates.data_ptr<float>();
  int32_t* off = rt.offsets.data_ptr<int32_t>();
  int32_t* perm = rt.perm.data_ptr<int32_t>();
  int32_t* inv = rt.inv.data_ptr<int32_t>();
  if (logits.is_cuda()) {
    GK_LAUNCH_CUDA("moe_route_softmax", logits,
                   cuda::launch_moe_route_softmax(lp, pp, op, ids, gates, off, perm, inv, T, E, topk, renormalize,
                                                  runtime::cuda_stream(logits)));
  } else {
    hostrt::launch("moe_route_softmax",
                   {reads(logits), writes(probs), writes(order), writes(rt.ids), writes(rt.gates), writes(rt.offsets),
                    writes(rt.perm), writes(rt.inv)},
                   [=] { route_softmax_cpu(lp, pp, op, ids, gates, off, perm, inv, T, E, topk, renormalize); });
  }
  return rt;
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

void check_strides(const at::Tensor& s, int64_t E, const char* name) {
  GK_CHECK(StateError, s.defined() && s.scalar_type() == at::kLong && s.dim() == 1 && s.size(0) == E && s.is_contiguous(),
           "MoE experts: stride array ", name, " must be a contiguous int64 [", E, "]");
}

// Site 4's grouped pipeline, shared by CutlassExperts and SwigluExperts.
// Its per-expert stride arrays, built as vLLM builds them: ab_strides1 = K
// is also c_strides2 (one tensor), ab_strides2 = N, c_strides1 = 2N.
void make_grouped_strides(int64_t E, int64_t K, int64_t N, c10::Device device, at::Tensor& ab1, at::Tensor& ab2,
                          at::Tensor& c1, at::Tensor& c2) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  ab1 = at::full({E}, K, opts);
  c2 = ab1;
  ab2 = at::full({E}, N, opts);
  c1 = at::full({E}, 2 * N, opts);
}

void check_grouped_strides(const at::Tensor& ab1, const at::Tensor& ab2, const at::Tensor& c1, const at::Tensor& c2,
                           int64_t E) {
  check_strides(ab1, E, "ab_strides1");
  check_strides(ab2, E, "ab_strides2");
  check_strides(c1, E, "c_strides1");
  check_strides(c2, E, "c_strides2");
}

// One call's intermediates: gathered rows a1 [M, K], GEMM1's output c1
// [M, 2N], the activation h [M, N], GEMM2's output c2 [M, K].
struct GroupedBuffers {
  at::Tensor a1, c1, h, c2;
};
GroupedBuffers grouped_buffers(const at::Tensor& x, int64_t M, int64_t K, int64_t N) {
  return {runtime::empty({M, K}, x.options()), runtime::empty({M, 2 * N}, x.options()),
          runtime::empty({M, N}, x.options()), runtime::empty({M, K}, x.options())};
}

}  // namespace

// --- site 4 ------------------------------------------------------------------------

CutlassExperts::CutlassExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                               c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk) {
  make_grouped_strides(num_experts, hidden, inter, device, ab_strides1_, ab_strides2_, c_strides1_, c_strides2_);
}

at::Tensor CutlassExperts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && call.logits.dim() == 2 && call.logits.size(0) == x.size(0) &&
               call.logits.size(1) == E && call.w13.sizes() == at::IntArrayRef({E, 2 * N, K}) &&
               call.w2.sizes() == at::IntArrayRef({E, K, N}),
           "CutlassExperts: x must be [T, ", K, "], logits [T, ", E, "], w13 [", E, ", ", 2 * N, ", ", K, "], w2 [", E,
           ", ", K, ", ", N, "]; got ", x.sizes(), ", ", call.logits.sizes(), ", ", call.w13.sizes(), ", ",
           call.w2.sizes());
  check_grouped_strides(ab_strides1_, ab_strides2_, c_strides1_, c_strides2_, E);
  const int64_t T = x.size(0), M = T * topk;
  const Routing rt = route(call.logits, E, topk);
  const auto [a1, c1, h, c2] = grouped_buffers(x, M, K, N);

  const float* xp = x.data_ptr<float>();
  const int32_t* perm = rt.perm.data_ptr<int32_t>();
  const int32_t* off = rt.offsets.data_ptr<int32_t>();
  const float* w13 = call.w13.data_ptr<float>();
  const float* w2 = call.w2.data_ptr<float>();
  const int64_t* ab1 = ab_strides1_.data_ptr<int64_t>();
  const int64_t* ab2 = ab_strides2_.data_ptr<int64_t>();
  const int64_t* cs1 = c_strides1_.data_ptr<int64_t>();
  const int64_t* cs2 = c_strides2_.data_ptr<int64_t>();
  float* a1p = a1.data_ptr<float>();
  float* c1p = c1.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* c2p = c2.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_cutlass_gemm", x, {
      void* s = runtime::cuda_stream(x);
      cuda::launch_moe_gather_rows(xp, perm, a1p, M, K, topk, s);
      cuda::launch_moe_grouped_gemm_nt(a1p, w13, c1p, off, ab1, ab1, cs1, E, 2 * N, K, s);
      cuda::launch_moe_act_rows(c1p, hp, M, N, s);
      cuda::launch_moe_grouped_gemm_nt(hp, w2, c2p, off, ab2, ab2, cs2, E, K, N, s);
    });
  } else {
    hostrt::launch("moe_gather", {reads(x), reads(rt.perm), writes(a1)}, [=] { gather_cpu(xp, perm, a1p, M, K, topk); });
    hostrt::launch("moe_grouped_gemm1",
                   {reads(a1), reads(call.w13), writes(c1), reads(rt.offsets), reads(ab_strides1_), reads(c_strides1_)},
                   [=] { grouped_gemm_nt_cpu(a1p, w13, c1p, off, ab1, ab1, cs1, E, 2 * N, K); });
    hostrt::launch("moe_act", {reads(c1), writes(h)}, [=] { act_cpu(c1p, hp, M, N); });
    hostrt::launch("moe_grouped_gemm2",
                   {reads(h), reads(call.w2), writes(c2), reads(rt.offsets), reads(ab_strides2_), reads(c_strides2_)},
                   [=] { grouped_gemm_nt_cpu(hp, w2, c2p, off, ab2, ab2, cs2, E, K, N); });
  }
  return finalize(c2, rt, T, K, topk);
}

// --- Qwen3-MoE / Mixtral experts ---------------------------------------------------

SwigluExperts::SwigluExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, bool norm_topk_prob,
                             c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk), norm_topk_prob_(norm_topk_prob) {
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts, "SwigluExperts: need 1 <= topk <= experts, got topk ",
           topk, " and ", num_experts, " experts");
  make_grouped_strides(num_experts, hidden, inter, device, ab_strides1_, ab_strides2_, c_strides1_, c_strides2_);
}

at::Tensor SwigluExperts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat && x.is_contiguous() &&
               call.logits.dim() == 2 && call.logits.size(0) == x.size(0) && call.logits.size(1) == E &&
               call.logits.scalar_type() == at::kFloat && call.logits.is_contiguous(),
           "SwigluExperts: x must be a contiguous float32 [T, ", K, "] and logits [T, ", E, "]; got ", x.sizes(), " ",
           x.scalar_type(), " and ", call.logits.sizes(), " ", call.logits.scalar_type());
  const at::ScalarType wt = call.w13.scalar_type();
  GK_CHECK(WeightError,
           call.w13.sizes() == at::IntArrayRef({E, 2 * N, K}) && call.w2.sizes() == at::IntArrayRef({E, K, N}) &&
               call.w2.scalar_type() == wt && (wt == at::kFloat || wt == at::kBFloat16 || wt == at::kHalf) &&
               call.w13.is_contiguous() && call.w2.is_contiguous() && call.w13.device() == x.device() &&
               call.w2.device() == x.device(),
           "SwigluExperts: w13 must be a contiguous [", E, ", ", 2 * N, ", ", K, "] and w2 [", E, ", ", K, ", ", N,
           "], both float32, bfloat16 or float16, on ", x.device(), "; got ", call.w13.sizes(), " ",
           call.w13.scalar_type(), " and ", call.w2.sizes(), " ", call.w2.scalar_type());
  check_grouped_strides(ab_strides1_, ab_strides2_, c_strides1_, c_strides2_, E);
  const int64_t T = x.size(0), M = T * topk;
  const Routing rt = route_softmax(call.logits, E, topk, norm_topk_prob_);
  const auto [a1, c1, h, c2] = grouped_buffers(x, M, K, N);

  const float* xp = x.data_ptr<float>();
  const int32_t* perm = rt.perm.data_ptr<int32_t>();
  const int32_t* off = rt.offsets.data_ptr<int32_t>();
  const void* w13 = call.w13.data_ptr();
  const void* w2 = call.w2.data_ptr();
  const int64_t* ab1 = ab_strides1_.data_ptr<int64_t>();
  const int64_t* ab2 = ab_strides2_.data_ptr<int64_t>();
  const int64_t* cs1 = c_strides1_.data_ptr<int64_t>();
  const int64_t* cs2 = c_strides2_.data_ptr<int64_t>();
  float* a1p = a1.data_ptr<float>();
  float* c1p = c1.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* c2p = c2.data_ptr<float>();
  const cuda::MoeWeightType type = wt == at::kFloat      ? cuda::MoeWeightType::f32
                                   : wt == at::kBFloat16 ? cuda::MoeWeightType::bf16
                                                         : cuda::MoeWeightType::f16;
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_swiglu_gemm", x, {
      void* s = runtime::cuda_stream(x);
      cuda::launch_moe_gather_rows(xp, perm, a1p, M, K, topk, s);
      cuda::launch_moe_grouped_gemm_nt_w(a1p, w13, type, c1p, off, ab1, ab1, cs1, E, 2 * N, K, s);
      cuda::launch_moe_silu_act_rows(c1p, hp, M, N, s);
      cuda::launch_moe_grouped_gemm_nt_w(hp, w2, type, c2p, off, ab2, ab2, cs2, E, K, N, s);
    });
  } else {
    // The weights' storage type picks the instantiation; c10::BFloat16 and
    // c10::Half are standard-layout wrappers of their uint16_t bits.
    auto gemm = [type](const float* a, const void* b, float* c, const int32_t* o, const int64_t* as,
                       const int64_t* bs, const int64_t* cs, int64_t e, int64_t ncols, int64_t kdim) {
      switch (type) {
        case cuda::MoeWeightType::f32:
          grouped_gemm_nt_w_cpu<mc::F32Weight>(a, static_cast<const float*>(b), c, o, as, bs, cs, e, ncols, kdim);
          break;
        case cuda::MoeWeightType::bf16:
          grouped_gemm_nt_w_cpu<mc::Bf16Weight>(a, static_cast<const std::uint16_t*>(b), c, o, as, bs, cs, e, ncols,
                                                kdim);
          break;
        case cuda::MoeWeightType::f16:
          grouped_gemm_nt_w_cpu<mc::F16Weight>(a, static_cast<const std::uint16_t*>(b), c, o, as, bs, cs, e, ncols,
                                               kdim);
          break;
      }
    };
    hostrt::launch("moe_gather", {reads(x), reads(rt.perm), writes(a1)}, [=] { gather_cpu(xp, perm, a1p, M, K, topk); });
    hostrt::launch("moe_swiglu_gemm1",
                   {reads(a1), reads(call.w13), writes(c1), reads(rt.offsets), reads(ab_strides1_), reads(c_strides1_)},
                   [=] { gemm(a1p, w13, c1p, off, ab1, ab1, cs1, E, 2 * N, K); });
    hostrt::launch("moe_silu_act", {reads(c1), writes(h)}, [=] { silu_act_cpu(c1p, hp, M, N); });
    hostrt::launch("moe_swiglu_gemm2",
                   {reads(h), reads(call.w2), writes(c2), reads(rt.offsets), reads(ab_strides2_), reads(c_strides2_)},
                   [=] { gemm(hp, w2, c2p, off, ab2, ab2, cs2, E, K, N); });
  }
  return finalize(c2, rt, T, K, topk);
}

// --- site 10 -----------------------------------------------------------------------

CutlassW4A8Experts::CutlassW4A8Experts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                                       int64_t group, c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk), group_(group) {
  GK_CHECK(DeclarationError, group > 0 && hidden % 8 == 0 && inter % 8 == 0 && hidden % group == 0 && inter % group == 0,
           "CutlassW4A8Experts: hidden (", hidden, ") and inter (", inter,
           ") must be multiples of 8 and of the group size (", group, ")");
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  a_strides1_ = at::full({num_experts}, hidden, opts);
  a_strides2_ = at::full({num_experts}, inter, opts);
  c_strides1_ = at::full({num_experts}, 2 * inter, opts);
  c_strides2_ = at::full({num_experts}, hidden, opts);
  s_strides1_ = at::full({num_experts}, 2 * inter, opts);
  s_strides2_ = at::full({num_experts}, hidden, opts);
}

at::Tensor CutlassW4A8Experts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_, G = group_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && call.logits.dim() == 2 && call.logits.size(0) == x.size(0) &&
               call.logits.size(1) == E && call.w13.sizes() == at::IntArrayRef({E, 2 * N, K / 8}) &&
               call.w2.sizes() == at::IntArrayRef({E, K, N / 8}) &&
               call.w13_scales.sizes() == at::IntArrayRef({E, K / G, 2 * N}) &&
               call.w2_scales.sizes() == at::IntArrayRef({E, N / G, K}),
           "CutlassW4A8Experts: unexpected shapes x ", x.sizes(), ", logits ", call.logits.sizes(), ", w13 ",
           call.w13.sizes(), ", w2 ", call.w2.sizes(), ", w13_scales ", call.w13_scales.sizes(), ", w2_scales ",
           call.w2_scales.sizes());
  for (const at::Tensor* s : {&a_strides1_, &a_strides2_, &c_strides1_, &c_strides2_, &s_strides1_, &s_strides2_})
    check_strides(*s, E, "a/c/s_strides");
  const int64_t T = x.size(0), M = T * topk;
  const Routing rt = route(call.logits, E, topk);
  const auto i8 = x.options().dtype(at::kChar);
  at::Tensor aq1 = runtime::empty({M, K}, i8), as1 = runtime::empty({M}, x.options());
  at::Tensor c1 = runtime::empty({M, 2 * N}, x.options());
  at::Tensor aq2 = runtime::empty({M, N}, i8), as2 = runtime::empty({M}, x.options());
  at::Tensor c2 = runtime::empty({M, K}, x.options());

  const float* xp = x.data_ptr<float>();
  const int32_t* perm = rt.perm.data_ptr<int32_t>();
  const int32_t* off = rt.offsets.data_ptr<int32_t>();
  const int32_t* w13 = call.w13.data_ptr<int32_t>();
  const int32_t* w2 = call.w2.data_ptr<int32_t>();
  const float* s13 = call.w13_scales.data_ptr<float>();
  const float* s2 = call.w2_scales.data_ptr<float>();
  const int64_t* a1s = a_strides1_.data_ptr<int64_t>();
  const int64_t* a2s = a_strides2_.data_ptr<int64_t>();
  const int64_t* c1s = c_strides1_.data_ptr<int64_t>();
  const int64_t* c2s = c_strides2_.data_ptr<int64_t>();
  const int64_t* s1s = s_strides1_.data_ptr<int64_t>();
  const int64_t* s2s = s_strides2_.data_ptr<int64_t>();
  int8_t* aq1p = aq1.data_ptr<int8_t>();
  int8_t* aq2p = aq2.data_ptr<int8_t>();
  float* as1p = as1.data_ptr<float>();
  float* as2p = as2.data_ptr<float>();
  float* c1p = c1.data_ptr<float>();
  float* c2p = c2.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_w4a8_gemm", x, {
      void* s = runtime::cuda_stream(x);
      cuda::launch_moe_quant_rows(xp, perm, aq1p, as1p, M, K, topk, s);
      cuda::launch_moe_w4a8_grouped_gemm(aq1p, as1p, w13, s13, c1p, off, a1s, c1s, s1s, E, 2 * N, K, G, s);
      cuda::launch_moe_act_quant_rows(c1p, aq2p, as2p, M, N, s);
      cuda::launch_moe_w4a8_grouped_gemm(aq2p, as2p, w2, s2, c2p, off, a2s, c2s, s2s, E, K, N, G, s);
    });
  } else {
    hostrt::launch("moe_quant", {reads(x), reads(rt.perm), writes(aq1), writes(as1)},
                   [=] { quant_cpu(xp, perm, aq1p, as1p, M, K, topk); });
    hostrt::launch("moe_w4a8_gemm1",
                   {reads(aq1), reads(as1), reads(call.w13), reads(call.w13_scales), writes(c1), reads(rt.offsets),
                    reads(a_strides1_), reads(c_strides1_), reads(s_strides1_)},
                   [=] { w4a8_gemm_cpu(aq1p, as1p, w13, s13, c1p, off, a1s, c1s, s1s, E, 2 * N, K, G); });
    hostrt::launch("moe_act_quant", {reads(c1), writes(aq2), writes(as2)},
                   [=] { quant_cpu(c1p, nullptr, aq2p, as2p, M, N, 1); });
    hostrt::launch("moe_w4a8_gemm2",
                   {reads(aq2), reads(as2), reads(call.w2), reads(call.w2_scales), writes(c2), reads(rt.offsets),
                    reads(a_strides2_), reads(c_strides2_), reads(s_strides2_)},
                   [=] { w4a8_gemm_cpu(aq2p, as2p, w2, s2, c2p, off, a2s, c2s, s2s, E, K, N, G); });
  }
  return finalize(c2, rt, T, K, topk);
}

}  // namespace gk::kernels

GRAPHKEEP_REGISTER_TYPE(gk::kernels::CutlassExperts);
GRAPHKEEP_REGISTER_TYPE(gk::kernels::CutlassW4A8Experts);
GRAPHKEEP_REGISTER_TYPE(gk::kernels::SwigluExperts);
