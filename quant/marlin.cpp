// The Marlin family (sites 5 and 6): PWAL (repacking, sort indices, lock
// workspaces) and the CPU twins of quant/cuda/marlin.cu.
#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/marlin.h>

#include "cuda/marlin_launch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

namespace gk::quant {
namespace {

namespace m = marlin;

// `kernel` and, when given, the checkpoint tensor it is built from: the
// subject of a refusal ("MarlinW4A16Kernel for model.layers.0.mlp.down_proj.weight").
std::string subject(std::string_view kernel, std::string_view name) {
  std::string out(kernel);
  if (!name.empty()) out.append(" for ").append(name);
  return out;
}

// The CPU twin of marlin_splitk_kernel: the blocks of a unit run in slice
// order, so the bounded spin of the GPU is decided at once. When slice s runs
// and its unit's lock does not hold s, no other block will ever set it to s
// (only slice s - 1 does, and it has run): that is the timeout, reported the
// same way as on the GPU (NaN outputs, lock left alone).
template <class V>
void splitk_cpu(const V& v, const m::SplitK& c) {
  const int64_t k_per = c.k / c.slices;
  for (int64_t g = 0; g < c.groups; ++g)
    for (int64_t t = 0; t < c.tiles; ++t) {
      int32_t* lock = c.locks + g * c.tiles + t;
      for (int64_t s = 0; s < c.slices; ++s) {
        const bool turn = *lock == s;
        const int64_t k0 = s * k_per, k1 = k0 + k_per;
        for (int64_t row = 0; row < c.m; ++row) {
          if (!v.active(g, row)) continue;
          for (int64_t col = t * c.tile_n; col < std::min((t + 1) * c.tile_n, c.n); ++col) {
            float* o = v.output(row, col);
            if (!turn) {
              *o = m::quiet_nan();
              continue;
            }
            const float p = v.partial(g, row, col, k0, k1);
            *o = s == 0 ? p : m::fadd(*o, p);
          }
        }
        if (turn) *lock = s + 1 == c.slices ? 0 : static_cast<int32_t>(s + 1);
      }
    }
}

// The split-K description of a launch; checks the workspace is large enough
// (Marlin checks workspace.numel() against its grid the same way).
m::SplitK make_split(const at::Tensor& workspace, const MarlinSplitK& split, int64_t m_rows, int64_t n, int64_t k,
                     int64_t groups, std::string_view kernel) {
  m::SplitK c;
  c.m = m_rows;
  c.n = n;
  c.k = k;
  c.groups = groups;
  c.tile_n = split.tile_n;
  c.slices = split.slices;
  c.tiles = (n + split.tile_n - 1) / split.tile_n;
  GK_CHECK(StateError, workspace.defined() && workspace.numel() >= c.groups * c.tiles, kernel,
           ": the lock workspace holds ", workspace.defined() ? workspace.numel() : 0, " counters but the grid needs ",
           c.groups * c.tiles);
  GK_CHECK(WeightError, m_rows * (split.tile_n + 1) * 4 <= 48 * 1024, kernel, ": ", m_rows,
           " rows do not fit one block's shared memory (tile_n ", split.tile_n, ")");
  c.locks = workspace.data_ptr<int32_t>();
  return c;
}

void check_split(const MarlinSplitK& split, int64_t k, int64_t k_align, std::string_view who) {
  GK_CHECK(WeightError, split.tile_n > 0 && split.slices > 0 && k % (split.slices * k_align) == 0, who,
           ": its input size K = ", k, " must split into ", split.slices, " slices of a multiple of ", k_align,
           " channels (MarlinSplitK: slices ", split.slices, ", tile_n ", split.tile_n, ")");
}

void check_input(const at::Tensor& x, int64_t k, const at::Tensor& like, std::string_view kernel) {
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == k && x.scalar_type() == at::kFloat && x.is_contiguous() &&
               x.device() == like.device(),
           kernel, ": x must be a contiguous float32 [M, ", k, "] tensor on ", like.device(), ", got ",
           x.sizes(), " ", x.scalar_type(), " on ", x.device());
}

// Every Marlin-style apply() is the same sequence around its own arguments:
// check x, allocate the output, fill the fields all Args share, plan the
// split-K grid over the lock workspace, then launch on x's device: the CUDA
// launcher (`cuda_launch`, written with GK_LAUNCH_CUDA so CPU-only builds
// never reference it), or the CPU twin through hostrt with `reads`, the
// kernel's own inputs besides x and qweight. `groups` lock sets (one per
// expert for the MoE kernel) share the workspace.
template <class Args, class CudaLaunch>
at::Tensor splitk_apply(std::string_view kernel, const at::Tensor& x, Args a, const at::Tensor& qweight,
                        const at::Tensor& workspace, const MarlinSplitK& split, int64_t n, int64_t k, int64_t groups,
                        std::vector<hostrt::Access> reads, CudaLaunch&& cuda_launch) {
  check_input(x, k, qweight, kernel);
  const int64_t rows = x.size(0);
  at::Tensor y = runtime::empty({rows, n}, x.options());
  a.x = x.data_ptr<float>();
  a.qweight = qweight.data_ptr<int32_t>();
  a.out = y.data_ptr<float>();
  a.m = rows;
  a.n = n;
  a.k = k;
  const m::SplitK c = make_split(workspace, split, rows, n, k, groups, kernel);
  if (x.is_cuda()) {
    cuda_launch(a, c, runtime::cuda_stream(x, kernel));
  } else {
    reads.insert(reads.begin(), {hostrt::reads(x), hostrt::reads(qweight)});
    reads.push_back(hostrt::writes(workspace));
    reads.push_back(hostrt::writes(y));
    hostrt::launch(kernel, std::move(reads), [a, c] { splitk_cpu(a, c); });
  }
  return y;
}

}  // namespace

