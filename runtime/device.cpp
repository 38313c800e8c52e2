#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ops/empty.h>

#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gk::runtime {

bool built_with_cuda() noexcept {
#ifdef GRAPHKEEP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_device_available() noexcept {
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

unsigned int wait_event_flags() noexcept {
#ifdef GRAPHKEEP_WITH_CUDA
  static const unsigned int flags = [] {
    unsigned int device_flags = 0;
    if (cudaGetDeviceFlags(&device_flags) != cudaSuccess) {
      (void)cudaGetLastError();
      device_flags = 0;
    }
    const bool blocking = (device_flags & cudaDeviceScheduleMask) == cudaDeviceScheduleBlockingSync;
    return static_cast<unsigned int>(cudaEventDisableTiming) | (blocking ? cudaEventBlockingSync : 0u);
  }();
  return flags;
#else
  return 0;
#endif
}

void synchronize(c10::Device device) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

void no_cuda(const at::Tensor& t, std::string_view kernel) {
  GK_THROW(StateError, "kernel ", kernel, " was called on ", t.device(),
                                  " but this build has no CUDA support (configure with GRAPHKEEP_CUDA=ON)");
}

void* cuda_stream(const at::Tensor& t, std::string_view kernel) {
#ifdef GRAPHKEEP_WITH_CUDA
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
#else
  no_cuda(t, kernel);
#endif
}

at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu()) return hostrt::empty(sizes, options);
  return at::empty(sizes, options);
}

}  // namespace gk::runtime
