// The reload pipeline (see engine.h and docs/reload.md).
#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/copy_slots.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/replay.h>

#include "non_finite.h"
#include "reload_internal.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace gk {

std::string_view to_string(EngineState s) noexcept {
  switch (s) {
    case EngineState::unprepared: return "unprepared";
    case EngineState::ready: return "ready";
    case EngineState::inconsistent: return "inconsistent";
    case EngineState::needs_recapture: return "needs_recapture";
    case EngineState::drift: return "drift";
  }
  return "?";
}

namespace {

// The expected checkpoint tensors, indexed by full name.
struct Expected {
  std::size_t layer, param, tensor;
  std::size_t flat;  // index of this tensor within its layer's completion set
  std::vector<std::int64_t> shard_shape;
  at::ScalarType dtype;
  std::int64_t num_shards;
};
// A whole parameter delivered under its own name (weight_source.h): it counts
// as every checkpoint tensor of the parameter.
struct ExpectedParam {
  std::size_t layer, param;
  std::vector<std::size_t> flats;  // its tensors' indices in the layer's completion set
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
};
constexpr std::size_t kWholeParam = static_cast<std::size_t>(-1);  // LayerRun::Pending::tensor

bool same_storage_and_offset(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset();
}

at::Tensor find_module_tensor(torch::nn::Module& m, const PlannedSlot& s) { return detail::module_tensor(m, s); }

}  // namespace

// Note [Undo by storage]
// ~~~~~~~~~~~~~~~~~~~~~~
// Several slots can view one captured storage: an exact alias, a prefix or
// interior view (q, k and v of a fused QKV weight), a strided view. An undo
// log kept per *slot* (the old values of each slot swapped into its new
// tensor) breaks there: the second slot's new tensor may be a view of the
// storage the first swap has just filled with old values, and the second
// copy then writes old values into the captured storage while the report
// says the reload succeeded. So every undo is kept per *storage*: before
// anything of a reload may write a captured storage (PWAL, which may write
// in place into the tensors it is handed, or the commit), the whole storage
// is copied once; a rollback copies each back. Overlap between slots then
// cannot matter, and neither can the order in which slots are restored.
class StorageBackups {
 public:
  // Copies t's whole storage unless this log holds it already. No-op for an
  // undefined or empty tensor.
  void take(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    for (const Entry& e : entries_)
      if (e.key == key) return;
    at::Tensor bytes = at::empty({0}, t.options().dtype(at::kByte).requires_grad(false));
    bytes.set_(t.storage(), 0, {static_cast<std::int64_t>(t.storage().nbytes())}, {1});
    entries_.push_back({key, bytes, bytes.clone()});
  }
  // Writes every saved storage back (newest first) and forgets them.
  void restore() {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) it->storage.copy_(it->saved);
    entries_.clear();
  }
  void release() { entries_.clear(); }

 private:
  struct Entry {
    const void* key;
    at::Tensor storage;  // the whole captured storage, as bytes
    at::Tensor saved;    // its contents before the reload wrote it
  };
  std::vector<Entry> entries_;
};

// ---------------------------------------------------------------------------
// One reload: per-layer state, completion gate, commit and rollback
// ---------------------------------------------------------------------------
struct LayerRun {
  enum class Phase { waiting, processed, committed };
  Phase phase = Phase::waiting;
  bool detached = false;
  std::vector<std::vector<bool>> shards;  // completion set: [tensor][shard]
  std::size_t loaded = 0, expected = 0;
  struct Pending {
    std::size_t param, tensor;  // tensor: kWholeParam for a whole parameter
    std::int64_t shard;
    at::Tensor value;
    std::string name;  // as delivered
  };
  std::vector<Pending> pending;
  // Source tensors the layer's parameters adopted (Note [Adopting source
  // tensors]), with their version counters at adoption.
  struct Adopted {
    at::Tensor value, param;  // the source's tensor; the parameter that adopted it
    std::int64_t value_version, param_version;
    std::string name;
  };
  std::vector<Adopted> adopted;
  std::vector<std::shared_ptr<const void>> configs;  // snapshot, per PlannedConfig (null: did not resolve)
  std::vector<at::Tensor> current;                   // per slot: the post-PWAL tensor (a storage view)
  std::vector<char> mismatched;                      // per slot
  StorageBackups backups;                            // captured storages this layer may write, before it did
  bool pwal_unguarded = false;  // PWAL ran on writable captured storage without a backup (restore_in_place_writes off)
  std::vector<std::shared_ptr<const void>> configs_after;  // staged: the configuration values PWAL left
};

// Note [Staging copies]
// ~~~~~~~~~~~~~~~~~~~~~
// stage() must not write a byte of any captured storage, yet PWAL may write
// in place into every captured tensor it can reach (a declared member, a
// buffer it does not load, a view of a parameter's storage; Note [Undo by
// storage]). So before a layer's PWAL every location of its slots -- the
// module's parameter or buffer, every declared path -- that still points at
// a captured storage is pointed (set_data, so every holder of that handle
// follows) at the same view of a *copy* of that whole storage. One copy per
// storage for the whole stage: slots viewing one storage (alias, prefix,
// interior, strided, tied across layers) keep viewing one storage, so the
// layout and alias checks see what a reload would. The copy holds the old
// values where a slot of that storage is copy_new (graphs read weights and
// never write them, so copying them races with nothing; a buffer the graphs
// write must be declared zero or preserve); a storage whose slots are all zero or
// preserve (lock workspaces, scratch: the graphs write them while they
// replay) is copied as zeros instead of read, its value being the init
// policy's business. After the checks every post-PWAL tensor must lie
// outside the captured storages (else PWAL reached one through a handle that
// is no slot location and may have written what the graphs read: stage()
// refuses, writing the old values back from the copy of that storage, or,
// without one, refusing replay until a reload), the fields are pointed back at
// the captured tensors, and the post-PWAL tensors are the staged tensors.
// A copy PWAL left bitwise as it was (compared with a second copy taken with
// it, freed when stage() returns) is not staged: its slots commit "in place",
// as a reload commits a tensor PWAL did not touch, so a buffer the graphs
// write (a cache) is not reverted to its value at stage() time. Plain modules
// have no PWAL: nothing of theirs is redirected.
class StagingCopies {
 public:
  explicit StagingCopies(const SlotPlan& plan) {
    for (const LayerPlan& lp : plan.layers())
      for (const PlannedSlot& s : lp.slots) {
        if (!s.defined() || !s.captured.has_storage() || s.captured.storage().nbytes() == 0) continue;
        bool& copy = read_[key(s.captured)];
        copy = copy || s.role.effective_init() == Init::copy_new;
      }
  }
  bool captured(const at::Tensor& t) const { return t.defined() && t.has_storage() && read_.count(key(t)) > 0; }
  // Points t (one handle: a module tensor or a declared field) at the same
  // view of its storage's copy.
  void redirect(const at::Tensor& t) {
    const void* k = key(t);
    auto it = copies_.find(k);
    if (it == copies_.end()) {
      at::Tensor bytes = at::empty({0}, t.options().dtype(at::kByte).requires_grad(false));
      bytes.set_(t.storage(), 0, {static_cast<std::int64_t>(t.storage().nbytes())}, {1});
      const bool read = read_.at(k);
      const at::Tensor copy = read ? bytes.clone() : at::zeros_like(bytes);
      it = copies_.emplace(k, Copy{copy.storage(), read ? copy.clone() : at::Tensor(), copy, bytes}).first;
    }
    at::Tensor view = at::empty({0}, t.options().requires_grad(false));
    view.set_(it->second.storage, t.storage_offset(), t.sizes(), t.strides());
    t.set_data(view);
  }
  // After PWAL: true when t views a copy of captured values that PWAL left
  // bitwise unchanged.
  // Writes the captured values saved with the copy of t's (captured) storage
  // back into it; false when there is no such copy of its values.
  bool restore_captured(const at::Tensor& t) {
    auto it = copies_.find(key(t));
    if (it == copies_.end() || !it->second.before.defined()) return false;
    it->second.captured.copy_(it->second.before);
    return true;
  }
  bool untouched(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return false;
    if (untouched_.empty())
      for (const auto& [k, c] : copies_)
        untouched_.emplace(c.storage.unsafeGetStorageImpl(), c.before.defined() && at::equal(c.bytes, c.before));
    auto it = untouched_.find(t.storage().unsafeGetStorageImpl());
    return it != untouched_.end() && it->second;
  }

 private:
  static const void* key(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }
  struct Copy {
    at::Storage storage;  // what PWAL is handed
    at::Tensor before;    // its bytes as copied (undefined for a zero-filled copy)
    at::Tensor bytes;     // `storage` as bytes
    at::Tensor captured;  // the captured storage, as bytes
  };
  std::unordered_map<const void*, bool> read_;  // captured storage -> copy its values (else zeros)
  std::unordered_map<const void*, Copy> copies_;
  std::unordered_map<const void*, bool> untouched_;  // per copy's storage, filled after the last PWAL
};