at::Tensor pack_int_rows(const at::Tensor& vals, int64_t per_word, int64_t bits) {
  const int64_t rows = vals.size(0), n = vals.size(1);
  const at::Tensor v = vals.to(at::kLong).reshape({rows / per_word, per_word, n});
  const at::Tensor shifts = (at::arange(per_word, v.options()) * bits).view({1, per_word, 1});
  at::Tensor words = at::bitwise_left_shift(v, shifts).sum(1);  // disjoint bits: sum == or
  words = at::where(words >= (int64_t{1} << 31), words - (int64_t{1} << 32), words);
  return words.to(at::kInt).contiguous();
}

at::Tensor unpack_int_rows(const at::Tensor& words, int64_t per_word, int64_t bits) {
  const at::Tensor w = at::bitwise_and(words.to(at::kLong), int64_t{0xFFFFFFFF}).unsqueeze(1);
  const at::Tensor shifts = (at::arange(per_word, w.options()) * bits).view({1, per_word, 1});
  return at::bitwise_and(at::bitwise_right_shift(w, shifts), (int64_t{1} << bits) - 1)
      .reshape({words.size(0) * per_word, words.size(1)});
}

at::Tensor marlin_make_workspace(int64_t locks, c10::Device device) {
  return at::zeros({std::max(locks, kMarlinMinLocks)}, at::TensorOptions().dtype(at::kInt).device(device));
}

// ---------------------------------------------------------------------------
// Site 5
// ---------------------------------------------------------------------------
MarlinW4A16Kernel::MarlinW4A16Kernel(const at::Tensor& qweight, const at::Tensor& g_idx, MarlinSplitK split,
                                     std::string_view name)
    : size_k_(g_idx.size(0)), size_n_(qweight.size(1)), split_(split) {
  const std::string who = subject("MarlinW4A16Kernel", name);
  GK_CHECK(WeightError, qweight.dim() == 2 && qweight.size(0) * 8 == size_k_ && g_idx.scalar_type() == at::kInt, who,
           ": qweight must be [K/8, N] for g_idx [K] int32, got ", qweight.sizes(), " and ", g_idx.sizes());
  check_split(split, size_k_, 1, who);
  const at::Tensor perm = at::argsort(g_idx, /*stable=*/true);
  g_idx_sort_indices_ = perm.to(at::kInt).contiguous();
  qweight_ = pack_int_rows(unpack_int_rows(qweight, 8, 4).index_select(0, perm), 8, 4);
  workspace_ = marlin_make_workspace((size_n_ + split.tile_n - 1) / split.tile_n, qweight.device());
}

at::Tensor MarlinW4A16Kernel::apply(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& g_idx) const {
  return marlin_w4a16_apply(x, qweight_, scales, g_idx, g_idx_sort_indices_, workspace_, split_);
}

