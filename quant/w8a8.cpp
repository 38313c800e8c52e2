// Site 13: compressed-tensors W8A8 int8. PWAL (cloned scales) and the CPU
// twins of quant/cuda/w8a8.cu.
#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/w8a8.h>

#include "cuda/w8a8_launch.h"

#include <ATen/ATen.h>

#include <numeric>

namespace gk::quant {

CompressedTensorsW8A8Int8::CompressedTensorsW8A8Int8(const at::Tensor& weight_scale,
                                                     const at::Tensor& input_scale,
                                                     std::vector<int64_t> shard_rows, int64_t size_k)
    : shard_rows_(std::move(shard_rows)),
      size_k_(size_k),
      size_n_(std::accumulate(shard_rows_.begin(), shard_rows_.end(), int64_t{0})) {
  const auto shards = static_cast<int64_t>(shard_rows_.size());
  GK_CHECK(WeightError, weight_scale.numel() == shards && input_scale.numel() == shards,
           "CompressedTensorsW8A8Int8: expected one weight_scale and one input_scale per shard (", shards,
           "), got weight_scale ", weight_scale.sizes(), " and input_scale ", input_scale.sizes());
  // static per-tensor activation scale: the largest of the shards' (vLLM: input_scale.max())
  input_scale_ = input_scale.to(at::kFloat).max().reshape({1}).clone();
  // per-tensor weight scales per shard -> per output channel (convert_to_channelwise)
  const at::Tensor rows = at::tensor(shard_rows_, at::TensorOptions().dtype(at::kLong)).to(weight_scale.device());
  weight_scale_ = at::repeat_interleave(weight_scale.to(at::kFloat).reshape({shards}), rows, 0, size_n_).contiguous();
}

at::Tensor CompressedTensorsW8A8Int8::apply(const at::Tensor& x, const at::Tensor& weight) const {
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == size_k_ && x.scalar_type() == at::kFloat && x.is_contiguous() &&
               x.device() == weight_scale_.device(),
           "w8a8_int8: x must be a contiguous float32 [M, ", size_k_, "] tensor on ",
           weight_scale_.device(), ", got ", x.sizes(), " ", x.scalar_type(), " on ", x.device());
  const int64_t rows = x.size(0), n = size_n_, k = size_k_;
  at::Tensor xq = runtime::empty({rows, k}, x.options().dtype(at::kChar));
  at::Tensor y = runtime::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* si = input_scale_.data_ptr<float>();
  const float* sw = weight_scale_.data_ptr<float>();
  const int8_t* wp = weight.data_ptr<int8_t>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("w8a8_quant", x, cuda::launch_w8a8_quant(xp, si, qp, rows, k, runtime::cuda_stream(x, "w8a8")));
    GK_LAUNCH_CUDA("w8a8_gemm", x,
                   cuda::launch_w8a8_gemm(qp, wp, si, sw, yp, rows, n, k, runtime::cuda_stream(x, "w8a8")));
  } else {
    hostrt::launch("w8a8_quant", {hostrt::reads(x), hostrt::reads(input_scale_), hostrt::writes(xq)}, [=] {
      const float s = si[0];
      for (int64_t i = 0; i < rows * k; ++i) qp[i] = w8a8::quantize(xp[i], s);
    });
    hostrt::launch("w8a8_gemm",
                   {hostrt::reads(xq), hostrt::reads(weight), hostrt::reads(input_scale_),
                    hostrt::reads(weight_scale_), hostrt::writes(y)},
                   [=] {
                     const float s = si[0];
                     for (int64_t r = 0; r < rows; ++r)
                       for (int64_t c = 0; c < n; ++c) yp[r * n + c] = w8a8::dequant_dot(qp, wp, s, sw, r, c, k);
                   });
  }
  return y;
}

W8A8Int8Linear::W8A8Int8Linear(int64_t in, std::vector<std::string> shard_names, std::vector<int64_t> shard_rows,
                               c10::Device device)
    : in_(in), shard_names_(std::move(shard_names)), shard_rows_(std::move(shard_rows)) {
  GK_CHECK(WeightError, !shard_names_.empty() && shard_names_.size() == shard_rows_.size(),
           "W8A8Int8Linear: give one row count per shard name (", shard_names_.size(), " shard_names, ",
           shard_rows_.size(), " shard_rows)");
  // Per shard s, concatenated: weight [N, in] int8, weight_scale [S] and input_scale [S] float32.
  std::vector<CheckpointTensor> w, ws, is;
  for (std::size_t s = 0; s < shard_names_.size(); ++s) {
    w.push_back({shard_names_[s] + ".weight", {shard_rows_[s], in}, at::kChar});
    ws.push_back({shard_names_[s] + ".weight_scale", {1}, at::kFloat});
    is.push_back({shard_names_[s] + ".input_scale", {1}, at::kFloat});
  }
  weight_ = checkpoint_param("weight", std::move(w), device);
  weight_scale_ = checkpoint_param("weight_scale", std::move(ws), device);
  input_scale_ = checkpoint_param("input_scale", std::move(is), device, Fill::ones);
}

void W8A8Int8Linear::process_weights_after_loading() {
  scheme_ = std::make_unique<CompressedTensorsW8A8Int8>(weight_scale_, input_scale_, shard_rows_, in_);
}

at::Tensor W8A8Int8Linear::forward(const at::Tensor& x) {
  return scheme_->apply(x, weight_);
}

}  // namespace gk::quant
