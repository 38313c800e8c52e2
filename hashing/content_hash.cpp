// gk::content_hash: the host function (sum64.h, at::parallel_for over
// blocks) and the CUDA dispatch (hashing/cuda/content_hash.cu), Note [Content
// hash: gk-sum64 v1] in content_hash.h.
#include <graphkeep/core/check.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <map>

#include "device_hashes.h"

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>

#include "cuda/content_hash_launch.h"
#endif

namespace gk {

static_assert(std::endian::native == std::endian::little,
              "the content hash reads little-endian words as they lie in memory here");

namespace detail {

std::uint64_t host_hash(const std::byte* p, std::size_t n) {
  const auto* q = reinterpret_cast<const unsigned char*>(p);
  return sum64::length_term(n) + sum_blocks(n, [&](std::uint64_t first, std::uint64_t last) {
           return sum64::sum_words(q, n, first, last, sum64::HostLoad{});
         });
}

void check_hashable(const at::Tensor& t, std::size_t index) {
  GK_CHECK(WeightError, t.defined(), "gk::content_hash: tensor ", index, " is undefined");
  GK_CHECK(WeightError, t.layout() == at::kStrided, "gk::content_hash: tensor ", index, " has layout ", t.layout(),
           "; only strided tensors have a content hash");
  GK_CHECK(WeightError, t.is_cpu() || t.is_cuda(), "gk::content_hash: tensor ", index, " is on ", t.device(),
           "; the content hash runs on the CPU or a CUDA device");
  GK_CHECK(WeightError, t.is_contiguous(), "gk::content_hash: tensor ", index, " (shape ", t.sizes(), ", strides ",
           t.strides(), ") is not contiguous; the hash is defined over a contiguous tensor's bytes: pass "
           "t.contiguous() (a copy)");
#if !defined(GRAPHKEEP_WITH_CUDA)
  GK_CHECK(WeightError, !t.is_cuda(), "gk::content_hash: tensor ", index, " is on ", t.device(),
           " but graphkeep was built without CUDA (GRAPHKEEP_CUDA=OFF)");
#endif
}

HashBytes bytes_of(const at::Tensor& t) {
  return {t.nbytes() > 0 ? static_cast<const std::byte*>(t.const_data_ptr()) : nullptr, t.nbytes()};
}

HashBytes bytes_of(const ContentRange& r) {
  return {r.nbytes > 0 ? static_cast<const std::byte*>(r.tensor.const_data_ptr()) + r.offset : nullptr, r.nbytes};
}

#if defined(GRAPHKEEP_WITH_CUDA)
DeviceLaunch launch_device_hashes(const std::vector<HashBytes>& inputs, std::vector<std::size_t> which,
                                  c10::Device device, c10::cuda::CUDAStream stream,
                                  const std::vector<std::vector<sum64::OverlaySource>>* sources,
                                  const std::vector<std::uint64_t>* before, const std::vector<ExponentTest>* tests,
                                  const std::vector<std::vector<sum64::OverlaySource>>* exclusive,
                                  const std::vector<std::byte*>* copy_to) {
  GK_INTERNAL_ASSERT(sources == nullptr || tests == nullptr, "a hash through writes is not scanned");
  GK_INTERNAL_ASSERT(copy_to == nullptr || (sources == nullptr && tests == nullptr),
                     "a copy while hashing is a whole hash, not scanned");
  GK_INTERNAL_ASSERT(exclusive == nullptr || sources != nullptr, "exclusive sources without sources");
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStreamGuard on(stream);
  const auto n = static_cast<std::int64_t>(which.size());
  GK_CHECK(WeightError, n <= std::numeric_limits<int>::max(), "gk::content_hashes: ", n,
           " tensors on one device in one call; at most ", std::numeric_limits<int>::max());
  // One upload: data[n], nbytes[n], block_begin[n + 1], sums[n] (zero);
  // with `sources`, then the tensors' OverlaySource rows (5 words each) and
  // where each tensor's rows begin (n + 1 uint32); with `tests`, then
  // first_bad[n] (all ones), the masks[n] and the element widths[n]; with
  // `exclusive`, after the sources, each pair's OverlaySource row, its
  // tensor[pairs] and task_begin[pairs + 1] (Note [Exclusive writes]); with
  // `copy_to`, then the destinations[n].
  static_assert(sizeof(sum64::OverlaySource) == 40, "an OverlaySource row is 5 words of the upload");
  std::size_t rows = 0, pairs = 0;
  if (sources != nullptr)
    for (const std::size_t w : which) rows += (*sources)[w].size();
  if (exclusive != nullptr)
    for (const std::size_t w : which) pairs += (*exclusive)[w].size();
  const std::int64_t base_words = 4 * n + 1, row_words = 5 * static_cast<std::int64_t>(rows);
  const std::int64_t pair_words = pairs > 0 ? 7 * static_cast<std::int64_t>(pairs) + 1 : 0;
  const std::int64_t words = base_words + (sources != nullptr ? row_words + (n + 2) / 2 + pair_words : 0) +
                             (tests != nullptr ? 3 * n : 0) + (copy_to != nullptr ? n : 0);
  // The back words (the sums, then first_bad) come back behind the upload,
  // in the same pinned block (Note [One pinned block per hash launch]).
  const std::int64_t back = tests != nullptr ? 2 * n : n;
  at::Tensor host = at::empty({words + back}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* h = reinterpret_cast<std::uint64_t*>(host.mutable_data_ptr<std::int64_t>());
  std::vector<std::uint64_t> add(static_cast<std::size_t>(n));
  std::uint64_t blocks = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t w = which[static_cast<std::size_t>(i)];
    const HashBytes& in = inputs[w];
    h[i] = reinterpret_cast<std::uintptr_t>(in.p);
    h[n + i] = in.n;
    h[2 * n + i] = blocks;
    blocks += (sum64::words_of(in.n) + kBlockWords - 1) / kBlockWords;
    // What the kernel's sum is added to: the length term for a whole hash,
    // the hash before the writes for a change.
    add[static_cast<std::size_t>(i)] = sources != nullptr ? (*before)[w] : sum64::length_term(in.n);
  }
  h[3 * n] = blocks;
  std::fill(h + 3 * n + 1, h + words, 0);
  if (tests != nullptr) {
    for (std::int64_t i = 0; i < n; ++i) {
      const ExponentTest& t = (*tests)[which[static_cast<std::size_t>(i)]];
      GK_INTERNAL_ASSERT(t.bytes == 0 || t.bytes == 1 || t.bytes == 2 || t.bytes == 4 || t.bytes == 8,
                         "an element test of ", t.bytes, " bytes");
      std::uint64_t rep = 0;  // the mask in every lane of a word
      for (std::uint32_t l = 0; t.bytes != 0 && l < 8 / t.bytes; ++l) rep |= t.mask << (8 * t.bytes * l);
      h[base_words + i] = ~std::uint64_t{0};
      h[base_words + n + i] = rep;
      h[base_words + 2 * n + i] = t.bytes;
    }
  }
  if (copy_to != nullptr)
    for (std::int64_t i = 0; i < n; ++i)
      h[base_words + i] = reinterpret_cast<std::uintptr_t>((*copy_to)[which[static_cast<std::size_t>(i)]]);
  if (sources != nullptr) {
    auto* row = reinterpret_cast<sum64::OverlaySource*>(h + base_words);
    auto* begin = reinterpret_cast<std::uint32_t*>(h + base_words + row_words);
    begin[0] = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::vector<sum64::OverlaySource>& src = (*sources)[which[static_cast<std::size_t>(i)]];
      row = std::copy(src.begin(), src.end(), row);
      begin[i + 1] = begin[i] + static_cast<std::uint32_t>(src.size());
    }
  }
  const std::int64_t pair_at = base_words + row_words + (n + 2) / 2;
  std::uint64_t pair_tasks = 0;
  if (pairs > 0) {
    auto* row = reinterpret_cast<sum64::OverlaySource*>(h + pair_at);
    std::uint64_t* tensor = h + pair_at + 5 * static_cast<std::int64_t>(pairs);
    std::uint64_t* task_begin = tensor + pairs;
    std::size_t k = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t w = which[static_cast<std::size_t>(i)];
      for (const sum64::OverlaySource& src : (*exclusive)[w]) {
        row[k] = src;
        tensor[k] = static_cast<std::uint64_t>(i);
        task_begin[k] = pair_tasks;
        pair_tasks += (inputs[w].n + cuda::kExclusiveRangeBytes - 1) / cuda::kExclusiveRangeBytes;
        ++k;
      }
    }
    task_begin[pairs] = pair_tasks;
  }
  at::Tensor dev = at::empty({words}, at::TensorOptions().dtype(at::kLong).device(device));
  auto* d = reinterpret_cast<std::uint64_t*>(dev.mutable_data_ptr<std::int64_t>());
  const auto words_bytes = static_cast<std::size_t>(words) * sizeof(std::uint64_t);
  cudaError_t e = cudaMemcpyAsync(d, h, words_bytes, cudaMemcpyHostToDevice, stream.stream());
  GK_CHECK(StateError, e == cudaSuccess, "gk::content_hashes: the upload of the hash job failed on ", device, ": ",
           cudaGetErrorString(e));
  cuda::ContentHashJob job;
  job.data = d;
  job.nbytes = d + n;
  job.block_begin = d + 2 * n;
  job.sums = reinterpret_cast<unsigned long long*>(d + 3 * n + 1);
  job.count = static_cast<int>(n);
  job.blocks = blocks;
  if (sources != nullptr) {
    job.sources = reinterpret_cast<const sum64::OverlaySource*>(d + base_words);
    job.source_begin = reinterpret_cast<const std::uint32_t*>(d + base_words + row_words);
    job.walk = rows > 0;
  }
  if (pairs > 0) {
    job.exclusive = reinterpret_cast<const sum64::OverlaySource*>(d + pair_at);
    job.pair_tensor = d + pair_at + 5 * static_cast<std::int64_t>(pairs);
    job.pair_task_begin = job.pair_tensor + pairs;
    job.pairs = static_cast<int>(pairs);
    job.pair_tasks = pair_tasks;
  }
  if (tests != nullptr) {
    job.first_bad = reinterpret_cast<unsigned long long*>(d + base_words);
    job.scan_mask = d + base_words + n;
    job.scan_bytes = d + base_words + 2 * n;
  }
  if (copy_to != nullptr) job.copy_to = d + base_words;
  const int err = cuda::launch_content_hash(job, stream.stream());
  GK_CHECK(StateError, err == 0, "gk::content_hashes: the hash kernel failed to launch on ", device, " (cudaError ",
           err, ")");
  // The sums come back through pinned memory behind an event, so that
  // reading them waits for this launch only, not for what the stream runs next.
  // The sums (base_words - n ..), then first_bad (base_words ..): adjacent.
  e = cudaMemcpyAsync(h + words, d + 3 * n + 1, static_cast<std::size_t>(back) * sizeof(std::uint64_t),
                      cudaMemcpyDeviceToHost, stream.stream());
  GK_CHECK(StateError, e == cudaSuccess, "gk::content_hashes: reading the hashes back failed on ", device, ": ",
           cudaGetErrorString(e));
  DeviceLaunch l{std::move(which), std::move(add), std::move(host), std::move(dev), stream,
                 reinterpret_cast<const std::uint64_t*>(h + words), ReadEvent(runtime::wait_event_flags()),
                 tests != nullptr};
  l.read.record(stream);
  return l;
}

