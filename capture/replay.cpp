// Replay backends (see replay.h). The CUDA backend lives in reload/cuda/.
#include <graphkeep/core/check.h>
#include <graphkeep/capture/replay.h>

namespace gk {

void HostReplay::capture(const std::function<void()>& forward) {
  rec_ = hostrt::capture(forward);
  captured_ = true;
}

void HostReplay::recapture(const std::function<void()>& forward) {
  GK_CHECK(StateError, captured_, "recapture of host graph '", name_, "' before its first capture");
  hostrt::Recording fresh = hostrt::capture(forward);
  rec_ = std::move(fresh);
}

void HostReplay::replay() {
  GK_CHECK(StateError, captured_, "replay of host graph '", name_, "' before capture");
  rec_.replay();
}

std::vector<CapturedAddress> HostReplay::addresses() const {
  std::vector<CapturedAddress> out;
  const auto& launches = rec_.launches();
  for (std::size_t n = 0; n < launches.size(); ++n)
    for (const hostrt::Access& a : launches[n].accesses)
      out.push_back({reinterpret_cast<std::uintptr_t>(a.ptr), n, launches[n].name, a.bytes, a.write});
  return out;
}

bool HostReplay::in_private_pool(std::uintptr_t address) const {
  for (const at::Tensor& t : rec_.pool()) {
    const auto b = reinterpret_cast<std::uintptr_t>(t.storage().data());
    if (address >= b && address < b + t.storage().nbytes()) return true;
  }
  return false;
}

#ifndef GRAPHKEEP_WITH_CUDA
std::unique_ptr<ReplayBackend> make_cuda_replay(std::string name, const ReplayBackend* /*share_pool_with*/) {
  GK_THROW(StateError, "cannot create CUDA graph '", name,
                       "': this build has no CUDA support (configure with GRAPHKEEP_CUDA=ON)");
}
#endif

std::unique_ptr<ReplayBackend> make_replay(c10::Device device, std::string name,
                                           const ReplayBackend* share_pool_with) {
  if (device.is_cuda()) return make_cuda_replay(std::move(name), share_pool_with);
  GK_CHECK(StateError, device.is_cpu(), "no replay backend for device ", device);
  return std::make_unique<HostReplay>(std::move(name));
}

}  // namespace gk