at::Tensor marlin_w4a16_apply(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                              const at::Tensor& g_idx, const at::Tensor& perm, const at::Tensor& workspace,
                              MarlinSplitK split) {
  const int64_t k = g_idx.numel(), n = qweight.size(1);
  GK_CHECK(WeightError,
           qweight.dim() == 2 && qweight.size(0) * 8 == k && qweight.scalar_type() == at::kInt &&
               g_idx.scalar_type() == at::kInt && perm.scalar_type() == at::kInt && perm.numel() == k &&
               scales.dim() == 2 && scales.size(1) == n && scales.scalar_type() == at::kFloat,
           "marlin_w4a16: qweight [K/8, N] int32, scales [G, N] float32, g_idx and perm [K] int32 expected, got ",
           qweight.sizes(), " ", qweight.scalar_type(), ", ", scales.sizes(), " ", scales.scalar_type(), ", ",
           g_idx.sizes(), ", ", perm.sizes());
  m::W4A16Args a;
  a.scales = scales.data_ptr<float>();
  a.g_idx = g_idx.data_ptr<int32_t>();
  a.perm = perm.data_ptr<int32_t>();
  return splitk_apply("marlin_w4a16", x, a, qweight, workspace, split, n, k, /*groups=*/1,
                      {hostrt::reads(scales), hostrt::reads(g_idx), hostrt::reads(perm)},
                      [&](const m::W4A16Args& args, const m::SplitK& c, void* stream) {
                        GK_LAUNCH_CUDA("marlin_w4a16", x, cuda::launch_marlin_w4a16(args, c, stream));
                      });
}

MarlinW4A16Linear::MarlinW4A16Linear(int64_t in, int64_t out, int64_t group_size, c10::Device device,
                                     MarlinSplitK split)
    : in_(in), out_(out), group_size_(group_size), split_(split) {
  GK_CHECK(WeightError, in % 8 == 0 && group_size > 0 && in % group_size == 0, "MarlinW4A16Linear: in = ", in,
           " (the rows of qweight [in/8, out] and of scales [in/group_size, out]) must be a multiple of 8 and of "
           "group_size ", group_size);
  qweight_ = checkpoint_param("qweight", {in / 8, out}, at::kInt, device);
  scales_ = checkpoint_param("scales", {in / group_size, out}, at::kFloat, device);
  g_idx_ = checkpoint_param("g_idx", {in}, at::kInt, device);
}

void MarlinW4A16Linear::process_weights_after_loading() {
  kernel_ = std::make_unique<MarlinW4A16Kernel>(qweight_, g_idx_, split_);
}

at::Tensor MarlinW4A16Linear::forward(const at::Tensor& x) {
  return kernel_->apply(x, scales_, g_idx_);
}

// ---------------------------------------------------------------------------
// Site 6: FP8
// ---------------------------------------------------------------------------
MarlinFp8Kernel::MarlinFp8Kernel(const at::Tensor& weight, const at::Tensor& weight_scale, MarlinSplitK split,
                                 std::string_view name)
    : size_k_(weight.size(1)), size_n_(weight.size(0)), split_(split) {
  const std::string who = subject("MarlinFp8Kernel", name);
  GK_CHECK(WeightError, weight.scalar_type() == at::kFloat8_e4m3fn && weight_scale.numel() == size_n_, who,
           ": weight must be float8_e4m3fn [N, K] with weight_scale [N], got ", weight.scalar_type(), " ",
           weight.sizes(), " and ", weight_scale.sizes());
  check_split(split, size_k_, 4, who);
  qweight_ = pack_int_rows(weight.view(at::kByte).t(), 4, 8);
  scales_ = weight_scale.to(at::kFloat).reshape({size_n_}).clone();
  workspace_ = marlin_make_workspace((size_n_ + split.tile_n - 1) / split.tile_n, weight.device());
}

at::Tensor MarlinFp8Kernel::apply(const at::Tensor& x) const {
  m::Fp8Args a;
  a.scales = scales_.data_ptr<float>();
  return splitk_apply("marlin_fp8", x, a, qweight_, workspace_, split_, size_n_, size_k_, /*groups=*/1,
                      {hostrt::reads(scales_)},
                      [&](const m::Fp8Args& args, const m::SplitK& c, void* stream) {
                        GK_LAUNCH_CUDA("marlin_fp8", x, cuda::launch_marlin_fp8(args, c, stream));
                      });
}

