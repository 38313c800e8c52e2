// The content hash "gk-sum64 v1" (graphkeep/hashing/content_hash.h): the
// host function against the definition written here from the Note's formula,
// and the definition's arithmetic against splitmix64's published outputs;
// edge sizes, dtypes and views; the change through a set of writes
// (overlaid_content_hashes); the refusals. The suite "gpu content hash"
// checks the kernels against the host functions bitwise (ctest:
// test_content_hash_gpu, label gpu). tests/content_hash_interop.py checks
// the host function against a NumPy computation of the definition.
#include "gk_test.h"

#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/hash_and_scan.h>
#include <graphkeep/hashing/overlaid_hash.h>
#include <graphkeep/hashing/overlay_load.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

// The definition (Note [Content hash: gk-sum64 v1]), serially, from the
// Note's formula: splitmix64's output function written out here, one word
// at a time, none of graphkeep's code.
std::uint64_t ref_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t reference_hash(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = ref_mix(n ^ 0x27D4EB2F165667C5ull);
  for (std::size_t j = 0; 8 * j < n; ++j) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < 8 && 8 * j + b < n; ++b) w |= std::uint64_t{p[8 * j + b]} << (8 * b);
    h += ref_mix(w + (j + 1) * 0x9E3779B97F4A7C15ull);
  }
  return h;
}

std::uint64_t reference_hash(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return reference_hash(c.const_data_ptr(), c.nbytes());
}

// A tensor's bytes cut into ranges (as a stacked MoE parameter's checkpoint
// tensors are hashed): each range's hash is the hash of a view of those
// bytes, at any offset and length, on its own or beside whole tensors.
std::vector<gk::ContentRange> cut(const at::Tensor& t, const std::vector<std::size_t>& lengths) {
  std::vector<gk::ContentRange> out;
  std::size_t at = 0;
  for (const std::size_t n : lengths) {
    out.push_back({t, at, n});
    at += n;
  }
  return out;
}

std::vector<std::uint64_t> view_hashes(const std::vector<gk::ContentRange>& ranges) {
  std::vector<std::uint64_t> out;
  for (const gk::ContentRange& r : ranges)
    out.push_back(gk::content_hash(r.tensor.reshape({-1}).view(at::kByte).narrow(0, static_cast<std::int64_t>(r.offset),
                                                                                 static_cast<std::int64_t>(r.nbytes))));
  return out;
}

// `n` random bytes.
at::Tensor random_bytes(std::int64_t n, at::Generator g = {}) {
  return at::randint(0, 256, {n}, g, at::TensorOptions().dtype(at::kByte));
}

// gk::detail::CopiedHashes on `device` (Note [Hashing while copying]):
// ranges of every length class (empty, a partial word, whole 64 KiB blocks,
// blocks and a tail) copied to destinations shifted by 0, 1, 3 and 8 bytes
// (aligned and not), from sources at aligned and odd offsets. The hashes
// are the host's hashes of the ranges, each destination holds its range's
// bytes, and every byte outside the destinations is untouched.
void check_copied_hashes(c10::Device device) {
  at::Generator g = at::detail::createCPUGenerator(29);
  const std::vector<std::size_t> lengths = {0, 1, 7, 8, 13, 65536, 3 * 65536 + 8, 65536 + 5, 2 * 65536, 57, 4096 + 3};
  for (std::size_t src_shift : {0, 5}) {
    for (std::size_t dst_shift : {0, 1, 3, 8}) {
      CAPTURE(src_shift);
      CAPTURE(dst_shift);
      std::size_t total = src_shift;
      for (std::size_t n : lengths) total += n;
      const at::Tensor host = random_bytes(static_cast<std::int64_t>(total), g);
      std::vector<gk::ContentRange> ranges = cut(host, lengths), on_device;
      for (gk::ContentRange& r : ranges) r.offset += src_shift;
      const at::Tensor src = host.to(device);
      // Each destination 16 bytes past the previous one's end, shifted.
      const std::int64_t dst_bytes = static_cast<std::int64_t>(total + 16 * lengths.size() + 16);
      const at::Tensor sentinel = at::full({dst_bytes}, 0xA5, at::TensorOptions().dtype(at::kByte));
      at::Tensor dst = sentinel.to(device, /*non_blocking=*/false, /*copy=*/true);
      at::Tensor expect = sentinel.clone();
      std::vector<std::byte*> to;
      std::size_t at = dst_shift;
      for (const gk::ContentRange& r : ranges) {
        on_device.push_back({src, r.offset, r.nbytes});
        to.push_back(static_cast<std::byte*>(dst.mutable_data_ptr()) + at);
        if (r.nbytes > 0)
          expect.narrow(0, static_cast<std::int64_t>(at), static_cast<std::int64_t>(r.nbytes))
              .copy_(host.narrow(0, static_cast<std::int64_t>(r.offset), static_cast<std::int64_t>(r.nbytes)));
        at += r.nbytes + 16;
      }
      gk::detail::CopiedHashes copied(on_device, to);
      const std::vector<std::uint64_t> got = copied.get();
      CHECK(got == view_hashes(ranges));
      CHECK(at::equal(dst.cpu(), expect));
      // Negative: the sentinel is not what the copies wrote.
      CHECK_FALSE(at::equal(sentinel, expect));
    }
  }
  // Refused as content_hashes refuses: a range past its tensor, before anything is copied.
  const at::Tensor t = random_bytes(100, g).to(device);
  at::Tensor d = at::zeros({100}, t.options());
  GK_CHECK_THROWS_WITH_SUBSTR(
      gk::detail::CopiedHashes(std::vector<gk::ContentRange>{{t, 90, 20}}, {static_cast<std::byte*>(d.mutable_data_ptr())}),
      gk::WeightError, "range 0 (bytes 90 to 110) lies outside its tensor's 100 bytes");
  CHECK(d.count_nonzero().item<std::int64_t>() == 0);
}

// A storage of random bytes, tensors viewing parts of it (some at odd byte
// offsets, some sharing bytes), and lists of writes of every unit over it:
// some over the whole storage (meeting many tensors), some over one tensor,
// some starting below a tensor or ending above it, two writing the same
// bytes (the later counts), and one tensor met by more lists than
// kMaxOverlaySources. `want` is computed here without the library: the
// writes made, in order, into a host copy of the storage, then the
// definition's hash of each view.
struct OverlayCase {
  at::Tensor storage;
  std::vector<at::Tensor> tensors;
  std::vector<gk::HashOverlay> overlays;
  std::vector<std::uint64_t> want, before;
};

