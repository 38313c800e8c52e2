// examples/engine/checkpoint_dir.h: a Hugging Face model directory as the
// example engine reads it, for a first load and for every later reload of a
// directory (internal to the engine).
#pragma once

#include "hf_config.h"

#include <graphkeep/sources/hf_checkpoint.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

namespace demo {

// The checkpoint of `dir`, checked against the model's expectations before
// any tensor is read. Names are Hugging Face's (module paths mirror them);
// rotary tables some checkpoints carry are recomputed here, so skipped; the
// LoRA adapter's tensors come from the adapter's own directory.
std::unique_ptr<gk::HfCheckpointSource> open_checkpoint(const std::string& dir, torch::nn::Module& model);

// A reload must bring the same architecture: compares what shapes the model,
// and what the captured graphs hold derived from the config (the rotary
// tables, positions up to max_len - 1). A difference is a gk::WeightError
// naming dir/config.json and the field.
void check_same_architecture(const HfConfig& have, const HfConfig& next, const std::string& dir,
                             std::int64_t max_len);

}  // namespace demo
