// graphkeep/numerics/exact_math.h: the float operations that graphkeep's CUDA kernels
// and their CPU twins share, so that both compute bit for bit the same
// function.
//
// On the device fadd/fsub/fmul/fdiv are the _rn intrinsics, which nvcc never
// contracts into an FMA; on the host they are the plain IEEE operators
// (graphkeep builds without -march, so the host compiler emits no FMA either).
// bits_of/float_of reinterpret without undefined behaviour on both sides.
//
//   #include <graphkeep/numerics/exact_math.h>
//   using gk::numerics::fadd; using gk::numerics::fmul;
//   GK_HD float dot(const float* a, const float* b, int n) {
//     float acc = 0.f;
//     for (int i = 0; i < n; ++i) acc = fadd(acc, fmul(a[i], b[i]));   // same order on CPU and GPU
//     return acc;
//   }
//
// No Torch, no Boost: .cu files include this header (kernels/cuda, quant/cuda)
// as well as the .cpp twins.
#pragma once

#include <cstdint>
#include <cstring>

#ifndef GK_HD
#if defined(__CUDACC__)
#define GK_HD __host__ __device__ __forceinline__
#else
#define GK_HD inline
#endif
#endif

namespace gk::numerics {

GK_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GK_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
GK_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GK_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
GK_HD std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
GK_HD float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
GK_HD float quiet_nan() { return float_of(0x7FC00000u); }

}  // namespace gk::numerics