OverlayCase overlay_case(std::uint64_t seed, c10::Device device) {
  std::mt19937_64 rng(seed);
  at::Generator g = at::detail::createCPUGenerator(seed);
  const std::int64_t n = 3 * 65536 + 4096 + static_cast<std::int64_t>(rng() % 70000);
  const at::Tensor host = random_bytes(n, g);
  OverlayCase c;
  c.storage = host.to(device);
  at::Tensor after = host.clone();
  auto* bytes = after.data_ptr<std::uint8_t>();
  auto view = [&](std::int64_t off, std::int64_t len) { return c.storage.narrow(0, off, len); };
  // Views: aligned, odd offsets, a tiny one, one under 32 bytes at an edge, overlapping ones.
  const std::vector<std::pair<std::int64_t, std::int64_t>> spans = {
      {0, n}, {64, 65536 * 2 + 5}, {3, 40000}, {65536 * 2 + 77, 65536}, {n - 19, 19}, {1000, 7}, {4096, 3 * 65536},
      {65536 * 2 + 64, 65536 - 64}};  // (aligned; four lists of writes, one of sectors)
  for (const auto& [off, len] : spans) c.tensors.push_back(view(off, len));
  // Writes: (dst offset in the storage, dst length, unit, density).
  struct W { std::int64_t off, len; int unit; double density; };
  std::vector<W> ws = {{0, n, 2, 0.01}, {64, 65536 * 2, 32, 0.15}, {3, 40000, 1, 0.05}, {4096, 3 * 65536, 8, 0.02},
                       {0, n, 4, 0.003}, {65536 * 2 + 64, 65536, 32, 0.5}, {n - 64, 64, 1, 0.9}};
  for (int k = 0; k < 10; ++k) ws.push_back({1000 + 2 * k, 64, 2, 0.5});  // eleven lists meet tensor 5 and 0
  for (const W& w : ws) {
    const std::int64_t units = w.len / w.unit;
    std::vector<std::int64_t> idx;
    for (std::int64_t u = 0; u < units; ++u)
      if (static_cast<double>(rng() % 1000000) < w.density * 1e6) idx.push_back(u);
    const at::Tensor values = random_bytes(static_cast<std::int64_t>(idx.size()) * w.unit, g);
    for (std::size_t k = 0; k < idx.size(); ++k)
      std::memcpy(bytes + w.off + idx[k] * w.unit, values.data_ptr<std::uint8_t>() + k * w.unit, w.unit);
    at::Tensor indices = at::tensor(idx, at::TensorOptions().dtype(at::kLong));
    if (rng() % 2) indices = indices.to(at::kInt);
    c.overlays.push_back({view(w.off, w.len), indices.to(device), values.to(device), w.unit});
  }
  for (const auto& [off, len] : spans) {
    c.want.push_back(reference_hash(after.narrow(0, off, len)));
    c.before.push_back(reference_hash(host.narrow(0, off, len)));
  }
  return c;
}

// A tensor of several 64 KiB blocks at an odd address, with sectors (32
// bytes, at 32-byte aligned addresses, so they straddle the tensor's words
// and blocks) and single bytes written: each block's change is summed on its
// own (a thread per block on a device), and the sum must be the whole hash
// of the bytes with the writes made.
struct BlocksCase {
  at::Tensor storage, tensor;
  std::vector<gk::HashOverlay> overlays;
  std::uint64_t before = 0, want = 0;
};

BlocksCase blocks_case(std::uint64_t seed, c10::Device device) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  const std::int64_t n = 5 * 65536 + 4096;
  const at::Tensor host = random_bytes(n, g);
  at::Tensor after = host.clone();
  BlocksCase c;
  c.storage = host.to(device).clone();
  const std::int64_t off = 5, len = 4 * 65536 + 1001;
  c.tensor = c.storage.narrow(0, off, len);
  // Sectors: every 32-byte sector of the storage whose index is 3 mod 7,
  // and the four around each 64 KiB boundary of the tensor.
  std::vector<std::int64_t> sec;
  for (std::int64_t k = 0; k < n / 32; ++k) {
    const std::int64_t boundary = ((k * 32 - off) / 65536 + 1) * 65536 + off;
    if (k % 7 == 3 || std::abs(k * 32 - boundary) < 64) sec.push_back(k);
  }
  const at::Tensor sv = random_bytes(static_cast<std::int64_t>(sec.size()) * 32, g);
  // Bytes: every 13th byte not in a written sector (applied after the sectors).
  std::vector<std::int64_t> bytes;
  std::vector<char> in_sector(static_cast<std::size_t>(n), 0);
  for (std::int64_t k : sec) std::fill_n(in_sector.begin() + 32 * k, 32, 1);
  for (std::int64_t b = 0; b < n; b += 13)
    if (!in_sector[static_cast<std::size_t>(b)]) bytes.push_back(b);
  const at::Tensor bv = random_bytes(static_cast<std::int64_t>(bytes.size()), g);
  auto* a = after.data_ptr<std::uint8_t>();
  for (std::size_t i = 0; i < sec.size(); ++i)
    std::memcpy(a + 32 * sec[i], sv.data_ptr<std::uint8_t>() + 32 * i, 32);
  for (std::size_t i = 0; i < bytes.size(); ++i) a[bytes[i]] = bv.data_ptr<std::uint8_t>()[i];
  c.overlays = {{c.storage, at::tensor(sec, at::kLong).to(device), sv.to(device), 32},
                {c.storage, at::tensor(bytes, at::kLong).to(at::kInt).to(device), bv.to(device), 1}};
  c.before = reference_hash(host.narrow(0, off, len));
  c.want = reference_hash(after.narrow(0, off, len));
  return c;
}

// Note [Exclusive writes] as a patch's stage meets it: a 32-byte aligned
// span holding three tensors back to back (boundaries 8-byte aligned, not
// 32: sectors straddle them; the first spans two of the kernel's 1 MiB
// ranges, and the sectors at every 512 KiB of the span are written; the
// last ends in a partial word), written by one list of sector images
// (exclusive) over the span's whole sectors and element writes in its
// partial last sector; a fourth tensor at an odd address
// inside the span (its words are not the sectors' words: walked); a list
// of single bytes at an odd address (walked), and two lists of elements
// alone in their words, at aligned addresses, summed word by word. With
// `broken`, a last list writes two bytes inside a sector image: the
// promise is false.
struct ExclusiveCase {
  at::Tensor storage;
  std::vector<at::Tensor> tensors;
  std::vector<gk::HashOverlay> overlays;
  std::vector<std::uint64_t> want, before;
};

