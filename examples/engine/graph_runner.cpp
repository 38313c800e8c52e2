#include "graph_runner.h"

#include "ops.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace demo {
GraphRunner::GraphRunner(TinyLM& model, gk::ReloadEngine& engine, std::vector<int64_t> batch_sizes)
    : model_(model), engine_(engine), batch_sizes_(std::move(batch_sizes)) {
  GK_CHECK(gk::StateError, !batch_sizes_.empty(), "GraphRunner: no batch sizes");
  std::sort(batch_sizes_.begin(), batch_sizes_.end());
  ids_ = at::zeros({batch_sizes_.back()}, at::TensorOptions().dtype(at::kLong).device(model.device()));
}

void GraphRunner::capture() {
  const auto t0 = std::chrono::steady_clock::now();
  engine_.add_static_io("input_ids", ids_);
  (void)model_.forward(ids_);  // warm-up outside any capture
  gk::runtime::synchronize(model_.device());
  graphs_.clear();
  for (int64_t b : batch_sizes_) {
    Graph g{b, gk::make_replay(model_.device(), "decode_bs" + std::to_string(b)), {}};
    at::Tensor view = ids_.narrow(0, 0, b);
    g.graph->capture([&] { g.logits = model_.forward(view); });
    engine_.track(*g.graph);
    graphs_.push_back(std::move(g));
  }
  gk::runtime::synchronize(model_.device());
  capture_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

at::Tensor GraphRunner::step(const at::Tensor& ids, bool checked) {
  const int64_t n = ids.size(0);
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const Graph& g) { return g.batch >= n; });
  GK_CHECK(gk::StateError, it != graphs_.end(), "GraphRunner: batch of ", n, " exceeds the largest captured graph (",
           batch_sizes_.back(), ")");
  if (checked) engine_.check_replay_allowed();
  ids_.zero_();
  ids_.narrow(0, 0, n).copy_(ids);
  it->graph->replay();
  gk::runtime::synchronize(model_.device());
  return it->logits.narrow(0, 0, n).to(at::kCPU).clone();
}

std::pair<at::Tensor, at::Tensor> GraphRunner::generate(const at::Tensor& start, int64_t tokens, bool checked) {
  at::Tensor cur = start.to(at::kLong);
  std::vector<at::Tensor> toks, logits;
  for (int64_t t = 0; t < tokens; ++t) {
    at::Tensor l = step(cur, checked);
    logits.push_back(l);
    cur = l.argmax(-1);
    toks.push_back(cur);
  }
  return {at::stack(toks, 1), at::stack(logits, 0)};
}

std::pair<at::Tensor, at::Tensor> generate_eager(TinyLM& model, const at::Tensor& start, int64_t tokens) {
  at::Tensor cur = start.to(at::kLong).to(model.device());
  std::vector<at::Tensor> toks, logits;
  for (int64_t t = 0; t < tokens; ++t) {
    at::Tensor l = model.forward(cur);
    gk::runtime::synchronize(model.device());
    l = l.to(at::kCPU).clone();
    logits.push_back(l);
    cur = l.argmax(-1);
    toks.push_back(cur);
    cur = cur.to(model.device());
  }
  return {at::stack(toks, 1), at::stack(logits, 0)};
}

}  // namespace demo
