// examples/migration/router_kernel.h
//
// A kernel author's migration, in three steps. The kernel: a top-k router
// whose PWAL builds a per-expert bias (derived from the router weights), an
// expert-count workspace the kernel zeroes and fills at each launch... and
// keeps a host-side copy of its config for logging.
//
// Compile with -DGK_MIGRATION_STEP=0, 1 or 2 (the tests do, see
// tests/examples.cmake):
//
// Step 0, before graphkeep: the class has no descriptor. The layer that holds
// it is described, so the registry refuses the layer:
//
//   error: static assertion failed: graphkeep: RouterLayer::kernel_ has a class
//   type graphkeep cannot look into: register it (GRAPHKEEP_DESCRIBE), declare it
//   (kernel_, gk::opaque("reason")), or, if it holds no tensor, specialize
//   gk::tensor_free_type for it
//
// Step 1, the author adds GRAPHKEEP_DESCRIBE but lists the tensors bare:
//
//   error: static assertion failed: graphkeep: TopKRouterKernel::expert_bias_ is
//   an at::Tensor with no role: declare it in the descriptor as (expert_bias_,
//   gk::workspace(gk::Init::zero)), gk::metadata, gk::scale, gk::derived_weight,
//   gk::permutation, gk::scratch or gk::parameter, or mark it
//   gk::not_graph_visible("reason") if no captured graph reads it
//
// Step 2, after: each tensor has its role; the reload engine now keeps their
// captured addresses (examples/migration/migration_demo.cpp).
#pragma once

#include <graphkeep/registry.h>

#include <ATen/core/Tensor.h>

#ifndef GK_MIGRATION_STEP
#define GK_MIGRATION_STEP 2
#endif

namespace migration {

class TopKRouterKernel {
 public:
  TopKRouterKernel() = default;
  TopKRouterKernel(at::Tensor expert_bias, at::Tensor counts, int64_t topk)
      : expert_bias_(std::move(expert_bias)), expert_counts_(std::move(counts)), topk_(topk) {}

  const at::Tensor& expert_bias() const { return expert_bias_; }
  const at::Tensor& expert_counts() const { return expert_counts_; }
  int64_t topk() const { return topk_; }

 private:
  at::Tensor expert_bias_;    // [E] derived from the router weights in PWAL
  at::Tensor expert_counts_;  // [E] int32, zeroed and filled by every launch
  int64_t topk_ = 2;

#if GK_MIGRATION_STEP == 1
  GRAPHKEEP_DESCRIBE(TopKRouterKernel, expert_bias_, expert_counts_, topk_)
#elif GK_MIGRATION_STEP >= 2
  GRAPHKEEP_DESCRIBE(TopKRouterKernel, (expert_bias_, gk::derived_weight),
                     (expert_counts_, gk::workspace(gk::Init::zero)), topk_)
#endif
};

}  // namespace migration
