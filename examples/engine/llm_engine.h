// examples/engine/llm_engine.h
//
// A small serving engine over demo::CausalLM, shaped like the real ones:
// weights from a Hugging Face model directory, a static KV cache, eager
// prefill, and decode through CUDA graphs captured once for 35 batch sizes
// (1, 2, 4, then 8 to 256 in steps of 8); on a machine without a GPU, host
// graphs stand in for CUDA graphs with the same burn-in semantics. Weight
// updates go through gk::ReloadEngine, so the graphs stay captured.
//
//   demo::LlmEngine eng("ckpt/step0", device, demo::WeightFormat::fp8);
//   at::Tensor l0 = eng.prefill(/*seq=*/0, prompt);       // [T, vocab], eager
//   at::Tensor t1 = eng.decode(next, positions);   // [B] int32: greedy, only the ids leave the GPU
//   at::Tensor t2 = eng.decode(t1, positions + 1, {.temperature = 0.7, .top_p = 0.9, .seed = 1});
//   at::Tensor l1 = eng.decode_logits(next_tokens, positions);   // [B, vocab] logits, a graph replay
//   gk::ReloadReport r = eng.reload("ckpt/step1");        // no recapture
//
// On CUDA the decoder runs its fast path (fused kernels, cuBLAS GEMMs,
// attention over each sequence's own positions, grouped MoE GEMMs: Note
// [The fast CUDA path] in layers.cpp); decode() chooses the next tokens
// on the device (Note [Sampling on the device] in sampler.cpp).
//
// Sequences are rows 0..max_seqs-1 of the KV cache; decode_logits(tokens, positions)
// advances sequences 0..B-1 by one token each. A graph captured for more rows
// than B also writes the cache of sequences B..graph size-1 (at position 0):
// keep the sequences in use at the low rows, as here.
#pragma once

#include "llm.h"
#include "lora.h"
#include "sampler.h"

