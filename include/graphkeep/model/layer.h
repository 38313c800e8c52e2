// graphkeep/model/layer.h
//
// The contract between graphkeep's reload engine and a model layer: small, so
// an existing libtorch engine adopts it without rewriting its layers.
//
// A layer is a torch::nn::Module that also implements gk::ReloadableLayer:
//   - checkpoint_params(): which parameters (or buffers) the checkpoint fills,
//     in checkpoint format (before PWAL), and from which checkpoint tensors;
//   - load_weight(): optional; loads one tensor or shard into a parameter
//     (the default copies it into its place along dim 0 / the shard dim);
//   - process_weights_after_loading(): PWAL, which turns checkpoint-format
//     parameters into kernel format and builds derived tensors;
//   - registered_members(): the layer's registered members (kernels,
//     quantization methods, derived tensors), usually gk::ObjectRef::of(*this)
//     for a layer described with GRAPHKEEP_DESCRIBE_DERIVED.
//
//   class QuantLinearImpl : public torch::nn::Module, public gk::ReloadableLayer {
//    public:
//     QuantLinearImpl(int64_t in, int64_t out) : in_(in), out_(out) {
//       qweight_ = register_parameter("qweight", at::empty({out, in / 8}, at::kInt), false);
//     }
//     std::vector<gk::CheckpointParam> checkpoint_params() const override {
//       return {{"qweight", {{"qweight", {out_, in_ / 8}, at::kInt}}}};
//     }
//     void process_weights_after_loading() override { kernel_ = MarlinKernel(qweight_, ...); }
//     gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
//    private:
//     at::Tensor qweight_;
//     MarlinKernel kernel_;
//     int64_t in_, out_;
//     GRAPHKEEP_DESCRIBE_DERIVED(QuantLinearImpl, (torch::nn::Module, gk::ReloadableLayer),
//                                (qweight_, gk::parameter), kernel_, in_, out_)
//   };
//
// Modules that do not implement the interface are reloaded as plain modules:
// each parameter is a checkpoint tensor of its current shape, with no PWAL.
#pragma once

#include <graphkeep/registry/walk.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gk {

// One tensor of the checkpoint, as a weight source delivers it.
struct CheckpointTensor {
  std::string name;                  // relative to the layer's module path
  std::vector<std::int64_t> shape;   // the whole tensor
  at::ScalarType dtype = at::kFloat;
  std::int64_t num_shards = 1;       // delivered in this many equal shards ...
  std::int64_t shard_dim = 0;        // ... split along this dimension

  // The shape of one shard.
  std::vector<std::int64_t> shard_shape() const;
};

// A parameter or buffer that the checkpoint fills, in checkpoint format.
// Its tensors are concatenated along dim 0 in order (one tensor: the whole
// parameter; e.g. w13 = [w1; w3]).
struct CheckpointParam {
  std::string param;                      // the module's parameter or buffer name
  std::vector<CheckpointTensor> tensors;

  std::vector<std::int64_t> shape() const;  // checkpoint-format shape of the parameter
  at::ScalarType dtype() const;
};

// One load: a checkpoint tensor (or shard) and the freshly materialized
// checkpoint-format parameter it goes into.
struct LoadRequest {
  const CheckpointParam& param;
  std::size_t tensor_index;  // into param.tensors
  std::int64_t shard;
  const at::Tensor& value;
  at::Tensor& target;        // the parameter, shape param.shape()
};

// Copies `r.value` into its place: tensor i starts at the sum of the dim-0
// sizes of tensors 0..i-1, shard s at s * shard size along shard_dim.
void default_load(const LoadRequest& r);

class ReloadableLayer {
 public:
  virtual ~ReloadableLayer() = default;

  virtual std::vector<CheckpointParam> checkpoint_params() const = 0;

  // Loads one tensor or shard. Return false to use gk::default_load.
  virtual bool load_weight(const LoadRequest& /*r*/) { return false; }

  // PWAL. Runs after every checkpoint tensor of the layer has been loaded.
  virtual void process_weights_after_loading() {}

  // The layer's registered members; an empty ObjectRef when there are none.
  virtual ObjectRef registered_members() { return {}; }
};

}  // namespace gk
