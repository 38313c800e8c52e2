#include <graphkeep/reload/report.h>

#include <cstdio>

namespace gk {

std::string ReloadReport::summary() const {
  char buf[640];
  int n = std::snprintf(buf, sizeof(buf),
                "reload %s: %zu layers, %zu slots (%zu declared), %zu tensors loaded (%zu adopted, %zu batched), %.2f MiB copied, "
                "%zu zeroed, drift %zu, %.2f ms (load %.2f, pwal %.2f, check %.2f, finite %.2f, copy %.2f, verify %.2f)%s",
                staged ? "staged" : mode == ReloadMode::streaming ? "streaming" : "transactional", layers,
                slots_tracked, declared_slots, tensors_loaded, tensors_adopted, tensors_batched, static_cast<double>(bytes_copied) / (1024.0 * 1024.0),
                slots_zeroed, drift, times.total_ms, times.load_ms, times.pwal_ms, times.check_ms, times.finite_ms, times.copy_ms,
                times.verify_ms, needs_recapture ? ", NEEDS RECAPTURE" : "");
  if (staged && n > 0 && static_cast<std::size_t>(n) < sizeof(buf))
    std::snprintf(buf + n, sizeof(buf) - static_cast<std::size_t>(n), ", stage %.2f ms, pause %.2f ms, version %llu",
                  times.stage_ms, times.commit_ms, static_cast<unsigned long long>(weight_version));
  return buf;
}

}  // namespace gk
