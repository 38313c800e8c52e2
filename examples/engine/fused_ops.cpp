#include "fused_ops.h"

#include "llm.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

#include <cmath>

#ifdef GRAPHKEEP_WITH_CUDA
#include "cuda/decoder_kernels_launch.h"

#include <ATen/cuda/CUDAContext.h>
#endif

namespace demo::fused {
namespace {

#ifdef GRAPHKEEP_WITH_CUDA
cuda::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return cuda::Dtype::bf16;
    case at::kHalf: return cuda::Dtype::f16;
    default: return cuda::Dtype::f32;
  }
}

void check_launch(const char* name, int error) {
  GK_CHECK(gk::StateError, error == 0, "fused op ", name, ": the CUDA launch failed: ", cuda::error_name(error));
}
#endif

void check_input(const char* name, const at::Tensor& t, const at::Tensor& like, std::int64_t dim) {
  GK_CHECK(gk::StateError, t.is_cuda() && t.device() == like.device() && t.dim() == dim, "fused op ", name,
           ": expected a ", dim, "-d tensor on ", like.device(), ", got ", t.sizes(), " on ", t.device());
}

[[maybe_unused]] const void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

bool supported(const at::Tensor& x) {
#ifdef GRAPHKEEP_WITH_CUDA
  const at::ScalarType dt = x.scalar_type();
  return x.is_cuda() && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf);
#else
  (void)x;
  return false;
#endif
}

Normed add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  check_input("add_rms_norm", x, x, 2);
  GK_CHECK(gk::StateError, x.is_contiguous() && w.is_contiguous() && w.numel() == x.size(1) &&
                               w.scalar_type() == x.scalar_type(),
           "fused op add_rms_norm: x ", x.sizes(), " must be contiguous and w ", w.sizes(), " its row, same dtype");
  GK_CHECK(gk::StateError,
           !delta.defined() ||
               (delta.is_contiguous() && delta.sizes() == x.sizes() && delta.scalar_type() == x.scalar_type()),
           "fused op add_rms_norm: delta ", delta.sizes(), " must match x ", x.sizes());
  Normed n;
  n.residual = delta.defined() ? gk::runtime::empty(x.sizes(), x.options()) : x;
  n.normed = gk::runtime::empty(x.sizes(), x.options());
  GK_LAUNCH_CUDA("add_rms_norm", x,
                 check_launch("add_rms_norm",
                              cuda::launch_add_rms_norm(dtype_of(x), x.data_ptr(), ptr_or_null(delta), w.data_ptr(),
                                                        delta.defined() ? n.residual.data_ptr() : nullptr,
                                                        n.normed.data_ptr(), x.size(0), x.size(1),
                                                        static_cast<float>(eps),
                                                        gk::runtime::cuda_stream(x, "add_rms_norm"))));
  return n;
}

at::Tensor qkv_rope_cache(const at::Tensor& qkv, const TokenBatch& batch, const KvCache& cache,
                          const RopeTables& rope, const HeadShape& s, const at::Tensor& q_norm,
                          const at::Tensor& k_norm) {
  check_input("qkv_rope_cache", qkv, qkv, 2);
  const std::int64_t T = qkv.size(0), D = s.head_dim;
  GK_CHECK(gk::StateError, qkv.stride(1) == 1 && qkv.size(1) == (s.heads + 2 * s.kv_heads) * D && D % 2 == 0,
           "fused op qkv_rope_cache: qkv ", qkv.sizes(), " must have unit column stride and (", s.heads, " + 2 x ",
           s.kv_heads, ") heads of ", D, " (even) columns");
  GK_CHECK(gk::StateError, cache.k.is_contiguous() && cache.v.is_contiguous() && cache.k.scalar_type() == qkv.scalar_type() &&
                               rope.cos.scalar_type() == at::kFloat && rope.cos.is_contiguous() && rope.sin.is_contiguous() &&
                               batch.positions.scalar_type() == at::kLong && batch.seqs.scalar_type() == at::kLong &&
                               batch.positions.is_contiguous() && batch.seqs.is_contiguous(),
           "fused op qkv_rope_cache: the cache, rope tables and batch must be contiguous, in ", qkv.scalar_type(),
           ", float32 and int64");
  at::Tensor q = gk::runtime::empty({T, s.heads * D}, qkv.options());
  GK_LAUNCH_CUDA("qkv_rope_cache", qkv,
                 check_launch("qkv_rope_cache",
                              cuda::launch_qkv_rope_cache(
                                  dtype_of(qkv), qkv.data_ptr(), qkv.stride(0), batch.positions.data_ptr<std::int64_t>(),
                                  batch.seqs.data_ptr<std::int64_t>(), rope.cos.data_ptr<float>(),
                                  rope.sin.data_ptr<float>(), ptr_or_null(q_norm), ptr_or_null(k_norm), q.data_ptr(),
                                  cache.k.data_ptr(), cache.v.data_ptr(), T, s.heads, s.kv_heads, D, cache.max_len,
                                  static_cast<float>(s.eps), gk::runtime::cuda_stream(qkv, "qkv_rope_cache"))));
  return q;
}

