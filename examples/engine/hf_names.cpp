// The Hugging Face name table of the example engine (hf_names.h).
#include "hf_names.h"

#include <graphkeep/core/check.h>

#include <torch/nn/module.h>

#include <utility>

namespace demo {
namespace hf_names {
namespace {

// One entry per fused parameter: the checkpoint tensors it is made of, in
// order (concatenated along dim 0), relative to the layer's module path.
// "{e}" expands to every expert index.
struct HfTensorRule {
  const char* layer;  // the engine's module (the checkpoint's module path ends with it)
  const char* param;  // the module's parameter
  std::vector<const char*> tensors;
};
// The one table from Hugging Face tensor names to the engine's parameters.
// Tensors not listed here load into plain modules under their own name
// (model.embed_tokens.weight, *.input_layernorm.weight, *.post_attention_layernorm.weight,
// self_attn.q_norm.weight, self_attn.k_norm.weight, model.norm.weight, lm_head.weight).
const std::vector<HfTensorRule>& hf_tensor_table() {
  static const std::vector<HfTensorRule> table{
      {"self_attn", "qkv_proj", {"q_proj.weight", "k_proj.weight", "v_proj.weight"}},
      {"self_attn", "o_proj", {"o_proj.weight"}},
      {"mlp", "gate_up_proj", {"gate_proj.weight", "up_proj.weight"}},
      {"mlp", "down_proj", {"down_proj.weight"}},
      {"mlp (moe)", "gate", {"gate.weight"}},
      {"mlp (moe)", "w13", {"experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight"}},
      {"mlp (moe)", "w2", {"experts.{e}.down_proj.weight"}},
  };
  return table;
}

const HfTensorRule& rule(std::string_view layer, std::string_view param) {
  for (const HfTensorRule& r : hf_tensor_table())
    if (layer == r.layer && param == r.param) return r;
  GK_THROW(gk::InternalError, "no checkpoint rule for ", layer, ".", param);
}

}  // namespace

// The checkpoint param `param` of `layer`, from the table: `rows` are the
// dim-0 sizes of each tensor of the rule (per expert for "{e}" rules).
gk::CheckpointParam checkpoint_param(std::string_view layer, std::string_view param, std::vector<int64_t> rows,
                                     int64_t cols, at::ScalarType dtype, int64_t experts) {
  const HfTensorRule& r = rule(layer, param);
  gk::CheckpointParam cp{std::string(param), {}};
  auto add = [&](const std::string& name, int64_t n) { cp.tensors.push_back({name, {n, cols}, dtype}); };
  if (experts == 0) {
    for (std::size_t i = 0; i < r.tensors.size(); ++i) add(r.tensors[i], rows.at(i));
    return cp;
  }
  for (int64_t e = 0; e < experts; ++e)
    for (std::size_t i = 0; i < r.tensors.size(); ++i) {
      std::string n = r.tensors[i];
      n.replace(n.find("{e}"), 3, std::to_string(e));
      add(n, rows.at(i));
    }
  return cp;
}

// The checkpoint tensors of `layer`'s parameter `param` under the module
// path `prefix`, for messages: "model.layers.0.mlp.gate_proj.weight + model.layers.0.mlp.up_proj.weight".
std::string checkpoint_names(const std::string& prefix, std::string_view layer, std::string_view param) {
  std::string out;
  for (const char* t : rule(layer, param).tensors) out += (out.empty() ? "" : " + ") + prefix + "." + t;
  return out;
}

}  // namespace hf_names

std::vector<gk::CheckpointTensor> expected_checkpoint(torch::nn::Module& model) {
  std::vector<gk::CheckpointTensor> out;
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());
  for (auto& [prefix, m] : modules) {
    const std::string p = prefix.empty() ? "" : prefix + ".";
    if (auto* layer = dynamic_cast<gk::ReloadableLayer*>(m)) {
      for (const auto& cp : layer->checkpoint_params())
        for (gk::CheckpointTensor t : cp.tensors) {
          t.name = p + t.name;
          out.push_back(std::move(t));
        }
    } else {
      for (const auto& item : m->named_parameters(/*recurse=*/false))
        out.push_back({p + item.key(), item.value().sizes().vec(), item.value().scalar_type()});
    }
  }
  return out;
}

}  // namespace demo