ExclusiveCase exclusive_case(std::uint64_t seed, c10::Device device, bool broken) {
  std::mt19937_64 rng(seed);
  at::Generator g = at::detail::createCPUGenerator(seed);
  const std::int64_t span = 256, a = (1 << 20) + 65536 + 40, b = 70000 + 8 * static_cast<std::int64_t>(rng() % 50),
                     c_len = 12345, end = span + a + b + c_len, e8 = (end + 1100 + 7) / 8 * 8, n = e8 + 8192;
  const at::Tensor host = random_bytes(n, g);
  ExclusiveCase c;
  c.storage = host.to(device);
  at::Tensor after = host.clone();
  auto* bytes = after.data_ptr<std::uint8_t>();
  const std::vector<std::pair<std::int64_t, std::int64_t>> spans = {
      {span, a}, {span + a, b}, {span + a + b, c_len}, {span + 1001, 5000}, {end + 100, 900}, {e8, 4000},
      {e8 + 4096, 2002}};
  for (const auto& [off, len] : spans) c.tensors.push_back(c.storage.narrow(0, off, len));
  auto add = [&](std::int64_t off, std::int64_t len, int unit, std::vector<std::int64_t> idx, bool exclusive) {
    const at::Tensor values = random_bytes(static_cast<std::int64_t>(idx.size()) * unit, g);
    for (std::size_t k = 0; k < idx.size(); ++k)
      std::memcpy(bytes + off + idx[k] * unit, values.data_ptr<std::uint8_t>() + k * unit, unit);
    at::Tensor indices = at::tensor(idx, at::TensorOptions().dtype(at::kLong));
    if (rng() % 2) indices = indices.to(at::kInt);
    gk::HashOverlay o{c.storage.narrow(0, off, len), indices.to(device), values.to(device), unit};
    o.exclusive = exclusive;
    c.overlays.push_back(std::move(o));
  };
  const std::int64_t whole = (end - span) / 32;
  std::vector<std::int64_t> sectors, tail, far;
  for (std::int64_t k = 0; k < whole; ++k) {
    const std::int64_t at_byte = span + 32 * k;
    const bool edge = std::abs(at_byte - (span + a)) < 64 || std::abs(at_byte - (span + a + b)) < 64 ||
                      (at_byte - span) % (512 << 10) < 32;
    if (edge || rng() % 100 < 15) sectors.push_back(k);
  }
  add(span, whole * 32, 32, sectors, true);
  for (std::int64_t e = span + whole * 32; e + 2 <= end; e += 2)
    if (rng() % 2) tail.push_back((e - span - whole * 32) / 2);
  add(span + whole * 32, end - span - whole * 32, 2, tail, false);
  for (std::int64_t k = 0; k < 900; k += 7) far.push_back(k);
  add(end + 100, 900, 1, far, true);  // (at an odd address: walked, promise or not)
  // Element writes alone in their words (exclusive), several to a word.
  std::vector<std::int64_t> halves, quads;
  for (std::int64_t k = 0; k < 2000; ++k)
    if (rng() % 2) halves.push_back(k);
  for (std::int64_t k = 0; k < 500; ++k)
    if (rng() % 10 < 3 || k == 499) quads.push_back(k);
  add(e8, 4000, 2, halves, true);
  add(e8 + 4096, 2002, 4, quads, true);  // (its last write ends in the tensor's partial last word)
  if (broken) add(span + 32 * sectors[3], 32, 2, {1, 2}, false);
  for (const auto& [off, len] : spans) {
    c.want.push_back(reference_hash(after.narrow(0, off, len)));
    c.before.push_back(reference_hash(host.narrow(0, off, len)));
  }
  return c;
}

// The same overlays, none of them exclusive (every one walked).
std::vector<gk::HashOverlay> all_walked(std::vector<gk::HashOverlay> overlays) {
  for (gk::HashOverlay& o : overlays) o.exclusive = false;
  return overlays;
}

// The first 8 bytes [w, w + 8) of the case's storage, w = from + 8k, that no
// write covers, or -1.
std::int64_t first_uncovered_word(const OverlayCase& c, std::int64_t from) {
  std::vector<char> covered(static_cast<std::size_t>(c.storage.numel()), 0);
  for (const gk::HashOverlay& o : c.overlays) {
    const at::Tensor idx = o.indices.cpu().to(at::kLong);
    for (std::int64_t k = 0; k < idx.numel(); ++k)
      for (int b = 0; b < o.unit; ++b)
        covered[static_cast<std::size_t>(o.dst.storage_offset() + idx[k].item<std::int64_t>() * o.unit + b)] = 1;
  }
  for (std::int64_t w = from; w + 8 <= c.storage.numel(); w += 8)
    if (std::count(covered.begin() + w, covered.begin() + w + 8, 1) == 0) return w;
  return -1;
}

}  // namespace