at::Tensor decode_attention(const at::Tensor& q, const TokenBatch& batch, const KvCache& cache, const HeadShape& s) {
  check_input("decode_attention", q, q, 2);
  GK_CHECK(gk::StateError, q.is_contiguous() && q.size(1) == s.heads * s.head_dim && s.head_dim <= 256 &&
                               s.kv_heads > 0 && s.heads % s.kv_heads == 0,
           "fused op decode_attention: q ", q.sizes(), " must be contiguous [T, ", s.heads, " x ", s.head_dim,
           "] with head_dim at most 256 and heads a multiple of kv_heads ", s.kv_heads);
  at::Tensor out = gk::runtime::empty(q.sizes(), q.options());
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  GK_LAUNCH_CUDA("decode_attention", q,
                 check_launch("decode_attention",
                              cuda::launch_decode_attention(
                                  dtype_of(q), q.data_ptr(), batch.positions.data_ptr<std::int64_t>(),
                                  batch.seqs.data_ptr<std::int64_t>(), cache.k.data_ptr(), cache.v.data_ptr(),
                                  out.data_ptr(), q.size(0), s.heads, s.kv_heads, s.head_dim, cache.max_len,
                                  static_cast<float>(scale), gk::runtime::cuda_stream(q, "decode_attention"))));
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& h) {
  check_input("silu_and_mul", h, h, 2);
  GK_CHECK(gk::StateError, h.stride(1) == 1 && h.size(1) % 2 == 0, "fused op silu_and_mul: h ", h.sizes(),
           " must have unit column stride and an even width");
  const std::int64_t inter = h.size(1) / 2;
  at::Tensor out = gk::runtime::empty({h.size(0), inter}, h.options());
  GK_LAUNCH_CUDA("silu_and_mul", h,
                 check_launch("silu_and_mul", cuda::launch_silu_and_mul(dtype_of(h), h.data_ptr(), h.stride(0),
                                                                        out.data_ptr(), h.size(0), inter,
                                                                        gk::runtime::cuda_stream(h, "silu_and_mul"))));
  return out;
}

bool grouped_mm_supported(const at::Tensor& x) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (!x.is_cuda() || x.scalar_type() != at::kBFloat16) return false;
  const int major = at::cuda::getDeviceProperties(x.device().index())->major;
  return major == 9 || major == 10;
#else
  (void)x;
  return false;
#endif
}

at::Tensor moe_grouped_mm(const at::Tensor& x, const at::Tensor& router_logits, const at::Tensor& w13,
                          const at::Tensor& w2, std::int64_t topk, bool norm_topk_prob) {
  GK_CHECK(gk::StateError, x.dim() == 2 && w13.dim() == 3 && w2.dim() == 3 && w13.size(0) == w2.size(0) &&
                               w13.size(2) == x.size(1) && w2.size(1) == x.size(1) && w13.size(1) == 2 * w2.size(2),
           "fused op moe_grouped_mm: x ", x.sizes(), ", w13 ", w13.sizes(), " and w2 ", w2.sizes(),
           " are not [T, H], [E, 2I, H] and [E, H, I]");
  const std::int64_t T = x.size(0), E = w13.size(0), K = topk;
  // routing: softmax in float32, top-k (torch.topk's order), renormalized
  const at::Tensor probs = at::softmax(router_logits, -1, at::kFloat);
  auto [gates, experts] = probs.topk(K, -1);
  if (norm_topk_prob) gates = gates / gates.sum(-1, /*keepdim=*/true);
  // the (token, rank) pairs grouped by expert, stably; the groups' end offsets
  const at::Tensor flat = experts.reshape({-1});
  const auto sorted = flat.sort(/*stable=*/true, 0, /*descending=*/false);
  const at::Tensor& order = std::get<1>(sorted);
  const at::Tensor counts = at::zeros({E}, flat.options().dtype(at::kInt))
                                .scatter_add_(0, flat, at::ones({T * K}, flat.options().dtype(at::kInt)));
  const at::Tensor offs = counts.cumsum(0, at::kInt);
  // the experts' GEMMs over the gathered rows
  const at::Tensor rows = x.index_select(0, at::floor_divide(order, K));
  const at::Tensor h = at::_grouped_mm(rows, w13.transpose(1, 2), offs);
  // (The CPU, for the tests: the same roundings in ATen ops.)
  const std::int64_t I = w2.size(2);
  const at::Tensor act = supported(h) ? silu_and_mul(h) : at::silu(h.narrow(1, 0, I)) * h.narrow(1, I, I);
  const at::Tensor y_grouped = at::_grouped_mm(act, w2.transpose(1, 2), offs);
  // back to (token, rank) order, then the gated sum in float32
  const at::Tensor y = at::empty({T * K, x.size(1)}, x.options()).index_copy_(0, order, y_grouped);
  return (y.view({T, K, x.size(1)}).to(at::kFloat) * gates.unsqueeze(-1)).sum(1).to(x.scalar_type());
}