// Waits for the calling thread's current stream on every non-CPU device the
// staged tensors live on. stage() and commit() may run on different threads,
// hence streams: the staged values must be complete before another stream's
// commit reads them, and the commit's copy must be done before the staged
// tensors go back to the caching allocator of the stream that made them
// (Note [Online reload threading]).
static void sync_staged_streams(const std::vector<LayerRun>& runs) {
  std::vector<c10::Device> devices;
  for (const LayerRun& run : runs)
    for (const at::Tensor& t : run.current)
      if (t.defined() && !t.device().is_cpu() &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
  for (const c10::Device& d : devices) c10::impl::VirtualGuardImpl(d.type()).getStream(d).synchronize();
}

namespace detail {
// What a StagedReload holds (staged_reload.h).
struct StagedState {
  ReloadEngine* engine = nullptr;  // null once the engine is destroyed
  std::vector<LayerRun> runs;      // per layer: the staged (post-PWAL) tensors and configuration values
  ReloadReport rep;
  ReloadOptions options;
  std::uint64_t base_version = 0, plan_generation = 0, graphs_generation = 0;
  std::string dropped;  // why the engine dropped it (prepare(), the engine destroyed); empty otherwise
  std::size_t bytes = 0;
  bool done = false;  // committed or aborted
};
}  // namespace detail

struct ReloadEngine::Impl {
  torch::nn::Module& model;
  ReloadOptions options;
  SlotPlan plan;
  // Atomic: the serving thread reads it (replay_allowed) while stage() runs
  // (Note [Online reload threading]).
  std::atomic<EngineState> state{EngineState::unprepared};
  // Written by the serving thread's calls, and by a stage() only under
  // reason_mu (which check_replay_allowed() takes).
  std::string reason;
  mutable std::mutex reason_mu;
  std::atomic<std::uint64_t> version{0};  // weight_version()
  // Bumped by prepare() and by track()/untrack(): a staged reload checked
  // against an older plan or set of graphs is stale.
  std::uint64_t plan_generation = 0, graphs_generation = 0;
  // The call that holds the engine now (nullptr: none), and the staged
  // reload that is outstanding; both under op_mu.
  std::mutex op_mu;
  const char* busy = nullptr;
  detail::StagedState* outstanding = nullptr;
  // A failed stage() could not point every field back at its captured tensor
  // (PWAL changed the object tree): the graphs still read untouched storage,
  // but the next reload() must run as a recovery.
  bool fields_unrestored = false;
  StagingCopies* staging = nullptr;  // set while stage() runs
  std::unordered_map<std::string, Expected> expected;
  std::unordered_map<std::string, ExpectedParam> expected_params;
  std::vector<std::size_t> expected_per_layer;
  struct Tracked {
    ReplayBackend* graph;  // valid only while `alive` has not expired
    std::weak_ptr<const void> alive;
    CaptureManifest manifest;
    // Why track() refused this graph (empty: it did not). The verdict lasts
    // as long as the graph is tracked (Note [Capture verdicts last]).
    std::string refused;
  };
  std::vector<Tracked> graphs;
  std::vector<StaticBuffer> io;
  std::vector<AddressRange> allowed;  // allow_address_range()
  bool initial = false;  // the first load (gk::load_weights): nothing captured, nothing to copy back

  Impl(torch::nn::Module& m, ReloadOptions o) : model(m), options(std::move(o)) {}

  void fault(const ReloadOptions& o, std::string_view stage, const std::string& layer) {
    if (o.fault_hook) o.fault_hook(stage, layer);
  }

  // Options that name slots must name real ones (a misspelt name would
  // silently protect nothing less, or nothing more, than the caller meant).
  // undeclared_members were checked by build_slot_plan (Note [Members treated
  // as undeclared] in slot_plan.cpp); they shape the plan, so only prepare()
  // can apply them.
  void validate(const ReloadOptions& o) const {
    for (const std::string& name : o.unprotected_slots)
      GK_CHECK(StateError, plan.find_slot(name) != nullptr,
               detail::unknown_slot_message(plan, "unprotected_slots", name));
    GK_CHECK(StateError, o.undeclared_members.empty() || o.undeclared_members == options.undeclared_members,
             "ReloadOptions::undeclared_members of a reload() call differ from the engine's: they shape the slot "
             "plan, which prepare() builds from the engine's options; leave them empty here (or repeat the "
             "engine's)");
  }

  void index_expected() {
    expected.clear();
    expected_per_layer.assign(plan.layers().size(), 0);
    for (std::size_t li = 0; li < plan.layers().size(); ++li) {
      const LayerPlan& lp = plan.layers()[li];
      for (std::size_t pi = 0; pi < lp.params.size(); ++pi)
        for (std::size_t ti = 0; ti < lp.params[pi].tensors.size(); ++ti) {
          const CheckpointTensor& t = lp.params[pi].tensors[ti];
          std::string full = lp.full_name(t.name);
          GK_CHECK(DeclarationError, !expected.count(full), "checkpoint tensor '", full,
                   "' is expected by two parameters; each checkpoint tensor loads into one place");
          expected.emplace(full, Expected{li, pi, ti, expected_per_layer[li], t.shard_shape(), t.dtype, t.num_shards});
          expected_per_layer[li] += 1;
        }
    }
    // Whole parameters, by their full names, where no checkpoint tensor has
    // that name (a plain module's "norm.weight" is both: it stays a tensor).
    expected_params.clear();
    for (std::size_t li = 0; li < plan.layers().size(); ++li) {
      const LayerPlan& lp = plan.layers()[li];
      for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
        std::string full = lp.full_name(lp.params[pi].param);
        if (expected.count(full)) continue;
        ExpectedParam ep{li, pi, {}, lp.params[pi].shape(), lp.params[pi].dtype()};
        for (const CheckpointTensor& t : lp.params[pi].tensors) ep.flats.push_back(expected.at(lp.full_name(t.name)).flat);
        expected_params.emplace(std::move(full), std::move(ep));
      }
    }
  }

  // --- per-layer steps --------------------------------------------------------
  void snapshot_and_detach(LayerPlan& lp, LayerRun& run, const ReloadOptions& o) {
    fault(o, "detach", lp.prefix);
    // The slots must still point at their captured storage: anything else is
    // drift that happened outside a reload.
    // After a failed reload left the model inconsistent, a path may not
    // resolve (PWAL changed the object tree): this reload's PWAL rebuilds it,
    // and check() reports it if it still does not resolve.
    const bool recovering = state == EngineState::inconsistent || fields_unrestored;
    for (const PlannedSlot& s : lp.slots) {
      if (initial || !s.defined()) continue;
      at::Tensor cur;
      if (s.kind == PlannedSlot::Kind::declared) {
        const at::Tensor* field = s.paths.front().resolve_tensor(lp.root.ptr);
        if (field == nullptr) {
          GK_CHECK(DriftError, recovering, s.name,
                   " no longer resolves before the reload started (the object tree changed shape at step ",
                   s.paths.front().broken_at(lp.root.ptr) + 1, " of ", s.paths.front().depth(),
                   " outside a reload); the captured graphs read stale memory: recapture and prepare() again");
          continue;
        }
        cur = *field;
      } else {
        cur = find_module_tensor(*lp.module, s);
      }
      GK_CHECK(DriftError, same_storage_and_offset(cur, s.captured), s.name,
               " no longer points at its captured storage before the reload started (something re-pointed it "
               "outside a reload); the captured graphs read stale memory: recapture and prepare() again");
    }
    run.configs.clear();
    for (const PlannedConfig& c : lp.configs) {
      void* p = c.path.resolve(lp.root.ptr);
      GK_CHECK(DriftError, p != nullptr || recovering, "configuration value ", c.name,
               " no longer resolves before the reload started (the object tree changed outside a reload): "
               "recapture and prepare() again");
      run.configs.push_back(p != nullptr ? c.ops->copy(p) : nullptr);
    }
    // Detach the checkpoint-format parameters from the captured storage (the
    // C++ counterpart of vLLM's move to the meta device: libtorch's set_data
    // cannot change a dense tensor's device, so an empty placeholder on the
    // same device holds no memory and fails loudly if anything reads it).
    for (const CheckpointParam& cp : lp.params) {
      at::Tensor t = find_param_or_buffer(*lp.module, cp.param);
      t.set_data(at::empty({0}, t.options().requires_grad(false)));
    }
    run.detached = true;
  }

  static at::Tensor find_param_or_buffer(torch::nn::Module& m, const std::string& name) {
    at::Tensor t = detail::module_parameter(m, name);
    if (!t.defined()) t = detail::module_buffer(m, name);
    GK_INTERNAL_ASSERT(t.defined(), "no parameter or buffer '", name, "'");
    return t;
  }

  void process(LayerPlan& lp, LayerRun& run, const ReloadOptions& o, ReloadReport& rep, const WeightSource& source) {
    {
      ScopedMsTimer t(rep.times.load_ms);
      fault(o, "load", lp.prefix);
      // Materialize fresh checkpoint-format parameters (each right before
      // its first load, so an adopted one holds no new storage) and replay
      // the loads, adopting what can be adopted (Note [Adopting source tensors]).
      const std::size_t n = lp.params.size();
      std::vector<at::Tensor> targets(n);
      std::vector<char> materialized(n, 0);
      auto handle = [&](std::size_t pi) -> at::Tensor& {
        if (!targets[pi].defined()) targets[pi] = find_param_or_buffer(*lp.module, lp.params[pi].param);
        return targets[pi];
      };
      auto device_of = [&](std::size_t pi) {
        const PlannedSlot* s = slot_named(lp, lp.params[pi].param);
        return s != nullptr && s->defined() ? s->device : handle(pi).device();
      };
      auto materialize = [&](std::size_t pi) -> at::Tensor& {
        at::Tensor& t = handle(pi);
        if (!materialized[pi]) {
          const CheckpointParam& cp = lp.params[pi];
          t.set_data(at::empty(cp.shape(), at::TensorOptions().dtype(cp.dtype()).device(device_of(pi))));
          materialized[pi] = 1;
        }
        return t;
      };
      const bool adopt = !initial && o.adopt_source_tensors;
      for (LayerRun::Pending& p : run.pending) {
        const CheckpointParam& cp = lp.params[p.param];
        if (p.tensor == kWholeParam) {  // the parameter as its loaders would fill it
          if (!(adopt && try_adopt(lp, run, p, handle(p.param), device_of(p.param), rep)))
            materialize(p.param).copy_(p.value);
          materialized[p.param] = 1;
          continue;
        }
        // The layer's own loader first (it needs its target materialized); a
        // plain module has none, so its parameter is adopted before allocating.
        if (lp.layer != nullptr && lp.layer->load_weight({cp, p.tensor, p.shard, p.value, materialize(p.param)}))
          continue;
        const bool whole = cp.tensors.size() == 1 && cp.tensors.front().num_shards == 1;
        if (adopt && whole && try_adopt(lp, run, p, handle(p.param), device_of(p.param), rep)) {
          materialized[p.param] = 1;
          continue;
        }
        default_load({cp, p.tensor, p.shard, p.value, materialize(p.param)});
      }
      for (std::size_t pi = 0; pi < n; ++pi) materialize(pi);
      run.pending.clear();
    }
    if (!o.allow_non_finite) {
      ScopedMsTimer t(rep.times.finite_ms);
      refuse_non_finite(lp, source);
    }
    // PWAL may write into the captured tensors it can reach (declared
    // members, buffers it does not load, views of a parameter's storage):
    // see Note [Undo by storage].
    if (!initial && staging != nullptr && lp.layer != nullptr) {
      // Note [Staging copies]: PWAL gets copies of the captured storages.
      for (const PlannedSlot& sl : lp.slots) {
        if (!sl.defined()) continue;
        if (sl.kind != PlannedSlot::Kind::declared) {
          const at::Tensor t = find_module_tensor(*lp.module, sl);
          if (staging->captured(t)) staging->redirect(t);
        }
        for (const SlotPath& path : sl.paths)
          if (const at::Tensor* f = path.resolve_tensor(lp.root.ptr); f != nullptr && staging->captured(*f))
            staging->redirect(*f);
      }
    } else if (!initial) {
      if (o.restore_in_place_writes) {
        for (const PlannedSlot& sl : lp.slots)
          if (pwal_can_write(lp, sl)) run.backups.take(sl.captured);
      } else {
        for (const PlannedSlot& sl : lp.slots) run.pwal_unguarded = run.pwal_unguarded || pwal_can_write(lp, sl);
      }
    }
    {
      ScopedMsTimer t(rep.times.pwal_ms);
      fault(o, "pwal", lp.prefix);
      if (lp.layer != nullptr) lp.layer->process_weights_after_loading();
      for (const LayerRun::Adopted& a : run.adopted)
        GK_CHECK(WeightError, a.value._version() == a.value_version && a.param._version() == a.param_version,
                 "PWAL of layer '", lp.prefix, "' wrote weight '", a.name,
                 "' in place, but the reload had adopted that tensor from the source instead of copying it "
                 "(ReloadOptions::adopt_source_tensors): the source's tensor now holds PWAL's output, not the "
                 "checkpoint's values. The reload stops here; reload this model with adopt_source_tensors off, "
                 "from a source that still holds the checkpoint's values");
    }
    if (!initial) {
      ScopedMsTimer t(rep.times.check_ms);
      fault(o, "check", lp.prefix);
      check(lp, run, o, rep);
      if (staging != nullptr && lp.layer != nullptr) {
        for (std::size_t i = 0; i < lp.slots.size(); ++i) {
          if (!staging->captured(run.current[i])) continue;
          // PWAL reached what the graphs read: write the old values back
          // where the stage holds them, else refuse replay.
          const bool restored = staging->restore_captured(run.current[i]);
          if (!restored) {
            std::lock_guard<std::mutex> lock(reason_mu);
            state = EngineState::inconsistent;
            reason = concat("a failed stage() let PWAL of layer '", lp.prefix, "' write the captured storage of ",
                            lp.slots[i].name, " through a handle that is no slot location; reload() to recover");
          }
          GK_THROW(StateError, "stage(): after PWAL of layer '", lp.prefix, "', ", lp.slots[i].name,
                   " views a captured storage through a handle that is no slot location (an opaque or undeclared "
                   "member?), so PWAL may have written what the graphs read; ",
                   restored ? "its captured values were written back (replays during the stage may have read the "
                              "new ones)"
                            : "replay is refused until a reload() succeeds",
                   ". Declare that member with a graph-visible role, or use reload()");
        }
      }
    }
    run.phase = LayerRun::Phase::processed;
    if (!initial && o.after_layer) o.after_layer(lp.prefix);
  }

  // Throws gk::WeightError naming the first checkpoint tensor of the layer
  // that holds a NaN or an infinity (Note [Refusing non-finite weights] in
  // non_finite.cpp). Reads the checkpoint-format parameters, as loaded.
  void refuse_non_finite(LayerPlan& lp, const WeightSource& source) {
    std::vector<at::Tensor> params;
    params.reserve(lp.params.size());
    for (const CheckpointParam& cp : lp.params) params.push_back(find_param_or_buffer(*lp.module, cp.param));
    const std::vector<std::int64_t> first = detail::first_non_finite(params);
    for (std::size_t pi = 0; pi < params.size(); ++pi) {
      if (first[pi] < 0) continue;
      const CheckpointParam& cp = lp.params[pi];
      const at::Tensor& t = params[pi];
      // The checkpoint tensor holding that element: they are concatenated
      // along dim 0 (model/layer.h).
      const std::int64_t row = t.dim() > 0 && t.size(0) > 0 ? first[pi] / (t.numel() / t.size(0)) : 0;
      std::size_t ti = 0;
      for (std::int64_t begin = 0; ti + 1 < cp.tensors.size(); ++ti) {
        begin += cp.tensors[ti].shape.empty() ? 1 : cp.tensors[ti].shape.front();
        if (row < begin) break;
      }
      const double value = t.reshape({-1})[first[pi]].item<double>();
      const std::string name = cp.tensors.empty() ? lp.full_name(cp.param) : lp.full_name(cp.tensors[ti].name);
      GK_THROW(WeightError, "weight '", name, "' from ", source.describe(), " holds a non-finite value (", value,
               " at element ", first[pi], " of parameter '", lp.full_name(cp.param), "' ", t.sizes(),
               "): refused, the served weights are unchanged. A diverged trainer writes such checkpoints; to serve "
               "them anyway, set ReloadOptions::allow_non_finite");
    }
  }

  // Note [Adopting source tensors]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A reload copies every byte twice: the load copies the source's tensor
  // into a fresh parameter, the commit copies PWAL's result into the
  // captured storage. Where PWAL leaves a parameter as it is (a bf16 weight
  // the kernels read directly) the first copy buys nothing when the source
  // already holds the bytes on the right device: a trainer on the same GPU
  // handing over its tensors. With ReloadOptions::adopt_source_tensors the
  // parameter *is* the source's tensor for the reload (set_data: every handle
  // the layer holds follows), PWAL reads it, and the commit copies it into
  // the captured storage once. Adopted only when nothing could tell the
  // difference from a copy:
  //   - the parameter arrives in one piece (one unsharded checkpoint tensor
  //     that the layer's load_weight() declined, or the whole parameter
  //     under its own name) with its exact shape, dtype and device;
  //   - contiguous, as a fresh parameter is (kernels may assume it);
  //   - not an inference tensor (it has no version counter, below);
  //   - not inside a captured storage (a source handing back the engine's
  //     own weights): PWAL writing it would write what the graphs read.
  // The hazard is a write: PWAL that scales or permutes its parameter in
  // place would write the trainer's tensor. Both version counters (the
  // source tensor's, shared with its views and detach(), and the
  // parameter's own, which set_data keeps) are recorded at adoption and
  // compared after PWAL: a write is a gk::WeightError naming the weight
  // (the values were already written; the error says so, and the reload
  // stops before anything reaches the captured storage of that layer). A
  // write through a raw pointer (a custom kernel, .data, from_blob) moves no
  // counter and is not seen: adopt only for models whose PWAL leaves its
  // inputs alone. For a stage(), the source's tensors are held until the
  // commit; one whose counter moved since (the trainer stepped) makes the
  // commit stale.
  bool try_adopt(const LayerPlan& lp, LayerRun& run, const LayerRun::Pending& p, at::Tensor& param,
                 c10::Device device, ReloadReport& rep) const {
    const CheckpointParam& cp = lp.params[p.param];
    const at::Tensor& v = p.value;
    if (v.device() != device || v.scalar_type() != cp.dtype() || !v.sizes().equals(cp.shape()) ||
        !v.is_contiguous() || v.is_inference() || v.nbytes() == 0)
      return false;
    const auto begin = reinterpret_cast<std::uintptr_t>(v.data_ptr());
    if (plan.find_owner(begin) || plan.find_owner(begin + v.nbytes() - 1)) return false;
    param.set_data(v.detach());
    run.adopted.push_back({v, param, v._version(), param._version(), p.name});
    rep.tensors_adopted += 1;
    rep.bytes_adopted += v.nbytes();
    return true;
  }

  // True when PWAL can reach slot s's captured storage: a declared member, a
  // buffer or parameter the checkpoint does not fill (not detached), or a
  // detached parameter that a declared member holds through its own handle.
  static bool pwal_can_write(const LayerPlan& lp, const PlannedSlot& s) {
    if (!s.defined()) return false;
    if (s.kind == PlannedSlot::Kind::declared) return true;
    const bool loaded = std::any_of(lp.params.begin(), lp.params.end(),
                                    [&](const CheckpointParam& cp) { return cp.param == s.local; });
    if (!loaded) return true;
    for (std::size_t a = 1; a < s.originals.size(); ++a)
      if (s.originals[a].defined() && !s.originals[a].is_same(s.originals.front())) return true;
    return false;
  }

  static const PlannedSlot* slot_named(const LayerPlan& lp, const std::string& local) {
    for (const PlannedSlot& s : lp.slots)
      if (s.kind != PlannedSlot::Kind::declared && s.local == local) return &s;
    return nullptr;
  }

  void check(LayerPlan& lp, LayerRun& run, const ReloadOptions& o, ReloadReport& rep) {
    std::vector<std::string> problems, paths;
    run.current.assign(lp.slots.size(), at::Tensor());
    run.mismatched.assign(lp.slots.size(), 0);
    for (std::size_t i = 0; i < lp.slots.size(); ++i) {
      const PlannedSlot& s = lp.slots[i];
      at::Tensor cur;
      std::vector<std::string> diff;
      if (s.kind == PlannedSlot::Kind::declared) {
        at::Tensor* field = s.paths.front().resolve_tensor(lp.root.ptr);
        if (field == nullptr) {
          const std::size_t at = s.paths.front().broken_at(lp.root.ptr);
          diff.push_back(concat("path no longer resolves after PWAL (the object tree changed shape at step ", at + 1,
                             " of ", s.paths.front().depth(), ")"));
        } else {
          cur = *field;
        }
      } else {
        cur = find_module_tensor(*lp.module, s);
        if (!cur.defined() && s.defined()) diff.push_back("was removed by PWAL");
      }
      if (diff.empty()) diff = detail::layout_differences(s, cur);
      // aliases must still share one storage region
      for (std::size_t a = s.kind == PlannedSlot::Kind::declared ? 1 : 0; diff.empty() && a < s.paths.size(); ++a) {
        at::Tensor* f = s.paths[a].resolve_tensor(lp.root.ptr);
        if (f == nullptr || (cur.defined() && !same_region(*f, cur)))
          diff.push_back(concat("alias ", lp.full_name(s.paths[a].str()), " no longer shares storage with it"));
      }
      if (!diff.empty()) {
        std::string d;
        for (const auto& x : diff) d += (d.empty() ? "" : ", ") + x;
        problems.push_back(concat(s.name, ": ", d));
        paths.push_back(s.name);
        run.mismatched[i] = 1;
        continue;
      }
      run.current[i] = detail::storage_view(cur);
    }
    if (o.check_configs) {
      for (std::size_t c = 0; c < lp.configs.size(); ++c) {
        const PlannedConfig& pc = lp.configs[c];
        void* p = pc.path.resolve(lp.root.ptr);
        if (p == nullptr) {
          problems.push_back(concat(pc.name, ": configuration path no longer resolves after PWAL"));
          paths.push_back(pc.name);
        } else if (const void* before = run.configs[c] != nullptr ? run.configs[c].get() : pc.captured.get();
                   !pc.ops->equal(p, before)) {
          problems.push_back(concat(pc.name, ": configuration value changed ", pc.ops->repr(before), " -> ",
                                 pc.ops->repr(p), " (a captured kernel may have taken it by value)"));
          paths.push_back(pc.name);
        }
      }
    }
    if (problems.empty()) return;
    if (o.on_mismatch == MismatchPolicy::raise) {
      std::string msg = concat("PWAL of layer '", lp.prefix, "' changed ", problems.size(),
                            " captured slot(s); the captured graphs cannot be kept (recapture, or reload with "
                            "MismatchPolicy::needs_recapture):");
      for (const auto& p : problems) msg += "\n  " + p;
      ::gk::detail::fail<MismatchError>(__func__, __FILE__, __LINE__, std::move(msg), std::move(paths));
    }
    rep.needs_recapture = true;
    rep.mismatched.insert(rep.mismatched.end(), paths.begin(), paths.end());
  }

  bool unprotected(const ReloadOptions& o, const PlannedSlot& s) const {
    return std::find(o.unprotected_slots.begin(), o.unprotected_slots.end(), s.name) != o.unprotected_slots.end();
  }

  // Points every location of slot s back at its captured storage.
  void repoint(LayerPlan& lp, const PlannedSlot& s) {
    const at::Tensor& C = s.captured;
    std::size_t first_path_location = 0;
    if (s.kind != PlannedSlot::Kind::declared) {
      at::Tensor P = find_module_tensor(*lp.module, s);
      if (P.defined() && C.defined() && !same_region(P, C)) P.set_data(C);
      const at::Tensor& orig = s.originals.front();
      if (orig.defined() && C.defined() && !orig.is_same(P) && !same_region(orig, C)) orig.set_data(C);
      first_path_location = 1;
    }
    for (std::size_t a = 0; a < s.paths.size(); ++a) {
      at::Tensor* field = s.paths[a].resolve_tensor(lp.root.ptr);
      if (field == nullptr) continue;  // reported by check()
      const at::Tensor& orig = s.originals[first_path_location + a];
      if (orig.defined() && C.defined() && !same_region(orig, C)) orig.set_data(C);
      *field = orig;
    }
  }

  // `staged`: the commit of a StagedReload, whose caller ran the "copy"
  // faults first and keeps no undo (Note [Online reload threading]).
  void commit(LayerPlan& lp, LayerRun& run, const ReloadOptions& o, ReloadReport& rep, bool staged = false) {
    if (initial) {
      run.phase = LayerRun::Phase::committed;
      return;
    }
    ScopedMsTimer t(rep.times.copy_ms);
    if (!staged) fault(o, "copy", lp.prefix);
    // Transactional: every captured storage this commit writes is saved
    // first, so a later failure can undo it (Note [Undo by storage]).
    const bool undoable = !staged && o.mode == ReloadMode::transactional;
    std::vector<at::Tensor> dst, src, zero;
    for (std::size_t i = 0; i < lp.slots.size(); ++i) {
      PlannedSlot& s = lp.slots[i];
      if (run.mismatched[i] || unprotected(o, s)) continue;
      const at::Tensor& C = s.captured;
      const at::Tensor& N = run.current[i];
      if (!C.defined()) continue;
      const Init init = s.role.effective_init();
      const bool in_place = same_storage_and_offset(N, C);
      if (init == Init::copy_new && !in_place) {
        dst.push_back(C);
        src.push_back(N);
        rep.bytes_copied += C.nbytes();
      } else if (init == Init::zero) {
        zero.push_back(C);
        rep.slots_zeroed += 1;
      }
    }
    if (undoable) {
      for (const at::Tensor& C : dst) run.backups.take(C);
      for (const at::Tensor& C : zero) run.backups.take(C);
    }
    // Zero first, then copy: where a zeroed slot overlaps a copied one, the
    // copied value wins, as it did when each slot was written on its own.
    for (const at::Tensor& C : zero) C.zero_();
    if (!dst.empty()) copy_slots(dst, src);  // one launch for the CUDA slots
    for (const PlannedSlot& s : lp.slots) {
      const std::size_t i = static_cast<std::size_t>(&s - lp.slots.data());
      if (run.mismatched[i] || unprotected(o, s)) continue;
      repoint(lp, s);
    }
    run.current.clear();
    if (!undoable) run.backups.release();
    run.phase = LayerRun::Phase::committed;
  }

  // Points the layer's fields back at their captured storage and restores
  // its values and configuration. Returns false when something could not be
  // restored (the model is then inconsistent).
  bool rollback(LayerPlan& lp, LayerRun& run) {
    bool ok = !run.pwal_unguarded;
    run.backups.restore();
    for (const PlannedSlot& s : lp.slots) {
      for (const SlotPath& p : s.paths) ok = ok && p.resolve_tensor(lp.root.ptr) != nullptr;
      repoint(lp, s);
    }
    for (std::size_t c = 0; c < lp.configs.size(); ++c) {
      void* p = lp.configs[c].path.resolve(lp.root.ptr);
      if (p == nullptr) {
        ok = false;
        continue;
      }
      const bool snapped = c < run.configs.size() && run.configs[c] != nullptr;
      lp.configs[c].ops->assign(p, snapped ? run.configs[c].get() : lp.configs[c].captured.get());
    }
    run.pending.clear();
    run.current.clear();
    return ok;
  }

  // Drops the tracked graphs that were destroyed; returns their names.
  std::vector<std::string> drop_destroyed() {
    std::vector<std::string> names;
    for (const Tracked& g : graphs)
      if (g.alive.expired()) names.push_back(g.manifest.graph_name());
    std::erase_if(graphs, [](const Tracked& g) { return g.alive.expired(); });
    return names;
  }

  // Note [Capture verdicts last]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // track() refuses a graph the manifest cannot vouch for (Note [Fail closed
  // at capture]). Verification after a reload re-checks the addresses a
  // manifest recorded, and a manifest that recorded nothing, or only static
  // I/O, passes that check trivially: if the refusal lived only in the
  // engine's state, the next successful reload() or commit() would set the
  // state back to ready and the refused graph would replay the old weights'
  // output. So the verdict is kept with the tracked graph, and every reload,
  // stage and commit that would make the engine ready fails closed while a
  // refused graph is tracked. It ends with the graph: untrack() it (or
  // recapture and prepare() again, which drops every graph).
  std::string capture_refusals() const {
    std::string all;
    for (const Tracked& g : graphs)
      if (!g.refused.empty() && !g.alive.expired()) all += (all.empty() ? "" : "\n") + g.refused;
    return all;
  }

  VerifyResult verify_all() const {
    VerifyResult all;
    CaptureManifest::SlotVerdicts verdicts(plan);  // one per slot for every graph: Note [Verify once per slot]
    for (const Tracked& g : graphs) {
      if (g.alive.expired()) continue;  // destroyed: nothing can replay it
      VerifyResult r = g.manifest.verify(plan, verdicts);
      all.checked += r.checked;
      all.issues.insert(all.issues.end(), r.issues.begin(), r.issues.end());
    }
    return all;
  }

  ReloadReport new_report(const ReloadOptions& o) const {
    ReloadReport rep;
    rep.mode = o.mode;
    rep.layers = plan.layers().size();
    rep.slots_tracked = plan.num_slots();
    rep.declared_slots = plan.num_declared_slots();
    return rep;
  }
  std::vector<LayerRun> new_runs() const {
    std::vector<LayerRun> runs(plan.layers().size());
    for (std::size_t li = 0; li < runs.size(); ++li) {
      runs[li].expected = expected_per_layer[li];
      runs[li].shards.resize(expected_per_layer[li]);
    }
    for (const auto& [name, e] : expected) runs[e.layer].shards[e.flat].assign(e.num_shards, false);
    return runs;
  }
  // For a message about checkpoint tensor e: the name of its parameter
  // delivered whole, which may be how it came before.
  std::string whole_note(const Expected& e) const {
    const LayerPlan& lp = plan.layers()[e.layer];
    const std::string full = lp.full_name(lp.params[e.param].param);
    return expected_params.count(full) ? concat(" (or as part of parameter '", full, "', delivered whole)")
                                       : std::string();
  }
  static void count_loaded(LayerRun& run) {
    std::size_t done = 0;
    for (const auto& s : run.shards)
      done += std::all_of(s.begin(), s.end(), [](bool b) { return b; }) ? 1 : 0;
    run.loaded = done;
  }
  // A whole parameter arrived under its name: it fills every shard of every
  // checkpoint tensor of the parameter, none of which may arrive as well.
  void deliver_whole(const ExpectedParam& ep, NamedTensor&& nt, WeightSource& source, std::vector<LayerRun>& runs,
                     ReloadReport& rep) {
    LayerRun& run = runs[ep.layer];
    const CheckpointParam& cp = plan.layers()[ep.layer].params[ep.param];
    GK_CHECK(WeightError, nt.shard == 0, "parameter '", nt.name, "' arrived as shard ", nt.shard,
             ": a whole parameter arrives in one piece (shard 0); deliver its checkpoint tensors to send shards");
    bool any = false;
    for (std::size_t f : ep.flats)
      for (bool b : run.shards[f]) any = any || b;
    GK_CHECK(WeightError, run.phase == LayerRun::Phase::waiting && !any, "parameter '", nt.name,
             "' was delivered whole by ", source.describe(),
             ", but some of its checkpoint tensors were delivered too (or it came twice); a parameter loads "
             "exactly once, whole or as its checkpoint tensors (", cp.tensors.size(), ")");
    GK_CHECK(WeightError, nt.value.defined(), "parameter '", nt.name, "' is an undefined tensor");
    GK_CHECK(WeightError, nt.value.sizes().equals(ep.shape), "parameter '", nt.name, "' (delivered whole) has shape ",
             nt.value.sizes(), " but the model expects ", at::IntArrayRef(ep.shape),
             " (the checkpoint-format parameter: its checkpoint tensors concatenated along dim 0)");
    GK_CHECK(WeightError, nt.value.scalar_type() == ep.dtype, "parameter '", nt.name, "' has dtype ",
             nt.value.scalar_type(), " but the model expects ", ep.dtype);
    for (std::size_t f : ep.flats) run.shards[f].assign(run.shards[f].size(), true);
    rep.tensors_loaded += 1;
    rep.bytes_loaded += nt.value.nbytes();
    run.pending.push_back({ep.param, kWholeParam, 0, std::move(nt.value), std::move(nt.name)});
    count_loaded(run);
  }
  // Everything before the commit: detach, then per layer load, PWAL, check
  // (and in streaming mode its commit), the completion gate, and in
  // transactional mode the "commit" faults and before_commit: the
  // stage/commit boundary. stage() is this with StagingCopies set (Note
  // [Staging copies]).
  void run_until_commit(WeightSource& source, const ReloadOptions& o, std::vector<LayerRun>& runs, ReloadReport& rep,
                        bool& any_committed);
  // Rolls back every layer a failed reload (or stage) touched; false when
  // something could not be restored.
  bool rollback_all(std::vector<LayerRun>& runs, const ReloadOptions& o) {
    // Roll back every layer that has not committed; in transactional mode
    // also undo the commits of this reload (the swap log).
    // Newest first: where layers share a storage (tied weights), the oldest
    // saved contents are written last (Note [Undo by storage]).
    bool restored = true;
    for (std::size_t li = runs.size(); li-- > 0;) {
      LayerRun& run = runs[li];
      const bool undoable = o.mode == ReloadMode::transactional;
      if (!run.detached) continue;
      if (run.phase != LayerRun::Phase::committed || undoable) restored = rollback(plan.layers()[li], run) && restored;
    }
    return restored;
  }
  // After the weights were written: the new state, the weight version, the
  // verification of the tracked graphs.
  ReloadReport finish(ReloadReport& rep, const ReloadOptions& o, const Stopwatch& total);
  ReloadReport run_reload(WeightSource& source, const ReloadOptions& o);

  void untrack(const ReplayBackend& graph) {
    // A destroyed graph's address may be reused by `graph`: compare only live ones.
    drop_destroyed();
    std::erase_if(graphs, [&](const Tracked& t) { return t.graph == &graph; });
    graphs_generation += 1;
  }

  // Holds the engine for one call: refuses it while another call holds it
  // (a stage() running on the staging thread) and, with refuse_outstanding,
  // while a staged reload is outstanding. Note [Online reload threading].
  class Busy {
   public:
    Busy(Impl& impl, const char* what, bool refuse_outstanding = false) : impl_(impl) {
      std::lock_guard<std::mutex> lock(impl.op_mu);
      GK_CHECK(StateError, impl.busy == nullptr, what, " while ", impl.busy,
               " is running on another thread: one call at a time per engine (only graph replay may run while "
               "stage() does; Note [Online reload threading]); call it after ", impl.busy, " has returned");
      GK_CHECK(StateError, !refuse_outstanding || impl.outstanding == nullptr, what,
               " while a staged reload is outstanding (staged at weight version ",
               impl.outstanding != nullptr ? impl.outstanding->base_version : 0,
               "): commit it (ReloadEngine::commit) or abort() it first; one staged reload per engine at a time, "
               "and ", what, " would make it stale");
      impl.busy = what;
    }
    ~Busy() {
      std::lock_guard<std::mutex> lock(impl_.op_mu);
      impl_.busy = nullptr;
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    Impl& impl_;
  };
  // Drops the outstanding staged reload, releasing its tensors; its commit()
  // is then refused with `why`. The caller holds op_mu.
  void drop_outstanding(std::string why, bool engine_gone) {
    if (outstanding == nullptr) return;
    outstanding->dropped = std::move(why);
    outstanding->runs.clear();
    outstanding->bytes = 0;
    if (engine_gone) outstanding->engine = nullptr;
    outstanding = nullptr;
  }
  // Fails closed before a staged commit writes anything: every slot must
  // still point at its captured storage.
  void check_fields_captured(LayerPlan& lp) {
    for (const PlannedSlot& s : lp.slots) {
      if (!s.defined()) continue;
      at::Tensor cur;
      if (s.kind == PlannedSlot::Kind::declared) {
        if (const at::Tensor* f = s.paths.front().resolve_tensor(lp.root.ptr)) cur = *f;
      } else {
        cur = find_module_tensor(*lp.module, s);
      }
      GK_CHECK(StateError, same_storage_and_offset(cur, s.captured), "commit refused, nothing was changed: ", s.name,
               " no longer points at its captured storage (something re-pointed it, or rebuilt its object, between "
               "stage() and commit()): abort() the staged reload; if the graphs may read stale memory, recapture "
               "and prepare() again");
    }
  }
};

ReloadReport ReloadEngine::Impl::run_reload(WeightSource& source, const ReloadOptions& o) {
  GK_CHECK(StateError, state != EngineState::unprepared,
           "ReloadEngine::reload() before prepare(): call prepare() after the first load and PWAL, "
           "before capturing graphs");
  GK_CHECK(StateError, state != EngineState::needs_recapture, "reload refused: ", reason);
  if (!initial) validate(o);
  at::NoGradGuard no_grad;
  const Stopwatch total;
  ReloadReport rep = new_report(o);
  std::vector<LayerRun> runs = new_runs();
  bool any_committed = false;
  try {
    run_until_commit(source, o, runs, rep, any_committed);
    if (o.mode == ReloadMode::transactional)
      for (std::size_t li = 0; li < runs.size(); ++li) commit(plan.layers()[li], runs[li], o, rep);
  } catch (...) {
    const bool restored = rollback_all(runs, o);
    if (!restored || (o.mode == ReloadMode::streaming && any_committed)) {
      state = EngineState::inconsistent;
      reason = !restored ? "a failed reload could not restore every slot (PWAL changed the object tree, or wrote "
                           "captured tensors with ReloadOptions::restore_in_place_writes off)"
                         : "a streaming reload failed after some layers were committed: the model mixes old and "
                           "new weights";
      if (!initial) version.fetch_add(1, std::memory_order_acq_rel);  // the weights the graphs read changed
    }
    throw;
  }
  fields_unrestored = false;
  return finish(rep, o, total);
}

void ReloadEngine::Impl::run_until_commit(WeightSource& source, const ReloadOptions& o, std::vector<LayerRun>& runs,
                                          ReloadReport& rep, bool& any_committed) {
  {
    ScopedMsTimer t(rep.times.detach_ms);
    for (std::size_t li = 0; li < runs.size(); ++li) snapshot_and_detach(plan.layers()[li], runs[li], o);
  }
  auto finish_layer = [&](std::size_t li) {
    process(plan.layers()[li], runs[li], o, rep, source);
    if (o.mode == ReloadMode::streaming) {
      commit(plan.layers()[li], runs[li], o, rep);
      any_committed = true;
    }
  };
  // Layers without checkpoint tensors (PWAL-only) are complete at once.
  for (std::size_t li = 0; li < runs.size(); ++li)
    if (runs[li].expected == 0) finish_layer(li);

  while (true) {
    std::optional<NamedTensor> nt;
    {
      ScopedMsTimer t(rep.times.load_ms);
      nt = source.next();
    }
    if (!nt) break;
    auto it = expected.find(nt->name);
    if (it == expected.end()) {
      auto wp = expected_params.find(nt->name);
      GK_CHECK(WeightError, wp != expected_params.end(), source.describe(), " has weight '", nt->name,
               "', which the model does not expect (no layer lists it among its checkpoint tensors, and no "
               "parameter has that name)");
      deliver_whole(wp->second, std::move(*nt), source, runs, rep);
      if (runs[wp->second.layer].loaded == runs[wp->second.layer].expected) finish_layer(wp->second.layer);
      continue;
    }
    const Expected& e = it->second;
    LayerRun& run = runs[e.layer];
    GK_CHECK(WeightError, nt->shard >= 0 && nt->shard < e.num_shards, "weight '", nt->name, "' shard ",
             nt->shard, " is out of range: the model expects ", e.num_shards, " shard(s)");
    GK_CHECK(WeightError, run.phase == LayerRun::Phase::waiting && !run.shards[e.flat][nt->shard],
             "weight '", nt->name, "'", e.num_shards > 1 ? concat(" shard ", nt->shard) : std::string(),
             " was delivered twice by ", source.describe(), whole_note(e),
             "; each checkpoint tensor loads exactly once");
    GK_CHECK(WeightError, nt->value.defined(), "weight '", nt->name, "' is an undefined tensor");
    GK_CHECK(WeightError, nt->value.sizes().equals(e.shard_shape), "weight '", nt->name, "'",
             e.num_shards > 1 ? concat(" shard ", nt->shard) : std::string(), " has shape ", nt->value.sizes(),
             " but the model expects ", at::IntArrayRef(e.shard_shape));
    GK_CHECK(WeightError, nt->value.scalar_type() == e.dtype, "weight '", nt->name, "' has dtype ",
             nt->value.scalar_type(), " but the model expects ", e.dtype);
    run.shards[e.flat][nt->shard] = true;
    rep.tensors_loaded += 1;
    rep.bytes_loaded += nt->value.nbytes();
    run.pending.push_back({e.param, e.tensor, nt->shard, std::move(nt->value), std::move(nt->name)});
    count_loaded(run);
    if (run.loaded == run.expected) finish_layer(e.layer);
  }

  // Completion gate: every checkpoint tensor and every shard, exactly once.
  std::vector<std::string> missing;
  for (const auto& [name, e] : expected) {
    const auto& s = runs[e.layer].shards[e.flat];
    std::vector<std::int64_t> absent;
    for (std::int64_t k = 0; k < e.num_shards; ++k)
      if (!s[k]) absent.push_back(k);
    if (absent.empty()) continue;
    if (e.num_shards == 1 || static_cast<std::int64_t>(absent.size()) == e.num_shards)
      missing.push_back(concat("'", name, "'"));
    else
      missing.push_back(concat("'", name, "' (partial: shards ", at::IntArrayRef(absent), " of ", e.num_shards, " missing)"));
  }
  if (!missing.empty()) {
    std::sort(missing.begin(), missing.end());
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 20; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 20) list += concat(", ... (", missing.size() - 20, " more)");
    GK_THROW(WeightError, source.describe(), " ended before the model was complete: ",
                          missing.size(), " checkpoint tensor(s) missing: ", list);
  }

  if (o.mode == ReloadMode::transactional) {
    for (std::size_t li = 0; li < runs.size(); ++li) fault(o, "commit", plan.layers()[li].prefix);
    if (o.before_commit) o.before_commit();
  }
}

