// LoRA adapters (lora.h).
#include "lora.h"


#include <graphkeep/core/check.h>
#include <graphkeep/reload/errors.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

namespace demo {
namespace {

using nlohmann::json;

const std::vector<std::string>& projections() {
  static const std::vector<std::string> p{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return p;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

LoraAdapter read_lora_adapter(const std::string& dir) {
  LoraAdapter out;
  out.dir = dir;
  const std::string cfg_path = dir + "/adapter_config.json";
  std::ifstream in(cfg_path);
  GK_CHECK(gk::WeightError, in.good(), cfg_path, ": cannot open the adapter's config (a PEFT adapter directory holds "
           "adapter_config.json and adapter_model.safetensors)");
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    GK_THROW(gk::WeightError, cfg_path, ": not JSON (", e.what(), ")");
  }
  auto field = [&](const char* name) -> const json& {
    GK_CHECK(gk::WeightError, j.contains(name) && !j[name].is_null(), cfg_path, ": field '", name, "' is missing");
    return j[name];
  };
  auto absent_or = [&](const char* name, auto&& ok, const char* why) {
    if (!j.contains(name) || j[name].is_null()) return;
    GK_CHECK(gk::WeightError, ok(j[name]), cfg_path, ": field '", name, "' is ", j[name].dump(), ": ", why);
  };
  GK_CHECK(gk::WeightError, field("peft_type") == "LORA", cfg_path, ": peft_type is ", j["peft_type"].dump(),
           ", not \"LORA\"");
  LoraConfig& c = out.config;
  c.rank = field("r").get<std::int64_t>();
  c.alpha = field("lora_alpha").get<double>();
  GK_CHECK(gk::WeightError, c.rank > 0 && c.alpha != 0, cfg_path, ": r is ", c.rank, " and lora_alpha ", c.alpha,
           " (both must be positive)");
  c.rslora = j.value("use_rslora", false);
  absent_or("use_dora", [](const json& v) { return v == false; }, "DoRA adapters are not served");
  absent_or("bias", [](const json& v) { return v == "none"; }, "adapters with biases are not served");
  absent_or("fan_in_fan_out", [](const json& v) { return v == false; }, "the engine reads A [r, in] and B [out, r]");
  absent_or("rank_pattern", [](const json& v) { return v.empty(); }, "per-module ranks are not served");
  absent_or("alpha_pattern", [](const json& v) { return v.empty(); }, "per-module alphas are not served");
  absent_or("modules_to_save", [](const json& v) { return v.empty(); }, "adapters that save whole modules are not served");
  const json& t = field("target_modules");
  GK_CHECK(gk::WeightError, t.is_array(), cfg_path, ": target_modules is ", t.dump(),
           ": the engine takes a list of module names");
  for (const json& m : t) {
    const std::string name = m.get<std::string>();
    GK_CHECK(gk::WeightError, std::find(projections().begin(), projections().end(), name) != projections().end(),
             cfg_path, ": target module '", name, "' is not a projection of the model (",
             joined(projections()), ")");
    c.targets.push_back(name);
  }
  std::sort(c.targets.begin(), c.targets.end());
  // The tensors: every one an A or a B of a targeted projection, of the config's rank.
  const std::string file = dir + "/adapter_model.safetensors";
  GK_CHECK(gk::WeightError, std::filesystem::exists(file), file, ": missing (PEFT saves the adapter's weights there)");
  gk::SafetensorsSource src(file);
  std::optional<at::ScalarType> dtype;
  while (auto nt = src.next()) {
    const std::string& name = nt->name;
    constexpr std::string_view prefix = "base_model.model.";
    GK_CHECK(gk::WeightError, name.starts_with(prefix), file, ": tensor '", name, "' is not under ", prefix,
             " (not a PEFT adapter of a causal LM)");
    std::string engine_name = name.substr(prefix.size());
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    GK_CHECK(gk::WeightError, is_a || is_b, file, ": tensor '", name, "' is neither a lora_A nor a lora_B weight");
    const std::string module = engine_name.substr(0, engine_name.size() - std::string_view(".lora_A.weight").size());
    const std::string proj = module.substr(module.find_last_of('.') + 1);
    GK_CHECK(gk::WeightError, c.targets_module(proj), file, ": tensor '", name, "' adapts ", proj,
             ", which adapter_config.json does not target (", joined(c.targets), ")");
    const at::Tensor& v = nt->value;
    GK_CHECK(gk::WeightError, v.dim() == 2 && v.size(is_a ? 0 : 1) == c.rank, file, ": tensor '", name, "' is ",
             v.sizes(), " but adapter_config.json says r = ", c.rank, " (lora_A is [r, in], lora_B [out, r])");
    if (!dtype) dtype = v.scalar_type();
    GK_CHECK(gk::WeightError, v.scalar_type() == *dtype, file, ": tensor '", name, "' is ", v.scalar_type(),
             " but the adapter's other tensors are ", *dtype);
    out.tensors.push_back({std::move(engine_name), v.clone(), 0});
  }
  GK_CHECK(gk::WeightError, !out.tensors.empty(), file, ": holds no tensor");
  return out;
}

void write_lora_adapter(const std::string& dir, const LoraConfig& config, const std::vector<gk::NamedTensor>& tensors) {
  std::filesystem::create_directories(dir);
  json c;
  c["peft_type"] = "LORA";
  c["r"] = config.rank;
  c["lora_alpha"] = config.alpha;
  c["use_rslora"] = config.rslora;
  c["target_modules"] = config.targets;
  c["bias"] = "none";
  c["fan_in_fan_out"] = false;
  c["lora_dropout"] = 0.0;
  std::ofstream(dir + "/adapter_config.json") << c.dump(2);
  std::vector<gk::NamedTensor> named;
  for (const gk::NamedTensor& t : tensors) named.push_back({"base_model.model." + t.name, t.value.contiguous().cpu(), 0});
  gk::write_safetensors(dir + "/adapter_model.safetensors", named, {{"format", "pt"}});
}

std::vector<gk::NamedTensor> random_lora_tensors(const LoraShapes& s, const LoraConfig& config, std::uint64_t seed,
                                                 at::ScalarType dtype) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<gk::NamedTensor> out;
  struct Proj {
    const char* module;
    const char* name;
    std::int64_t in, out;
  };
  const std::vector<Proj> projs{{"self_attn", "q_proj", s.hidden, s.q_out},  {"self_attn", "k_proj", s.hidden, s.kv_out},
                                {"self_attn", "v_proj", s.hidden, s.kv_out}, {"self_attn", "o_proj", s.q_out, s.hidden},
                                {"mlp", "gate_proj", s.hidden, s.inter},     {"mlp", "up_proj", s.hidden, s.inter},
                                {"mlp", "down_proj", s.inter, s.hidden}};
  for (std::int64_t l = 0; l < s.layers; ++l)
    for (const Proj& p : projs) {
      if (!config.targets_module(p.name) || (s.moe && std::string_view(p.module) == "mlp")) continue;
      const std::string base = "model.layers." + std::to_string(l) + "." + p.module + "." + p.name;
      out.push_back({base + ".lora_A.weight", (at::randn({config.rank, p.in}, g) * 0.05).to(dtype), 0});
      out.push_back({base + ".lora_B.weight", (at::randn({p.out, config.rank}, g) * 0.05).to(dtype), 0});
    }
  return out;
}

bool is_lora_tensor(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::string lora_mismatch(const LoraConfig& served, const LoraConfig& next, const std::string& next_dir) {
  if (served.rank != next.rank)
    return gk::detail::concat(next_dir, ": the adapter's rank is ", next.rank, " but the graphs were captured with rank ",
                      served.rank, " (every targeted module: ", joined(served.targets),
                      "); start a new engine for another rank");
  if (served.scale() != next.scale())
    return gk::detail::concat(next_dir, ": the adapter's scale is ", next.scale(), " (lora_alpha ", next.alpha,
                              next.rslora ? ", rsLoRA" : "", ") but the graphs were captured with ", served.scale(),
                              " (lora_alpha ", served.alpha, served.rslora ? ", rsLoRA" : "",
                              "); start a new engine for another scale");
  if (served.targets != next.targets)
    return gk::detail::concat(next_dir, ": the adapter targets ", joined(next.targets), " but the graphs were captured for ",
                      joined(served.targets), "; start a new engine for other target modules");
  return {};
}

}  // namespace demo