MarlinFp8Linear::MarlinFp8Linear(int64_t in, int64_t out, c10::Device device, MarlinSplitK split)
    : in_(in), out_(out), split_(split) {
  weight_ = checkpoint_param("weight", {out, in}, at::kFloat8_e4m3fn, device);
  weight_scale_ = checkpoint_param("weight_scale", {out}, at::kFloat, device);
}

void MarlinFp8Linear::process_weights_after_loading() {
  kernel_ = std::make_unique<MarlinFp8Kernel>(weight_, weight_scale_, split_);
}

at::Tensor MarlinFp8Linear::forward(const at::Tensor& x) { return kernel_->apply(x); }

// ---------------------------------------------------------------------------
// Site 6: FP4
// ---------------------------------------------------------------------------
MarlinFp4Kernel::MarlinFp4Kernel(const at::Tensor& weight, const at::Tensor& weight_scale,
                                 const at::Tensor& weight_scale_2, MarlinSplitK split, std::string_view name)
    : size_k_(weight.size(1) * 2), size_n_(weight.size(0)), split_(split) {
  const std::string who = subject("MarlinFp4Kernel", name);
  GK_CHECK(WeightError,
           weight.scalar_type() == at::kByte && weight_scale.scalar_type() == at::kFloat8_e4m3fn &&
               weight_scale.dim() == 2 && weight_scale.size(0) == size_n_ && weight_scale.size(1) * kBlock == size_k_ &&
               weight_scale_2.numel() == 1,
           who, ": weight must be uint8 [N, K/2], weight_scale float8_e4m3fn [N, K/16] and weight_scale_2 [1], got ",
           weight.sizes(), ", ", weight_scale.sizes(), " and ", weight_scale_2.sizes());
  check_split(split, size_k_, 8, who);
  const at::Tensor b = weight.to(at::kLong);
  const at::Tensor nibbles =
      at::stack({at::bitwise_and(b, 15), at::bitwise_right_shift(b, 4)}, 2).reshape({size_n_, size_k_});
  qweight_ = pack_int_rows(nibbles.t(), 8, 4);
  block_scales_ = weight_scale.to(at::kFloat).t().contiguous();
  global_scale_ = weight_scale_2.to(at::kFloat).reshape({1}).clone();
  workspace_ = marlin_make_workspace((size_n_ + split.tile_n - 1) / split.tile_n, weight.device());
}

at::Tensor MarlinFp4Kernel::apply(const at::Tensor& x) const {
  m::Fp4Args a;
  a.block_scales = block_scales_.data_ptr<float>();
  a.global_scale = global_scale_.data_ptr<float>();
  return splitk_apply("marlin_fp4", x, a, qweight_, workspace_, split_, size_n_, size_k_, /*groups=*/1,
                      {hostrt::reads(block_scales_), hostrt::reads(global_scale_)},
                      [&](const m::Fp4Args& args, const m::SplitK& c, void* stream) {
                        GK_LAUNCH_CUDA("marlin_fp4", x, cuda::launch_marlin_fp4(args, c, stream));
                      });
}

MarlinFp4Linear::MarlinFp4Linear(int64_t in, int64_t out, c10::Device device, MarlinSplitK split)
    : in_(in), out_(out), split_(split) {
  GK_CHECK(WeightError, in % MarlinFp4Kernel::kBlock == 0, "MarlinFp4Linear: in = ", in,
           " (the columns of weight [out, in/2] and of weight_scale [out, in/", MarlinFp4Kernel::kBlock,
           "]) must be a multiple of ", MarlinFp4Kernel::kBlock);
  weight_ = checkpoint_param("weight", {out, in / 2}, at::kByte, device);
  weight_scale_ = checkpoint_param("weight_scale", {out, in / MarlinFp4Kernel::kBlock}, at::kFloat8_e4m3fn, device);
  weight_scale_2_ = checkpoint_param("weight_scale_2", {1}, at::kFloat, device);
}

void MarlinFp4Linear::process_weights_after_loading() {
  kernel_ = std::make_unique<MarlinFp4Kernel>(weight_, weight_scale_, weight_scale_2_, split_);
}