ReloadReport ReloadEngine::Impl::finish(ReloadReport& rep, const ReloadOptions& o, const Stopwatch& total) {
  rep.times.total_ms = total.elapsed_ms();
  if (!initial) rep.weight_version = version.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (rep.needs_recapture) {
    state = EngineState::needs_recapture;
    reason = "the last reload accepted layout mismatches: recapture the graphs, then call prepare()";
  } else {
    state = EngineState::ready;
    reason.clear();
  }
  rep.graphs_destroyed = drop_destroyed();
  if (o.verify && !initial && !graphs.empty() && !rep.needs_recapture) {
    ScopedMsTimer t(rep.times.verify_ms);
    VerifyResult r = verify_all();
    rep.addresses_verified = r.checked;
    rep.drift = r.issues.size();
    if (!r.ok()) {
      state = EngineState::drift;
      reason = r.describe();
      rep.times.total_ms = total.elapsed_ms();
      GK_THROW(DriftError, "after the reload, ", r.issues.size(), " captured address(es) are not covered; "
                           "replay is refused:\n", r.describe());
    }
  }
  // After verification, which names what moved (Note [Capture verdicts last]).
  if (const std::string refused = capture_refusals(); !refused.empty() && !rep.needs_recapture) {
    state = EngineState::drift;
    reason = refused;
    rep.times.total_ms = total.elapsed_ms();
    GK_THROW(DriftError, "after the reload, replay stays refused: ", refused);
  }
  rep.times.total_ms = total.elapsed_ms();
  return rep;
}

