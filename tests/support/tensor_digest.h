// tests/support/tensor_digest.h
//
// FNV-1a 64 of a tensor's bytes (row-major, its own dtype), as 16 hex
// digits: what the interop checkers (tests/safetensors_check.cpp,
// tests/hf_checkpoint_check.cpp) print for each tensor, and what
// tests/support/gk_interop.py computes on the Python side to compare.
//
//   std::cout << gk::testing::fnv1a64(t);   // "cbf29ce484222325": no bytes
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gk::testing {

inline std::string fnv1a64(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
  for (std::size_t i = 0; i < c.nbytes(); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace gk::testing