void read_device_hashes(DeviceLaunch& l, std::vector<std::uint64_t>& out, std::vector<std::int64_t>* first_bad) {
  l.read.synchronize();
  const auto n = static_cast<std::int64_t>(l.which.size());
  const std::uint64_t* r = l.result;
  for (std::int64_t i = 0; i < n; ++i)
    out[l.which[static_cast<std::size_t>(i)]] = l.add[static_cast<std::size_t>(i)] + r[i];
  if (first_bad == nullptr) return;
  GK_INTERNAL_ASSERT(l.scanned, "read_device_hashes: first_bad asked of a launch without tests");
  for (std::int64_t i = 0; i < n; ++i)
    (*first_bad)[l.which[static_cast<std::size_t>(i)]] =
        r[n + i] == ~std::uint64_t{0} ? -1 : static_cast<std::int64_t>(r[n + i]);
}
#endif

std::map<c10::DeviceIndex, std::vector<std::size_t>> hash_host_ranges(const std::vector<ContentRange>& ranges,
                                                                      std::vector<std::uint64_t>& out) {
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ContentRange& r = ranges[i];
    check_hashable(r.tensor, i);
    GK_CHECK(WeightError, r.offset <= r.tensor.nbytes() && r.nbytes <= r.tensor.nbytes() - r.offset,
             "gk::content_hashes: range ", i, " (bytes ", r.offset, " to ", r.offset + r.nbytes,
             ") lies outside its tensor's ", r.tensor.nbytes(), " bytes (shape ", r.tensor.sizes(), ")");
  }
  std::map<c10::DeviceIndex, std::vector<std::size_t>> by_device;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ContentRange& r = ranges[i];
