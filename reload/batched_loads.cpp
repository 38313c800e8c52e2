#include "batched_loads.h"

#include "copied_from.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>

#if defined(GRAPHKEEP_WITH_CUDA)
#include "byte_copies.h"
#endif

namespace gk::detail {

BatchedLoads::BatchedLoads()
#if defined(GRAPHKEEP_WITH_CUDA)
    : copies_(std::make_unique<ByteCopies>())
#endif
{
}

BatchedLoads::~BatchedLoads() = default;

const std::vector<std::int64_t>& BatchedLoads::starts(const CheckpointParam& p) {
  for (const auto& [param, s] : starts_)
    if (param == &p) return s;
  starts_.emplace_back(&p, p.first_rows());
  return starts_.back().second;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpmf-conversions"
bool overrides_load_weight(ReloadableLayer& layer) {
  // A layer that inherits the base's load_weight(): its vtable entry is the
  // base's function (GCC: "extracting the function pointer from a bound
  // pointer to member function").
  struct Base final : ReloadableLayer {
    std::vector<CheckpointParam> checkpoint_params() const override { return {}; }
  };
  using Fn = bool (*)(ReloadableLayer*, const LoadRequest&);
  static Base base;
  static const Fn inherited = reinterpret_cast<Fn>(base.*(&ReloadableLayer::load_weight));
  return reinterpret_cast<Fn>(layer.*(&ReloadableLayer::load_weight)) != inherited;
}
#pragma GCC diagnostic pop
#else
bool overrides_load_weight(ReloadableLayer&) { return true; }
#endif

bool copy_moves_bytes(const at::Tensor& dst, const at::Tensor& src) {
  // copy_ would do more than move bytes for anything else (a cast, a
  // conjugate or negative view, a quantized or sparse tensor).
  return dst.defined() && src.defined() && dst.layout() == at::kStrided && src.layout() == at::kStrided &&
         (dst.is_cuda() || dst.is_cpu()) && src.device() == dst.device() && src.scalar_type() == dst.scalar_type() &&
         !src.is_quantized() && !src.is_conj() && !src.is_neg();
}

bool BatchedLoads::add(const LoadRequest& r, CopiedFrom* copied) {
  const at::Tensor& dst = r.target;
  const at::Tensor& src = r.value;
  if (!copy_moves_bytes(dst, src) || dst.dim() < 1 || !dst.is_contiguous() || !src.is_contiguous() ||
      r.tensor_index >= r.param.tensors.size())
    return false;
#if !defined(GRAPHKEEP_WITH_CUDA)
  if (dst.is_cuda()) return false;
#endif
  const CheckpointTensor& t = r.param.tensors[r.tensor_index];
  if (t.shape.empty() || static_cast<std::int64_t>(t.shape.size()) != dst.dim()) return false;
  // The slice default_load writes: rows [row, row + rows) of the parameter,
  // which are contiguous because the parameter is.
  std::int64_t row = starts(r.param)[r.tensor_index];
  std::int64_t rows = t.shape[0];
  if (t.num_shards > 1) {
    if (t.shard_dim != 0 || t.shape[0] % t.num_shards != 0) return false;
    rows /= t.num_shards;
    row += r.shard * rows;
  }
  if (row < 0 || rows < 0 || row + rows > dst.size(0) || src.dim() != dst.dim() || src.size(0) != rows) return false;
  for (std::int64_t d = 1; d < dst.dim(); ++d)
    if (src.size(d) != dst.size(d) || t.shape[static_cast<std::size_t>(d)] != dst.size(d)) return false;
  // A row's bytes from the sizes: a contiguous tensor's stride along a dim
  // of size 1 may be anything.
  std::uint64_t row_bytes = dst.element_size();
  for (std::int64_t d = 1; d < dst.dim(); ++d) row_bytes *= static_cast<std::uint64_t>(dst.size(d));
  const auto n = static_cast<std::uint64_t>(src.nbytes());
  if (n != static_cast<std::uint64_t>(rows) * row_bytes) return false;
  if (n == 0) return true;
  auto* to = static_cast<unsigned char*>(dst.mutable_data_ptr()) + static_cast<std::uint64_t>(row) * row_bytes;
  const auto* from = static_cast<const unsigned char*>(src.const_data_ptr());
  if (copied != nullptr) copied->add(to, from, n);
  if (dst.is_cpu()) {
    // On the host the copy is made now, in the order of the loads; large
    // ones in parallel chunks, as copy_ would.
    constexpr std::int64_t kChunk = std::int64_t{1} << 20;
    at::parallel_for(0, static_cast<std::int64_t>(n), kChunk, [&](std::int64_t begin, std::int64_t end) {
      std::memcpy(to + begin, from + begin, static_cast<std::size_t>(end - begin));
    });
    return true;
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  copies_->add(dst.device(), from, to, n);
  if (std::find(queued_.begin(), queued_.end(), dst.const_data_ptr()) == queued_.end())
    queued_.push_back(dst.const_data_ptr());
  return true;
#else
  return false;
#endif
}

void BatchedLoads::flush() {
#if defined(GRAPHKEEP_WITH_CUDA)
  copies_->flush();
#endif
  queued_.clear();
}

bool BatchedLoads::queued_into(const at::Tensor& target) const noexcept {
  return target.defined() && std::find(queued_.begin(), queued_.end(), target.const_data_ptr()) != queued_.end();
}

}  // namespace gk::detail