TEST_SUITE("content hash") {

TEST_CASE("the hash's terms are splitmix64's outputs; the arithmetic is the definition's") {
  namespace s64 = gk::detail::sum64;
  // splitmix64 started from state 0 (Vigna's splitmix64.c) gives, first,
  // these four outputs (published test values): the terms of four zero words.
  const std::uint64_t published[4] = {0xE220A8397B1DCDAFull, 0x6E789E6AA1B965F4ull, 0x06C45D188009454Full,
                                      0xF88BB8A8724C81ECull};
  for (std::uint64_t j = 0; j < 4; ++j) CHECK(s64::word_term(0, j) == published[j]);
  const at::Tensor zeros = at::zeros({32}, at::kByte);
  CHECK(gk::content_hash(zeros) ==
        ref_mix(32 ^ 0x27D4EB2F165667C5ull) + published[0] + published[1] + published[2] + published[3]);
  // The empty input: the length term alone.
  CHECK(gk::content_hash(at::empty({0}, at::kFloat)) == ref_mix(0x27D4EB2F165667C5ull));
  CHECK(gk::content_hash(at::empty({3, 0, 2}, at::kBFloat16)) == ref_mix(0x27D4EB2F165667C5ull));
  // The header's arithmetic (the kernels run it) against the definition, at
  // every tail length and alignment.
  std::mt19937_64 rng(1234);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  int compared = 0;
  for (std::uint64_t n = 0; n <= 300; ++n)
    for (int offset : {0, 1, 3, 8}) {
      const unsigned char* p = buf.data() + offset;
      INFO("bytes " << n << " offset " << offset);
      CHECK(s64::length_term(n) + s64::sum_words(p, n, 0, s64::words_of(n), s64::HostLoad{}) ==
            reference_hash(p, n));
      ++compared;
    }
  CHECK(compared > 1000);
  // A term is a bijection of its word: a change confined to one word always
  // changes the hash (every single-bit change of one word, here).
  for (std::uint64_t j : {0ull, 1ull, 1000ull})
    for (int bit = 0; bit < 64; ++bit) CHECK(s64::word_term(0x0123456789ABCDEFull ^ (1ull << bit), j) !=
                                             s64::word_term(0x0123456789ABCDEFull, j));
}

TEST_CASE("the content hash is the definition at the edge sizes") {
  at::Generator g = at::detail::createCPUGenerator(7);
  for (std::int64_t n : {0, 1, 2, 7, 8, 9, 31, 32, 33, 65535, 65536, 65537, 131072, 131073, 3 * 65536 + 17,
                         16 * 65536 + 3, 1 << 22}) {
    INFO("bytes " << n);
    const at::Tensor t = random_bytes(n, g);
    const std::uint64_t want = reference_hash(t);
    CHECK(gk::content_hash(t) == want);
    CHECK(gk::content_hash_bytes({static_cast<const std::byte*>(t.const_data_ptr()), t.nbytes()}) == want);
  }
  // Negative: the length is hashed (a zero byte appended pads the same last
  // word), and so is each word's position.
  const at::Tensor seven = at::tensor({1, 2, 3, 4, 5, 6, 7}, at::kByte);
  const at::Tensor eight = at::tensor({1, 2, 3, 4, 5, 6, 7, 0}, at::kByte);
  CHECK(gk::content_hash(seven) != gk::content_hash(eight));
  CHECK(gk::content_hash(seven) - ref_mix(7 ^ 0x27D4EB2F165667C5ull) ==
        gk::content_hash(eight) - ref_mix(8 ^ 0x27D4EB2F165667C5ull));
}

TEST_CASE("the content hash covers every byte, the block order and the length") {
  at::Generator g = at::detail::createCPUGenerator(8);
  const at::Tensor t = random_bytes(3 * 65536 + 100, g);
  const std::uint64_t h = gk::content_hash(t);
  for (std::int64_t pos : std::vector<std::int64_t>{0, 65535, 65536, 2 * 65536 + 7, t.numel() - 1}) {
    at::Tensor c = t.clone();
    c[pos] = (c[pos].item<int>() + 1) % 256;
    CHECK(gk::content_hash(c) != h);
  }
  // Two whole blocks swapped: the same words at other positions, another hash.
  at::Tensor swapped = t.clone();
  swapped.narrow(0, 0, 65536).copy_(t.narrow(0, 65536, 65536));
  swapped.narrow(0, 65536, 65536).copy_(t.narrow(0, 0, 65536));
  CHECK(gk::content_hash(swapped) != h);
  // A zero byte appended to a 64 KiB block: the same words (the last one
  // zero), another length.
  const at::Tensor zeros = at::zeros({65536}, at::kByte);
  CHECK(gk::content_hash(zeros) != gk::content_hash(at::zeros({65537}, at::kByte)));
}

TEST_CASE("every dtype hashes its raw bytes; NaN payloads and -0.0 are distinct") {
  at::Generator g = at::detail::createCPUGenerator(9);
  const std::vector<at::ScalarType> dtypes = {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt,
                                              at::kLong, at::kHalf, at::kBFloat16, at::kFloat, at::kDouble,
                                              at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kComplexFloat};
  for (const at::ScalarType dtype : dtypes) {
    INFO("dtype " << dtype);
    const std::int64_t itemsize = static_cast<std::int64_t>(c10::elementSize(dtype));
    at::Tensor t = dtype == at::kBool ? at::randint(0, 2, {70007}, g, at::kByte).to(at::kBool)
                                      : random_bytes(70007 * itemsize, g).view(dtype);
    t = t.reshape({7, 10001});
    CHECK(gk::content_hash(t) == reference_hash(t));
    // The same bytes under another dtype hash the same (the dtype is not hashed).
    if (dtype != at::kBool) CHECK(gk::content_hash(t.view(at::kByte)) == gk::content_hash(t));
  }
  const at::Tensor pz = at::zeros({4}, at::kFloat), nz = -at::zeros({4}, at::kFloat);
  CHECK(at::equal(pz, nz));  // equal as numbers ...
  CHECK(gk::content_hash(pz) != gk::content_hash(nz));  // ... not as bytes
  const at::Tensor nan1 = at::tensor({0x7FC00000}, at::kInt).view(at::kFloat);
  const at::Tensor nan2 = at::tensor({0x7FC00001}, at::kInt).view(at::kFloat);
  CHECK(gk::content_hash(nan1) != gk::content_hash(nan2));
}

TEST_CASE("a contiguous view is hashed from its storage offset; a non-contiguous one is refused") {
  at::Generator g = at::detail::createCPUGenerator(10);
  const at::Tensor base = random_bytes(4 * 65536 + 64, g);
  for (std::int64_t offset : {1, 3, 8, 65536, 65537}) {
    const at::Tensor view = base.narrow(0, offset, 2 * 65536 + 5);
    REQUIRE(view.storage_offset() == offset);
    CHECK(gk::content_hash(view) == gk::content_hash(view.clone()));
    CHECK(gk::content_hash(view) == reference_hash(view));
  }
  const at::Tensor m = base.narrow(0, 0, 4 * 65536).view(at::kBFloat16).reshape({512, 256});
  const at::Tensor rows = m.narrow(0, 3, 100);  // contiguous rows at an offset
  CHECK(gk::content_hash(rows) == reference_hash(rows));
  // Non-contiguous: refused, the message says what to do; its .contiguous() hashes.
  const at::Tensor cols = m.narrow(1, 1, 100);
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hash(cols), gk::WeightError, "pass t.contiguous()");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hashes({m, cols}), gk::WeightError, "tensor 1 (shape [512, 100]");
  CHECK(gk::content_hash(cols.contiguous()) == reference_hash(cols));
  CHECK(gk::content_hash(m.t().contiguous()) != gk::content_hash(m));
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hash(at::Tensor()), gk::WeightError, "tensor 0 is undefined");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hash(at::empty({4}, at::TensorOptions().device(at::kMeta))),
                              gk::WeightError, "is on meta");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hash(at::eye(3).to_sparse()), gk::WeightError, "only strided tensors");
}