#if defined(GRAPHKEEP_WITH_CUDA)
    if (r.tensor.is_cuda() && r.nbytes > 0) {
      by_device[r.tensor.device().index()].push_back(i);
      continue;
    }
#endif
    const HashBytes b = bytes_of(r);
    out[i] = host_hash(b.p, b.n);
  }
  return by_device;
}

}  // namespace detail

using detail::hash_host_ranges;
using detail::host_hash;
#if defined(GRAPHKEEP_WITH_CUDA)
using detail::launch_device_hashes;
using detail::read_device_hashes;
#endif

std::uint64_t content_hash_bytes(std::span<const std::byte> bytes) { return host_hash(bytes.data(), bytes.size()); }

std::uint64_t content_hash(const at::Tensor& tensor) { return content_hashes({tensor})[0]; }

std::vector<std::uint64_t> content_hashes(const std::vector<at::Tensor>& tensors) {
  // On the caller's current stream: ordered after its writes, one wait.
  return PendingContentHashes(tensors, HashStream::current).get();
}

std::vector<std::uint64_t> content_hashes(const std::vector<ContentRange>& ranges) {
  return PendingContentHashes(ranges, HashStream::current).get();
}

namespace {
// Whole tensors as ranges (each checked first, so that an undefined one is
// named as a tensor, not as a range).
std::vector<ContentRange> whole_ranges(std::vector<at::Tensor> tensors) {
  std::vector<ContentRange> out;
  out.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::check_hashable(tensors[i], i);
    const std::size_t n = tensors[i].nbytes();
    out.push_back({std::move(tensors[i]), 0, n});
  }
  return out;
}
}  // namespace

