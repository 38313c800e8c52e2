// examples/engine/graph_runner.h
//
// What an inference engine does with graphs: one captured graph per batch
// size, persistent input buffers, replay per decode step. With graphkeep the
// runner registers each graph with the reload engine (its capture manifest is
// verified after every reload) and asks before replaying.
//
//   demo::GraphRunner runner(model, engine, {1, 2, 4, 8});
//   runner.capture();                        // after engine.prepare()
//   at::Tensor logits = runner.step(ids);    // replays the smallest graph that fits
#pragma once

#include "tiny_lm.h"

#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/capture/replay.h>

#include <memory>
#include <vector>

namespace demo {

class GraphRunner {
 public:
  GraphRunner(TinyLM& model, gk::ReloadEngine& engine, std::vector<int64_t> batch_sizes);

  // Captures one graph per batch size and tracks it with the engine.
  void capture();
  // Logits [n, vocab] (CPU) for n = ids.size(0) tokens. `checked`: ask the
  // engine first (the default); false replays as an engine without
  // graphkeep would.
  at::Tensor step(const at::Tensor& ids, bool checked = true);
  // Greedy generation: `tokens` steps from `start` ([B] int64). Returns the
  // tokens [B, tokens] and the logits of every step [tokens, B, vocab].
  std::pair<at::Tensor, at::Tensor> generate(const at::Tensor& start, int64_t tokens, bool checked = true);

  const std::vector<int64_t>& batch_sizes() const { return batch_sizes_; }
  double capture_ms() const { return capture_ms_; }

 private:
  TinyLM& model_;
  gk::ReloadEngine& engine_;
  std::vector<int64_t> batch_sizes_;
  at::Tensor ids_;  // persistent input buffer [max batch] int64
  struct Graph {
    int64_t batch;
    std::unique_ptr<gk::ReplayBackend> graph;
    at::Tensor logits;
  };
  std::vector<Graph> graphs_;
  double capture_ms_ = 0;
};

// Eager greedy generation with no graphs: the "fresh engine" reference.
std::pair<at::Tensor, at::Tensor> generate_eager(TinyLM& model, const at::Tensor& start, int64_t tokens);

}  // namespace demo
