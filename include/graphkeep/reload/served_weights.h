// graphkeep/reload/served_weights.h
//
// What a ReloadEngine serves, by content: the content hash ("gk-sum64 v1",
// graphkeep/hashing/content_hash.h) of every checkpoint tensor as it was
// loaded (checkpoint format, before PWAL), recorded during the first load,
// every reload and stage, and every patch; and a content version that names
// the whole set. This is what a weight patch is checked against (its base
// hashes must be these), and what an RL loop logs to know which weights a
// replay computed with.
//
//   gk::ReloadReport first = gk::load_weights(model, source);   // hashes on the device, per layer
//   gk::ReloadEngine engine(model);
//   engine.prepare(first);                      // the first load's hashes go to the engine
//   std::shared_ptr<const gk::ServedWeights> s = engine.served();
//   s->hash("model.norm.weight");               // std::optional<std::uint64_t>
//   s->content_version();                       // the same for the same bytes, whatever led to them
//   s->label();                                 // "step-42": the patch's target, or ReloadOptions::version_label
//
// A ServedWeights never changes once made: the engine replaces its pointer
// when a reload or a commit changes what it serves (readable from any thread
// through ReloadEngine::served()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gk {

class ServedWeights {
 public:
  // The reload layer's record (reload/served_state.h): landings and kept bases.
  struct State;
  explicit ServedWeights(std::unique_ptr<State> state);
  ~ServedWeights();
  ServedWeights(const ServedWeights&) = delete;
  ServedWeights& operator=(const ServedWeights&) = delete;

  // The content hash of the served checkpoint tensor `name` (its full name,
  // as a source delivers it), or std::nullopt for a name the model does not
  // expect.
  std::optional<std::uint64_t> hash(std::string_view name) const;
  // Every checkpoint tensor with its hash, sorted by name (the list is made
  // on the first call: a reload keeps a hash per tensor, not a name).
  const std::vector<std::pair<std::string, std::uint64_t>>& hashes() const;
  // The content version: the content hash of the sorted (name, hash) pairs (Note
  // [Content versions] in reload/served_state.cpp). Equal content gives an
  // equal version, so weights A reloaded after B are recognised as A.
  std::uint64_t content_version() const noexcept;
  // The version id the weights were given: a patch's target_version, or the
  // ReloadOptions::version_label of the load that brought them; the engine
  // also recalls the label of a content version it served before. Empty when
  // none is known.
  const std::string& label() const noexcept;
  // Checkpoint-format bases kept for tensors that PWAL transforms
  // (ReloadOptions::patch_base): how many tensors, and their bytes.
  std::size_t kept_base_tensors() const noexcept;
  std::size_t kept_base_bytes() const noexcept;
  // "<label> (<16 hex digits>)", or the hex digits alone without a label.
  std::string describe() const;

  const State& state() const noexcept { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

}  // namespace gk
