// graphkeep/hashing/overlay_load.h
//
// What a set of writes not yet made changes in a content hash: each word a
// write covers is read as memory holds it and as it will be, and the
// difference of the two words' terms (sum64.h) is summed. Header-only, host
// and device, no Torch: the CUDA kernel runs it for
// gk::overlaid_content_hashes (overlaid_hash.h), and the host runs the very
// same code, so the tests check the device arithmetic on machines without a
// GPU.
//
//   using namespace gk::detail::sum64;
//   OverlayLoad<HostLoad> load{HostLoad{}, sources, n};
//   std::uint64_t d = load.delta(p, nbytes, 0, nbytes);   // whole tensor at p
//   // content_hash(tensor with the writes made) == content_hash(tensor) + d
//
// A source is one list of writes of `unit` bytes each: write k puts the
// `unit` bytes at values + k * unit at address base + indices[k] * unit.
// Indices ascend strictly within a source, so the writes of a source never
// overlap and a cursor per source walks them in address order: delta()
// jumps from one covered word to the next, so it costs O(writes + covered
// words), whatever the bytes between them. Sources apply in order: where two
// sources write the same byte, the later one's byte counts.
#pragma once

#include <graphkeep/hashing/sum64.h>

#include <cstdint>

namespace gk::detail::sum64 {

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

// Note [Exclusive writes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// delta() walks a tensor's covered words in address order, because a word
// may take bytes from several writes and several sources. Each walker is a
// chain of dependent loads (the next write's index, then its word): at 1 %
// of an 8B model's bf16 weights, 15 % of its sectors are written, and the
// walk was the stage's largest device item (docs/performance.md, "Figures
// behind the code"). A
// source that no other source writes a byte of, nor a byte of the same
// aligned 8-byte word (the caller's promise: HashOverlay::exclusive), at
// an 8-byte aligned base, over a tensor at an 8-byte aligned address, needs
// no walk: each word it covers takes its bytes from it alone, so the change
// is a sum of independent parts (exclusive_part_delta), which a device sums
// in parallel. A part is one word of a write of 8 bytes or more (a sector
// image has four), or, for element writes, the word that the write opens:
// the first write of each word applies the writes after it in that word,
// which are consecutive (the indices ascend), and the others add nothing.
// Sector images keep the promise (use_sector_images makes them only for
// writes that share no byte with another; the elements outside their whole
// sectors go in element writes of their own), and so do element writes
// whose destinations share no word with another write's. A broken promise
// gives a hash that matches nothing, never a write.
GK_SUM64_HD bool aligned_words(const OverlaySource& s, std::uint64_t tensor_address) {
  return s.base % 8 == 0 && tensor_address % 8 == 0 && (s.unit % 8 == 0 || 8 % s.unit == 0);
}
// The parts of each write of an exclusive source.
GK_SUM64_HD std::uint32_t parts_per_write(const OverlaySource& s) { return s.unit >= 8 ? s.unit / 8 : 1; }

// Sources one tensor may meet (a tensor overlapped by more is hashed from a
// copy with the writes made: gk::overlaid_content_hashes). A tensor a patch
// touches meets at most three: the elements in its first partial sector,
// the whole sectors, the elements in its last partial sector.
inline constexpr int kMaxOverlaySources = 4;

template <class Mem>
struct OverlayLoad {
  Mem mem;                     // reads memory: word(p), byte(p)
  const OverlaySource* src = nullptr;
  int n = 0;                   // sources, at most kMaxOverlaySources
  // Per source: its first write not wholly below the bytes visited so far,
  // and that write's address (~0: none left). Kept in registers: the loops
  // over sources are unrolled.
  std::uint64_t k[kMaxOverlaySources] = {};
  std::uint64_t at[kMaxOverlaySources] = {};

  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  GK_SUM64_HD static std::uint64_t index(const OverlaySource& s, std::uint64_t j) {
    return s.index_bytes == 4
               ? static_cast<std::uint64_t>(static_cast<const std::int32_t*>(s.indices)[j])
               : static_cast<std::uint64_t>(static_cast<const std::int64_t*>(s.indices)[j]);
  }
  GK_SUM64_HD static std::uint64_t addr(const OverlaySource& s, std::uint64_t j) {
    return j < s.count ? s.base + index(s, j) * s.unit : kNone;
  }
  GK_SUM64_HD static std::uint64_t address(const unsigned char* p) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  }