TEST_CASE("content_hashes equals content_hash one by one; the thread count does not matter") {
  at::Generator g = at::detail::createCPUGenerator(11);
  std::vector<at::Tensor> ts;
  for (std::int64_t n : {0, 5, 65536, 200000, 1 << 20}) ts.push_back(random_bytes(n, g));
  const std::vector<std::uint64_t> all = gk::content_hashes(ts);
  REQUIRE(all.size() == ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) CHECK(all[i] == gk::content_hash(ts[i]));
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const std::vector<std::uint64_t> serial = gk::content_hashes(ts);
  at::set_num_threads(threads);
  CHECK(serial == all);
}


TEST_CASE("a range of a tensor hashes as a view of its bytes; a range past the tensor is refused") {
  at::Generator g = at::detail::createCPUGenerator(13);
  const at::Tensor t = random_bytes(3 * 65536 + 77, g);
  const std::vector<gk::ContentRange> ranges = cut(t, {0, 1, 7, 8, 65536, 3, 65536 + 13, 57, 65536 - 12});
  const std::vector<std::uint64_t> got = gk::content_hashes(ranges);
  CHECK(got == view_hashes(ranges));
  CHECK(got[3] == reference_hash(t.narrow(0, 8, 8)));
  // The whole tensor as one range is the tensor's hash.
  CHECK(gk::content_hashes(std::vector<gk::ContentRange>{{t, 0, t.nbytes()}})[0] == gk::content_hash(t));
  // A stacked bf16 parameter cut by rows: each row range hashes as its row.
  const at::Tensor w = t.narrow(0, 0, 3 * 65536).view(at::kBFloat16).reshape({96, 1024});
  const std::vector<std::uint64_t> rows = gk::content_hashes(cut(w, std::vector<std::size_t>(96, 2048)));
  for (std::int64_t r = 0; r < 96; r += 19) CHECK(rows[static_cast<std::size_t>(r)] == gk::content_hash(w[r]));
  // Negative: the same length at the next byte is another hash.
  CHECK(gk::content_hashes(std::vector<gk::ContentRange>{{t, 9, 8}})[0] != got[3]);
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hashes(std::vector<gk::ContentRange>{{t, 0, 8}, {t, t.nbytes() - 4, 8}}),
                              gk::WeightError, "range 1 (bytes 196681 to 196689) lies outside its tensor's 196685 bytes");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::PendingContentHashes(std::vector<gk::ContentRange>{{at::Tensor(), 0, 0}}),
                              gk::WeightError, "tensor 0 is undefined");
}

TEST_CASE("CopiedHashes copies each range and hashes it as content_hashes does, at every alignment") {
  check_copied_hashes(c10::Device(c10::kCPU));
}

TEST_CASE("PendingContentHashes gives content_hashes' answer; an unread one is destroyed safely") {
  at::Generator g = at::detail::createCPUGenerator(12);
  std::vector<at::Tensor> ts;
  for (std::int64_t n : {0, 3, 65537, 300000}) ts.push_back(random_bytes(n, g));
  gk::PendingContentHashes pending(ts);
  CHECK(pending.get() == gk::content_hashes(ts));
  { gk::PendingContentHashes unread(ts); }
  gk::PendingContentHashes current(ts, gk::HashStream::current);
  CHECK(current.get() == gk::content_hashes(ts));
  // Refused as content_hashes refuses, naming the position.
  GK_CHECK_THROWS_WITH_SUBSTR(gk::PendingContentHashes({ts[2], ts[3].view({-1, 2}).t()}), gk::WeightError,
                              "tensor 1");
}

TEST_CASE("overlaid hashes are the hashes of the bytes with the writes made, without making them") {
  for (std::uint64_t seed : {1, 2, 3, 4}) {
    INFO("seed " << seed);
    const OverlayCase c = overlay_case(seed, at::kCPU);
    const at::Tensor untouched = c.storage.clone();
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, c.overlays) == c.want);
    CHECK(at::equal(c.storage, untouched));  // nothing was written
    // Negative: without the writes, or with one written byte changed, the
    // hashes are not the target's.
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, {}) == c.before);
    for (std::size_t t = 0; t < c.want.size(); ++t) CHECK(c.want[t] != c.before[t]);
    std::vector<gk::HashOverlay> wrong = c.overlays;
    wrong[1].values = wrong[1].values.clone();
    wrong[1].values[0] = (wrong[1].values[0].item<int>() + 1) % 256;
    const std::vector<std::uint64_t> got = gk::overlaid_content_hashes(c.tensors, c.before, wrong);
    CHECK(got[0] != c.want[0]);  // the whole storage holds the changed byte
    CHECK(got[4] == c.want[4]);  // the last 19 bytes do not
    // The result is the given hash plus the change: a wrong hash now gives a
    // wrong hash after (the caller's promise is not checked) ... (tensor 7:
    // four lists of writes meet it, the change is summed; the whole storage,
    // tensor 0, met by more, is hashed whole from a copy)
    // Tensor 3 also takes the summed path, from an odd address: its words
    // straddle the 32-byte sectors of one of its lists.
    std::vector<std::uint64_t> off = c.before;
    off[7] += 1;
    off[3] += 5;
    off[0] += 1;
    const std::vector<std::uint64_t> shifted = gk::overlaid_content_hashes(c.tensors, off, c.overlays);
    CHECK(shifted[7] == c.want[7] + 1);
    CHECK(shifted[3] == c.want[3] + 5);
    CHECK(shifted[0] == c.want[0]);
    // ... and only the words the writes cover are read (O(changed)): a word
    // no write covers, changed after the hashes now were taken, goes unseen.
    at::Tensor changed = c.storage.clone();
    std::vector<at::Tensor> views;
    for (const at::Tensor& t : c.tensors) views.push_back(changed.narrow(0, t.storage_offset(), t.numel()));
    std::vector<gk::HashOverlay> moved = c.overlays;
    for (gk::HashOverlay& o : moved) o.dst = changed.narrow(0, o.dst.storage_offset(), o.dst.numel());
    const std::vector<std::uint64_t> same = gk::overlaid_content_hashes(views, c.before, moved);
    CHECK(same == c.want);
    const std::int64_t from = c.tensors[7].storage_offset();
    const std::int64_t free_word = first_uncovered_word(c, from);  // in tensor 7, 8-aligned from its start
    REQUIRE(free_word >= from);
    REQUIRE(free_word + 8 <= from + views[7].numel());
    changed[free_word] = (changed[free_word].item<int>() + 1) % 256;
    const std::vector<std::uint64_t> unseen = gk::overlaid_content_hashes(views, c.before, moved);
    CHECK(unseen[7] == c.want[7]);
    CHECK(gk::content_hash(views[7]) != c.before[7]);  // (the byte did change)
    CHECK(unseen[0] != c.want[0]);                      // (a whole hash sees it)
  }
  // The order of two lists writing the same bytes is the order given.
  const at::Tensor t = at::zeros({64}, at::kByte);
  const at::Tensor idx = at::arange(4, at::kLong);
  const gk::HashOverlay ones{t, idx, at::full({4}, 1, at::kByte), 1}, twos{t, idx, at::full({4}, 2, at::kByte), 1};
  at::Tensor two = t.clone();
  two.narrow(0, 0, 4).fill_(2);
  const std::vector<std::uint64_t> h = {gk::content_hash(t)};
  CHECK(gk::overlaid_content_hashes({t}, h, {ones, twos})[0] == gk::content_hash(two));
  CHECK(gk::overlaid_content_hashes({t}, h, {twos, ones})[0] != gk::content_hash(two));
  // Refusals name the overlay, or the count of hashes.
  GK_CHECK_THROWS_WITH_SUBSTR(gk::overlaid_content_hashes({t}, h, {ones, {t, idx, at::full({4}, 1, at::kByte), 3}}),
                              gk::WeightError, "overlay 1 has unit 3");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::overlaid_content_hashes({t}, h, {{t, idx, at::full({3}, 1, at::kByte), 1}}),
                              gk::WeightError, "overlay 0 has 4 indices of 1 bytes each but 3 bytes of values");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::overlaid_content_hashes({t, t}, h, {ones}), gk::WeightError,
                              "2 tensors but 1 hashes");
}