// ---------------------------------------------------------------------------
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source) { return load_weights(model, source, {}); }
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const ReloadOptions& options) {
  ReloadOptions o;
  o.allow_non_finite = options.allow_non_finite;
  ReloadEngine::Impl impl(model, o);
  impl.plan = build_slot_plan(model);
  impl.index_expected();
  impl.state = EngineState::ready;
  impl.initial = true;
  return impl.run_reload(source, impl.options);
}

ReloadEngine::ReloadEngine(torch::nn::Module& model, ReloadOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(options))) {}
ReloadEngine::~ReloadEngine() {
  // A staged reload outliving its engine holds nothing afterwards, and its
  // commit() is refused.
  std::lock_guard<std::mutex> lock(impl_->op_mu);
  impl_->drop_outstanding("its ReloadEngine was destroyed", /*engine_gone=*/true);
}

void ReloadEngine::prepare() {
  Impl::Busy busy(*impl_, "prepare()");
  {
    std::lock_guard<std::mutex> lock(impl_->op_mu);
    impl_->drop_outstanding("prepare() ran again since staging (the slot plan it was checked against is gone; its "
                            "staged tensors were released)",
                            /*engine_gone=*/false);
  }
  impl_->graphs.clear();
  impl_->graphs_generation += 1;
  impl_->plan_generation += 1;
  impl_->plan = build_slot_plan(impl_->model, impl_->options.undeclared_members);
  impl_->index_expected();
  impl_->validate(impl_->options);
  impl_->fields_unrestored = false;
  impl_->state = EngineState::ready;
  impl_->reason.clear();
}

