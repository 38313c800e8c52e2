// Site 12: Machete act-order. PWAL and the CPU twins of quant/cuda/act_order.cu.
#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/act_order.h>
#include <graphkeep/quant/marlin.h>

#include "cuda/act_order_launch.h"

#include <ATen/ATen.h>

namespace gk::quant {

at::Tensor ActPerm::operator()(const at::Tensor& x) const {
  const int64_t k = act_perm_.numel();
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == k && x.scalar_type() == at::kFloat && x.is_contiguous() &&
               x.device() == act_perm_.device(),
           "act_perm: x must be a contiguous float32 [M, ", k, "] tensor on ", act_perm_.device(), ", got ",
           x.sizes(), " ", x.scalar_type(), " on ", x.device());
  const int64_t rows = x.size(0);
  at::Tensor y = runtime::empty({rows, k}, x.options());
  const float* xp = x.data_ptr<float>();
  const int32_t* pp = act_perm_.data_ptr<int32_t>();
  float* yp = y.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("act_perm_gather", x,
                   cuda::launch_act_perm_gather(xp, pp, yp, rows, k, runtime::cuda_stream(x, "act_perm_gather")));
  } else {
    hostrt::launch("act_perm_gather", {hostrt::reads(x), hostrt::reads(act_perm_), hostrt::writes(y)}, [=] {
      for (int64_t r = 0; r < rows; ++r) act_order::gather_row(xp, pp, yp, r, k);
    });
  }
  return y;
}

MacheteLinearMethod::MacheteLinearMethod(const at::Tensor& qweight, const at::Tensor& g_idx,
                                         int64_t group_size)
    : size_k_(g_idx.size(0)), size_n_(qweight.size(1)), group_size_(group_size) {
  GK_CHECK(WeightError,
           qweight.dim() == 2 && qweight.size(0) * 8 == size_k_ && g_idx.scalar_type() == at::kInt &&
               group_size > 0 && size_k_ % group_size == 0,
           "MacheteLinearMethod: qweight must be [K/8, N] for g_idx [K] int32 and K a multiple of "
           "group_size ",
           group_size, ", got ", qweight.sizes(), " and ", g_idx.sizes());
  const at::Tensor perm = at::argsort(g_idx, /*stable=*/true);
  // Machete's act-order contract: after sorting, channel i is in group i / group_size.
  const at::Tensor want = at::floor_divide(at::arange(size_k_, g_idx.options()), group_size);
  GK_CHECK(WeightError, at::equal(g_idx.index_select(0, perm), want),
           "MacheteLinearMethod: every group of g_idx must hold exactly ", group_size, " channels");
  act_perm_ = ActPerm(perm.to(at::kInt).contiguous());
  weight_prepacked_ = pack_int_rows(unpack_int_rows(qweight, 8, 4).index_select(0, perm), 8, 4);
}

at::Tensor MacheteLinearMethod::apply(const at::Tensor& x, const at::Tensor& scales) const {
  const at::Tensor xp = act_perm_(x);  // the closure call of vLLM's apply()
  const int64_t rows = x.size(0), n = size_n_, k = size_k_, gs = group_size_;
  at::Tensor y = runtime::empty({rows, n}, x.options());
  const float* xpp = xp.data_ptr<float>();
  const int32_t* wp = weight_prepacked_.data_ptr<int32_t>();
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("machete_w4a16", x,
                   cuda::launch_machete_w4a16(xpp, wp, sp, yp, rows, n, k, gs, runtime::cuda_stream(x, "machete")));
  } else {
    hostrt::launch("machete_w4a16",
                   {hostrt::reads(xp), hostrt::reads(weight_prepacked_), hostrt::reads(scales), hostrt::writes(y)},
                   [=] {
                     for (int64_t r = 0; r < rows; ++r)
                       for (int64_t c = 0; c < n; ++c) yp[r * n + c] = act_order::machete_dot(xpp, wp, sp, r, c, n, k, gs);
                   });
  }
  return y;
}

MacheteW4A16Linear::MacheteW4A16Linear(int64_t in, int64_t out, int64_t group_size, c10::Device device)
    : in_(in), out_(out), group_size_(group_size) {
  GK_CHECK(WeightError, in % 8 == 0 && group_size > 0 && in % group_size == 0, "MacheteW4A16Linear: in = ", in,
           " (the rows of qweight [in/8, out] and of scales [in/group_size, out]) must be a multiple of 8 and of "
           "group_size ", group_size);
  qweight_ = checkpoint_param("qweight", {in / 8, out}, at::kInt, device);
  scales_ = checkpoint_param("scales", {in / group_size, out}, at::kFloat, device);
  g_idx_ = checkpoint_param("g_idx", {in}, at::kInt, device);
}

void MacheteW4A16Linear::process_weights_after_loading() {
  quant_method_ = std::make_unique<MacheteLinearMethod>(qweight_, g_idx_, group_size_);
}

at::Tensor MacheteW4A16Linear::forward(const at::Tensor& x) {
  return quant_method_->apply(x, scales_);
}

}  // namespace gk::quant
