#include "tiny_lm.h"

#include "ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>
#include <functional>

namespace demo {
namespace {

// A CPU generator seeded from (seed, name, step): the same stream everywhere.
at::Generator generator(uint64_t seed, const std::string& name, int64_t step) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 0xC2B2AE3D27D4EB4Full;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
  return at::make_generator<at::CPUGeneratorImpl>(h);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The base value of one checkpoint tensor (step 0) and its trainer update.
at::Tensor make_tensor(const gk::CheckpointTensor& t, uint64_t seed, int64_t step, int64_t group_size) {
  at::Generator g0 = generator(seed, t.name, 0);
  at::Generator gs = generator(seed, t.name, step + 1);
  if (t.dtype == at::kInt && ends_with(t.name, "g_idx")) {
    // act-order: channel k belongs to group perm(k) / group_size
    const int64_t in = t.shape.at(0);
    at::Tensor perm = at::randperm(in, g0, at::kLong);
    return at::floor_divide(perm, group_size).to(at::kInt);
  }
  if (t.dtype == at::kInt) {
    at::Tensor q = at::randint(INT32_MIN, INT32_MAX, t.shape, g0, at::kLong).to(at::kInt);
    if (step == 0) return q;
    // flip the low bit of a random subset of nibbles: valid int4 codes still
    at::Tensor mask = at::randint(0, 1 << 16, t.shape, gs, at::kLong).to(at::kInt);
    return at::bitwise_xor(q, at::bitwise_and(mask.mul(0x10001), 0x11111111));
  }
  // Magnitudes keep activations of order one through the layers (a weight
  // of fan-in n has a standard deviation near 1/sqrt(n); int4 codes have one
  // near 4.6), so that every layer, attention included, moves the logits and
  // a stale derived tensor shows in the output.
  at::Tensor w;
  const double fan_in = static_cast<double>(t.shape.back());
  if (ends_with(t.name, "scales")) {
    w = (0.5 + at::rand(t.shape, g0)) * (1.0 / (4.6 * std::sqrt(static_cast<double>(t.shape.front() * group_size))));
    if (step > 0) w = w * (1.0 + 0.2 * at::rand(t.shape, gs));
  } else {
    const double sd = ends_with(t.name, "embed.weight") ? 1.0 : 1.0 / std::sqrt(fan_in);
    w = sd * at::randn(t.shape, g0);
    if (step > 0) w = w + 0.3 * sd * at::randn(t.shape, gs);
  }
  return w.to(t.dtype);
}

}  // namespace

Plain::Plain(std::vector<int64_t> shape, c10::Device device, double fill) {
  weight = register_parameter("weight", at::full(shape, fill, at::TensorOptions().device(device)), false);
}

Block::Block(const TinyLMConfig& c, c10::Device d) {
  const int64_t hd = c.heads * c.head_dim;
  wq = register_module("wq", std::make_shared<gk::quant::MarlinW4A16Linear>(c.dim, hd, c.group_size, d));
  wc = register_module("wc", std::make_shared<gk::quant::MarlinW4A16Linear>(c.dim, c.latent, c.group_size, d));
  attn = register_module("attn", std::make_shared<gk::kernels::MlaAttention>(c.heads, c.head_dim, c.head_dim, c.latent, d));
  wo = register_module("wo", std::make_shared<gk::quant::MarlinW4A16Linear>(hd, c.dim, c.group_size, d));
  router = register_module("router", std::make_shared<Plain>(std::vector<int64_t>{c.experts, c.dim}, d));
  moe = register_module("moe", std::make_shared<gk::kernels::CutlassMoe>(c.experts, c.dim, c.inter, c.topk, d));
}

at::Tensor Block::forward(const at::Tensor& x) {
  at::Tensor a = attn->forward(wq->forward(x), wc->forward(x));
  at::Tensor h = ops::add(x, wo->forward(a));
  at::Tensor logits = ops::linear(h, router->weight);
  return ops::add(h, moe->forward(h, logits));
}

TinyLM::TinyLM(const TinyLMConfig& c, c10::Device d) : config_(c), device_(d) {
  embed_ = register_module("embed", std::make_shared<Plain>(std::vector<int64_t>{c.vocab, c.dim}, d));
  auto list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_shared<Block>(c, d));
    list->push_back(blocks_.back());
  }
  norm_ = register_module("norm", std::make_shared<Plain>(std::vector<int64_t>{c.dim}, d, 1.0));
  lm_head_ = register_module("lm_head", std::make_shared<Plain>(std::vector<int64_t>{c.vocab, c.dim}, d));
}

at::Tensor TinyLM::forward(const at::Tensor& ids) {
  at::Tensor x = ops::embedding(embed_->weight, ids);
  for (auto& b : blocks_) x = b->forward(x);
  return ops::linear(ops::rms_norm(x, norm_->weight), lm_head_->weight);
}

std::vector<gk::NamedTensor> TinyLM::checkpoint(uint64_t seed, int64_t step) {
  std::vector<gk::NamedTensor> out;
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", this}};
  for (const auto& item : named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());
  for (auto& [prefix, m] : modules) {
    const std::string p = prefix.empty() ? "" : prefix + ".";
    std::vector<gk::CheckpointTensor> tensors;
    if (auto* layer = dynamic_cast<gk::ReloadableLayer*>(m)) {
      for (const auto& cp : layer->checkpoint_params())
        for (const auto& t : cp.tensors) tensors.push_back(t);
    } else {
      for (const auto& item : m->named_parameters(/*recurse=*/false))
        tensors.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
    }
    for (auto& t : tensors) {
      t.name = p + t.name;
      at::Tensor v = make_tensor(t, seed, step, config_.group_size);
      if (prefix == "norm") v = 1.0 + v;  // a norm gain near 1
      out.push_back({t.name, v, 0});
    }
  }
  return out;
}

}  // namespace demo
