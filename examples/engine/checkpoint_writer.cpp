#include "checkpoint_writer.h"

#include "llm.h"

#include <graphkeep/core/check.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace demo {
namespace {

// A CPU generator seeded from (seed, step, name): the same stream everywhere.
at::Generator generator(std::uint64_t seed, std::int64_t step, const std::string& name) {
  std::uint64_t h = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step) * 0xC2B2AE3D27D4EB4Full;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
  return at::make_generator<at::CPUGeneratorImpl>(h);
}

bool is_norm(const std::string& name) { return name.ends_with("norm.weight"); }

}  // namespace

HfConfig builtin_tiny_config() {
  HfConfig c;
  c.model_type = "qwen3";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = false;
  c.dtype = at::kFloat;
  return c;
}

std::vector<HfConfig> builtin_tiny_configs() {
  HfConfig qwen3 = builtin_tiny_config(), llama = qwen3, moe = qwen3;
  llama.model_type = "llama";
  moe.model_type = "qwen3_moe";
  moe.num_experts = 8;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 32;
  moe.norm_topk_prob = true;
  return {llama, qwen3, moe};
}

std::vector<gk::NamedTensor> random_weights(const HfConfig& c, std::uint64_t seed) {
  at::NoGradGuard no_grad;
  CausalLM shape_only(c, c10::kCPU, WeightFormat::dense);
  std::vector<gk::NamedTensor> out;
  for (const gk::CheckpointTensor& t : expected_checkpoint(shape_only)) {
    at::Generator g = generator(seed, 0, t.name);
    at::Tensor w;
    if (is_norm(t.name)) {
      w = 1.0 + 0.1 * at::randn(t.shape, g);
    } else {
      const double fan_in = static_cast<double>(t.shape.back());
      w = at::randn(t.shape, g) * (t.name.ends_with("embed_tokens.weight") ? 1.0 : 1.0 / std::sqrt(fan_in));
    }
    out.push_back({t.name, w.to(t.dtype), 0});
  }
  return out;
}

std::vector<gk::NamedTensor> trainer_update(const std::string& dir, std::uint64_t seed, std::int64_t step) {
  at::NoGradGuard no_grad;
  gk::HfCheckpointSource src(dir);
  std::vector<gk::NamedTensor> out;
  while (auto t = src.next()) {
    const at::Tensor w = t->value.to(at::kFloat);
    const double rms = std::sqrt(w.pow(2).mean().item<double>());
    at::Generator g = generator(seed, step, t->name);
    out.push_back({t->name, (w + 0.05 * rms * at::randn(w.sizes(), g)).to(t->value.scalar_type()), 0});
  }
  return out;
}

void write_hf_checkpoint(const std::string& dir, const HfConfig& c, const std::vector<gk::NamedTensor>& tensors,
                         std::size_t max_shard_bytes) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string n = entry.path().filename().string();
    if (n.ends_with(".safetensors") || n == "model.safetensors.index.json") fs::remove(entry.path());
  }
  write_hf_config(c, dir);
  // Greedy shards in tensor order, as save_pretrained's split does.
  std::vector<std::vector<gk::NamedTensor>> shards(1);
  std::size_t bytes = 0, total = 0;
  for (const gk::NamedTensor& t : tensors) {
    const std::size_t n = t.value.nbytes();
    if (!shards.back().empty() && bytes + n > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(t);
    bytes += n;
    total += n;
  }
  if (shards.size() == 1) {
    gk::write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], {{"format", "pt"}});
    return;
  }
  nlohmann::json map = nlohmann::json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    gk::write_safetensors((fs::path(dir) / name).string(), shards[i], {{"format", "pt"}});
    for (const gk::NamedTensor& t : shards[i]) map[t.name] = name;
  }
  const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  const std::string path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(path);
  out << index.dump(2) << "\n";
  GK_CHECK(gk::WeightError, out.good(), path, ": cannot write");
}

}  // namespace demo
