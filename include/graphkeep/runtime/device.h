// graphkeep/runtime/device.h
//
// How a kernel class runs on its tensors' device. graphkeep's kernels all
// follow one pattern, the same on both paths: gather *raw pointers* and
// sizes, then launch.
//   - CPU: gk::hostrt::launch(name, accesses, closure) runs now, or is
//     recorded into a host capture (burn-in semantics of a CUDA graph);
//   - CUDA: a plain launcher from kernels/cuda or quant/cuda (no Torch in
//     the .cu files) on the current stream, captured by a CUDA graph.
//
//   if (x.is_cuda()) {
//     GK_LAUNCH_CUDA("row_scale", x, launch_row_scale(xp, qp, sp, yp, m, n, k, gk::runtime::cuda_stream(x)));
//   } else {
//     gk::hostrt::launch("row_scale", {...}, [=] { row_scale_cpu(xp, qp, sp, yp, m, n, k); });
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

namespace gk::runtime {

// True in builds with CUDA support (GRAPHKEEP_CUDA=ON).
bool built_with_cuda() noexcept;

// True when this build has CUDA support and a CUDA device is visible (false,
// never an exception, on a machine without a driver or device).
bool cuda_device_available() noexcept;

// Waits for the device's queued work; nothing on CPU, where kernels run
// eagerly or are recorded.
void synchronize(c10::Device device);

// The flags for a CUDA event that graphkeep waits on (cudaEventFlags; 0 in
// builds without CUDA): timing off, and cudaEventBlockingSync where the
// process asked its devices to block waiting threads
// (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)). cudaEventSynchronize
// spins on an event without that flag whatever the device's flags say, so
// without it such a process would still spin in every wait of a reload.
// Read once, when first asked (the flags cannot change once a context exists).
unsigned int wait_event_flags() noexcept;

// The current CUDA stream of t's device, as an opaque cudaStream_t. Raises
// gk::StateError naming `kernel` in builds without CUDA support.
void* cuda_stream(const at::Tensor& t, std::string_view kernel = {});

// Raises gk::StateError: `kernel` was called on a CUDA tensor in a build
// without CUDA support.
[[noreturn]] void no_cuda(const at::Tensor& t, std::string_view kernel);

// Allocates an output: from the host capture's pool on CPU (gk::hostrt::empty),
// with at::empty on CUDA (a CUDA graph capture routes it to the graph's pool).
at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace gk::runtime

// Expands to the CUDA launch in CUDA builds; elsewhere to a gk::StateError,
// so CPU-only builds never reference the CUDA launchers.
#if defined(GRAPHKEEP_WITH_CUDA)
#define GK_LAUNCH_CUDA(kernel, tensor, ...) __VA_ARGS__
#else
#define GK_LAUNCH_CUDA(kernel, tensor, ...) ::gk::runtime::no_cuda(tensor, kernel)
#endif
