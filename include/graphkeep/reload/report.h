// graphkeep/reload/report.h
//
// What a reload did: the numbers an RL loop logs after each weight update.
//
//   gk::ReloadReport r = engine.reload(source);
//   std::cout << r.summary() << "\n";
//   // reload streaming: 12 layers, 96 slots, 48.2 MiB copied, drift 0, 41.3 ms
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gk {

class ServedWeights;

enum class ReloadMode {
  streaming,      // layer by layer; peak memory about one layer above the model
  transactional,  // nothing visible changes until every layer is loaded and checked
};

// What a reload does when PWAL changes a slot's layout.
enum class MismatchPolicy {
  raise,           // fail closed: throw gk::MismatchError (default)
  needs_recapture, // finish, leave the new tensors in place, report the paths;
                   // replay is refused until the graphs are recaptured
};

struct PhaseTimes {
  double detach_ms = 0;   // snapshot checks, parameters detached from storage
  double load_ms = 0;     // reading the source, buffering, materializing, loaders
  double pwal_ms = 0;     // process_weights_after_loading
  double check_ms = 0;    // layout and configuration checks
  double finite_ms = 0;   // the non-finite weight check (ReloadOptions::allow_non_finite)
  double hash_ms = 0;     // content hashes: served tensors (load, stage), adopted tensors (stage: at adoption;
                          // commit: in the pause), a patch's targets (stage) and verify_served (commit)
  double copy_ms = 0;     // copy-back, re-pointing, init policies
  double verify_ms = 0;   // capture-manifest verification
  double total_ms = 0;
  // Online reload (ReloadEngine::stage / commit): the stage, on the staging
  // thread while the graphs keep replaying (its load, PWAL and check phases
  // are above), and the commit, the serving thread's pause (copy-back, init
  // policies, re-pointing; verification is verify_ms). Zero for reload().
  double stage_ms = 0;
  double commit_ms = 0;
};

struct ReloadReport {
  ReloadMode mode = ReloadMode::streaming;
  std::size_t layers = 0;
  std::size_t slots_tracked = 0;     // parameters, buffers and declared slots
  std::size_t declared_slots = 0;
  std::size_t tensors_loaded = 0;    // checkpoint tensors and shards received
  std::size_t bytes_loaded = 0;
  std::size_t bytes_copied = 0;      // copied into captured storage
  // Of those received, adopted without a load copy (ReloadOptions::adopt_source_tensors).
  std::size_t tensors_adopted = 0, bytes_adopted = 0;
  // Of those copied, loaded as one byte range each instead of a copy_ each
  // (slices of a parameter that concatenates checkpoint tensors, such as
  // stacked experts, in gk::default_load's layout): one batched copy per
  // layer on a CUDA device, memcpy on a CPU.
  std::size_t tensors_batched = 0;
  // Of those received, the ones whose content hash the resident source's
  // scan took (adopted, or copied byte for byte): their bytes were read once.
  std::size_t hashes_from_scan = 0;
  std::size_t slots_zeroed = 0;      // init policy zero
  std::size_t drift = 0;             // captured addresses not covered after the reload (must be 0)
  std::size_t addresses_verified = 0;
  bool needs_recapture = false;
  bool staged = false;               // committed from a gk::StagedReload
  std::uint64_t weight_version = 0;  // the engine's weight version after this reload
  std::vector<std::string> mismatched;  // slot paths, when needs_recapture
  // Graphs destroyed while tracked: dropped before verification (untrack a
  // graph before destroying it, or destroy it after the engine).
  std::vector<std::string> graphs_destroyed;
  // What the engine serves after this reload (and what gk::load_weights
  // hands to ReloadEngine::prepare): every checkpoint tensor's content hash
  // and the content version (served_weights.h). Null when the content is
  // unknown (gk::testing::EngineHooks::skip_served_hashes).
  std::shared_ptr<const ServedWeights> served;
  // A weight patch (ReloadEngine::reload(const Patch&), stage(const Patch&)):
  // the checkpoint tensors it touched, the elements it changed, the patch's
  // payload bytes, the layers whose PWAL ran again (the rest were written by
  // the scatter alone), and the bytes the scatter wrote into captured storage.
  struct PatchStats {
    bool applied = false;
    std::size_t tensors = 0, elements = 0, payload_bytes = 0, layers_scattered = 0, layers_rerun = 0;
    std::size_t bytes_scattered = 0;
    std::size_t sectors_written = 0;  // whole 32-byte sectors (PatchWrites::sectors; the rest as elements)
    // Blocks of by_blocks() members recomputed in scattered layers (Note
    // [Declared derivations] in graphkeep/registry/role.h).
    std::size_t blocks_recomputed = 0;
    // Elements of by_layout() members written where their layouts put the
    // changed elements (Note [Layout derivations] in
    // graphkeep/model/block_derivation.h).
    std::size_t layout_elements = 0;
    bool sectors_declined = false;    // PatchWrites::automatic wrote elements: the images would not fit
    // Per layer that re-ran PWAL, "<layer>: <why>", the first reason found:
    // a derived slot without a declared derivation (Note [Declared
    // derivations] in graphkeep/registry/role.h), a parameter PWAL
    // transforms, a layer's own load_weight(), configuration checks off.
    std::vector<std::string> rerun_why;
    // Each touched layer's landing, in model order: the scatter (with the
    // derived blocks and layout elements it wrote) or a PWAL re-run (why).
    struct Landing {
      std::string layer;
      bool rerun = false;
      std::size_t blocks_recomputed = 0, layout_elements = 0;
      std::string why;  // rerun: the first reason found
    };
    std::vector<Landing> landings;
  } patch;
  PhaseTimes times;

  std::string summary() const;
};

}  // namespace gk
