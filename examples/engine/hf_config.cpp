#include "hf_config.h"

#include <graphkeep/core/check.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace demo {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string file;
  std::string prefix = "";  // before each key in messages ("rope_scaling.")

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  template <class T>
  T get(const char* key) const {
    const json* v = find(key);
    GK_CHECK(gk::WeightError, v != nullptr, file, ": the field '", prefix, key, "' is missing");
    try {
      return v->get<T>();
    } catch (const json::exception& e) {
      GK_THROW(gk::WeightError, file, ": the field '", prefix, key, "' has the value ", v->dump(), ", which is not a ",
               std::is_same_v<T, bool> ? "boolean" : std::is_floating_point_v<T> ? "number" : std::is_integral_v<T> ? "integer" : "string");
    }
  }
  template <class T>
  T get(const char* key, T fallback) const {
    return find(key) == nullptr ? fallback : get<T>(key);
  }
  // A field the engine does not implement: allowed only absent, null or equal to `ok`.
  template <class T>
  void require(const char* key, const T& ok, const char* why) const {
    const json* v = find(key);
    if (v == nullptr) return;
    bool same = false;
    try {
      same = v->get<T>() == ok;
    } catch (const json::exception&) {
    }
    GK_CHECK(gk::WeightError, same, file, ": unsupported value ", v->dump(), " of the field '", prefix, key, "' (",
             why, "; the engine implements ", json(ok).dump(), "): the engine cannot serve this model");
  }
};

