// bench/bench_sync.h: how the benches' waits for a CUDA device behave, so
// that a host CPU time means what it says.
//
//   const std::string sync = gkbench::apply_sync(common.blocking_sync);  // before any CUDA work
//   row["sync"] = sync;                                                   // "spin" or "blocking"
//
// Note [Host time and spinning waits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The benches report host work per slot or per patched tensor as the
// calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID). By default the CUDA
// runtime spins while a thread waits for the device (cudaDeviceScheduleAuto
// spins when there are fewer contexts than cores), so every wait inside a
// reload or a stage (a hash read back, a scan's result, a copy to the host)
// counts as CPU time: the 14-185 us "per slot" measured so far are the
// host's work plus its waits. With --blocking-sync the runtime blocks the
// thread on a synchronization primitive instead
// (cudaDeviceScheduleBlockingSync, set before the context exists): the
// waits cost wall time only, and the CPU time is the host's own work. A
// blocking wait wakes later than a spinning one, so wall times measured
// that way may be a little longer: rows carry "sync" to tell them apart.
#pragma once

#include <string>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace gkbench {

// Sets the CUDA runtime's wait behaviour for this process; call before any
// CUDA work. Returns "blocking" or "spin" (what the rows report), or why
// the setting was refused.
inline std::string apply_sync(bool blocking) {
  if (!blocking) return "spin";
#if defined(GRAPHKEEP_WITH_CUDA)
  const cudaError_t err = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("spin (blocking sync refused: ") + cudaGetErrorString(err) + ")";
  }
  return "blocking";
#else
  return "blocking";  // (no device: nothing waits)
#endif
}

}  // namespace gkbench