ReloadReport ReloadEngine::reload(WeightSource& source) { return reload(source, impl_->options); }
ReloadReport ReloadEngine::reload(WeightSource& source, const ReloadOptions& options) {
  Impl::Busy busy(*impl_, "reload()", /*refuse_outstanding=*/true);
  return impl_->run_reload(source, options);
}

// Note [Online reload threading]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An online reload has two threads: the *serving* thread, which replays the
// captured graphs, and the *staging* thread, which calls stage().
//   - While stage() runs, the module objects belong to the staging thread:
//     it detaches parameters, runs PWAL (which may rebuild kernel objects)
//     and re-points fields at copies (Note [Staging copies]). The serving
//     thread may only replay captured graphs, which read the captured
//     storage through the addresses burnt in at capture and never touch a
//     module; no eager forward, and no other call on the engine (reload(),
//     prepare(), track(), untrack(), commit() are refused with a
//     gk::StateError while stage() runs: Impl::Busy).
//   - stage() never writes a captured storage. It reads the captured values
//     of copy_new slots (which the graphs only read) and nothing the graphs
//     write (zero/preserve storages are copied as zeros). When it returns,
//     successful or not, every field points at its captured tensor again and
//     the model computes with the old weights, eagerly or by replay.
//   - commit() and abort() run on the serving thread between two replays:
//     the serving thread holds its own lock (or is simply not replaying)
//     around each replay and around commit(). commit() writes the captured
//     storage; the pause is commit() alone (times.commit_ms).
//   - Streams (CUDA): stage() enqueues on the staging thread's current
//     stream and waits for it before returning; commit() copies on the
//     serving thread's current stream, so the next replay on that stream is
//     ordered after the copy, and waits for it before releasing the staged
//     tensors (sync_staged_streams), so the pause includes the copy.
//   - Atomic, readable from any thread at any time: state(),
//     replay_allowed() and weight_version(). check_replay_allowed() reads the
//     reason string too, so call it on the serving thread.
//   - One staged reload per engine: a second stage() or a reload() while one
//     is outstanding is refused; prepare() drops it (its commit() is then
//     refused); track()/untrack() make it stale.
// Failure guarantees: a stage() that throws changed nothing (the graphs go
// on replaying the old weights; replay stays allowed). A commit() refused
// before writing (empty, another engine's, stale, a field re-pointed since
// staging, a fault at "copy") changed nothing. A commit() that fails while
// writing (which only an allocation failure can cause) leaves the model
// inconsistent, like a streaming reload: replay refused until a reload()
// succeeds. There is no undo copy: it would double the pause and the memory.
StagedReload ReloadEngine::stage(WeightSource& source) { return stage(source, impl_->options); }
StagedReload ReloadEngine::stage(WeightSource& source, const ReloadOptions& options) {
  Impl& I = *impl_;
  Impl::Busy busy(I, "stage()", /*refuse_outstanding=*/true);
  GK_CHECK(StateError, I.state == EngineState::ready, "stage() refused: the engine is ",
           to_string(I.state.load()), I.reason.empty() ? std::string() : concat(" (", I.reason, ")"),
           "; a staged reload can only be committed to a ready engine: use reload() (after prepare() if the "
           "engine is unprepared or needs recapture)");
  GK_CHECK(StateError, !I.fields_unrestored, "stage() refused: a failed stage() could not point every field back at "
           "its captured tensor (PWAL changed the object tree); reload() to recover first");
  GK_CHECK(StateError, options.on_mismatch == MismatchPolicy::raise, "stage() refused: "
           "MismatchPolicy::needs_recapture cannot be staged (the graphs would have to be recaptured anyway): use "
           "reload()");
  GK_CHECK(StateError, options.unprotected_slots.empty(), "stage() refused: ReloadOptions::unprotected_slots is "
           "for demonstrations of reload() without copy-back; a staged reload always copies back");
  I.validate(options);
  auto st = std::make_unique<detail::StagedState>();
  st->engine = this;
  st->options = options;
  st->options.mode = ReloadMode::transactional;
  st->base_version = I.version.load(std::memory_order_acquire);
  st->plan_generation = I.plan_generation;
  st->graphs_generation = I.graphs_generation;
  at::NoGradGuard no_grad;
  const Stopwatch total;
  ReloadReport rep = I.new_report(st->options);
  rep.staged = true;
  std::vector<LayerRun> runs = I.new_runs();
  bool any_committed = false;
  {
    StagingCopies copies(I.plan);
    I.staging = &copies;
    try {
      I.run_until_commit(source, st->options, runs, rep, any_committed);
      GK_INTERNAL_ASSERT(!any_committed, "a stage committed a layer");
      // A copy PWAL did not write commits in place (Note [Staging copies]).
      for (std::size_t li = 0; li < runs.size(); ++li) {
        const LayerPlan& lp = I.plan.layers()[li];
        for (std::size_t i = 0; i < lp.slots.size() && i < runs[li].current.size(); ++i)
          if (copies.untouched(runs[li].current[i])) runs[li].current[i] = lp.slots[i].captured;
      }
      // Point every field back at its captured tensor; keep the staged
      // tensors and the configuration values PWAL left.
      for (std::size_t li = 0; li < runs.size(); ++li) {
        LayerPlan& lp = I.plan.layers()[li];
        LayerRun& run = runs[li];
        run.configs_after.clear();
        for (const PlannedConfig& c : lp.configs) {
          void* p = c.path.resolve(lp.root.ptr);
          run.configs_after.push_back(p != nullptr ? c.ops->copy(p) : nullptr);
        }
        std::vector<at::Tensor> staged = std::move(run.current);
        const bool ok = I.rollback(lp, run);
        run.current = std::move(staged);
        GK_INTERNAL_ASSERT(ok, "layer '", lp.prefix, "' passed its checks but a path does not resolve");
      }
      // What the staged tensors hold beyond the captured storage.
      std::unordered_set<const void*> seen;
      for (const LayerRun& run : runs)
        for (const at::Tensor& t : run.current)
          if (t.defined() && t.has_storage() && !copies.captured(t) &&
              seen.insert(t.storage().unsafeGetStorageImpl()).second)
            st->bytes += t.storage().nbytes();
    } catch (...) {
      I.staging = nullptr;
      if (!I.rollback_all(runs, st->options)) I.fields_unrestored = true;
      throw;
    }
    I.staging = nullptr;
  }  // the copies no staged tensor views are freed here
  sync_staged_streams(runs);
  rep.times.stage_ms = rep.times.total_ms = total.elapsed_ms();
  st->rep = std::move(rep);
  st->runs = std::move(runs);
  std::lock_guard<std::mutex> lock(I.op_mu);
  I.outstanding = st.get();
  return StagedReload(std::move(st));
}

