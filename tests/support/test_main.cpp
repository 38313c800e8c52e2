// The doctest main shared by every test binary. A binary containing
// GK_TEST_REQUIRES_GPU() exits with 77 (ctest: skipped) when no CUDA device is
// present, so the gpu-labelled tests skip cleanly on CI machines.
#include "gk_test.h"

#include <cstdio>

#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gk::testing {
bool cuda_available() {
#ifdef GRAPHKEEP_WITH_CUDA
  try {
    return c10::cuda::device_count() > 0;
  } catch (...) {
    return false;
  }
#else
  return false;
#endif
}
}  // namespace gk::testing

extern "C" __attribute__((weak)) int gk_test_requires_gpu();

int main(int argc, char** argv) {
  if (gk_test_requires_gpu != nullptr && gk_test_requires_gpu() != 0 &&
      !gk::testing::cuda_available()) {
    std::printf("no CUDA device: skipping this gpu test binary\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