at::Tensor MarlinFp4Linear::forward(const at::Tensor& x) { return kernel_->apply(x); }

// ---------------------------------------------------------------------------
// Site 6: MoE
// ---------------------------------------------------------------------------
MarlinMoeKernel::MarlinMoeKernel(const at::Tensor& w, const at::Tensor& scales, int64_t group_size,
                                 MarlinSplitK split, std::string_view name)
    : experts_(w.size(0)), size_k_(w.size(1) * 8), size_n_(w.size(2)), group_size_(group_size), split_(split) {
  const std::string who = subject("MarlinMoeKernel", name);
  GK_CHECK(WeightError,
           w.dim() == 3 && scales.dim() == 3 && scales.size(0) == experts_ && scales.size(1) * group_size == size_k_ &&
               scales.size(2) == size_n_,
           who, ": w must be [E, K/8, N] and scales [E, K/", group_size, ", N], got ", w.sizes(), " and ",
           scales.sizes());
  check_split(split, size_k_, 1, who);
  qweight_ = w.transpose(1, 2).clone(at::MemoryFormat::Contiguous);  // [E, N, K/8]
  scales_ = scales.clone(at::MemoryFormat::Contiguous);
  workspace_ = marlin_make_workspace(experts_ * ((size_n_ + split.tile_n - 1) / split.tile_n), w.device());
}

at::Tensor MarlinMoeKernel::apply(const at::Tensor& x, const at::Tensor& expert_ids) const {
  check_input(x, size_k_, qweight_, "marlin_moe");
  GK_CHECK(WeightError, expert_ids.scalar_type() == at::kInt && expert_ids.numel() == x.size(0),
           "marlin_moe: expert_ids must be int32 [", x.size(0), "]");
  m::MoeArgs a;
  a.expert_ids = expert_ids.data_ptr<int32_t>();
  a.scales = scales_.data_ptr<float>();
  a.group_size = group_size_;
  return splitk_apply("marlin_moe", x, a, qweight_, workspace_, split_, size_n_, size_k_, experts_,
                      {hostrt::reads(expert_ids), hostrt::reads(scales_)},
                      [&](const m::MoeArgs& args, const m::SplitK& c, void* stream) {
                        GK_LAUNCH_CUDA("marlin_moe", x, cuda::launch_marlin_moe(args, c, stream));
                      });
}

MarlinMoeLayer::MarlinMoeLayer(int64_t experts, int64_t in, int64_t out, int64_t group_size, c10::Device device,
                               MarlinSplitK split)
    : experts_(experts), in_(in), out_(out), group_size_(group_size), split_(split) {
  GK_CHECK(WeightError, in % 8 == 0 && group_size > 0 && in % group_size == 0, "MarlinMoeLayer: in = ", in,
           " (the rows of w [experts, in/8, out] and of scales [experts, in/group_size, out]) must be a multiple of 8 "
           "and of group_size ", group_size);
  gate_ = checkpoint_param("gate", {experts, in}, at::kFloat, device);
  w_ = checkpoint_param("w", {experts, in / 8, out}, at::kInt, device);
  scales_ = checkpoint_param("scales", {experts, in / group_size, out}, at::kFloat, device);
}

void MarlinMoeLayer::process_weights_after_loading() {
  kernel_ = std::make_unique<MarlinMoeKernel>(w_, scales_, group_size_, split_);
}

at::Tensor MarlinMoeLayer::forward(const at::Tensor& x) {
  check_input(x, in_, gate_, "marlin_moe_route");
  const int64_t rows = x.size(0), experts = experts_, k = in_;
  at::Tensor ids = runtime::empty({rows}, x.options().dtype(at::kInt));
  const float* xp = x.data_ptr<float>();
  const float* gp = gate_.data_ptr<float>();
  int32_t* ip = ids.data_ptr<int32_t>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("marlin_moe_route", x,
                   cuda::launch_marlin_moe_route(xp, gp, ip, rows, experts, k, runtime::cuda_stream(x)));
  } else {
    hostrt::launch("marlin_moe_route", {hostrt::reads(x), hostrt::reads(gate_), hostrt::writes(ids)}, [=] {
      for (int64_t r = 0; r < rows; ++r) ip[r] = m::route_row(xp, gp, r, experts, k);
    });
  }
  return kernel_->apply(x, ids);
}

}  // namespace gk::quant
