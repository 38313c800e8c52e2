// examples/engine/hf_config.h
//
// The architecture and sizes of a Hugging Face decoder, read from its
// config.json. The engine supports the Llama / Qwen3 family and Qwen3-MoE,
// with plain RoPE or the rope scalings "linear", "dynamic" and "llama3"
// (Llama 3.1+) as transformers 4.57 computes them; anything that would
// change the computation and that the engine does not implement (another
// model_type, attention or MLP biases, another rope scaling, partial
// rotary embeddings, sliding windows, shared experts, dense layers inside a
// MoE model, another activation) is a gk::WeightError naming the file, the
// field and its value, and saying the engine cannot serve the model. Fields
// that do not change the computation (token ids, architectures,
// transformers_version, ...) are ignored.
//
//   demo::HfConfig c = demo::read_hf_config("ckpt/step0");   // ckpt/step0/config.json
//   c.num_hidden_layers, c.is_moe(), c.dtype ...
#pragma once

#include "lora_config.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace demo {

// config.json's rope_scaling: how the rotary frequencies are scaled
// (transformers' modeling_rope_utils.py; Note [Rope scaling as transformers
// computes it] in rope.cpp). type "default" when the field is absent or null.
struct RopeScaling {
  std::string type = "default";  // "default", "linear", "dynamic" or "llama3"
  double factor = 1.0;           // linear, dynamic, llama3
  double low_freq_factor = 0, high_freq_factor = 0;     // llama3
  std::int64_t original_max_position_embeddings = 0;   // llama3
  bool operator==(const RopeScaling&) const = default;
  // The field as config.json would give it ("null" for default).
  std::string to_json() const;
};

struct HfConfig {
  std::string model_type;  // "llama", "qwen3" or "qwen3_moe"
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;  // dense MLP
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::int64_t max_position_embeddings = 0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  at::ScalarType dtype = at::kFloat;  // torch_dtype / dtype
  // Qwen3-MoE
  std::int64_t num_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;

  // The LoRA adapter the model serves (lora.h), set by the engine that loads
  // one: its rank and targets shape the layers' parameters.
  std::optional<LoraConfig> adapter;

  bool is_moe() const { return model_type == "qwen3_moe"; }
  bool has_qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  // Parameters of the model (embedding and head counted once when tied).
  std::int64_t num_parameters() const;
};

// Reads `dir`/config.json. gk::WeightError for a missing or malformed file,
// a missing field, or an unsupported model_type, field or value.
HfConfig read_hf_config(const std::string& dir);

// Writes `c` as `dir`/config.json (creating `dir`), in the form transformers
// writes: the demo's built-in model.
void write_hf_config(const HfConfig& c, const std::string& dir);

}  // namespace demo