ReloadReport ReloadEngine::commit(StagedReload&& staged) {
  Impl& I = *impl_;
  GK_CHECK(StateError, staged.state_ != nullptr && !staged.state_->done,
           "commit() of an empty StagedReload (already committed, aborted, or moved from): nothing to commit; "
           "stage() again");
  detail::StagedState& st = *staged.state_;
  GK_CHECK(StateError, st.engine == this, "commit refused, nothing was changed: the StagedReload ",
           st.engine == nullptr ? concat("was dropped: ", st.dropped)
                                : std::string("belongs to another ReloadEngine (it was staged against that "
                                              "engine's slot plan and captured storage)"),
           "; commit it through the engine whose stage() made it, or stage() again on this one");
  Impl::Busy busy(I, "commit()");
  std::vector<std::string> stale;
  if (!st.dropped.empty()) stale.push_back(st.dropped);
  if (const std::uint64_t now = I.version.load(std::memory_order_acquire); now != st.base_version)
    stale.push_back(concat("the weights changed since staging (weight version ", st.base_version, " when staged, ",
                           now, " now: a reload() or another commit ran in between)"));
  if (I.plan_generation != st.plan_generation && st.dropped.empty())
    stale.push_back("prepare() ran again since staging (the slot plan it was checked against is gone)");
  if (I.graphs_generation != st.graphs_generation)
    stale.push_back("the tracked graphs changed since staging (track() or untrack() ran)");
  for (const LayerRun& run : st.runs)
    for (const LayerRun::Adopted& a : run.adopted)
      if (a.value._version() != a.value_version)
        stale.push_back(concat("weight '", a.name, "' was adopted from the source (ReloadOptions::adopt_source_tensors) "
                               "and has been written since staging (its version counter moved): what the commit "
                               "would copy is not what stage() checked"));
  if (I.state != EngineState::ready)
    stale.push_back(concat("the engine is not ready (", to_string(I.state.load()),
                           I.reason.empty() ? std::string() : concat(": ", I.reason), ")"));
  if (!stale.empty()) {
    std::string why;
    for (const std::string& s : stale) why += (why.empty() ? "" : "; ") + s;
    GK_THROW(StateError, "commit refused, nothing was changed: the staged reload is stale: ", why,
             ". abort() it and stage() again from the current weights");
  }
  at::NoGradGuard no_grad;
  const Stopwatch total;
  const ReloadOptions& o = st.options;
  // Fail closed before anything is written.
  for (std::size_t li = 0; li < st.runs.size(); ++li) I.check_fields_captured(I.plan.layers()[li]);
  for (std::size_t li = 0; li < st.runs.size(); ++li) I.fault(o, "copy", I.plan.layers()[li].prefix);
  ReloadReport rep = std::move(st.rep);
  const double stage_total = rep.times.total_ms;
  try {
    for (std::size_t li = 0; li < st.runs.size(); ++li) {
      LayerPlan& lp = I.plan.layers()[li];
      LayerRun& run = st.runs[li];
      I.commit(lp, run, o, rep, /*staged=*/true);
      for (std::size_t c = 0; c < lp.configs.size() && c < run.configs_after.size(); ++c) {
        void* p = lp.configs[c].path.resolve(lp.root.ptr);
        if (p != nullptr && run.configs_after[c] != nullptr && !lp.configs[c].ops->equal(p, run.configs_after[c].get()))
          lp.configs[c].ops->assign(p, run.configs_after[c].get());
      }
    }
  } catch (...) {
    I.state = EngineState::inconsistent;
    I.reason = "a staged commit failed while writing the captured storage: the model mixes old and new weights; "
               "reload() to recover";
    I.version.fetch_add(1, std::memory_order_acq_rel);
    try {
      sync_staged_streams(st.runs);
    } catch (...) {  // the first error is the one to report
    }
    staged.abort();
    throw;
  }
  sync_staged_streams(st.runs);  // the copy is done before the staged tensors are released
  staged.abort();  // done: releases the staged tensors and the engine's record of them
  try {
    I.finish(rep, o, total);
  } catch (...) {
    rep.times.commit_ms = total.elapsed_ms();
    throw;
  }
  rep.times.commit_ms = rep.times.total_ms;
  rep.times.total_ms += stage_total;
  return rep;
}