TEST_CASE("the change through writes is summed block by block, across blocks and sectors that straddle them") {
  for (std::uint64_t seed : {31, 32}) {
    const BlocksCase c = blocks_case(seed, at::kCPU);
    CHECK(gk::overlaid_content_hashes({c.tensor}, {c.before}, c.overlays)[0] == c.want);
    CHECK(gk::overlaid_content_hashes({c.tensor}, {c.before + 9}, c.overlays)[0] == c.want + 9);  // summed, not whole
    // Negative: without the byte writes, another hash.
    CHECK(gk::overlaid_content_hashes({c.tensor}, {c.before}, {c.overlays[0]})[0] != c.want);
  }
}

TEST_CASE("exclusive writes are summed write by write, and agree with the walk") {
  for (std::uint64_t seed : {41, 42, 43}) {
    INFO("seed " << seed);
    const ExclusiveCase c = exclusive_case(seed, at::kCPU, /*broken=*/false);
    const std::vector<std::uint64_t> got = gk::overlaid_content_hashes(c.tensors, c.before, c.overlays);
    CHECK(got == c.want);
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, all_walked(c.overlays)) == c.want);
    for (std::size_t t = 0; t < c.want.size(); ++t) CHECK(c.want[t] != c.before[t]);
    // Negative: a broken promise (a later list writes two bytes inside a
    // sector image) is wrong for the tensor it meets when the sector list is
    // summed on its own, and right when every list is walked ...
    const ExclusiveCase b = exclusive_case(seed, at::kCPU, /*broken=*/true);
    const std::vector<std::uint64_t> wrong = gk::overlaid_content_hashes(b.tensors, b.before, b.overlays);
    CHECK(wrong[0] != b.want[0]);
    CHECK(wrong[1] == b.want[1]);
    CHECK(gk::overlaid_content_hashes(b.tensors, b.before, all_walked(b.overlays)) == b.want);
    // ... and the tensor at an odd address takes the walk, promise or not.
    CHECK(wrong[3] == b.want[3]);
  }
}

TEST_CASE("hashes format as 16 hex digits and parse back") {
  for (std::uint64_t h : std::vector<std::uint64_t>{0, 1, 0xEF46DB3751D8E999ull, ~std::uint64_t{0}}) {
    const std::string s = gk::format_content_hash(h);
    CHECK(s.size() == 16);
    CHECK(gk::parse_content_hash(s) == h);
  }
  CHECK(gk::format_content_hash(0xEF46DB3751D8E999ull) == "ef46db3751d8e999");
  CHECK(gk::parse_content_hash("EF46DB3751D8E999") == 0xEF46DB3751D8E999ull);
  CHECK_FALSE(gk::parse_content_hash("ef46db3751d8e99").has_value());
  CHECK_FALSE(gk::parse_content_hash("ef46db3751d8e9999").has_value());
  CHECK_FALSE(gk::parse_content_hash("0xf46db3751d8e999").has_value());
  CHECK_FALSE(gk::parse_content_hash("ef46db3751d8e99g").has_value());
  CHECK_FALSE(gk::parse_content_hash("").has_value());
}

}  // TEST_SUITE("content hash")

// ---------------------------------------------------------------------------
// The CUDA kernel against the host function, bitwise (label gpu)
// ---------------------------------------------------------------------------
TEST_SUITE("gpu content hash") {

TEST_CASE("the kernel equals the host function on random tensors of many sizes, in one batch and one by one") {
  REQUIRE(gk::testing::cuda_available());
  at::Generator g = at::detail::createCPUGenerator(20);
  std::vector<std::int64_t> sizes = {0, 1, 7, 8, 31, 32, 33, 63, 64, 511, 512, 513, 4096, 65535, 65536, 65537,
                                     131071, 131072, 131073, 3 * 65536 + 17, 1 << 20, (1 << 24) + 5};
  std::mt19937_64 rng(21);
  for (int i = 0; i < 40; ++i) sizes.push_back(static_cast<std::int64_t>(rng() % (3 * 65536)));
  std::vector<at::Tensor> host, dev;
  for (std::int64_t n : sizes) {
    host.push_back(random_bytes(n, g));
    dev.push_back(host.back().cuda());
  }
  // A few dtypes and shapes, and views whose data pointer is not 8-byte aligned.
  const at::Tensor big = random_bytes(5 * 65536 + 40, g);
  for (std::int64_t offset : {1, 2, 3, 4, 5, 6, 7, 8, 65537}) {
    host.push_back(big.narrow(0, offset, 2 * 65536 + 3));
    dev.push_back(big.cuda().narrow(0, offset, 2 * 65536 + 3));
  }
  host.push_back(big.narrow(0, 0, 5 * 65536).view(at::kBFloat16).reshape({640, 256}));
  dev.push_back(host.back().cuda());
  host.push_back(big.narrow(0, 0, 4 * 65536).view(at::kFloat).reshape({256, 256}).narrow(0, 1, 100));
  dev.push_back(host.back().cuda());

  const std::vector<std::uint64_t> want = gk::content_hashes(host);
  const std::vector<std::uint64_t> got = gk::content_hashes(dev);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("tensor " << i << " (" << host[i].nbytes() << " bytes, offset " << dev[i].storage_offset() << ")");
    CHECK(got[i] == want[i]);
    CHECK(want[i] == reference_hash(host[i]));
  }
  for (std::size_t i = 0; i < dev.size(); i += 7) CHECK(gk::content_hash(dev[i]) == want[i]);
  // CPU and CUDA tensors in one call.
  const std::vector<std::uint64_t> mixed = gk::content_hashes({host[20], dev[21], host[22], dev[5]});
  CHECK(mixed == std::vector<std::uint64_t>{want[20], want[21], want[22], want[5]});
  // Negative: one changed byte on the device changes the device hash.
  at::Tensor changed = dev[21].clone();
  changed[changed.numel() - 1] = (changed[changed.numel() - 1].item<int>() + 1) % 256;
  CHECK(gk::content_hash(changed) != want[21]);
  CHECK(gk::content_hash(changed) == gk::content_hash(changed.cpu()));
}

