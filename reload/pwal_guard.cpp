#include "pwal_guard.h"

#include "reload_internal.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/model/layer.h>

#include <algorithm>

namespace gk {

bool pwal_can_write(const LayerPlan& lp, const PlannedSlot& s) {
  if (!s.defined()) return false;
  if (s.kind == PlannedSlot::Kind::declared) return true;
  const bool loaded = std::any_of(lp.params.begin(), lp.params.end(),
                                  [&](const CheckpointParam& cp) { return cp.param == s.local; });
  if (!loaded) return true;
  for (std::size_t a = 1; a < s.originals.size(); ++a)
    if (s.originals[a].defined() && !s.originals[a].is_same(s.originals.front())) return true;
  return false;
}

void ReloadGuard::before_pwal(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o) {
  if (o.restore_in_place_writes) {
    std::vector<at::Tensor> writable;
    for (const PlannedSlot& sl : lp.slots)
      if (pwal_can_write(lp, sl)) writable.push_back(sl.captured);
    run.backups.take_all(writable);
  } else {
    for (const PlannedSlot& sl : lp.slots) run.pwal_unguarded = run.pwal_unguarded || pwal_can_write(lp, sl);
  }
}

void StageGuard::after_load(LayerRun& run, const detail::RunOptions& o, ReloadReport& rep) {
  if (!o.check_adopted_content || run.adopted.empty()) return;
  ScopedMsTimer t(rep.times.hash_ms);
  std::vector<at::Tensor> values;
  values.reserve(run.adopted.size());
  for (const LayerRun::Adopted& a : run.adopted) values.push_back(a.value);
  const std::vector<std::uint64_t> hashes = content_hashes(values);
  for (std::size_t i = 0; i < hashes.size(); ++i) run.adopted[i].hash = hashes[i];
}

// Note [Staging copies]: PWAL gets copies of the captured storages. Plain
// modules have no PWAL: nothing of theirs is redirected.
void StageGuard::before_pwal(LayerPlan& lp, LayerRun& /*run*/, const detail::RunOptions& /*o*/) {
  if (lp.layer == nullptr) return;
  for (const PlannedSlot& sl : lp.slots) {
    if (!sl.defined()) continue;
    if (sl.kind != PlannedSlot::Kind::declared) {
      const at::Tensor t = detail::module_tensor(*lp.module, sl);
      if (copies_.captured(t)) copies_.redirect(t);
    }
    for (const SlotPath& path : sl.paths)
      if (const at::Tensor* f = path.resolve_tensor(lp.root.ptr); f != nullptr && copies_.captured(*f))
        copies_.redirect(*f);
  }
}

void StageGuard::after_check(LayerPlan& lp, LayerRun& run) {
  if (lp.layer == nullptr) return;
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    if (!copies_.captured(run.current[i])) continue;
    // PWAL reached what the graphs read: write the old values back where
    // the stage holds them, else refuse replay.
    const bool restored = copies_.restore_captured(run.current[i]);
    if (!restored)
      on_unrestored_(concat("a failed stage() let PWAL of layer '", lp.prefix, "' write the captured storage of ",
                            lp.slots[i].name, " through a handle that is no slot location; reload() to recover"));
    GK_THROW(StateError, "stage(): after PWAL of layer '", lp.prefix, "', ", lp.slots[i].name,
             " views a captured storage through a handle that is no slot location (an opaque or undeclared "
             "member?), so PWAL may have written what the graphs read; ",
             restored ? "its captured values were written back (replays during the stage may have read the new ones)"
                      : "replay is refused until a reload() succeeds",
             ". Declare that member with a graph-visible role, or use reload()");
  }
}

}  // namespace gk