struct PendingContentHashes::Launch {
#if defined(GRAPHKEEP_WITH_CUDA)
  detail::DeviceLaunch l;
#endif
};

PendingContentHashes::PendingContentHashes(std::vector<at::Tensor> tensors, HashStream where)
    : PendingContentHashes(whole_ranges(std::move(tensors)), where) {}

PendingContentHashes::PendingContentHashes(std::vector<ContentRange> ranges, HashStream where)
    : ranges_(std::move(ranges)), out_(ranges_.size()) {
  const auto by_device = hash_host_ranges(ranges_, out_);
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<detail::HashBytes> inputs;
  if (!by_device.empty()) {
    inputs.reserve(ranges_.size());
    for (const ContentRange& r : ranges_) inputs.push_back(detail::bytes_of(r));
  }
  for (const auto& [index, which] : by_device) {
    const c10::cuda::CUDAGuard guard(index);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
    if (where == HashStream::current) {
      launches_.push_back({launch_device_hashes(inputs, which, c10::Device(c10::kCUDA, index), caller)});
      continue;
    }
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    // The side stream starts after what the caller has enqueued (the writes
    // of these tensors); ranges_ keeps them alive until it is done.
    at::cuda::CUDAEvent written;
    written.record(caller);
    written.block(side);
    launches_.push_back({launch_device_hashes(inputs, which, c10::Device(c10::kCUDA, index), side)});
  }
#else
  (void)by_device;
  (void)where;
#endif
  // On the caller's stream, later work is ordered after the hash: the caching
  // allocator may reuse the tensors' memory, and the caller may write them.
  if (where == HashStream::current) ranges_.clear();
}

PendingContentHashes::~PendingContentHashes() {
#if defined(GRAPHKEEP_WITH_CUDA)
  for (Launch& l : launches_) l.l.read.synchronize();
#endif
}
PendingContentHashes::PendingContentHashes(PendingContentHashes&&) noexcept = default;
PendingContentHashes& PendingContentHashes::operator=(PendingContentHashes&&) noexcept = default;

bool PendingContentHashes::ready() const {
#if defined(GRAPHKEEP_WITH_CUDA)
  for (const Launch& l : launches_)
    if (!l.l.read.query()) return false;
#endif
  return true;
}

std::vector<std::uint64_t> PendingContentHashes::get() {
#if defined(GRAPHKEEP_WITH_CUDA)
  for (Launch& l : launches_) read_device_hashes(l.l, out_);
  launches_.clear();
#endif
  return out_;
}

std::string format_content_hash(std::uint64_t hash) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) s[static_cast<std::size_t>(i)] = kDigits[hash & 15u];
  return s;
}

std::optional<std::uint64_t> parse_content_hash(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

}  // namespace gk
