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
//     for a layer described with GRAPHKEEP_DESCRIBE_DERIVED;
//   - declare_derivations(): optional; how members declared by_blocks()
//     follow from a checkpoint parameter, so a weight patch need not re-run
//     PWAL (graphkeep/model/block_derivation.h).
//
// A new layer derives from gk::DescribedLayer<Self> (below), which supplies
// the last one and states each checkpoint parameter once:
//
//   class QuantLinear : public torch::nn::Module, public gk::DescribedLayer<QuantLinear> {
//    public:
//     QuantLinear(int64_t in, int64_t out, c10::Device device) : in_(in), out_(out) {
//       // registers "qweight" (int32 zeros [in/8, out]) and records it for checkpoint_params()
//       qweight_ = checkpoint_param("qweight", {in / 8, out}, at::kInt, device);
//     }
//     void process_weights_after_loading() override { kernel_ = MarlinKernel(qweight_, ...); }
//    private:
//     at::Tensor qweight_;
//     MarlinKernel kernel_;
//     int64_t in_, out_;
//     GRAPHKEEP_DESCRIBE_DERIVED(QuantLinear, (torch::nn::Module, gk::DescribedLayer<QuantLinear>),
//                                (qweight_, gk::parameter), kernel_, in_, out_)
//   };
//
// A layer with a base of its own implements gk::ReloadableLayer directly:
// register the parameter in the constructor, list it in checkpoint_params(),
// and return gk::ObjectRef::of(*this) from registered_members() (or hold a
// gk::CheckpointParams, below, and return its list()).
//
// Modules that do not implement the interface are reloaded as plain modules:
// each parameter is a checkpoint tensor of its current shape, with no PWAL.
#pragma once

#include <graphkeep/model/block_derivation.h>
#include <graphkeep/registry/describe.h>
#include <graphkeep/registry/member_kind.h>
#include <graphkeep/registry/walk.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

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
  // Per tensor, the row of the parameter (dim 0) where it begins.
  std::vector<std::int64_t> first_rows() const;
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

  // Binds the members its classes declare by_blocks() to their block
  // derivations (graphkeep/model/block_derivation.h): the source parameter,
  // the block shape and the function. Called by ReloadEngine::prepare()
  // after PWAL, with the fields as the graphs capture them.
  virtual void declare_derivations(Derivations& /*d*/) const {}
};

// What a checkpoint parameter holds before its first load.
enum class Fill : std::uint8_t { zeros, ones };

// CheckpointParams
//
// The checkpoint parameters of one layer, each stated once: add() registers
// the parameter on the module and records the CheckpointParam that
// checkpoint_params() returns, so the two cannot disagree. The parameter's
// shape is CheckpointParam::shape() (the tensors concatenated along dim 0),
// its dtype theirs, its device `device`; it is filled with zeros or ones and
// does not require grad.
//
//   gk::CheckpointParams params_;
//   weight_ = params_.add(*this, "weight",
//                         {{"q_proj.weight", {32, 64}, at::kChar}, {"k_proj.weight", {16, 64}, at::kChar}},
//                         device);   // a [48, 64] int8 parameter "weight", from two checkpoint tensors
//   ...
//   std::vector<gk::CheckpointParam> checkpoint_params() const override { return params_.list(); }
//
// gk::DescribedLayer holds one and does both; use this class directly only in
// a layer that cannot derive from it. It holds no tensor, so a descriptor
// lists it bare.
class CheckpointParams {
 public:
  // Registers `param` on `module` and records it. Throws gk::DeclarationError
  // when the tensors do not concatenate along dim 0 or differ in dtype.
  at::Tensor add(torch::nn::Module& module, std::string param, std::vector<CheckpointTensor> tensors,
                 c10::Device device, Fill fill = Fill::zeros);

  // In the order of add().
  const std::vector<CheckpointParam>& list() const { return params_; }

 private:
  std::vector<CheckpointParam> params_;
};

template <>
struct tensor_free_type<CheckpointParams> : std::true_type {};

// DescribedLayer
//
// The base of a layer described with GRAPHKEEP_DESCRIBE_DERIVED (CRTP: Derived
// is the layer, also a torch::nn::Module). It supplies
//   - registered_members(): gk::ObjectRef::of(the layer);
//   - checkpoint_params(): the parameters the constructor declared with
//     checkpoint_param(), in that order;
// both virtual, so a layer may still override them. The layer names it in its
// descriptor's base list, as gk::DescribedLayer<Derived> (a registered base:
// its one member, the CheckpointParams, is walked with the layer).
//
//   class Experts : public torch::nn::Module, public gk::DescribedLayer<Experts> {
//    public:
//     Experts(int64_t e, int64_t k, int64_t n, c10::Device device) {
//       w13_ = checkpoint_param("w13", {e, 2 * n, k}, at::kFloat, device);             // one tensor "w13"
//       scale_ = checkpoint_param("scale", {e}, at::kFloat, device, gk::Fill::ones);
//       w2_ = checkpoint_param("w2", {{"w2.a", {e, k}, at::kFloat}, {"w2.b", {e, k}, at::kFloat}}, device);
//     }
//     ...
//     GRAPHKEEP_DESCRIBE_DERIVED(Experts, (torch::nn::Module, gk::DescribedLayer<Experts>), (w13_, gk::parameter),
//                                (scale_, gk::parameter), (w2_, gk::parameter))
//   };
template <class Derived>
class DescribedLayer : public ReloadableLayer {
 public:
  std::vector<CheckpointParam> checkpoint_params() const override { return checkpoint_.list(); }
  ObjectRef registered_members() override { return ObjectRef::of(static_cast<Derived&>(*this)); }

 protected:
  DescribedLayer() = default;

  // A parameter filled from the checkpoint tensor of the same name.
  at::Tensor checkpoint_param(std::string name, std::vector<std::int64_t> shape, at::ScalarType dtype,
                              c10::Device device, Fill fill = Fill::zeros) {
    std::string tensor = name;
    return checkpoint_param(std::move(name), {{std::move(tensor), std::move(shape), dtype}}, device, fill);
  }

  // A parameter filled from these checkpoint tensors (concatenated along dim
  // 0; each may come in shards, see CheckpointTensor).
  at::Tensor checkpoint_param(std::string name, std::vector<CheckpointTensor> tensors, c10::Device device,
                              Fill fill = Fill::zeros) {
    return checkpoint_.add(static_cast<Derived&>(*this), std::move(name), std::move(tensors), device, fill);
  }

 private:
  CheckpointParams checkpoint_;

  GRAPHKEEP_DESCRIBE_DERIVED(DescribedLayer, (ReloadableLayer), checkpoint_)
};

}  // namespace gk
