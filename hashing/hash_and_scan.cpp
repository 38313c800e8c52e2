// gk::detail::hash_and_scan: the sum kernel of Note [Summing at memory
// speed] with each word's elements tested as it is read (Note [Scanning
// while summing], both in hashing/cuda/content_hash.cu).
#include <graphkeep/hashing/hash_and_scan.h>

#include <graphkeep/core/check.h>

#include "device_hashes.h"

#include <cstring>
#include <map>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gk::detail {

struct PendingHashScan::State {
  std::vector<ContentRange> ranges;  // alive until the launches ran
  std::vector<ExponentTest> tests;
  HashScan r;
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<DeviceLaunch> launches;
#endif
};

PendingHashScan::PendingHashScan(std::vector<ContentRange> ranges, std::vector<ExponentTest> tests)
    : s_(std::make_unique<State>()) {
  GK_INTERNAL_ASSERT(tests.size() == ranges.size(), "hash_and_scan: ", tests.size(), " tests for ", ranges.size(),
                     " ranges");
  State& st = *s_;
  st.ranges = std::move(ranges);
  st.tests = std::move(tests);
  st.r.hashes.assign(st.ranges.size(), 0);
  st.r.first_bad.assign(st.ranges.size(), -1);
  if (st.ranges.empty()) return;
#if defined(GRAPHKEEP_WITH_CUDA)
  for (std::size_t i = 0; i < st.ranges.size(); ++i)
    GK_CHECK(WeightError, !st.ranges[i].tensor.defined() || st.ranges[i].tensor.is_cuda(),
             "gk::detail::hash_and_scan: range ", i, " is on ", st.ranges[i].tensor.device(),
             "; it runs on CUDA devices only");
  auto by_device = hash_host_ranges(st.ranges, st.r.hashes);  // checks every range (the empty ones hashed here)
  std::vector<HashBytes> inputs;
  inputs.reserve(st.ranges.size());
  for (const ContentRange& c : st.ranges) inputs.push_back(bytes_of(c));
  for (auto& [index, which] : by_device) {
    const c10::cuda::CUDAGuard guard(index);
    st.launches.push_back(launch_device_hashes(inputs, std::move(which), c10::Device(c10::kCUDA, index),
                                               c10::cuda::getCurrentCUDAStream(index), nullptr, nullptr, &st.tests));
  }
#else
  GK_CHECK(StateError, false, "gk::detail::hash_and_scan: graphkeep was built without CUDA");
#endif
}

PendingHashScan::~PendingHashScan() {
#if defined(GRAPHKEEP_WITH_CUDA)
  if (s_ != nullptr)
    for (DeviceLaunch& l : s_->launches) l.read.synchronize();
#endif
}
PendingHashScan::PendingHashScan(PendingHashScan&&) noexcept = default;
PendingHashScan& PendingHashScan::operator=(PendingHashScan&&) noexcept = default;

bool PendingHashScan::ready() const {
#if defined(GRAPHKEEP_WITH_CUDA)
  return all_read(s_->launches);
#else
  return true;
#endif
}

HashScan PendingHashScan::get() {
  State& st = *s_;
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<std::int64_t> bad_byte(st.ranges.size(), -1);
  for (DeviceLaunch& l : st.launches) read_device_hashes(l, st.r.hashes, &bad_byte);
  st.launches.clear();
  for (std::size_t i = 0; i < st.ranges.size(); ++i)
    if (bad_byte[i] >= 0 && st.tests[i].bytes != 0) st.r.first_bad[i] = bad_byte[i] / st.tests[i].bytes;
#endif
  st.ranges.clear();
  return std::move(st.r);
}

HashScan hash_and_scan(const std::vector<ContentRange>& ranges, const std::vector<ExponentTest>& tests) {
  return PendingHashScan(ranges, tests).get();
}

struct CopiedHashes::State {
  std::vector<ContentRange> ranges;  // until launched (see the constructor)
  std::vector<std::uint64_t> out;
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<DeviceLaunch> launches;
#endif
};

CopiedHashes::CopiedHashes(std::vector<ContentRange> ranges, const std::vector<std::byte*>& to)
    : s_(std::make_unique<State>()) {
  GK_INTERNAL_ASSERT(to.size() == ranges.size(), "CopiedHashes: ", to.size(), " destinations for ", ranges.size(),
                     " ranges");
  State& st = *s_;
  st.ranges = std::move(ranges);
  st.out.assign(st.ranges.size(), 0);
  auto by_device = hash_host_ranges(st.ranges, st.out);  // checks every range; hashes the CPU ones
  for (std::size_t i = 0; i < st.ranges.size(); ++i) {
    const ContentRange& r = st.ranges[i];
    GK_INTERNAL_ASSERT(r.nbytes == 0 || to[i] != nullptr, "CopiedHashes: range ", i, " has no destination");
    if (r.nbytes > 0 && r.tensor.is_cpu())
      std::memcpy(to[i], static_cast<const std::byte*>(r.tensor.const_data_ptr()) + r.offset, r.nbytes);
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<HashBytes> inputs;
  inputs.reserve(st.ranges.size());
  for (const ContentRange& c : st.ranges) inputs.push_back(bytes_of(c));
  for (auto& [index, which] : by_device) {
    const c10::cuda::CUDAGuard guard(index);
    st.launches.push_back(launch_device_hashes(inputs, std::move(which), c10::Device(c10::kCUDA, index),
                                               c10::cuda::getCurrentCUDAStream(index), nullptr, nullptr, nullptr,
                                               nullptr, &to));
  }
#else
  GK_INTERNAL_ASSERT(by_device.empty(), "CUDA ranges in a build without CUDA");
#endif
  // The launches are on the current streams: what is enqueued there later,
  // the caching allocator's reuse of these tensors' memory included, runs
  // after them, so the ranges need not outlive this call (a streaming
  // reload drops the copied layer's loads here, not when it reads the
  // hashes: Note [Copy back one layer late]). The CPU ones were hashed above.
  st.ranges.clear();
}

CopiedHashes::~CopiedHashes() {
#if defined(GRAPHKEEP_WITH_CUDA)
  if (s_ != nullptr)
    for (DeviceLaunch& l : s_->launches) l.read.synchronize();
#endif
}
CopiedHashes::CopiedHashes(CopiedHashes&&) noexcept = default;
CopiedHashes& CopiedHashes::operator=(CopiedHashes&&) noexcept = default;

bool CopiedHashes::ready() const {
#if defined(GRAPHKEEP_WITH_CUDA)
  return all_read(s_->launches);
#else
  return true;
#endif
}

std::vector<std::uint64_t> CopiedHashes::get() {
#if defined(GRAPHKEEP_WITH_CUDA)
  for (DeviceLaunch& l : s_->launches) read_device_hashes(l, s_->out);
  s_->launches.clear();
#endif
  s_->ranges.clear();
  return s_->out;
}

}  // namespace gk::detail
