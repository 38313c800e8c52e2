// examples/engine/hf_names.h: the one table from Hugging Face checkpoint
// tensor names to the example engine's parameters (internal to the engine,
// bar expected_checkpoint).
//
//   self_attn.qkv_proj     = [q_proj; k_proj; v_proj]   one storage (fused QKV)
//   mlp.gate_up_proj       = [gate_proj; up_proj]       one storage (fused gate_up)
//   mlp.w13 / mlp.w2       = every expert's [gate; up] / down, one storage each (MoE)
//
//   gk::CheckpointParam p = demo::hf_names::checkpoint_param("mlp", "down_proj", {hidden}, inter, dtype);
#pragma once

#include <graphkeep/model/layer.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace demo {
namespace hf_names {

// The checkpoint param `param` of `layer` ("self_attn", "mlp", "mlp (moe)"),
// from the table: `rows` are the dim-0 sizes of each tensor of the rule (per
// expert for the experts' rules, `experts` of them).
gk::CheckpointParam checkpoint_param(std::string_view layer, std::string_view param, std::vector<std::int64_t> rows,
                                     std::int64_t cols, at::ScalarType dtype, std::int64_t experts = 0);
// The checkpoint tensors of `layer`'s parameter `param` under the module
// path `prefix`, for messages: "model.layers.0.mlp.gate_proj.weight + model.layers.0.mlp.up_proj.weight".
std::string checkpoint_names(const std::string& prefix, std::string_view layer, std::string_view param);

}  // namespace hf_names

// Every checkpoint tensor the model expects, with its full name, shape and
// dtype (for gk::HfCheckpointSource::check).
std::vector<gk::CheckpointTensor> expected_checkpoint(torch::nn::Module& model);

}  // namespace demo
