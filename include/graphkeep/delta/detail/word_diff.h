// graphkeep/delta/detail/word_diff.h
//
// Counting changed elements a 64-bit word at a time (internal to the delta
// layer; host and device, no Torch): make_patch's count kernel
// (delta/cuda/changed_elements.cu) reads the base and the target as 8-byte
// words, so one read of each serves both the count of changed elements and
// the content hashes of both (Note [Changed elements on the device]); the
// tests run the same code on the host.
//
//   const int n = gk::detail::changed_lanes(base_word ^ target_word, 2);  // bf16: 0..4 changed elements
#pragma once

#include <graphkeep/hashing/sum64.h>

#include <cstdint>

namespace gk::detail {

// How many of the 8 / elem_bytes elements of a 64-bit word have a bit set
// in x (x: the XOR of a base word and a target word; elem_bytes 1, 2, 4 or
// 8). Each lane's bits are folded into its lowest bit, then counted.
GK_SUM64_HD int changed_lanes(std::uint64_t x, int elem_bytes) {
  std::uint64_t low;
  switch (elem_bytes) {
    case 1:
      x |= x >> 4, x |= x >> 2, x |= x >> 1;
      low = 0x0101010101010101ull;
      break;
    case 2:
      x |= x >> 8, x |= x >> 4, x |= x >> 2, x |= x >> 1;
      low = 0x0001000100010001ull;
      break;
    case 4:
      x |= x >> 16, x |= x >> 8, x |= x >> 4, x |= x >> 2, x |= x >> 1;
      low = 0x0000000100000001ull;
      break;
    default:
      return x != 0 ? 1 : 0;
  }
#if defined(__CUDA_ARCH__)
  return __popcll(x & low);
#else
  return __builtin_popcountll(x & low);
#endif
}

}  // namespace gk::detail
