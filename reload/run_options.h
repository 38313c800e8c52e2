// reload/run_options.h: every setting one call of the engine runs with
// (internal to the reload layer).
//
// Note [Options per call, protections per engine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each public call takes the options it honours (ReloadOptions,
// StageOptions, PatchOptions, LoadOptions in graphkeep/reload/
// reload_options.h), so no field is silently ignored. The pipeline below
// them is one, and reads one struct: the call's options, translated here,
// and the protections (manifest verification, configuration checks,
// in-place backups, content hashes, the adopted-content check), which are
// on unless the engine's gk::testing::EngineHooks switch them off. No
// product setting can.
//
//   detail::RunOptions o = detail::run_options(options, hooks);   // at the top of a call
#pragma once

#include <graphkeep/reload/reload_options.h>
#include <graphkeep/reload/testing.h>

#include <functional>
#include <memory>
#include <string>

namespace gk::detail {

class KnownHashes;  // known_hashes.h

// A reload's options, the patch writes, and the protections.
struct RunOptions : ReloadOptions {
  PatchWrites patch_writes = PatchWrites::elements;
  // The protections (gk::testing::EngineHooks may switch them).
  bool verify = true;                   // capture manifests after each reload
  bool check_configs = true;            // a configuration value PWAL changed is a mismatch
  bool restore_in_place_writes = true;  // back up what PWAL may write in place
  bool check_adopted_content = true;    // adopted tensors hashed at stage and commit
  bool hash_served = true;              // content hashes of what is served
  bool verify_served = false;           // after a commit, the written tensors hashed again
  // Set by a streaming reload that scanned its whole source for non-finite
  // values before copying anything (Note [Scanning a resident source
  // first]): the per-layer scans would read the same bytes again.
  bool source_scanned = false;
  // With it, the content hashes that scan computed (Note [Scanning a
  // resident source first] in weight_stream.cpp), for the loads to reuse.
  std::shared_ptr<const KnownHashes> known_hashes;
};

RunOptions run_options(const ReloadOptions& o, const testing::EngineHooks& h);
RunOptions run_options(const StageOptions& o, const testing::EngineHooks& h);
// `defaults`: the engine's, for where re-run layers keep new bases.
RunOptions run_options(const PatchOptions& o, const ReloadOptions& defaults, const testing::EngineHooks& h);
RunOptions run_options(const LoadOptions& o, const testing::EngineHooks& h);

}  // namespace gk::detail