  // Sets each cursor to the source's first write that ends above address a.
  GK_SUM64_HD void start(std::uint64_t a) {
    GK_SUM64_UNROLL
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

  // The lowest address at or above a that a write covers (kNone: none).
  // Passes, for good, the writes wholly below a.
  GK_SUM64_HD std::uint64_t next_covered(std::uint64_t a) {
    std::uint64_t best = kNone;
    GK_SUM64_UNROLL
    for (int i = 0; i < kMaxOverlaySources; ++i) {
      if (i >= n) break;
      const OverlaySource& s = src[i];
      while (at[i] != kNone && at[i] + s.unit <= a) at[i] = addr(s, ++k[i]);
      if (at[i] == kNone) continue;
      const std::uint64_t c = at[i] > a ? at[i] : a;
      if (c < best) best = c;
    }
    return best;
  }

  // v with the bytes of [a, a + len) that the write of `unit` bytes at
  // address w (its bytes at vals) covers.
  GK_SUM64_HD static std::uint64_t patch(std::uint64_t v, std::uint64_t a, std::uint64_t len, std::uint64_t w,
                                         const unsigned char* vals, std::uint32_t unit) {
    if (len == 8 && w <= a && a + 8 <= w + unit && (((a - w) | address(vals)) & 7u) == 0) {
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
  // write that covers one of them applied, sources in order. The cursors
  // must be at or below a (start(), next_covered()).
  GK_SUM64_HD std::uint64_t apply(std::uint64_t v, std::uint64_t a, std::uint64_t len) {
    GK_SUM64_UNROLL
    for (int i = 0; i < kMaxOverlaySources; ++i) {
      if (i >= n || at[i] >= a + len) continue;  // (no write here)
      const OverlaySource& s = src[i];
      while (at[i] != kNone && at[i] + s.unit <= a) at[i] = addr(s, ++k[i]);  // wholly below: passed for good
      for (std::uint64_t j = k[i], w = at[i]; w < a + len; w = addr(s, ++j))
        v = patch(v, a, len, w, s.values + j * s.unit, s.unit);
    }
    return v;
  }

  // The change the writes make to the hash's word terms over bytes [lo, hi)
  // of the `nbytes` bytes at p (lo a multiple of 8, hi <= nbytes): the sum
  // of word_term(as it will be) - word_term(as it is) over the words there
  // that a write covers (a word a write leaves as it was adds 0). Words are
  // numbered from p; writes outside [p + lo, p + hi) are ignored.
  GK_SUM64_HD std::uint64_t delta(const unsigned char* p, std::uint64_t nbytes, std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t base = address(p);
    start(base + lo);
    std::uint64_t d = 0;
    for (std::uint64_t a = base + lo;;) {
      const std::uint64_t c = next_covered(a);
      if (c >= base + hi) break;  // (kNone included)
      const std::uint64_t j = (c - base) / 8;
      const std::uint64_t len = nbytes - 8 * j < 8 ? nbytes - 8 * j : 8;
      const std::uint64_t was = word_at(p, nbytes, j, mem);
      d += word_term(apply(was, base + 8 * j, len), j) - word_term(was, j);
      a = base + 8 * j + 8;
    }
    return d;
  }
};

// Where the writes an exclusive source s (Note [Exclusive writes]) owns in
// the tensor of `nbytes` bytes at address p begin at byte offset `off`: the
// first write whose first byte within the tensor, max(its address, p), is
// at or above p + off. The writes a range [lo, hi) of the tensor owns are
// [owned_from(lo), owned_from(hi)); the ranges of a partition of
// [0, nbytes) own each write that meets the tensor exactly once.
GK_SUM64_HD std::uint64_t owned_from(const OverlaySource& s, std::uint64_t p, std::uint64_t off) {
  std::uint64_t b = 0, e = s.count;
  while (b < e) {
    const std::uint64_t mid = b + (e - b) / 2;
    const std::uint64_t w = OverlayLoad<HostLoad>::addr(s, mid);
    if (off == 0 ? w + s.unit <= p : w < p + off) b = mid + 1; else e = mid;
  }
  return b;
}

// Part `part` of exclusive write k's change to the word terms of the
// tensor of `nbytes` bytes at p (Note [Exclusive writes]): word `part` of a
// write of 8 bytes or more; for a smaller write, the change of the word it
// opens (0 where an earlier write opened it).
template <class Mem>
GK_SUM64_HD std::uint64_t exclusive_part_delta(const OverlaySource& s, std::uint64_t k, std::uint32_t part,
                                               const unsigned char* p, std::uint64_t nbytes, const Mem& mem) {
  using L = OverlayLoad<Mem>;
  const std::uint64_t base = L::address(p);
  const std::uint64_t w = L::addr(s, k);
  const std::uint64_t a = s.unit >= 8 ? w + 8 * std::uint64_t{part} : w & ~std::uint64_t{7};
  if (a < base || a >= base + nbytes) return 0;
  if (s.unit < 8 && k > 0 && (L::addr(s, k - 1) & ~std::uint64_t{7}) == a) return 0;  // opened before
  const std::uint64_t j = (a - base) / 8;
  const std::uint64_t len = base + nbytes - a < 8 ? base + nbytes - a : 8;
  const std::uint64_t was = word_at(p, nbytes, j, mem);
  std::uint64_t now = L::patch(was, a, len, w, s.values + k * s.unit, s.unit);
  if (s.unit < 8)
    for (std::uint64_t m = k + 1; m < s.count; ++m) {
      const std::uint64_t wm = L::addr(s, m);
      if ((wm & ~std::uint64_t{7}) != a) break;
      now = L::patch(now, a, len, wm, s.values + m * s.unit, s.unit);
    }
  return word_term(now, j) - word_term(was, j);
}

}  // namespace gk::detail::sum64
