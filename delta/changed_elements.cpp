// Note [Changed elements on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// make_patch with tensor operations costs about eight launches per tensor
// (compare, count, the count's conversion, nonzero_static's scan and
// compaction, the index conversion, the gather) and a byte of mask per
// element: with a MoE's 18,000 expert tensors, seconds where its bytes take
// milliseconds to read (docs/performance.md, "Figures behind the code"). On
// a CUDA device the pairs of a chunk are rows of a table instead, cut into
// tasks of at most kDiffTaskElements elements (cuda/changed_elements.h),
// and the chunk takes two launches: one counts each task's differing
// elements; the counts come back in one copy (the synchronization
// make_patch needs anyway, to size its entries); the other writes each
// change's position and target value at its rank (a block-wide ballot
// scan), for the pairs make_patch keeps sparse. No mask is stored. The
// count reads both tensors as 8-byte words (delta/detail/word_diff.h), and
// the same words give both content hashes (a sum of one term per word: Note
// [Content hash: gk-sum64 v1]), so make_patch hashes nothing again: each
// pair's bytes are read once by the count and, where it has changes to
// collect, once more by the collection.
#include "changed_elements.h"

#if defined(GRAPHKEEP_WITH_CUDA)

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/device_upload.h>
#include <graphkeep/hashing/sum64.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>

#include "cuda/changed_elements.h"

