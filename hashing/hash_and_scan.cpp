// gk::detail::hash_and_scan: the sum kernel of Note [Summing at memory
// speed] with each word's elements tested as it is read (Note [Scanning
// while summing], both in hashing/cuda/content_hash.cu).
#include <graphkeep/hashing/hash_and_scan.h>

#include <graphkeep/core/check.h>

#include "device_hashes.h"

#include <map>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gk::detail {

HashScan hash_and_scan(const std::vector<ContentRange>& ranges, const std::vector<ExponentTest>& tests) {
  GK_INTERNAL_ASSERT(tests.size() == ranges.size(), "hash_and_scan: ", tests.size(), " tests for ", ranges.size(),
                     " ranges");
  HashScan r;
  r.hashes.assign(ranges.size(), 0);
  r.first_bad.assign(ranges.size(), -1);
  if (ranges.empty()) return r;
#if defined(GRAPHKEEP_WITH_CUDA)
  for (std::size_t i = 0; i < ranges.size(); ++i)
    GK_CHECK(WeightError, !ranges[i].tensor.defined() || ranges[i].tensor.is_cuda(), "gk::detail::hash_and_scan: range ",
             i, " is on ", ranges[i].tensor.device(), "; it runs on CUDA devices only");
  auto by_device = hash_host_ranges(ranges, r.hashes);  // checks every range (the empty ones hashed here)
  std::vector<HashBytes> inputs;
  inputs.reserve(ranges.size());
  for (const ContentRange& c : ranges) inputs.push_back(bytes_of(c));
  std::vector<DeviceLaunch> launches;
  for (auto& [index, which] : by_device) {
    const c10::cuda::CUDAGuard guard(index);
    launches.push_back(launch_device_hashes(inputs, std::move(which), c10::Device(c10::kCUDA, index),
                                            c10::cuda::getCurrentCUDAStream(index), nullptr, nullptr, &tests));
  }
  std::vector<std::int64_t> bad_byte(ranges.size(), -1);
  for (DeviceLaunch& l : launches) read_device_hashes(l, r.hashes, &bad_byte);
  for (std::size_t i = 0; i < ranges.size(); ++i)
    if (bad_byte[i] >= 0 && tests[i].bytes != 0) r.first_bad[i] = bad_byte[i] / tests[i].bytes;
#else
  GK_CHECK(StateError, false, "gk::detail::hash_and_scan: graphkeep was built without CUDA");
#endif
  return r;
}

}  // namespace gk::detail
