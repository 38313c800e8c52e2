// graphkeep/sources/weight_source.h
//
// Where a reload's new weights come from. A weight source yields checkpoint
// tensors (or shards of one) by name, in any order, one at a time, so the
// engine can process a layer as soon as its weights are complete and keep
// peak memory near one layer above the model.
//
//   gk::InMemorySource src({{"layers.0.qkv.weight", w}, {"layers.0.qkv.bias", b}});
//   while (auto t = src.next()) { ... t->name, t->shard, t->value ... }
//
// Sources in graphkeep: InMemorySource (here), SafetensorsSource (a
// memory-mapped .safetensors file), and the broadcast source of the
// distributed reload.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gk {

// One checkpoint tensor, or one shard of it. A checkpoint tensor that a layer
// expects in N shards arrives as N NamedTensors with shard 0..N-1.
//
// A whole parameter may arrive instead of its checkpoint tensors: named by
// the parameter's full name (the module path and the parameter, e.g.
// "layers.0.self_attn.qkv_proj" for a fused q/k/v parameter), shard 0,
// holding the parameter as the layer's loaders would have filled it (its
// checkpoint-format shape: the tensors concatenated along dim 0, the layer's
// own layout where it loads a tensor itself). It counts as all of that
// parameter's checkpoint tensors; delivering one of them as well is an
// error. A trainer that keeps the engine's fused layout hands over such
// tensors, and with ReloadOptions::adopt_source_tensors nothing is copied to
// load them.
struct NamedTensor {
  std::string name;
  at::Tensor value;
  std::int64_t shard = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The next tensor, or std::nullopt when the source is exhausted. Errors in
  // the source itself (a corrupt file) raise gk::WeightError.
  virtual std::optional<NamedTensor> next() = 0;
  // A short description for error messages ("safetensors file 'x.safetensors'").
  virtual std::string describe() const = 0;
  // Every tensor next() has yet to yield, when they are all in memory already
  // (reading them holds nothing more); empty otherwise. A streaming reload
  // checks a resident source on the device for non-finite values before it
  // copies anything (Note [Scanning a resident source first] in
  // reload/weight_stream.cpp).
  virtual std::span<const NamedTensor> resident() const { return {}; }
};

// Yields a fixed list of tensors in order. The tensors are not copied.
class InMemorySource final : public WeightSource {
 public:
  explicit InMemorySource(std::vector<NamedTensor> tensors, std::string label = "in-memory weights")
      : tensors_(std::move(tensors)), label_(std::move(label)) {}

  std::optional<NamedTensor> next() override {
    if (pos_ >= tensors_.size()) return std::nullopt;
    return std::move(tensors_[pos_++]);
  }
  std::string describe() const override { return label_; }
  std::span<const NamedTensor> resident() const override {
    return std::span<const NamedTensor>(tensors_).subspan(pos_);
  }

 private:
  std::vector<NamedTensor> tensors_;
  std::string label_;
  std::size_t pos_ = 0;
};

}  // namespace gk