#include <graphkeep/capture/replay.h>
#include <graphkeep/reload/reload_engine.h>

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace demo {

struct LlmEngineOptions {
  // The decode graphs' batch sizes; empty: none captured (eager decode only).
  std::vector<std::int64_t> batch_sizes = default_batch_sizes();
  std::int64_t max_len = 64;  // KV cache length per sequence
  std::int64_t max_seqs = 0;  // sequences in the KV cache; 0: the largest batch size (at least 1)
  bool shared_pool = true;    // all decode graphs in one memory pool (CUDA), else a pool each
  gk::ReloadOptions reload;
  // CUDA: prefill, decode, reload, commit and recapture run on a stream of
  // the engine's own with high priority, which they alone synchronize: a
  // stage() on its default-priority stream then yields to the decode graphs
  // (a graph launch takes its stream's priority) and no decode step waits
  // for the stage's work. false: the calling thread's current stream, and
  // each step waits for the whole device.
  bool high_priority_serving = true;
  // In (0, 1]: stage() paces itself so that its work occupies the device
  // about this share of the time: after each layer it waits for that layer's
  // work and then idles (1 / share - 1) times as long as the layer took. A
  // stage that competes with decode for memory bandwidth (PWAL quantizing
  // the weights) then slows decode less, and takes longer. 1: no pacing.
  double stage_device_share = 1.0;
  // CUDA: the decoder's fast path (CausalLM::set_fast_cuda); false: the
  // reference ops the CPU runs. No effect on the CPU.
  bool fast_cuda = true;
  // A sampling graph per decode graph (decode() with a temperature
  // replays it after the decode graph; one that cannot be captured is
  // reported on stderr, and sampling then runs eagerly on the device);
  // false: decode() is greedy only.
  bool sampling_graphs = true;
  // A PEFT LoRA adapter directory served with the model (lora.h): its A and
  // B are parameters of the layers, inside the decode graphs; empty: none.
  std::string adapter;

  // 1, 2, 4, then 8 to 256 in steps of 8 (35 sizes).
  static std::vector<std::int64_t> default_batch_sizes();
};

class LlmEngine {
 public:
  // Reads dir/config.json, builds the model on `device` in `format`, loads
  // the directory's weights (checked against the model first), prepares the
  // reload engine and captures the decode graphs.
  LlmEngine(const std::string& dir, c10::Device device, WeightFormat format, LlmEngineOptions options = {});
  // The same from a config and a weight source (device tensors handed over by
  // a trainer, say): the source's names are the Hugging Face names.
  LlmEngine(const HfConfig& cfg, c10::Device device, WeightFormat format, gk::WeightSource& weights,
            LlmEngineOptions options = {});
  ~LlmEngine();

  // Eager prefill of sequence `seq` with `tokens` [T] at positions 0..T-1:
  // logits [T, vocab] float32 on the CPU. `checked`: as for decode_logits().
  at::Tensor prefill(std::int64_t seq, const at::Tensor& tokens, bool checked = true);
  // One decode step of sequences 0..B-1: tokens [B] at positions [B] (each
  // below max_len). Replays the smallest graph of at least B rows; `checked`
  // asks the reload engine first (false replays as an engine without
  // graphkeep would). logits [B, vocab] float32 on the CPU.
  at::Tensor decode_logits(const at::Tensor& tokens, const at::Tensor& positions, bool checked = true);
  // The same step without graphs.
  at::Tensor decode_eager(const at::Tensor& tokens, const at::Tensor& positions);
  // The same step, returning the next token of each row instead of logits:
  // [B] int32 on the CPU. Greedy (params.temperature 0) is computed inside
  // the decode graph; otherwise the batch size's sampling graph replays
  // after it, over the logits it left on the device. Only the ids are
  // copied back (into pinned memory on CUDA). Row b samples from the stream
  // of params.seed + b at its position: the same inputs draw the same tokens.
  at::Tensor decode(const at::Tensor& tokens, const at::Tensor& positions, const SamplingParams& params = {},
                           bool checked = true);
  // For benchmarks: replays the decode graph of exactly `batch` rows on the
  // inputs the last decode step left (no host work besides the launch) and
  // does not wait for it.
  void replay_graph(std::int64_t batch);

  // Loads the model directory `dir` into the running engine. Its config must
  // describe the same architecture, rope scaling included, with
  // max_position_embeddings at least max_len (else a gk::WeightError naming
  // the field), and its tensors are checked against the model before any is
  // read; either error leaves the served weights untouched.
  gk::ReloadReport reload(const std::string& dir);
  gk::ReloadReport reload(const std::string& dir, const gk::ReloadOptions& options);
  // From any weight source with the checkpoint's names (no directory checks).
  gk::ReloadReport reload(gk::WeightSource& weights) { return reload(weights, engine_->options().defaults); }
  gk::ReloadReport reload(gk::WeightSource& weights, const gk::ReloadOptions& options);
  // Online reload (include/graphkeep/reload/staged_reload.h): stage() checks
  // `dir` as reload() does, then loads, processes and checks its weights into
  // new storage, on the calling thread (on CUDA on a stream of its own, which
  // it synchronizes before returning), while another thread goes on calling
  // decode_logits() on the old weights; prefill() must wait. commit() is called by
  // the decoding thread between two decode_logits() calls; the pause is the commit.
  gk::StagedReload stage(const std::string& dir);
  gk::StagedReload stage(gk::WeightSource& weights);
  // A weight patch (graphkeep/delta, docs/delta.md), checked against the
  // served content: reload() applies it in one call; stage() stages it as
  // stage(dir) does, for commit().
  gk::ReloadReport reload(const gk::Patch& patch);
  gk::StagedReload stage(const gk::Patch& patch);
  gk::ReloadReport commit(gk::StagedReload&& staged);
  // Swaps the served LoRA adapter for the one in `dir`, of the same rank,
  // scale and targets: a weight patch of its A and B (every projection's in
  // one commit, so no replay sees two adapters), staged for commit() or
  // applied in one call. A bad adapter (a missing tensor, another rank or
  // target set, another dtype, a NaN, a truncated file, a config that
  // disagrees with its tensors) is a gk::WeightError naming the file and the
  // tensor or module; the old adapter stays served bit for bit.
  gk::StagedReload stage_adapter(const std::string& dir);
  gk::ReloadReport reload_adapter(const std::string& dir);
  std::uint64_t weight_version() const { return engine_->weight_version(); }

  CausalLM& model() { return *model_; }
  gk::ReloadEngine& reload_engine() { return *engine_; }
  const HfConfig& config() const { return model_->config(); }
  const std::vector<std::int64_t>& batch_sizes() const { return options_.batch_sizes; }
  // The KV cache, one per layer (the graphs' static I/O; tests write into it).
  const std::vector<KvCache>& kv_caches() const { return caches_; }
  // The rotary tables, [max_len, head_dim] float32 (static I/O as well).
  const RopeTables& rope_tables() const { return rope_; }
  std::size_t num_graphs() const { return graphs_.size(); }
  // True when every decode graph has its sampling graph (false: sampling
  // runs eagerly, or not at all without LlmEngineOptions::sampling_graphs).
  bool sampling_in_graphs() const { return options_.sampling_graphs && !sampling_eager_; }
  // The decode graphs, smallest batch first (each tracked by reload_engine()).
  std::vector<const gk::ReplayBackend*> decode_graphs() const;
  double capture_ms() const { return capture_ms_; }
  // Captures every decode graph again (what an engine without graphkeep does
  // after a reload that moved tensors); returns the time taken in ms.
  double recapture();

 private:
  at::Tensor run_eager(const at::Tensor& ids, const TokenBatch& batch);
  struct Graph;
  // The smallest graph of at least n rows, with the step's inputs copied in
  // (rows n.. zero) and the checks of decode_logits() done.
  Graph& prepare_step(const at::Tensor& tokens, const at::Tensor& positions, bool checked);
  // After the first load: KV cache, static inputs, prepare(first_load), capture.
  void start(const gk::ReloadReport& first_load);
  void capture_graphs();
  // The serving stream's scope, and waiting for what was enqueued on it
  // (LlmEngineOptions::high_priority_serving).
  std::optional<c10::StreamGuard> serving() const;
  // The options of a stage() of weights or of a patch, with its pacing
  // (stage_device_share: null at 1).
  std::function<void(const std::string&)> stage_pacer() const;
  gk::StageOptions paced_stage_options() const;
  gk::PatchOptions paced_patch_options() const;
  void wait_serving() const;
  // The adapter of LlmEngineOptions::adapter, read and fitted to `cfg`
  // (its config set on cfg.adapter); nullopt without one.
  std::optional<LoraAdapter> adapter_for(HfConfig& cfg) const;
  // `base` followed by the served adapter's tensors (copies), if any.
  std::unique_ptr<gk::WeightSource> with_served_adapter(gk::WeightSource& base) const;
  // The same with the adapter `first` (the first load, before anything is served).
  std::unique_ptr<gk::WeightSource> with_adapter(gk::WeightSource& base, const std::optional<LoraAdapter>& first) const;

  LlmEngineOptions options_;
  std::shared_ptr<CausalLM> model_;
  std::unique_ptr<gk::ReloadEngine> engine_;
  std::vector<KvCache> caches_;
  RopeTables rope_;
  at::Tensor inputs_;                  // [2, max batch] int64: the tokens, then the positions
  at::Tensor ids_, positions_, seqs_;  // the graphs' static inputs, [max batch] (ids_, positions_: rows of inputs_)
  at::Tensor host_inputs_;             // inputs_' staging copy (pinned on CUDA)
  at::Tensor host_tokens_;             // [max batch] int32: decode()' result (pinned on CUDA)
  SamplingRows sampling_;              // the sampling graphs' static inputs, [max batch]
  std::optional<std::pair<SamplingParams, std::int64_t>> sampling_set_;  // what sampling_ holds, for how many rows
  bool sampling_eager_ = false;  // a sampling graph could not be captured: decode samples eagerly
  struct Graph {
    std::int64_t batch;
    std::unique_ptr<gk::ReplayBackend> graph;
    at::Tensor logits;  // [batch, vocab] float32
    at::Tensor greedy;  // [batch] int32, the argmax of the logits (in the graph)
    std::unique_ptr<gk::ReplayBackend> sampler;  // the sampling graph over `logits` (sampling_graphs)
    at::Tensor sampled;  // [batch] int32
  };
  std::vector<Graph> graphs_;
  double capture_ms_ = 0;
  std::optional<c10::Stream> serve_stream_;  // CUDA with high_priority_serving

};

}  // namespace demo
