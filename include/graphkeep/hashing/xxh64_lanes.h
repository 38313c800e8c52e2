// graphkeep/hashing/xxh64_lanes.h
//
// XXH64 written as its four accumulator lanes, for graphkeep's CUDA content
// hash kernel (hashing/cuda/content_hash.cu), which gives each lane its own
// thread (Note [One quad of threads per block] there). Header-only, host and
// device, no Torch: the kernel includes it, and the tests run the very same
// lane code on the host against libxxhash, so the device arithmetic is
// checked on machines without a GPU.
//
//   using namespace gk::detail::xxh64;
//   std::uint64_t v[4];
//   for (int lane = 0; lane < 4; ++lane)
//     v[lane] = lane_stripes<16>(lane_init(lane, seed), p + 8 * lane, len / 32, HostLoad{});
//   std::uint64_t h = finish(v, p, len, seed, HostLoad{});   // == XXH64(p, len, seed)
//
// XXH64 (xxHash's specification, doc/xxhash_spec.md in the reference
// repository): the input is read as 32-byte stripes; lane j (0..3)
// accumulates the j-th little-endian 64-bit word of every stripe with
// lane_round(); the four lanes then converge, the tail (len % 32 bytes) is mixed
// in 8, 4 and 1 bytes at a time, and the result is avalanched. Inputs
// shorter than 32 bytes skip the lanes.
//
// A Load policy reads the input: word(p) is the little-endian 64-bit value of
// the 8 bytes at p, byte(p) one byte. The lane loop only calls word() at
// p + 32 * s (so p's alignment is the caller's to know); the tail uses byte().
// A policy may also have fix(v, p): the lane loop then passes each word
// through it just before its round, in ascending address order, after the
// loads of its chunk were all issued (overlay_load.h uses it, so that its
// work does not hold back the loads in flight).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__CUDACC__)
#define GK_XXH64_HD __host__ __device__ __forceinline__
#else
#define GK_XXH64_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define GK_XXH64_UNROLL _Pragma("unroll")
#else
#define GK_XXH64_UNROLL
#endif

namespace gk::detail::xxh64 {

inline constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kP3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ull;

GK_XXH64_HD std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

GK_XXH64_HD std::uint64_t lane_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kP2;
  return rotl(acc, 31) * kP1;
}

GK_XXH64_HD std::uint64_t merge_round(std::uint64_t acc, std::uint64_t lane) {
  acc ^= lane_round(0, lane);
  return acc * kP1 + kP4;
}

// The initial value of lane 0..3.
GK_XXH64_HD std::uint64_t lane_init(int lane, std::uint64_t seed) {
  switch (lane) {
    case 0: return seed + kP1 + kP2;
    case 1: return seed + kP2;
    case 2: return seed;
    default: return seed - kP1;
  }
}

template <class L, class = void>
struct has_fix : std::false_type {};
template <class L>
struct has_fix<L, std::void_t<decltype(std::declval<const L&>().fix(std::uint64_t{},
                                                                    static_cast<const unsigned char*>(nullptr)))>>
    : std::true_type {};

// The word v read at p, through load.fix() where the policy has one.
template <class Load>
GK_XXH64_HD std::uint64_t fixed(const Load& load, std::uint64_t v, const unsigned char* p) {
  if constexpr (has_fix<Load>::value) return load.fix(v, p);
  else return v;
}

// Accumulates `stripes` stripes into `acc`: the words at p, p + 32, p + 64, ...
// (p is the input plus 8 * lane). Loads run U words ahead of the rounds
// (two register buffers of U words), so a thread always has U loads in
// flight while it computes; the rounds of one lane are a serial chain.
template <int U, class Load>
GK_XXH64_HD std::uint64_t lane_stripes(std::uint64_t acc, const unsigned char* p, std::uint64_t stripes,
                                       const Load& load) {
  const std::uint64_t chunks = stripes / U;
  std::uint64_t a[U] = {}, b[U] = {};  // (initialized: g++ cannot see that b is loaded before use)
  if (chunks > 0) {
    GK_XXH64_UNROLL
    for (int i = 0; i < U; ++i) a[i] = load.word(p + 32 * static_cast<std::uint64_t>(i));
  }
  for (std::uint64_t c = 0; c < chunks; c += 2) {
    const unsigned char* next = p + 32 * U * (c + 1);
    if (c + 1 < chunks) {
      GK_XXH64_UNROLL
      for (int i = 0; i < U; ++i) b[i] = load.word(next + 32 * static_cast<std::uint64_t>(i));
    }
    const unsigned char* here = p + 32 * U * c;
    GK_XXH64_UNROLL
    for (int i = 0; i < U; ++i) acc = lane_round(acc, fixed(load, a[i], here + 32 * static_cast<std::uint64_t>(i)));
    if (c + 1 < chunks) {
      if (c + 2 < chunks) {
        GK_XXH64_UNROLL
        for (int i = 0; i < U; ++i) a[i] = load.word(next + 32 * U + 32 * static_cast<std::uint64_t>(i));
      }
      GK_XXH64_UNROLL
      for (int i = 0; i < U; ++i) acc = lane_round(acc, fixed(load, b[i], next + 32 * static_cast<std::uint64_t>(i)));
    }
  }
  for (std::uint64_t s = chunks * U; s < stripes; ++s)
    acc = lane_round(acc, fixed(load, load.word(p + 32 * s), p + 32 * s));
  return acc;
}

GK_XXH64_HD std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

// The little-endian value of `n` bytes at p, read with load.byte().
template <class Load>
GK_XXH64_HD std::uint64_t bytes_le(const unsigned char* p, int n, const Load& load) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(load.byte(p + i)) << (8 * i);
  return v;
}

// XXH64 of the `len` bytes at p with `seed`, given the four lanes after
// len / 32 stripes (ignored when len < 32).
template <class Load>
GK_XXH64_HD std::uint64_t finish(const std::uint64_t (&v)[4], const unsigned char* p, std::uint64_t len,
                                 std::uint64_t seed, const Load& load) {
  std::uint64_t h;
  if (len >= 32) {
    h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    h = merge_round(h, v[0]);
    h = merge_round(h, v[1]);
    h = merge_round(h, v[2]);
    h = merge_round(h, v[3]);
  } else {
    h = seed + kP5;
  }
  h += len;
  p += len / 32 * 32;
  std::uint64_t rest = len % 32;
  for (; rest >= 8; rest -= 8, p += 8) {
    h ^= lane_round(0, bytes_le(p, 8, load));
    h = rotl(h, 27) * kP1 + kP4;
  }
  if (rest >= 4) {
    h ^= bytes_le(p, 4, load) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    rest -= 4;
    p += 4;
  }
  for (; rest > 0; --rest, ++p) {
    h ^= load.byte(p) * kP5;
    h = rotl(h, 11) * kP1;
  }
  return avalanche(h);
}

// Host loads of any alignment (little-endian hosts, as graphkeep requires).
struct HostLoad {
  GK_XXH64_HD std::uint64_t word(const unsigned char* p) const {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  GK_XXH64_HD std::uint64_t byte(const unsigned char* p) const { return *p; }
};

}  // namespace gk::detail::xxh64
