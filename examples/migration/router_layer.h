// examples/migration/router_layer.h: the layer that owns the kernel (already
// described; its PWAL rebuilds the kernel object on every load).
#pragma once

#include "router_kernel.h"

#include <graphkeep/model/layer.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>

namespace migration {

class RouterLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  RouterLayer(int64_t experts, int64_t dim) : experts_(experts), dim_(dim) {
    weight_ = register_parameter("weight", at::zeros({experts, dim}), /*requires_grad=*/false);
  }
  std::vector<gk::CheckpointParam> checkpoint_params() const override {
    return {{"weight", {{"weight", {experts_, dim_}, at::kFloat}}}};
  }
  void process_weights_after_loading() override {
    // a new kernel object with new tensors, every time (the escaping pattern)
    kernel_ = TopKRouterKernel(weight_.mean(1).neg(), at::zeros({experts_}, at::kInt), 2);
  }
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  const TopKRouterKernel& kernel() const { return kernel_; }

 private:
  at::Tensor weight_;
  TopKRouterKernel kernel_;
  int64_t experts_, dim_;
  GRAPHKEEP_DESCRIBE_DERIVED(RouterLayer, (torch::nn::Module, gk::ReloadableLayer), (weight_, gk::parameter),
                             kernel_, experts_, dim_)
};

}  // namespace migration
