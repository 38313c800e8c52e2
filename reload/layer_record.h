// reload/layer_record.h: what one load learns about a layer's checkpoint
// tensors: their content hashes, and how each parameter lands in captured
// storage (internal to the reload layer; served_state.h turns the records of
// a finished load into what the engine serves).
#pragma once

#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/hash_and_scan.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gk::detail {
class KnownHashes;  // known_hashes.h
}  // namespace gk::detail

namespace gk {

// Note [Patch landings]
// ~~~~~~~~~~~~~~~~~~~~~
// A patch is in checkpoint coordinates; the graphs read captured storage in
// kernel format. Each checkpoint parameter (a layer's parameter filled from
// one or more checkpoint tensors, model/layer.h) lands in one of two ways,
// decided afresh by every load that runs its layer's PWAL:
//   passthrough  its captured slot holds the checkpoint-format values bit for
//                bit, in default_load's layout: the tensors concatenated
//                along dim 0, each one's flat elements a contiguous range of
//                the parameter's. Proven, never assumed: every tensor of the
//                parameter went through default_load (or arrived as the
//                whole parameter), after PWAL the module's parameter is
//                still the tensor that was loaded (same storage and offset,
//                the checkpoint-format shape and dtype, contiguous), and its
//                bytes hash after PWAL as they hashed before. A plain module
//                (no PWAL) is passthrough by construction. The captured
//                storage is then the base a patch applies to, and a patch
//                entry is a scatter into it.
//   kept         anything else (PWAL made an FP8 or int4 weight from it and
//                let it go, a layer's own load_weight() placed it, PWAL wrote
//                it in place): its checkpoint-format values are gone from
//                captured storage. With ReloadOptions::patch_base the load
//                keeps them (per checkpoint tensor, whole) on the device or
//                in pinned host memory; without, the parameter has no base
//                and a patch touching its layer is refused, saying why.
// A kept base is the loaded parameter's own storage when PWAL left it
// intact and re-pointed the parameter elsewhere (no copy; a copy when the
// tensor was adopted from the source, or for pinned host), a copy of the
// delivered tensors when a load_weight() took them, and none when PWAL wrote
// the loaded parameter in place (its values before PWAL are gone).
struct ServedParam {
  bool passthrough = false;
  std::vector<at::Tensor> base;  // kept: per checkpoint tensor of the parameter, whole, checkpoint format
  std::string no_base;           // neither passthrough nor kept: why (for the refusal)
  std::size_t base_bytes() const;
};

// What one load (or a patch's re-run of a layer's PWAL) learned about one
// layer's checkpoint tensors (filled by record_loaded / record_after_pwal).
struct LayerRecord {
  bool recorded = false;
  std::vector<std::uint64_t> hashes;  // per checkpoint tensor: by parameter, then the parameter's tensors
  std::vector<std::pair<std::string, ServedParam>> params;    // full parameter names
  // Between the loads and PWAL: per parameter, the loaded tensor (a storage
  // view), whether a load_weight() took any of its tensors, and for those,
  // the delivered tensors made whole.
  std::vector<at::Tensor> loaded;
  std::vector<char> custom;
  std::vector<std::vector<at::Tensor>> delivered;
  std::vector<char> adopted;
  // The bytes of each checkpoint tensor, as loaded (until launch_loaded_hashes).
  std::vector<ContentRange> loaded_ranges;
  std::vector<std::size_t> loaded_at;  // loaded_ranges[k] is hashes[loaded_at[k]]
  // Hashes a streaming reload's scan of the source took (hashes[i] is
  // known->hash(k) for each {i, k}), filled in by record_loaded_hashes once
  // the scan has answered.
  std::shared_ptr<const detail::KnownHashes> known;
  std::vector<std::pair<std::size_t, std::size_t>> known_at;
  // Hashes still on the device: of the loaded tensors (until
  // record_loaded_hashes) and of what PWAL left (until
  // finish_record_after_pwal), with what the latter decides from.
  std::shared_ptr<PendingContentHashes> loaded_hashes, after_hashes;
  std::vector<char> candidate, rehash;
  // Parameters hashed after PWAL by the copy-back instead, as it copies them
  // into captured storage (Note [Hashing while copying] in
  // hashing/cuda/content_hash.cu; a streaming reload's): by_copy[pi], and the
  // copy's hashes, per such parameter in order, its tensors in order. Null
  // after a copy-back that could not take them all (finish_record_after_pwal
  // hashes them itself then).
  std::vector<char> by_copy;
  std::shared_ptr<detail::CopiedHashes> copied_hashes;
};

}  // namespace gk