std::uint64_t ReloadEngine::weight_version() const noexcept {
  return impl_->version.load(std::memory_order_acquire);
}

// ---------------------------------------------------------------------------
// StagedReload
// ---------------------------------------------------------------------------
StagedReload::StagedReload() noexcept = default;
StagedReload::StagedReload(std::unique_ptr<detail::StagedState> state) noexcept : state_(std::move(state)) {}
StagedReload::StagedReload(StagedReload&& other) noexcept = default;
StagedReload& StagedReload::operator=(StagedReload&& other) noexcept {
  if (this != &other) {
    abort();
    state_ = std::move(other.state_);
  }
  return *this;
}
StagedReload::~StagedReload() { abort(); }

bool StagedReload::pending() const noexcept { return state_ != nullptr && !state_->done; }

ReloadReport StagedReload::commit() {
  GK_CHECK(StateError, pending(), "StagedReload::commit() of an empty StagedReload (already committed, aborted, or "
           "moved from): nothing to commit; stage() again");
  GK_CHECK(StateError, state_->engine != nullptr, "commit refused, nothing was changed: the StagedReload was "
           "dropped: ", state_->dropped, "; stage() again");
  return state_->engine->commit(std::move(*this));
}

void StagedReload::abort() noexcept {
  if (state_ == nullptr || state_->done) return;
  state_->done = true;
  if (state_->engine != nullptr) {
    ReloadEngine::Impl& impl = *state_->engine->impl_;
    std::lock_guard<std::mutex> lock(impl.op_mu);
    if (impl.outstanding == state_.get()) impl.outstanding = nullptr;
  }
  state_->runs.clear();
  state_->bytes = 0;
}

std::uint64_t StagedReload::base_version() const noexcept { return state_ != nullptr ? state_->base_version : 0; }
std::size_t StagedReload::staged_bytes() const noexcept { return state_ != nullptr ? state_->bytes : 0; }
const ReloadReport& StagedReload::report() const {
  GK_CHECK(StateError, state_ != nullptr, "StagedReload::report() of an empty StagedReload (moved from)");
  return state_->rep;
}

EngineState ReloadEngine::state() const noexcept { return impl_->state; }

void ReloadEngine::check_replay_allowed() const {
  switch (impl_->state.load()) {
    case EngineState::ready: return;
    case EngineState::drift: GK_THROW(DriftError, "replay refused: ", impl_->reason);
    case EngineState::unprepared:
      GK_THROW(StateError, "replay refused: prepare() has not run, so no address is protected");
    default: {
      std::lock_guard<std::mutex> lock(impl_->reason_mu);
      GK_THROW(StateError, "replay refused (", to_string(impl_->state.load()), "): ", impl_->reason);
    }
  }
}

