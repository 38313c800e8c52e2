// The settings of one call (Note [Options per call, protections per engine]
// in run_options.h).
#include "run_options.h"

#include <graphkeep/core/check.h>

namespace gk::detail {
namespace {

RunOptions protections(const testing::EngineHooks& h) {
  RunOptions r;
  r.verify = !h.skip_manifest_verification;
  r.check_configs = !h.skip_config_checks;
  r.restore_in_place_writes = !h.skip_in_place_backups;
  r.check_adopted_content = !h.skip_adopted_content_check;
  r.hash_served = !h.skip_served_hashes;
  r.verify_served = h.verify_served;
  return r;
}

}  // namespace

RunOptions run_options(const StageOptions& o, const testing::EngineHooks& h) {
  RunOptions r = protections(h);
  static_cast<StageOptions&>(r) = o;
  r.mode = ReloadMode::transactional;  // a stage commits whole or not at all
  return r;
}

RunOptions run_options(const ReloadOptions& o, const testing::EngineHooks& h) {
  GK_CHECK(StateError, !(o.mode == ReloadMode::streaming && o.before_commit),
           "reload(): ReloadOptions::before_commit is set, but ReloadOptions::mode is ReloadMode::streaming, "
           "which copies each layer back as soon as it is checked and has no moment before a first commit to "
           "call it at; use ReloadMode::transactional (or stage() and commit()), or leave before_commit empty; "
           "nothing was loaded");
  RunOptions r = protections(h);
  static_cast<ReloadOptions&>(r) = o;
  return r;
}

RunOptions run_options(const PatchOptions& o, const ReloadOptions& defaults, const testing::EngineHooks& h) {
  RunOptions r = protections(h);
  r.allow_non_finite = o.allow_non_finite;
  r.patch_writes = o.patch_writes;
  r.after_layer = o.after_layer;
  r.patch_base = defaults.patch_base;
  r.mode = ReloadMode::transactional;
  return r;
}

RunOptions run_options(const LoadOptions& o, const testing::EngineHooks& h) {
  RunOptions r = protections(h);
  r.allow_non_finite = o.allow_non_finite;
  r.version_label = o.version_label;
  r.patch_base = o.patch_base;
  return r;
}

}  // namespace gk::detail
