// graphkeep/hashing/overlay_load.h
//
// A Load policy for the XXH64 lane code (xxh64_lanes.h) that reads memory as
// it will be after a set of writes: each word or byte read comes from memory
// unless a write covers it, in which case it comes from that write's value.
// Header-only, host and device, no Torch: the CUDA content hash kernel runs
// it for gk::overlaid_content_hashes (overlaid_hash.h), and the host runs
// the very same code, so the tests check the device arithmetic on machines
// without a GPU.
//
//   using namespace gk::detail::xxh64;
//   OverlayLoad<HostLoad> load{HostLoad{}, sources, n};
//   load.start(p);                                  // p: the first byte to be read
//   std::uint64_t v = load.fix(load.word(p), p);    // memory at p, the writes applied
//
// A source is one list of writes of `unit` bytes each: write k puts the
// `unit` bytes at values + k * unit at address base + indices[k] * unit.
// Indices ascend strictly within a source, so the writes of a source never
// overlap and a cursor per source walks them in address order. word() only
// loads; fix() applies the writes, and the lane loop calls it in ascending
// address order once the loads of a chunk are in flight (then finish()
// reads the tail bytes, above them, through byte()): each read passes the
// writes below it once, and the whole read costs O(bytes + writes). Sources
// apply in order: where two sources write the same byte, the later one's
// byte is read. Reading an address below one already fixed is not supported
// (the cursors do not move back).
#pragma once

#include <graphkeep/hashing/xxh64_lanes.h>

#include <cstdint>

namespace gk::detail::xxh64 {

// One list of writes (see the header comment). Plain data, shared by the
// host and the kernel.
struct OverlaySource {
  std::uint64_t base = 0;                // address of unit 0
  const void* indices = nullptr;         // [count] ascending unit numbers, int32 or int64
  const unsigned char* values = nullptr; // [count * unit] the bytes written
  std::uint64_t count = 0;
  std::uint32_t unit = 0;                // bytes per write: 1, 2, 4, 8 or 32
  std::uint32_t index_bytes = 0;         // 4 or 8
};

// Sources one read may apply (a tensor overlapped by more is hashed from a
// copy with the writes made: gk::overlaid_content_hashes). A tensor a patch
// touches meets at most three: the elements in its first partial sector,
// the whole sectors, the elements in its last partial sector.
inline constexpr int kMaxOverlaySources = 4;

template <class Mem>
struct OverlayLoad {
  Mem mem;                     // reads memory: word(p), byte(p)
  const OverlaySource* src = nullptr;
  int n = 0;                   // sources, at most kMaxOverlaySources
  // Per source: its first write not wholly below the bytes read so far, and
  // that write's address (~0: none left). Kept in registers: the loops over
  // sources are unrolled, so a word no write covers costs n comparisons.
  mutable std::uint64_t k[kMaxOverlaySources] = {};
  mutable std::uint64_t at[kMaxOverlaySources] = {};

  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  GK_XXH64_HD static std::uint64_t index(const OverlaySource& s, std::uint64_t j) {
    return s.index_bytes == 4
               ? static_cast<std::uint64_t>(static_cast<const std::int32_t*>(s.indices)[j])
               : static_cast<std::uint64_t>(static_cast<const std::int64_t*>(s.indices)[j]);
  }
  GK_XXH64_HD static std::uint64_t addr(const OverlaySource& s, std::uint64_t j) {
    return j < s.count ? s.base + index(s, j) * s.unit : kNone;
  }

  // Sets each cursor to the source's first write that ends above p.
  GK_XXH64_HD void start(const unsigned char* p) {
    const auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    GK_XXH64_UNROLL
    for (int i = 0; i < kMaxOverlaySources; ++i) {
      if (i >= n) break;
      std::uint64_t lo = 0, hi = src[i].count;
      while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (addr(src[i], mid) + src[i].unit <= a) lo = mid + 1; else hi = mid;
      }
      k[i] = lo;
      at[i] = addr(src[i], lo);
    }
  }

  // v with the bytes of [a, a + len) that the write of `unit` bytes at
  // address w (its bytes at vals) covers.
  GK_XXH64_HD static std::uint64_t patch(std::uint64_t v, std::uint64_t a, std::uint64_t len, std::uint64_t w,
                                         const unsigned char* vals, std::uint32_t unit) {
    if (len == 8 && w <= a && a + 8 <= w + unit &&
        (((a - w) | static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(vals))) & 7u) == 0) {
#if defined(__CUDA_ARCH__)
      return *reinterpret_cast<const std::uint64_t*>(vals + (a - w));
#else
      std::uint64_t x;
      std::memcpy(&x, vals + (a - w), sizeof x);
      return x;
#endif
    }
    const std::uint64_t lo = w > a ? w : a, hi = w + unit < a + len ? w + unit : a + len;
    for (std::uint64_t b = lo; b < hi; ++b) {
      const int shift = static_cast<int>(8 * (b - a));
      v = (v & ~(std::uint64_t{0xFF} << shift)) | (std::uint64_t{vals[b - w]} << shift);
    }
    return v;
  }

  // `v`, the `len` bytes of memory at address a (little-endian), with every
  // write that covers one of them applied, sources in order.
  GK_XXH64_HD std::uint64_t apply(std::uint64_t v, std::uint64_t a, std::uint64_t len) const {
    GK_XXH64_UNROLL
    for (int i = 0; i < kMaxOverlaySources; ++i) {
      if (i >= n || at[i] >= a + len) continue;  // (the common case: no write here)
      const OverlaySource& s = src[i];
      while (at[i] != kNone && at[i] + s.unit <= a) at[i] = addr(s, ++k[i]);  // wholly below: passed for good
      for (std::uint64_t j = k[i], w = at[i]; w < a + len; w = addr(s, ++j))
        v = patch(v, a, len, w, s.values + j * s.unit, s.unit);
    }
    return v;
  }

  GK_XXH64_HD std::uint64_t word(const unsigned char* p) const { return mem.word(p); }
  GK_XXH64_HD std::uint64_t fix(std::uint64_t v, const unsigned char* p) const {
    return apply(v, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)), 8);
  }
  GK_XXH64_HD std::uint64_t byte(const unsigned char* p) const {
    return apply(mem.byte(p), static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)), 1);
  }
};

}  // namespace gk::detail::xxh64
