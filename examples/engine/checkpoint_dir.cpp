#include "checkpoint_dir.h"

#include "hf_names.h"
#include "lora.h"

#include <graphkeep/core/check.h>

#include <vector>

namespace demo {

std::unique_ptr<gk::HfCheckpointSource> open_checkpoint(const std::string& dir, torch::nn::Module& model) {
  auto src = std::make_unique<gk::HfCheckpointSource>(dir, [](std::string_view hf) -> std::string {
    if (hf.ends_with(".rotary_emb.inv_freq")) return "";
    return std::string(hf);
  });
  std::vector<gk::ExpectedTensor> expected;
  for (gk::CheckpointTensor& t : expected_checkpoint(model))
    if (!is_lora_tensor(t.name)) expected.push_back({std::move(t.name), std::move(t.shape), t.dtype});  // (the adapter's come apart)
  src->check(expected);
  return src;
}

void check_same_architecture(const HfConfig& have, const HfConfig& next, const std::string& dir,
                             std::int64_t max_len) {
  auto same = [&](const char* field, auto a, auto b) {
    GK_CHECK(gk::WeightError, a == b, dir, "/config.json: ", field, " is ", b, " but the served model has ", a,
             " (a reload keeps the architecture; start a new engine for another model)");
  };
  same("model_type", have.model_type, next.model_type);
  same("vocab_size", have.vocab_size, next.vocab_size);
  same("hidden_size", have.hidden_size, next.hidden_size);
  same("intermediate_size", have.intermediate_size, next.intermediate_size);
  same("num_hidden_layers", have.num_hidden_layers, next.num_hidden_layers);
  same("num_attention_heads", have.num_attention_heads, next.num_attention_heads);
  same("num_key_value_heads", have.num_key_value_heads, next.num_key_value_heads);
  same("head_dim", have.head_dim, next.head_dim);
  same("rms_norm_eps", have.rms_norm_eps, next.rms_norm_eps);
  same("rope_theta", have.rope_theta, next.rope_theta);
  same("tie_word_embeddings", have.tie_word_embeddings, next.tie_word_embeddings);
  same("torch_dtype", std::string(c10::toString(have.dtype)), std::string(c10::toString(next.dtype)));
  same("num_experts", have.num_experts, next.num_experts);
  same("num_experts_per_tok", have.num_experts_per_tok, next.num_experts_per_tok);
  same("moe_intermediate_size", have.moe_intermediate_size, next.moe_intermediate_size);
  same("norm_topk_prob", have.norm_topk_prob, next.norm_topk_prob);
  same("rope_scaling", have.rope_scaling.to_json(), next.rope_scaling.to_json());
  if (have.rope_scaling.type == "dynamic")  // its frequencies derive from it
    same("max_position_embeddings", have.max_position_embeddings, next.max_position_embeddings);
  // The start-up check (LlmEngine::start), for the new config.
  GK_CHECK(gk::WeightError, max_len <= next.max_position_embeddings, dir, "/config.json: max_position_embeddings is ",
           next.max_position_embeddings, ", below the engine's max_len ", max_len,
           " (the KV cache and the rotary tables the graphs captured reach position ", max_len - 1,
           "; start a new engine with a smaller max_len for this model)");
}

}  // namespace demo