at::Tensor lora_expand(const at::Tensor& y, const at::Tensor& t, const at::Tensor& b,
                       const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& sizes,
                       std::int64_t rank, double scale) {
  check_input("lora_expand", y, y, 2);
  const auto parts = static_cast<std::int64_t>(offsets.size());
  GK_CHECK(gk::StateError, y.stride(1) == 1 && b.is_contiguous() && t.dim() == 2 && t.stride(1) == 1 &&
                               t.size(0) == y.size(0) && t.size(1) >= parts * rank && b.dim() == 2 &&
                               b.size(1) == rank && t.scalar_type() == y.scalar_type() &&
                               b.scalar_type() == y.scalar_type() && offsets.size() == sizes.size() &&
                               parts <= 4,
           "fused op lora_expand: y ", y.sizes(), ", t ", t.sizes(), " and b ", b.sizes(), " are not [T, N], [T, ",
           parts, " x ", rank, "] and [rows, ", rank, "] of one dtype, rows contiguous (b whole), with at most 4 parts");
  at::Tensor out = gk::runtime::empty(y.sizes(), y.options());
#ifdef GRAPHKEEP_WITH_CUDA
  cuda::LoraParts lp;
  lp.count = static_cast<int>(parts);
  std::int64_t brow = 0;
  for (std::int64_t p = 0; p < parts; ++p) {
    const auto i = static_cast<std::size_t>(p);
    GK_CHECK(gk::StateError, offsets[i] >= 0 && offsets[i] + sizes[i] <= y.size(1),
             "fused op lora_expand: part ", p, " (columns ", offsets[i], " + ", sizes[i], ") is outside y ", y.sizes());
    lp.offset[p] = offsets[i], lp.size[p] = sizes[i], lp.brow[p] = brow;
    brow += sizes[i];
  }
  GK_CHECK(gk::StateError, brow == b.size(0), "fused op lora_expand: the parts cover ", brow, " rows of b ", b.sizes());
#endif
  GK_LAUNCH_CUDA("lora_expand", y,
                 check_launch("lora_expand", cuda::launch_lora_expand(
                                                 dtype_of(y), y.data_ptr(), y.stride(0), t.data_ptr(), t.stride(0), b.data_ptr(),
                                                 out.data_ptr(), y.size(0), y.size(1), rank, lp,
                                                 static_cast<float>(scale), gk::runtime::cuda_stream(y, "lora_expand"))));
  return out;
}

at::Tensor gumbel_noise(const at::Tensor& ids, const at::Tensor& row_keys) {
  check_input("gumbel_noise", ids, ids, 2);
  GK_CHECK(gk::StateError, ids.scalar_type() == at::kLong && ids.stride(1) == 1 && row_keys.scalar_type() == at::kLong &&
                               row_keys.is_contiguous() && row_keys.numel() == ids.size(0),
           "fused op gumbel_noise: ids ", ids.sizes(), " and row_keys ", row_keys.sizes(), " must be int64, one key per row");
  at::Tensor out = gk::runtime::empty(ids.sizes(), ids.options().dtype(at::kFloat));
  GK_LAUNCH_CUDA("gumbel_noise", ids,
                 check_launch("gumbel_noise", cuda::launch_gumbel_noise(ids.data_ptr<std::int64_t>(), ids.stride(0),
                                                                        row_keys.data_ptr<std::int64_t>(),
                                                                        out.data_ptr<float>(), ids.size(0), ids.size(1),
                                                                        gk::runtime::cuda_stream(ids, "gumbel_noise"))));
  return out;
}

}  // namespace demo::fused
