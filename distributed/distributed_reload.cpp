// Two-phase commit of a reload across the ranks (distributed_reload.h): the
// engine's transactional reload, a vote before the commit, a vote on the
// outcome (Note [The collective sequence] in wire.h).
#include <graphkeep/distributed/distributed_reload.h>

#include <graphkeep/core/stopwatch.h>

#include "wire.h"

#include <c10/util/Exception.h>

#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace gk {

using detail::concat;
using namespace detail::wire;

namespace {

std::string_view kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::declaration: return "DeclarationError";
    case ErrorKind::weights: return "WeightError";
    case ErrorKind::mismatch: return "MismatchError";
    case ErrorKind::drift: return "DriftError";
    case ErrorKind::state: return "StateError";
    case ErrorKind::internal: return "InternalError";
  }
  return "Error";
}

std::string type_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : t.name();
  std::free(d);
  return out;
}

std::string describe_exception(const std::exception_ptr& e) {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return concat(kind_name(x.kind()), ": ", x.what());
  } catch (const c10::Error& x) {
    return concat("c10::Error: ", x.what_without_backtrace());
  } catch (const std::exception& x) {
    return concat(type_name(typeid(x)), ": ", x.what());
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

struct DistributedReload::Impl {
  Impl(Collective g, ReloadEngine* e, DistributedOptions o) : group(std::move(g)), engine(e), options(std::move(o)) {}
  Collective group;
  ReloadEngine* engine;
  DistributedOptions options;
  bool diverged = false;
  std::string reason;
};

DistributedReload::DistributedReload(Collective group, ReloadEngine* engine, DistributedOptions options)
    : impl_(std::make_unique<Impl>(std::move(group), engine, std::move(options))) {}
DistributedReload::~DistributedReload() = default;

DistributedReport DistributedReload::reload(WeightSource& source) {
  Impl& m = *impl_;
  ReloadOptions o = m.options.reload ? *m.options.reload : (m.engine ? m.engine->options().defaults : ReloadOptions{});
  o.mode = ReloadMode::transactional;
  auto* bsrc = dynamic_cast<BroadcastSource*>(&source);
  const c10::Device dev = m.options.device ? *m.options.device : (bsrc ? bsrc->config().device : c10::Device(c10::kCPU));
  const std::string role = bsrc ? bsrc->role() : concat("rank ", m.group.rank());
  DistributedReport rep;

  bool voted = false;
  std::vector<RankVote> votes;
  std::exception_ptr local;
  bool peer = false;  // local is a ReloadAbortedError: it failed everywhere, first elsewhere
  auto vote = [&](bool ok, std::string reason) {
    voted = true;
    ScopedMsTimer t(rep.vote_ms);
    votes = gather_votes(m.group, dev, {m.group.rank(), ok, role, std::move(reason), !ok && peer});
  };
  auto throw_aborted = [&] {
    if (bsrc) rep.broadcast = bsrc->stats();
    // Every rank failed through the same group-wide error (the handshake):
    // it names the ranks already.
    const bool all_peer = std::all_of(votes.begin(), votes.end(), [](const RankVote& v) { return !v.ok && v.peer; });
    if (all_peer && local && peer) std::rethrow_exception(local);
    const std::vector<RankVote> failed = failures_of(votes);
    GK_THROW_ABORTED(concat("distributed reload aborted on every rank, each keeps its old weights: ",
                                    format_failures(failed)),
                             failed);
  };
  // Phase 1 ends here on a rank whose load, PWAL and checks all passed.
  const std::function<void()> user_hook = o.before_commit;
  o.before_commit = [&] {
    if (user_hook) user_hook();
    vote(true, {});
    if (!all_ok(votes)) throw_aborted();
  };

  try {
    if (m.engine != nullptr) {
      rep.reload = m.engine->reload(source, o);
    } else if (bsrc != nullptr) {
      bsrc->drain();
    } else {
      while (source.next()) {
      }
    }
  } catch (const ReloadAbortedError&) {
    local = std::current_exception();
    peer = true;
  } catch (...) {
    local = std::current_exception();
  }

  if (!voted) {
    // Failed before the vote (the engine rolled back), or a rank without a
    // model: finish the broadcast so every rank's collectives stay in step.
    if (local && bsrc != nullptr) {
      try {
        bsrc->drain();
      } catch (...) {
      }
    }
    vote(local == nullptr, describe_exception(local));
    if (!all_ok(votes)) throw_aborted();
  } else if (!all_ok(votes)) {
    throw_aborted();  // this rank voted yes; the engine rolled back in before_commit
  }

  // Every rank voted yes and committed: did every commit (and verify) work?
  std::vector<RankVote> outcome;
  {
    ScopedMsTimer t(rep.vote_ms);
    outcome = gather_votes(m.group, dev, {m.group.rank(), local == nullptr, role, describe_exception(local), false});
  }
  if (bsrc) rep.broadcast = bsrc->stats();
  if (!all_ok(outcome)) {
    m.diverged = true;
    m.reason = concat("every rank voted to commit, but after the vote the reload failed on ", format_failures(outcome),
                      "; the other ranks hold the new weights");
    GK_THROW(StateError, "distributed reload diverged: ", m.reason,
                            ". Replay is refused until a reload succeeds on every rank");
  }
  m.diverged = false;
  m.reason.clear();
  return rep;
}

bool DistributedReload::replay_allowed() const noexcept {
  return !impl_->diverged && (impl_->engine == nullptr || impl_->engine->replay_allowed());
}

void DistributedReload::check_replay_allowed() const {
  GK_CHECK(StateError, !impl_->diverged, "replay refused: ", impl_->reason);
  if (impl_->engine != nullptr) impl_->engine->check_replay_allowed();
}

std::string DistributedReport::summary() const {
  std::string out = reload ? reload->summary() : std::string("no model on this rank");
  out += concat("; broadcast: ", broadcast.buckets, " bucket(s), ", broadcast.bytes_broadcast, " B, ",
                broadcast.tensors_yielded, " shard(s) yielded (", broadcast.bytes_yielded, " B); vote ", vote_ms, " ms");
  return out;
}

}  // namespace gk
