#include <graphkeep/reload/report.h>

#include <cstdio>

namespace gk {

std::string ReloadReport::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "reload %s: %zu layers, %zu slots (%zu declared), %zu tensors loaded, %.2f MiB copied, "
                "%zu zeroed, drift %zu, %.2f ms (load %.2f, pwal %.2f, check %.2f, copy %.2f, verify %.2f)%s",
                mode == ReloadMode::streaming ? "streaming" : "transactional", layers, slots_tracked, declared_slots,
                tensors_loaded, static_cast<double>(bytes_copied) / (1024.0 * 1024.0), slots_zeroed, drift,
                times.total_ms, times.load_ms, times.pwal_ms, times.check_ms, times.copy_ms, times.verify_ms,
                needs_recapture ? ", NEEDS RECAPTURE" : "");
  return buf;
}

}  // namespace gk
