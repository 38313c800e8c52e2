// reload/served_state.h: the record behind gk::ServedWeights, what one load
// learns about each layer's checkpoint tensors, and how a finished load
// turns into what the engine serves (internal to the reload layer).
#pragma once

#include "layer_run.h"
#include "run_options.h"
#include "served_names.h"

#include <graphkeep/reload/reload_options.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/reload/slot_plan.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gk {
namespace detail {
class CopiedFrom;  // copied_from.h
}

struct ServedWeights::State {
  // Every checkpoint tensor's hash, by its place in names' sorted order
  // (Note [Served names are the plan's] in served_names.h).
  std::shared_ptr<const detail::ServedNames> names;
  std::vector<std::uint64_t> values;
  std::map<std::string, ServedParam, std::less<>> params;  // by the parameter's full name
  std::string label;
  std::uint64_t content_version = 0;
  std::size_t kept_tensors = 0, kept_bytes = 0;
  // ServedWeights::hashes(), made on its first call.
  mutable std::once_flag listed;
  mutable std::vector<std::pair<std::string, std::uint64_t>> list;

  // Computes the content version and the kept-base totals.
  void finish();
  // The hash of `name`, or nullptr; `cursor` as in ServedNames::find.
  const std::uint64_t* find(std::string_view name, std::size_t* cursor = nullptr) const;
  std::uint64_t* find(std::string_view name, std::size_t* cursor = nullptr);
};

// The checkpoint tensors of `param` (in checkpoint format, cp's tensors
// concatenated along dim 0) as byte ranges of it, appended to `out`: what
// their content hashes read, with no view made per tensor (a MoE layer's
// parameters hold hundreds each; ContentRange in content_hash.h).
void append_tensor_ranges(const CheckpointParam& cp, const at::Tensor& param, std::vector<ContentRange>& out);

// After the layer's loads: which bytes hold each checkpoint tensor of the
// layer (byte ranges, gk::ContentRange: no view per tensor), into
// run.record. `targets`: the materialized checkpoint-format parameters;
// `custom[pi]`: a load_weight() took some tensor of parameter pi. Reads
// run.pending (the delivered tensors), so call it before they are dropped.
// `copied`: the loads' verbatim copies, whose hashes the source's scan took
// (Note [Hashes of verbatim copies] in copied_from.h).
void record_loaded(const LayerPlan& lp, LayerRun& run, const std::vector<at::Tensor>& targets,
                   const std::vector<char>& custom, const detail::RunOptions& o, ReloadReport& rep,
                   const detail::CopiedFrom& copied);
// Launches their hashes (one batched launch on the current stream,
// gk::PendingContentHashes), before PWAL, which may write the loaded
// tensors in place and runs after them in stream order.
// record_loaded_hashes() collects them (finish_record_after_pwal calls it).
void launch_loaded_hashes(LayerRun& run, ReloadReport& rep);
void record_loaded_hashes(LayerRun& run, ReloadReport& rep);
// After the layer's PWAL: which parameters are passthrough, and the bases
// kept for the others (Note [Patch landings]). In two halves: the first
// launches the hashes of the bytes PWAL left; finish_record_after_pwal()
// waits for them and decides (a streaming reload calls it a layer late:
// Note [Copy back one layer late]). `defer` false: both at once.
void record_after_pwal(const LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep,
                       bool defer = false);
void finish_record_after_pwal(const LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep);
// After the copy-back that hashed the by-copy parameters as it copied them
// (run.record.copied_hashes) was enqueued on the current stream: drops the
// record's references to those parameters' loaded storage, which
// finish_record_after_pwal will not read (their hashes come from the copy;
// a passthrough keeps no base), so that finishing the record later does
// not hold the layer's loads. Nothing when the copy-back took none.
void release_copied_loads(LayerRun& run);
// Whether finish_record_after_pwal would not wait for the device: every
// hash it collects is in (asked of their events; never blocks).
bool record_ready(const LayerRun& run);
// For the copy-back of dst[k] <- src[k]: the ranges of the parameters whose
// hashes after PWAL it takes as it copies (run.record.by_copy), with their
// destinations `to` in dst, and `taken[k]` for the pairs they cover. Empty
// (nothing taken) when some such parameter has no pair of its own bytes to
// copy: finish_record_after_pwal then hashes them itself.
std::vector<ContentRange> copy_hash_ranges(const LayerPlan& lp, LayerRun& run, const std::vector<at::Tensor>& dst,
                                           const std::vector<at::Tensor>& src, std::vector<char>& taken,
                                           std::vector<std::byte*>& to);

// What the engine serves after a load that ran every layer (the runs'
// records are moved out), or nullptr when a layer was not recorded (hashing
// off). `names`: the plan's (the runs' layers, in order). `label`:
// ReloadOptions::version_label.
std::unique_ptr<ServedWeights::State> served_from_runs(std::vector<LayerRun>& runs,
                                                       std::shared_ptr<const detail::ServedNames> names,
                                                       std::string label);

}  // namespace gk
