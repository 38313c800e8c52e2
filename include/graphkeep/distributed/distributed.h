// graphkeep/distributed/distributed.h
//
// Every header of the distributed layer, one concept each: collective.h,
// weight_manifest.h, shard_rules.h, broadcast_source.h, votes.h,
// distributed_reload.h.
//
// Reloading a tensor-parallel engine from a trainer rank, through libtorch's
// own distributed engine (c10d): ProcessGroupGloo on CPUs, ProcessGroupNCCL
// on GPUs, the same code path (only c10d::ProcessGroup / c10d::Backend
// collectives are used: broadcast and allgather).
//
//   // every rank: the manifest of the full (unsharded) checkpoint, the rules
//   gk::WeightManifest manifest = ...;       // names, shapes, dtypes
//   gk::ShardRules rules;
//   rules.column("*.qkv.weight").row("*.o_proj.weight");   // the rest: replicated
//   gk::BroadcastConfig cfg{.trainer_rank = 0, .tp_rank = tp, .tp_size = 2};
//
//   // the trainer rank also passes the full weights (any WeightSource)
//   gk::BroadcastSource src(pg, manifest, rules, cfg, is_trainer ? &full : nullptr);
//
//   // two-phase commit: succeeds on every rank or on none
//   gk::DistributedReload dist(pg, engine_or_nullptr);   // nullptr on a trainer without a model
//   gk::DistributedReport r = dist.reload(src);           // collective: every rank calls it
//
// BroadcastSource: the trainer streams its tensors in buckets (several
// tensors, or row ranges of a large one, flattened into one byte buffer of at
// most `bucket_bytes`), one broadcast per bucket plus a small header; every
// inference rank keeps only its shard of each tensor (replicated, or split
// along dim 0 or dim 1 by the rule for its name) and yields it under the name
// its model expects. No inference rank ever holds the whole model: at most
// one bucket and the shards not yet taken by the engine. Before the first
// bucket the trainer broadcasts its manifest; a rank whose manifest differs,
// or that cannot shard a tensor by its rules, makes every rank fail with a
// gk::ReloadAbortedError (a gk::WeightError) naming the rank and the
// difference.
//
// DistributedReload: each inference rank runs gk::ReloadEngine::reload in
// transactional mode (load, PWAL, checks: phase 1); in ReloadOptions::
// before_commit every rank votes (an allgather of status and reason). Only a
// unanimous yes commits; otherwise every rank rolls back, keeps its old
// weights and throws gk::ReloadAbortedError naming the failing rank(s) and
// why. A rank that fails before the vote still finishes the broadcast
// (drain) and votes no, so the collectives of all ranks stay in step.
//
// See docs/distributed.md for the design, the guarantees and their limits.
#pragma once

#include <graphkeep/distributed/broadcast_source.h>
#include <graphkeep/distributed/collective.h>
#include <graphkeep/distributed/distributed_reload.h>
#include <graphkeep/distributed/shard_rules.h>
#include <graphkeep/distributed/votes.h>
#include <graphkeep/distributed/weight_manifest.h>