// Note [Fail closed at capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A graph is trusted only when the manifest can vouch for every address it
// reads. track() therefore refuses replay (state drift, gk::DriftError) when
//   - the capture recorded no address at all: on the CPU backend a forward
//     written with plain ATen ops runs eagerly and records nothing, so replay
//     would return whatever the output buffer last held;
//   - the graph reads none of the model's slots although the model has some:
//     it cannot be serving this model's weights;
//   - an address lies in no slot, pool, static buffer, library workspace or
//     allowed range: an undeclared tensor (named, with its role) or a raw
//     allocation (with the opaque members near it that could hold it).
// The graph stays tracked, so later reloads verify it too; prepare() after a
// recapture starts over. A library's own persistent workspace is allowed by
// name with allow_address_range().
//
// Note [Confirming raw addresses]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA kernel node's parameter bytes may hold stale host bytes that look
// like a device address (Note [Stale bytes in kernel parameters] in
// capture/cuda/cuda_replay.cpp). Given the forward, track() tells them apart
// from real reads by capturing once more when the first manifest has raw
// unknown addresses: a real operand is read again by the same kernel, from
// the same parameter byte, at the same address (its tensor was allocated
// before the capture and does not move); stale bytes depend on what host
// code ran at that stack depth and do not repeat. Only the repeated ones are
// refused; the rest stay in the manifest as AddressClass::unstable, and the
// second capture is the graph that is kept. Fail closed: a stale word that
// happens to repeat is refused, as before.
//
// Repeating is common, though: the H200 runs at 8B shapes showed stale words
// that are two halves, a 4-byte integer and 4 bytes of padding holding the
// upper half of some pointer, and every pointer near it shares that upper
// half, in both captures. Those words point into memory that no live
// allocation covers (a free caching-allocator block): no tensor is there,
// so no kernel can be reading one. Such raw words are therefore unstable too
// (ReplayBackend::in_live_allocation; before and without the recapture). The
// one read this lets through is a graph that reads memory freed before
// track(): a tensor that died right after the capture, an engine bug that
// recapturing would not fix either, since it would read whatever reuses the
// block; graphkeep's promise is about reloads, and a reload cannot cause it.
void ReloadEngine::track(ReplayBackend& graph) { track(graph, {}); }

void ReloadEngine::track(ReplayBackend& graph, const std::function<void()>& forward) {
  Impl::Busy busy(*impl_, "track()");
  GK_CHECK(StateError, impl_->state != EngineState::unprepared,
           "track() before prepare(): the manifest classifies addresses against the slot plan");
  impl_->untrack(graph);
  auto record = [&] {
    return CaptureManifest::record(graph, impl_->plan, impl_->io, reachable_tensors(impl_->model, impl_->plan),
                                   impl_->allowed);
  };
  CaptureManifest first = record();
  first.mark_unstable_if_free(graph);  // Note [Confirming raw addresses]
  if (forward && first.count_raw_unknown() > 0) {
    graph.recapture(forward);
    CaptureManifest second = record();
    second.mark_unstable_if_free(graph);
    second.mark_unstable(first);
    first = std::move(second);
  }
  impl_->graphs.push_back({&graph, graph.lifetime(), std::move(first)});
  const CaptureManifest& m = impl_->graphs.back().manifest;
  std::string problem;
  if (m.entries().empty()) {
    problem = concat("graph '", graph.name(), "' recorded no launch and no address",
                     graph.device().is_cpu()
                         ? ": on the CPU replay backend a forward must launch through gk::hostrt (plain ATen ops run "
                           "eagerly and are not recorded, so replay would not recompute anything)"
                         : ": nothing was captured on the capture stream");
  } else if (m.count(AddressClass::slot) == 0 && impl_->plan.num_slots() > 0) {
    problem = concat("graph '", graph.name(), "' reads none of the model's ", impl_->plan.num_slots(),
                     " slots: it cannot be computing with this model's weights (was the forward captured on another "
                     "model, or through copies of its tensors?)");
  } else if (m.count(AddressClass::unknown) > 0) {
    problem = concat("graph '", graph.name(), "' reads ", m.count(AddressClass::unknown),
                     " address(es) that no slot, pool, static buffer or allowed range owns; after a reload these "
                     "would be stale or freed:");
    const std::vector<std::string> opaque = opaque_members(impl_->model);
    std::size_t shown = 0;
    for (const ManifestEntry& e : m.entries()) {
      if (e.cls != AddressClass::unknown) continue;
      if (++shown > 10) {
        problem += concat("\n  ... ", m.count(AddressClass::unknown) - 10, " more");
        break;
      }
      problem += concat("\n  node ", e.use.node, " (", e.use.node_name, ") address 0x", std::hex, e.use.address,
                        std::dec);
      if (e.use.param >= 0) problem += concat(" (kernel parameter ", e.use.param, ", byte ", e.use.byte_offset, ")");
      problem += ": ";
      if (e.reachable != SIZE_MAX) {
        const ReachableTensor& r = m.reachable()[e.reachable];
        problem += concat("in the undeclared tensor ", r.path, " (role ", to_string(r.role.role),
                          r.role.reason.empty() ? "" : concat(": ", r.role.reason),
                          "), which is reachable but no slot");
        problem += r.role.reason == kUndeclaredMemberReason
                       ? ": its class declares it, but ReloadOptions::undeclared_members left it out of the plan"
                       : ": declare it with a graph-visible role (gk::workspace, gk::scale, gk::metadata, ...), or "
                         "call prepare() again if it was added after prepare()";
        continue;
      }
      problem += "in no tensor the collector reaches (a raw allocation, e.g. a caching-allocator block or a "
                 "library handle's memory)";
      if (const std::string where = graph.describe_address(e.use.address); !where.empty())
        problem += concat(" [", where, "]");
      // The opaque members of the layers this node also reads could hold it.
      std::vector<std::string> near;
      for (const ManifestEntry& o : m.entries()) {
        if (o.use.node != e.use.node || o.cls != AddressClass::slot) continue;
        const std::string& prefix = impl_->plan.layers()[o.layer].prefix;
        for (const std::string& op : opaque)
          if ((prefix.empty() || op.rfind(prefix + ".", 0) == 0) &&
              std::find(near.begin(), near.end(), op) == near.end())
            near.push_back(op);
      }
      const std::vector<std::string>& list = near.empty() ? opaque : near;
      if (list.empty()) {
        problem += "; the model has no opaque member that could hold it";
      } else {
        problem += concat("; opaque members", near.empty() ? " of the model" : " of the layers this node reads",
                          " that could hold it:");
        for (std::size_t i = 0; i < list.size() && i < 8; ++i) problem += concat(i ? ", " : " ", list[i]);
      }
      problem += ". If it is a library's own persistent workspace, allow it with "
                 "ReloadEngine::allow_address_range(name, ptr, bytes, reason) before track()";
    }
  }
  if (problem.empty()) return;
  if (impl_->options.on_unknown_address == UnknownAddressPolicy::report) return;
  impl_->graphs.back().refused = concat("graph '", graph.name(), "' was refused at capture and is still tracked (",
                                        "untrack() it, or recapture and prepare() again): ", problem);
  impl_->state = EngineState::drift;
  impl_->reason = problem;
  GK_THROW(DriftError, "replay refused at capture: ", problem);
}

void ReloadEngine::allow_address_range(std::string name, const void* begin, std::size_t bytes, std::string reason) {
  GK_CHECK(StateError, begin != nullptr && bytes > 0, "allow_address_range('", name,
           "'): the range is empty or null");
  GK_CHECK(StateError, !reason.empty(), "allow_address_range('", name,
           "') needs a reason (who owns the memory, and why it never moves across reloads)");
  const auto b = reinterpret_cast<std::uintptr_t>(begin);
  impl_->allowed.push_back({concat(name, " (allowed: ", reason, ")"), b, b + bytes});
}

std::vector<std::string> ReloadEngine::slot_names() const { return impl_->plan.slot_names(); }

void ReloadEngine::untrack(const ReplayBackend& graph) {
  Impl::Busy busy(*impl_, "untrack()");
  Impl& I = *impl_;
  const bool was_refused = std::any_of(I.graphs.begin(), I.graphs.end(), [&](const Impl::Tracked& t) {
    return t.graph == &graph && !t.alive.expired() && !t.refused.empty();
  });
  I.untrack(graph);
  // The refusal ends with the graph (Note [Capture verdicts last]): when it
  // was what held replay back, the remaining graphs decide.
  if (was_refused && I.state == EngineState::drift && I.capture_refusals().empty()) {
    const VerifyResult r = I.verify_all();
    std::lock_guard<std::mutex> lock(I.reason_mu);
    if (r.ok()) {
      I.state = EngineState::ready;
      I.reason.clear();
    } else {
      I.reason = r.describe();
    }
  }
}

void ReloadEngine::add_static_io(std::string name, const at::Tensor& buffer) {
  GK_CHECK(StateError, buffer.defined() && buffer.has_storage(), "static buffer '", name, "' is undefined");
  const auto b = reinterpret_cast<std::uintptr_t>(buffer.storage().data());
  impl_->io.push_back({std::move(name), b, b + buffer.storage().nbytes()});
}

VerifyResult ReloadEngine::verify() const { return impl_->verify_all(); }

const CaptureManifest* ReloadEngine::manifest(const ReplayBackend& graph) const {
  for (const auto& t : impl_->graphs)
    if (!t.alive.expired() && t.graph == &graph) return &t.manifest;
  return nullptr;
}

const SlotPlan& ReloadEngine::plan() const { return impl_->plan; }
const ReloadOptions& ReloadEngine::options() const noexcept { return impl_->options; }
torch::nn::Module& ReloadEngine::model() noexcept { return impl_->model; }

}  // namespace gk