namespace gk::detail {
namespace {

void check_launch(int err, const char* what, c10::Device device) {
  GK_CHECK(StateError, err == 0, "gk::make_patch: the ", what, " kernel failed to launch on ", device, " (cudaError ",
           err, ")");
}

cuda::DiffPair row(const std::pair<at::Tensor, at::Tensor>& p) {
  cuda::DiffPair r;
  r.base = p.first.const_data_ptr();
  r.target = p.second.const_data_ptr();
  r.elem_bytes = static_cast<std::uint16_t>(p.first.element_size());
  return r;
}

}  // namespace

ChangedElements::ChangedElements(c10::Device device, const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs)
    : device_(device), pairs_(pairs), counts_(pairs.size(), 0), hashes_(pairs.size()), out_(pairs.size()) {
  const c10::cuda::CUDAGuard guard(device_);
  std::vector<cuda::DiffPair> rows;
  std::vector<cuda::DiffTask> tasks;
  for (std::size_t k = 0; k < pairs_.size(); ++k) {
    const auto& [b, t] = pairs_[k];
    GK_INTERNAL_ASSERT(b.is_contiguous() && t.is_contiguous() && b.device() == device_ && t.device() == device_ &&
                           b.numel() == t.numel() && b.element_size() == t.element_size(),
                       "ChangedElements: contiguous pairs of one size on one device");
    rows.push_back(row(pairs_[k]));
    // Each hash: the length term, plus the word terms the count sums below
    // (none for an empty pair).
    const std::uint64_t len = sum64::length_term(b.nbytes());
    hashes_[k] = {len, len};
    first_task_.push_back(static_cast<std::int64_t>(tasks.size()));
    for (std::int64_t o = 0; o < b.numel(); o += cuda::kDiffTaskElements)
      tasks.push_back({o, static_cast<std::uint32_t>(k),
                       static_cast<std::uint32_t>(std::min(cuda::kDiffTaskElements, b.numel() - o))});
  }
  first_task_.push_back(static_cast<std::int64_t>(tasks.size()));
  GK_CHECK(StateError, tasks.size() < static_cast<std::size_t>(std::numeric_limits<int>::max()),
           "gk::make_patch: ", tasks.size(), " comparison tasks in one chunk on ", device_);
  if (tasks.empty()) return;
  const at::Tensor d_rows = upload_rows(rows, device_), d_tasks = upload_rows(tasks, device_);
  // One buffer: the hash sums (two per pair, zeroed), then the task counts.
  const auto npairs = static_cast<std::int64_t>(pairs_.size()), ntasks = static_cast<std::int64_t>(tasks.size());
  at::Tensor out = at::zeros({2 * npairs + (ntasks + 1) / 2}, at::TensorOptions(at::kLong).device(device_));
  auto* sums = reinterpret_cast<unsigned long long*>(out.mutable_data_ptr<std::int64_t>());
  check_launch(cuda::launch_diff_count(reinterpret_cast<const cuda::DiffPair*>(d_rows.const_data_ptr()),
                                       reinterpret_cast<const cuda::DiffTask*>(d_tasks.const_data_ptr()),
                                       static_cast<int>(tasks.size()), reinterpret_cast<std::int32_t*>(sums + 2 * npairs),
                                       sums, c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
               "comparison", device_);
  const at::Tensor host = out.cpu();  // the one synchronization
  const auto* h = reinterpret_cast<const std::uint64_t*>(host.const_data_ptr<std::int64_t>());
  const auto* c = reinterpret_cast<const std::int32_t*>(h + 2 * npairs);
  task_counts_.assign(c, c + tasks.size());
  for (std::size_t k = 0; k < pairs_.size(); ++k) {
    hashes_[k].first += h[2 * k];
    hashes_[k].second += h[2 * k + 1];
  }
  for (std::size_t k = 0; k < pairs_.size(); ++k)
    for (std::int64_t t = first_task_[k]; t < first_task_[k + 1]; ++t) counts_[k] += task_counts_[static_cast<std::size_t>(t)];
}

void ChangedElements::collect(std::size_t k, const at::Tensor& indices, const at::Tensor& values) {
  GK_INTERNAL_ASSERT(indices.numel() == counts_[k] && values.numel() == counts_[k] && indices.device() == device_ &&
                         values.device() == device_ && values.element_size() == pairs_[k].first.element_size() &&
                         (indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong),
                     "ChangedElements::collect: outputs of the pair's count, dtype and device");
  out_[k] = {indices, values};
}

void ChangedElements::run() {
  const c10::cuda::CUDAGuard guard(device_);
  std::vector<cuda::DiffPair> rows;
  std::vector<cuda::DiffTask> tasks;
  std::vector<std::int64_t> slots;
  for (std::size_t k = 0; k < pairs_.size(); ++k) {
    if (!out_[k].first.defined() || counts_[k] == 0) continue;
    cuda::DiffPair r = row(pairs_[k]);
    r.indices = out_[k].first.data_ptr();
    r.values = out_[k].second.data_ptr();
    r.index_bytes = static_cast<std::uint16_t>(out_[k].first.element_size());
    const auto pair = static_cast<std::uint32_t>(rows.size());
    rows.push_back(r);
    std::int64_t slot = 0;
    for (std::int64_t t = first_task_[k]; t < first_task_[k + 1]; ++t) {
      const std::int32_t c = task_counts_[static_cast<std::size_t>(t)];
      if (c == 0) continue;  // nothing to write: no block for it
      const std::int64_t begin = (t - first_task_[k]) * cuda::kDiffTaskElements;
      tasks.push_back({begin, pair, static_cast<std::uint32_t>(std::min(cuda::kDiffTaskElements,
                                                                        pairs_[k].first.numel() - begin))});
      slots.push_back(slot);
      slot += c;
    }
  }
  if (tasks.empty()) return;
  const at::Tensor d_rows = upload_rows(rows, device_), d_tasks = upload_rows(tasks, device_), d_slots = upload_rows(slots, device_);
  check_launch(cuda::launch_diff_collect(reinterpret_cast<const cuda::DiffPair*>(d_rows.const_data_ptr()),
                                         reinterpret_cast<const cuda::DiffTask*>(d_tasks.const_data_ptr()),
                                         static_cast<int>(tasks.size()),
                                         reinterpret_cast<const std::int64_t*>(d_slots.const_data_ptr()),
                                         c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
               "collection", device_);
}

}  // namespace gk::detail

#endif  // GRAPHKEEP_WITH_CUDA