// config.json's rope_scaling as transformers 4.57 reads it
// (modeling_rope_utils.py): the type from "rope_type" or the older "type",
// the keys its computation requires. A type the engine does not implement
// (yarn, longrope, ...) and a key the type does not use are refused: the
// engine cannot tell what the model's authors meant by them.
RopeScaling parse_rope_scaling(const json& field, const std::string& file) {
  GK_CHECK(gk::WeightError, field.is_object(), file, ": the field 'rope_scaling' has the value ", field.dump(),
           ", which is not an object: the engine cannot serve this model");
  const Reader r{field, file, "rope_scaling."};
  RopeScaling rs;
  const json* rope_type = r.find("rope_type");
  const json* legacy = r.find("type");
  GK_CHECK(gk::WeightError, rope_type != nullptr || legacy != nullptr, file, ": the field 'rope_scaling' = ",
           field.dump(), " has no 'rope_type' (nor 'type'): the engine cannot serve this model");
  rs.type = r.get<std::string>(rope_type != nullptr ? "rope_type" : "type");
  if (rope_type != nullptr && legacy != nullptr) {
    GK_CHECK(gk::WeightError, r.get<std::string>("type") == rs.type, file, ": rope_scaling.rope_type '", rs.type,
             "' and rope_scaling.type '", r.get<std::string>("type"), "' differ: the engine cannot serve this model");
  }
  std::vector<std::string> keys{"rope_type", "type"};
  if (rs.type == "linear" || rs.type == "dynamic" || rs.type == "llama3") {
    rs.factor = r.get<double>("factor");
    GK_CHECK(gk::WeightError, std::isfinite(rs.factor) && rs.factor > 0, file, ": rope_scaling.factor is ", rs.factor,
             "; it must be a positive number: the engine cannot serve this model");
    keys.push_back("factor");
  }
  // transformers 4.57 accepts it for dynamic and computes without it (its scaling uses max_position_embeddings).
  if (rs.type == "dynamic") keys.push_back("original_max_position_embeddings");
  if (rs.type == "llama3") {
    rs.low_freq_factor = r.get<double>("low_freq_factor");
    rs.high_freq_factor = r.get<double>("high_freq_factor");
    rs.original_max_position_embeddings = r.get<std::int64_t>("original_max_position_embeddings");
    GK_CHECK(gk::WeightError, rs.low_freq_factor > 0 && rs.high_freq_factor > rs.low_freq_factor, file,
             ": rope_scaling.low_freq_factor (", rs.low_freq_factor, ") and rope_scaling.high_freq_factor (",
             rs.high_freq_factor, ") must satisfy 0 < low < high: the engine cannot serve this model");
    GK_CHECK(gk::WeightError, rs.original_max_position_embeddings > 0, file,
             ": rope_scaling.original_max_position_embeddings is ", rs.original_max_position_embeddings,
             "; it must be positive: the engine cannot serve this model");
    keys.insert(keys.end(), {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  }
  GK_CHECK(gk::WeightError, rs.type == "default" || rs.type == "linear" || rs.type == "dynamic" || rs.type == "llama3",
           file, ": unsupported rope_scaling.rope_type '", rs.type, "' = ", field.dump(),
           " (the engine implements default, linear, dynamic and llama3): the engine cannot serve this model");
  for (const auto& item : field.items()) {
    if (item.value().is_null() || std::find(keys.begin(), keys.end(), item.key()) != keys.end()) continue;
    GK_THROW(gk::WeightError, file, ": unsupported field 'rope_scaling.", item.key(), "' = ", item.value().dump(),
             " (the engine's rope_type '", rs.type, "' has no such parameter): the engine cannot serve this model");
  }
  return rs;
}

at::ScalarType parse_dtype(const std::string& s, const std::string& file) {
  if (s == "float32") return at::kFloat;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  GK_THROW(gk::WeightError, file, ": unsupported torch_dtype '", s,
           "' (the engine implements float32, bfloat16 and float16): the engine cannot serve this model");
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

}  // namespace

std::string RopeScaling::to_json() const {
  if (type == "default") return "null";
  json j{{"rope_type", type}, {"factor", factor}};
  if (type == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
    j["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  return j.dump();
}

std::int64_t HfConfig::num_parameters() const {
  const std::int64_t h = hidden_size, d = head_dim;
  std::int64_t attn = h * (num_attention_heads * d) * 2 + h * (num_key_value_heads * d) * 2;
  if (has_qk_norm()) attn += 2 * d;
  const std::int64_t mlp = is_moe() ? num_experts * 3 * h * moe_intermediate_size + num_experts * h
                                    : 3 * h * intermediate_size;
  const std::int64_t layer = attn + mlp + 2 * h;
  return num_hidden_layers * layer + vocab_size * h * (tie_word_embeddings ? 1 : 2) + h;
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(file);
  GK_CHECK(gk::WeightError, in.good(), file, ": cannot open the model's config (is '", dir,
           "' a Hugging Face model directory?)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    GK_THROW(gk::WeightError, file, ": not valid JSON: ", e.what());
  }
  GK_CHECK(gk::WeightError, j.is_object(), file, ": expected a JSON object");
  const Reader r{j, file};
  HfConfig c;
  c.model_type = r.get<std::string>("model_type");
  GK_CHECK(gk::WeightError, c.model_type == "llama" || c.model_type == "qwen3" || c.model_type == "qwen3_moe", file,
           ": unsupported model_type '", c.model_type,
           "' (the engine implements llama, qwen3 and qwen3_moe): the engine cannot serve this model");
  c.vocab_size = r.get<std::int64_t>("vocab_size");
  c.hidden_size = r.get<std::int64_t>("hidden_size");
  c.num_hidden_layers = r.get<std::int64_t>("num_hidden_layers");
  c.num_attention_heads = r.get<std::int64_t>("num_attention_heads");
  c.num_key_value_heads = r.get<std::int64_t>("num_key_value_heads", c.num_attention_heads);
  c.head_dim = r.get<std::int64_t>("head_dim", c.hidden_size / std::max<std::int64_t>(c.num_attention_heads, 1));
  c.rms_norm_eps = r.get<double>("rms_norm_eps", 1e-6);
  c.rope_theta = r.get<double>("rope_theta", 10000.0);
  c.max_position_embeddings = r.get<std::int64_t>("max_position_embeddings", 2048);
  c.tie_word_embeddings = r.get<bool>("tie_word_embeddings", false);
  const json* dt = r.find("torch_dtype");
  if (dt == nullptr) dt = r.find("dtype");
  c.dtype = dt == nullptr ? at::kFloat : parse_dtype(dt->get<std::string>(), file);

  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
    GK_CHECK(gk::WeightError, r.get<std::int64_t>(key) > 0, file, ": the field '", key, "' must be positive");
  GK_CHECK(gk::WeightError, c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, file,
           ": num_attention_heads (", c.num_attention_heads, ") must be a multiple of num_key_value_heads (",
           c.num_key_value_heads, ")");
  GK_CHECK(gk::WeightError, c.head_dim > 0 && c.head_dim % 2 == 0, file, ": head_dim ", c.head_dim,
           " must be positive and even (rotary embedding)");

  r.require<std::string>("hidden_act", "silu", "the MLP activation");
  r.require<bool>("attention_bias", false, "biases of q, k, v and o");
  r.require<bool>("mlp_bias", false, "biases of the MLP");
  r.require<bool>("use_sliding_window", false, "sliding-window attention");
  r.require<double>("attention_dropout", 0.0, "dropout at inference");
  r.require<std::int64_t>("pretraining_tp", 1, "tensor-parallel slicing of the pretraining");
  r.require<double>("partial_rotary_factor", 1.0, "rotary embedding over part of each head");
  if (const json* rs = r.find("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, file);
  GK_CHECK(gk::WeightError, c.max_position_embeddings > 0, file, ": the field 'max_position_embeddings' is ",
           c.max_position_embeddings, "; it must be positive");

  if (c.is_moe()) {
    c.num_experts = r.get<std::int64_t>("num_experts");
    c.num_experts_per_tok = r.get<std::int64_t>("num_experts_per_tok");
    c.moe_intermediate_size = r.get<std::int64_t>("moe_intermediate_size");
    c.norm_topk_prob = r.get<bool>("norm_topk_prob", false);
    GK_CHECK(gk::WeightError, c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, file,
             ": num_experts_per_tok (", c.num_experts_per_tok, ") must be in 1..num_experts (", c.num_experts, ")");
    r.require<std::int64_t>("decoder_sparse_step", 1, "MoE on every layer");
    r.require<std::int64_t>("shared_expert_intermediate_size", 0, "shared experts");
    if (const json* dense = r.find("mlp_only_layers")) {
      GK_CHECK(gk::WeightError, dense->is_array() && dense->empty(), file,
               ": unsupported field 'mlp_only_layers' = ", dense->dump(),
               " (the engine implements MoE on every layer): the engine cannot serve this model");
    }
    c.intermediate_size = r.get<std::int64_t>("intermediate_size", 0);
  } else {
    c.intermediate_size = r.get<std::int64_t>("intermediate_size");
  }
  return c;
}

void write_hf_config(const HfConfig& c, const std::string& dir) {
  std::filesystem::create_directories(dir);
  json j{{"model_type", c.model_type},
         {"architectures", json::array({c.model_type == "llama"   ? "LlamaForCausalLM"
                                        : c.model_type == "qwen3" ? "Qwen3ForCausalLM"
                                                                  : "Qwen3MoeForCausalLM"})},
         {"vocab_size", c.vocab_size},
         {"hidden_size", c.hidden_size},
         {"intermediate_size", c.intermediate_size},
         {"num_hidden_layers", c.num_hidden_layers},
         {"num_attention_heads", c.num_attention_heads},
         {"num_key_value_heads", c.num_key_value_heads},
         {"head_dim", c.head_dim},
         {"hidden_act", "silu"},
         {"rms_norm_eps", c.rms_norm_eps},
         {"rope_theta", c.rope_theta},
         {"max_position_embeddings", c.max_position_embeddings},
         {"tie_word_embeddings", c.tie_word_embeddings},
         {"attention_bias", false},
         {"torch_dtype", dtype_name(c.dtype)}};
  j["rope_scaling"] = json::parse(c.rope_scaling.to_json());
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
  }
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  std::ofstream out(file);
  out << j.dump(2) << "\n";
  GK_CHECK(gk::WeightError, out.good(), file, ": cannot write");
}

}  // namespace demo