TEST_CASE("the copying hash kernel copies each range and hashes it as the host does, at every alignment") {
  REQUIRE(gk::testing::cuda_available());
  check_copied_hashes(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("ranges of device tensors hash as the host's views, in one launch with whole tensors") {
  REQUIRE(gk::testing::cuda_available());
  at::Generator g = at::detail::createCPUGenerator(23);
  const at::Tensor host = random_bytes(5 * 65536 + 41, g);
  const at::Tensor dev = host.cuda();
  const std::vector<std::size_t> lengths = {0, 1, 7, 8, 65536, 3, 65536 + 13, 57, 2 * 65536 - 8, 31};
  std::vector<gk::ContentRange> on_dev = cut(dev, lengths), on_host = cut(host, lengths);
  // A whole device tensor and a whole host tensor in the same call.
  on_dev.push_back({dev, 0, dev.nbytes()});
  on_host.push_back({host, 0, host.nbytes()});
  const at::Tensor small = random_bytes(100, g);
  on_dev.push_back({small, 3, 90});
  on_host.push_back({small, 3, 90});
  const std::vector<std::uint64_t> want = view_hashes(on_host);
  CHECK(gk::content_hashes(on_dev) == want);
  CHECK(gk::PendingContentHashes(on_dev).get() == want);
  CHECK(want[4] == reference_hash(host.narrow(0, 16, 65536)));
}

TEST_CASE("many small tensors and one large one hash in one call") {
  REQUIRE(gk::testing::cuda_available());
  at::Generator g = at::detail::createCPUGenerator(22);
  std::vector<at::Tensor> host, dev;
  for (int i = 0; i < 3000; ++i) {
    host.push_back(random_bytes(1 + i % 300, g));
    dev.push_back(host.back().cuda());
  }
  host.push_back(random_bytes(std::int64_t{256} << 20, g));  // 256 MiB: 4096 blocks
  dev.push_back(host.back().cuda());
  CHECK(gk::content_hashes(dev) == gk::content_hashes(host));
  // On a side stream, after the caller's writes: the caller's stream keeps
  // working (a long copy enqueued after the launch is not waited for by get(),
  // and does not touch the hashed tensors).
  {
    at::Tensor fresh = at::empty_like(dev.back());
    fresh.copy_(dev.back());  // enqueued before: the hashes see its result
    gk::PendingContentHashes pending({fresh, dev[7]});
    at::Tensor other = at::empty_like(fresh);
    for (int i = 0; i < 8; ++i) other.copy_(fresh);  // enqueued after, on the caller's stream
    CHECK(pending.get() == std::vector<std::uint64_t>{gk::content_hash(host.back()), gk::content_hash(host[7])});
  }
  // On the caller's stream (HashStream::current): the hash is ordered
  // between the writes before it and after it, and nothing is kept. Layer
  // after layer, one buffer reused: each hash sees what was written before
  // it, not the later overwrite, and dropping the buffer is safe.
  {
    std::vector<gk::PendingContentHashes> pending;
    std::vector<std::uint64_t> want;
    for (int i = 0; i < 6; ++i) {
      at::Tensor buf = dev.back().clone();
      buf.narrow(0, i * 4096, 4096).fill_(i);  // written before the hash: seen
      at::Tensor h = host.back().clone();
      h.narrow(0, i * 4096, 4096).fill_(i);
      want.push_back(gk::content_hash(h));
      pending.emplace_back(std::vector<at::Tensor>{buf}, gk::HashStream::current);
      buf.fill_(255);  // written after the hash, on the same stream: not seen
    }                  // buf dropped: its memory serves the next clone, in stream order
    std::vector<std::uint64_t> got;
    for (gk::PendingContentHashes& p : pending) got.push_back(p.get()[0]);
    CHECK(got == want);
    // Negative: the same writes, read back by content_hash after the
    // overwrite, are the overwrite's hash, not the one recorded.
    at::Tensor last = dev.back().clone();
    last.fill_(255);
    CHECK(gk::content_hash(last) != want.back());
  }
  // Non-contiguous device tensors are refused as on the host.
  GK_CHECK_THROWS_WITH_SUBSTR(gk::content_hash(dev.back().view({1 << 14, 1 << 14}).t()), gk::WeightError,
                              "pass t.contiguous()");
}

TEST_CASE("overlaid hashes on the device equal the host's, through every unit, alignment and fallback") {
  REQUIRE(gk::testing::cuda_available());
  for (std::uint64_t seed : {1, 2, 3, 4, 5, 6}) {
    INFO("seed " << seed);
    const OverlayCase c = overlay_case(seed, c10::Device(c10::kCUDA, 0));
    const at::Tensor untouched = c.storage.clone();
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, c.overlays) == c.want);
    CHECK(at::equal(c.storage, untouched));
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, {}) == c.before);
    // The device's answer is the host's for the same bytes and writes.
    std::vector<at::Tensor> host_views;
    const at::Tensor host = c.storage.cpu();
    for (const at::Tensor& t : c.tensors) host_views.push_back(host.narrow(0, t.storage_offset(), t.numel()));
    std::vector<gk::HashOverlay> host_overlays;
    for (const gk::HashOverlay& o : c.overlays)
      host_overlays.push_back({host.narrow(0, o.dst.storage_offset(), o.dst.numel()), o.indices.cpu(), o.values.cpu(),
                               o.unit});
    CHECK(gk::overlaid_content_hashes(host_views, c.before, host_overlays) == c.want);
  }
}

