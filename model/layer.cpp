#include <graphkeep/core/check.h>
#include <graphkeep/model/layer.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace gk {

std::vector<std::int64_t> CheckpointTensor::shard_shape() const {
  std::vector<std::int64_t> s = shape;
  GK_CHECK(DeclarationError, num_shards >= 1 && shard_dim >= 0 && shard_dim < static_cast<std::int64_t>(s.size()) &&
                                 s[shard_dim] % num_shards == 0,
           "checkpoint tensor '", name, "' with shape ", at::IntArrayRef(shape), " cannot be split into ",
           num_shards, " shards along dim ", shard_dim);
  s[shard_dim] /= num_shards;
  return s;
}

std::vector<std::int64_t> CheckpointParam::shape() const {
  GK_CHECK(DeclarationError, !tensors.empty(), "checkpoint param '", param, "' lists no tensors");
  std::vector<std::int64_t> s = tensors.front().shape;
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    const auto& t = tensors[i].shape;
    GK_CHECK(DeclarationError, !s.empty() && t.size() == s.size() && std::equal(t.begin() + 1, t.end(), s.begin() + 1),
             "checkpoint tensors of param '", param, "' cannot be concatenated along dim 0: ",
             at::IntArrayRef(s), " and ", at::IntArrayRef(t));
    s[0] += t[0];
  }
  return s;
}

std::vector<std::int64_t> CheckpointParam::first_rows() const {
  std::vector<std::int64_t> rows;
  rows.reserve(tensors.size());
  std::int64_t row = 0;
  for (const CheckpointTensor& t : tensors) {
    rows.push_back(row);
    row += t.shape.empty() ? 1 : t.shape.front();
  }
  return rows;
}

at::ScalarType CheckpointParam::dtype() const {
  GK_CHECK(DeclarationError, !tensors.empty(), "checkpoint param '", param, "' lists no tensors");
  for (const auto& t : tensors)
    GK_CHECK(DeclarationError, t.dtype == tensors.front().dtype, "checkpoint tensors of param '", param,
             "' have different dtypes");
  return tensors.front().dtype;
}

void default_load(const LoadRequest& r) {
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < r.tensor_index; ++i) offset += r.param.tensors[i].shape.at(0);
  const CheckpointTensor& t = r.param.tensors.at(r.tensor_index);
  at::Tensor dst = r.target;
  if (r.param.tensors.size() > 1) dst = dst.narrow(0, offset, t.shape.at(0));
  if (t.num_shards > 1) {
    const std::int64_t len = t.shape.at(t.shard_dim) / t.num_shards;
    dst = dst.narrow(t.shard_dim, r.shard * len, len);
  }
  dst.copy_(r.value);
}

at::Tensor CheckpointParams::add(torch::nn::Module& module, std::string param, std::vector<CheckpointTensor> tensors,
                                c10::Device device, Fill fill) {
  CheckpointParam cp{std::move(param), std::move(tensors)};
  const auto options = at::TensorOptions().device(device).dtype(cp.dtype());
  at::Tensor initial = fill == Fill::ones ? at::ones(cp.shape(), options) : at::zeros(cp.shape(), options);
  at::Tensor registered = module.register_parameter(cp.param, std::move(initial), /*requires_grad=*/false);
  params_.push_back(std::move(cp));
  return registered;
}

}  // namespace gk
