// examples/engine/checkpoint_writer.h
//
// What the demo's "trainer" does: writes Hugging Face model directories
// (config.json, safetensors shards and model.safetensors.index.json, as
// save_pretrained lays them out), from random weights for the built-in model,
// or as an update of a previous checkpoint, which stands in for a few
// optimizer steps of an RL trainer.
//
//   demo::HfConfig cfg = demo::builtin_tiny_config();
//   demo::write_hf_checkpoint("run/step0", cfg, demo::random_weights(cfg, /*seed=*/1));
//   demo::write_hf_checkpoint("run/step1", cfg, demo::trainer_update("run/step0", /*seed=*/1, /*step=*/1));
#pragma once

#include "hf_config.h"

#include <graphkeep/sources/weight_source.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace demo {

// The demo's built-in model: a Qwen3-shaped decoder small enough for a CPU
// (2 layers, hidden 64, 4 heads of 16 over 2 KV heads, vocab 256, float32).
HfConfig builtin_tiny_config();
// The same model as each architecture the engine serves: Llama (no q/k
// norms), Qwen3 (the built-in one) and Qwen3-MoE (8 experts of 32, top 2).
std::vector<HfConfig> builtin_tiny_configs();

// Every tensor the model of `c` expects, in Hugging Face names, with random
// values of a trained model's magnitudes (projections ~ 1/sqrt(fan-in),
// norms near 1), the same for the same seed on every machine.
std::vector<gk::NamedTensor> random_weights(const HfConfig& c, std::uint64_t seed);

// The checkpoint in `dir`, each tensor moved by a small deterministic step
// (w + 0.05 * rms(w) * noise(seed, step, name)): what a trainer publishes.
std::vector<gk::NamedTensor> trainer_update(const std::string& dir, std::uint64_t seed, std::int64_t step);

// Writes `c` and `tensors` to `dir` as save_pretrained does: shards of at
// most `max_shard_bytes` named model-0000i-of-0000n.safetensors and an index,
// or one model.safetensors when everything fits in one shard. Any previous
// safetensors files and index in `dir` are removed first.
void write_hf_checkpoint(const std::string& dir, const HfConfig& c, const std::vector<gk::NamedTensor>& tensors,
                         std::size_t max_shard_bytes = 200 * 1024);

}  // namespace demo