TEST_CASE("the device sums the change block by block as the host does") {
  REQUIRE(gk::testing::cuda_available());
  for (std::uint64_t seed : {31, 32, 33}) {
    const BlocksCase c = blocks_case(seed, c10::Device(c10::kCUDA, 0));
    CHECK(gk::overlaid_content_hashes({c.tensor}, {c.before}, c.overlays)[0] == c.want);
    CHECK(gk::overlaid_content_hashes({c.tensor}, {c.before + 9}, c.overlays)[0] == c.want + 9);
    CHECK(gk::content_hash(c.tensor) == c.before);
  }
}

TEST_CASE("the device sums exclusive writes as the host does, across its ranges and the tensors' edges") {
  REQUIRE(gk::testing::cuda_available());
  for (std::uint64_t seed : {41, 42, 43, 44}) {
    INFO("seed " << seed);
    const ExclusiveCase c = exclusive_case(seed, c10::Device(c10::kCUDA, 0), /*broken=*/false);
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, c.overlays) == c.want);
    CHECK(gk::overlaid_content_hashes(c.tensors, c.before, all_walked(c.overlays)) == c.want);
    std::vector<gk::HashOverlay> sectors_only = {c.overlays[0]};  // (no list to walk: the walk is not launched)
    std::vector<at::Tensor> first = {c.tensors[0], c.tensors[1]};
    const std::vector<std::uint64_t> got = gk::overlaid_content_hashes(first, {c.before[0], c.before[1]}, sectors_only);
    CHECK(got[0] == c.want[0]);
    CHECK(got[1] == c.want[1]);
    const ExclusiveCase b = exclusive_case(seed, c10::Device(c10::kCUDA, 0), /*broken=*/true);
    const std::vector<std::uint64_t> wrong = gk::overlaid_content_hashes(b.tensors, b.before, b.overlays);
    CHECK(wrong[0] != b.want[0]);
    CHECK(wrong[1] == b.want[1]);
  }
}

TEST_CASE("hash_and_scan hashes as content_hashes does and finds the first non-finite element torch finds") {
  // Note [Scanning while summing]: one read for the hash and the test. The
  // oracle is torch's isfinite on the same elements; the masks are the
  // exponent bits of each dtype.
  REQUIRE(gk::testing::cuda_available());
  const c10::Device dev(c10::kCUDA, 0);
  const std::vector<std::pair<at::ScalarType, gk::detail::ExponentTest>> dtypes = {
      {at::kBFloat16, {2, 0x7F80}},      {at::kHalf, {2, 0x7C00}},         {at::kFloat, {4, 0x7F800000u}},
      {at::kDouble, {8, 0x7FF0000000000000ull}}, {at::kFloat8_e4m3fn, {1, 0x7F}}, {at::kFloat8_e5m2, {1, 0x7C}}};
  std::mt19937_64 rng(43);
  std::vector<at::Tensor> tensors;
  std::vector<gk::detail::ExponentTest> tests;
  for (const auto& [t, test] : dtypes) {
    const auto per_block = static_cast<std::int64_t>(65536 / c10::elementSize(t));
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, per_block - 1, per_block, 3 * per_block + 5,
                           std::int64_t{1} << 20}) {
      for (std::int64_t off : {std::int64_t{0}, std::int64_t{3}}) {  // 3: a data pointer not 8-byte aligned
        // Finite values up to the dtype's largest (no false hit), then
        // none, one or two bad elements.
        const double top = t == at::kFloat8_e4m3fn ? 448.0 : t == at::kFloat8_e5m2 ? 57344.0 : 65504.0;
        at::Tensor v = (at::rand({n + off}, at::TensorOptions().device(dev).dtype(at::kFloat)) * 2 - 1).mul(top).to(t);
        v = v.narrow(0, off, n);
        const int kind = static_cast<int>(rng() % 3);
        if (kind >= 1) v[static_cast<std::int64_t>(rng() % n)] = std::nan("");
        if (kind == 2) v[static_cast<std::int64_t>(rng() % n)] = t == at::kFloat8_e4m3fn ? std::nan("") : -INFINITY;
        tensors.push_back(v);
        tests.push_back(test);
      }
    }
  }
  // Not tested: an int32 tensor whose words are a float's infinity.
  tensors.push_back(at::full({1000}, 0x7F800000, at::TensorOptions().device(dev).dtype(at::kInt)));
  tests.push_back({});
  tensors.push_back(at::empty({0}, at::TensorOptions().device(dev).dtype(at::kFloat)));
  tests.push_back({4, 0x7F800000u});

  // Each tensor whole, and the largest ones also in three ranges that
  // start on an element (as a whole parameter's checkpoint tensors do).
  std::vector<gk::ContentRange> ranges;
  std::vector<gk::detail::ExponentTest> range_tests;
  std::vector<at::Tensor> views;  // each range as a tensor, for the oracle
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    ranges.push_back({t, 0, t.nbytes()});
    range_tests.push_back(tests[i]);
    views.push_back(t);
    if (t.numel() < 3000) continue;
    const std::int64_t n = t.numel(), cuts[4] = {0, 1001, n / 2 + 3, n};
    for (int k = 0; k < 3; ++k) {
      const auto e = static_cast<std::size_t>(t.element_size());
      ranges.push_back({t, static_cast<std::size_t>(cuts[k]) * e, static_cast<std::size_t>(cuts[k + 1] - cuts[k]) * e});
      range_tests.push_back(tests[i]);
      views.push_back(t.narrow(0, cuts[k], cuts[k + 1] - cuts[k]));
    }
  }
  const gk::detail::HashScan r = gk::detail::hash_and_scan(ranges, range_tests);
  REQUIRE(r.hashes.size() == ranges.size());
  CHECK(r.hashes == gk::content_hashes(ranges));
  CHECK(r.hashes == gk::content_hashes(views));
  int bad = 0;
  for (std::size_t i = 0; i < views.size(); ++i) {
    INFO("range " << i << " " << views[i].scalar_type() << " " << views[i].sizes() << " offset "
                  << views[i].storage_offset());
    std::int64_t want = -1;
    if (range_tests[i].bytes != 0 && views[i].numel() > 0) {
      const at::Tensor nonfinite = at::logical_not(at::isfinite(views[i].to(at::kFloat))).nonzero();
      if (nonfinite.numel() > 0) want = nonfinite.min().item<std::int64_t>();
    }
    bad += want >= 0;
    CHECK(r.first_bad[i] == want);
  }
  CHECK(bad > 10);  // the case tests hits, not only their absence
}

}  // TEST_SUITE("gpu content hash")
