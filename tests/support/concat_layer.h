// tests/support/concat_layer.h: a layer whose parameters concatenate many
// checkpoint tensors, for the batched default loads (Note [Default loads in
// one launch] in reload/batched_loads.h): tests/reload_test.cpp on the
// CPU, tests/cuda_graph_test.cpp on CUDA. expected() builds what the loads
// must leave by concatenation, not through any load.
#pragma once

#include <graphkeep/model/layer.h>
#include <graphkeep/registry.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace gktest {

// A layer whose parameters concatenate many checkpoint tensors, as stacked
// experts do: `w` 37 bf16 tensors of 1 to 7 rows of 9 (18-byte rows: copies
// at unaligned addresses), `s` two tensors each in 3 shards along dim 0, `t`
// one tensor in 2 shards along dim 1 (not one byte range: default_load), and
// `c` three tensors whose second the layer loads itself, also writing row 0,
// which the first tensor's load wrote before it: the order of the writes
// decides row 0.
class ConcatLayer : public torch::nn::Module, public gk::DescribedLayer<ConcatLayer> {
 public:
  explicit ConcatLayer(c10::Device d) {
    std::vector<gk::CheckpointTensor> w;
    for (int i = 0; i < 37; ++i) w.push_back({"w" + std::to_string(i), {1 + i % 7, 9}, at::kBFloat16});
    w_ = checkpoint_param("w", w, d);
    s_ = checkpoint_param("s", {{"s0", {6, 4}, at::kFloat, 3, 0}, {"s1", {6, 4}, at::kFloat, 3, 0}}, d);
    t_ = checkpoint_param("t", {{"t", {4, 6}, at::kFloat, 2, 1}}, d);
    c_ = checkpoint_param("c", {{"c0", {2, 5}, at::kFloat}, {"c1", {3, 5}, at::kFloat}, {"c2", {1, 5}, at::kFloat}}, d);
  }
  bool load_weight(const gk::LoadRequest& r) override {
    if (r.param.param != "c" || r.tensor_index != 1) return false;
    gk::default_load(r);
    r.target[0].fill_(-1.0f);
    return true;
  }
  // Every checkpoint tensor, in the order a source delivers it.
  static std::vector<gk::NamedTensor> checkpoint(int step) {
    auto wave = [&](std::vector<int64_t> shape, double phase) {
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      return at::sin(at::arange(n, at::kFloat).reshape(shape) * 0.37 + phase + 0.11 * step);
    };
    std::vector<gk::NamedTensor> out;
    for (int i = 0; i < 37; ++i) out.push_back({"w" + std::to_string(i), wave({1 + i % 7, 9}, i).to(at::kBFloat16), 0});
    for (int k = 0; k < 2; ++k) {
      const at::Tensor whole = wave({6, 4}, 40 + k);
      for (int64_t sh = 0; sh < 3; ++sh) out.push_back({"s" + std::to_string(k), whole.chunk(3, 0)[sh].contiguous(), sh});
    }
    const at::Tensor t = wave({4, 6}, 50);
    for (int64_t sh = 0; sh < 2; ++sh) out.push_back({"t", t.chunk(2, 1)[sh].contiguous(), sh});
    out.push_back({"c0", wave({2, 5}, 60), 0});
    out.push_back({"c1", wave({3, 5}, 61), 0});
    out.push_back({"c2", wave({1, 5}, 62), 0});
    return out;
  }
  std::vector<at::Tensor> params() const { return {w_, s_, t_, c_}; }
  // What w, s, t and c must hold after loading checkpoint(step): the
  // tensors concatenated along dim 0, the shards put back whole, and c1's
  // loader's row 0.
  static std::vector<at::Tensor> expected(int step) {
    std::vector<at::Tensor> w, s, t, c;
    for (const gk::NamedTensor& n : checkpoint(step)) {
      const char k = n.name[0];
      (k == 'w' ? w : k == 's' ? s : k == 't' ? t : c).push_back(n.value);
    }
    at::Tensor cs = at::cat(c);
    cs[0].fill_(-1.0f);
    return {at::cat(w), at::cat(s), at::cat(t, 1), cs};
  }

 private:
  at::Tensor w_, s_, t_, c_;
  GRAPHKEEP_DESCRIBE_DERIVED(ConcatLayer, (torch::nn::Module, gk::DescribedLayer<ConcatLayer>), (w_, gk::parameter),
                             (s_, gk::parameter), (t_, gk::parameter), (c_, gk::parameter))
};

}  // namespace gktest
