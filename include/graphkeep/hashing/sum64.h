// graphkeep/hashing/sum64.h
//
// The arithmetic of the content hash "gk-sum64 v1" (Note [Content hash:
// gk-sum64 v1] in content_hash.h): a tensor's hash is a sum, modulo 2^64,
// of one term per 8-byte word and a term for the length. Header-only, host
// and device, no Torch: the CUDA kernels (hashing/cuda/content_hash.cu) and
// the host functions (hashing/content_hash.cpp, overlaid_hash.cpp) run this
// same code, so the tests check the device arithmetic on machines without a
// GPU.
//
//   using namespace gk::detail::sum64;
//   std::uint64_t h = length_term(n);
//   h += sum_words(p, n, 0, words_of(n), HostLoad{});  // == gk::content_hash_bytes({p, n})
//   // one word j changed from `was` to `now`:
//   h += word_term(now, j) - word_term(was, j);       // the new bytes' hash, O(1)
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GK_SUM64_HD __host__ __device__ __forceinline__
#else
#define GK_SUM64_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define GK_SUM64_UNROLL _Pragma("unroll")
#else
#define GK_SUM64_UNROLL
#endif

namespace gk::detail::sum64 {

// splitmix64's increment (the golden ratio in 64 bits) and output function
// (Vigna's splitmix64.c; the multipliers are Stafford's "Mix13").
inline constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;
// Keys the length term apart from the word terms.
inline constexpr std::uint64_t kLengthKey = 0x27D4EB2F165667C5ull;

GK_SUM64_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The term of word j (0-based) holding the little-endian value w: the
// (j + 1)-th output of splitmix64 started from state w. A bijection of w for
// each j, so a change confined to one word always changes the hash.
GK_SUM64_HD std::uint64_t word_term(std::uint64_t w, std::uint64_t j) { return mix64(w + (j + 1) * kGamma); }

// The term of the byte length n.
GK_SUM64_HD std::uint64_t length_term(std::uint64_t n) { return mix64(n ^ kLengthKey); }

// Words of n bytes: the last one zero-padded.
GK_SUM64_HD std::uint64_t words_of(std::uint64_t n) { return (n + 7) / 8; }

// The little-endian value of `n` (<= 8) bytes at p, read with load.byte(),
// zero-padded.
template <class Load>
GK_SUM64_HD std::uint64_t bytes_le(const unsigned char* p, std::uint64_t n, const Load& load) {
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(load.byte(p + i)) << (8 * i);
  return v;
}

// Word j of the n bytes at p: load.word() where all 8 bytes exist, the
// zero-padded tail otherwise.
template <class Load>
GK_SUM64_HD std::uint64_t word_at(const unsigned char* p, std::uint64_t n, std::uint64_t j, const Load& load) {
  return 8 * j + 8 <= n ? load.word(p + 8 * j) : bytes_le(p + 8 * j, n - 8 * j, load);
}

// The sum of the terms of words [first, last) of the n bytes at p. Whole
// words four at a time into four sums (independent chains for the host's
// pipelines; (j + 1) * kGamma advanced by additions), the tail one by one.
template <class Load>
GK_SUM64_HD std::uint64_t sum_words(const unsigned char* p, std::uint64_t n, std::uint64_t first, std::uint64_t last,
                                    const Load& load) {
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const std::uint64_t whole = last < n / 8 ? last : n / 8;
  std::uint64_t j = first, key = (first + 1) * kGamma;
  for (; j + 4 <= whole; j += 4, key += 4 * kGamma) {
    const unsigned char* q = p + 8 * j;
    s0 += mix64(load.word(q) + key);
    s1 += mix64(load.word(q + 8) + key + kGamma);
    s2 += mix64(load.word(q + 16) + key + 2 * kGamma);
    s3 += mix64(load.word(q + 24) + key + 3 * kGamma);
  }
  for (; j < last; ++j) s0 += word_term(word_at(p, n, j, load), j);
  return s0 + s1 + s2 + s3;
}

// Host loads of any alignment (little-endian hosts, as graphkeep requires).
struct HostLoad {
  GK_SUM64_HD std::uint64_t word(const unsigned char* p) const {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  GK_SUM64_HD std::uint64_t byte(const unsigned char* p) const { return *p; }
};

}  // namespace gk::detail::sum64
