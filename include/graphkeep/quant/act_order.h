// graphkeep/quant/act_order.h
//
// Failure site 12: Machete act-order. vLLM's MacheteLinearKernel builds, in
// process_weights_after_loading,
//
//   perm = torch.argsort(g_idx).to(torch.int)
//   self.act_perm = lambda x: x[:, perm]
//
// and its apply() calls self.act_perm(x) before the GEMM. `perm` lives only
// in the closure: no attribute walk sees it, every PWAL makes a new one, and a
// captured graph keeps gathering with the old one (wrong output).
//
// In C++ the closure becomes a *registered functor type*: ActPerm has an
// operator() and declares its tensor as gk::permutation, and the quant method
// holds it as a member, so a reload copies the new permutation into the
// captured storage like any other slot.
//
// The same lambda in a std::function member does not compile:
//
//   class MacheteLinearMethod {
//     std::function<at::Tensor(const at::Tensor&)> act_perm_;  // = [perm](auto& x) { return x.index_select(1, perm); }
//     ...
//     GRAPHKEEP_DESCRIBE(MacheteLinearMethod, (weight_prepacked_, gk::derived_weight), act_perm_, ...)
//   };
//
//   error: static assertion failed: graphkeep: MacheteLinearMethod::act_perm_ is a std::function, lambda
//   or functor whose captures graphkeep cannot see: make the functor a registered type (GRAPHKEEP_DESCRIBE)
//   or declare it (act_perm_, gk::opaque("why it captures no device tensor"))
//
// (tests/compile_fail/std_function_member.cpp checks that message for
// std::function members in general; gk::opaque would be a lie here, since the
// closure captures a device tensor.)
//
//   gk::quant::MacheteW4A16Linear lin(/*in=*/128, /*out=*/32, /*group_size=*/16, at::kCPU);
//   ... gk::load_weights(...)  (qweight [in/8, out] int32, scales [in/gs, out], g_idx [in] int32)
//   at::Tensor y = lin.forward(x);   // x: [M, in] float32 -> [M, out]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

namespace gk::quant {

// The act-order closure as a registered functor: operator()(x) is x[:, act_perm]
// (a gather kernel on CUDA, a hostrt launch on CPU).
class ActPerm {
 public:
  ActPerm() = default;
  explicit ActPerm(at::Tensor act_perm) : act_perm_(std::move(act_perm)) {}

  // x: [M, K] float32 contiguous -> [M, K] with column i = x[:, act_perm[i]]
  at::Tensor operator()(const at::Tensor& x) const;

  const at::Tensor& act_perm() const { return act_perm_; }

 private:
  at::Tensor act_perm_;  // [K] int32: argsort(g_idx)

  GRAPHKEEP_DESCRIBE(ActPerm, (act_perm_, gk::permutation))
};

// The quant method: the Machete W4A16 kernel's state after PWAL.
class MacheteLinearMethod {
 public:
  MacheteLinearMethod() = default;
  // PWAL: qweight [K/8, N] int32 (GPTQ packing), g_idx [K] int32 in which each
  // group holds exactly group_size channels (Machete's act-order requirement).
  MacheteLinearMethod(const at::Tensor& qweight, const at::Tensor& g_idx, int64_t group_size);

  // x: [M, K] -> act_perm_(x) -> W4A16 GEMM with group scales [K/gs, N] -> [M, N]
  at::Tensor apply(const at::Tensor& x, const at::Tensor& scales) const;

  const ActPerm& act_perm() const { return act_perm_; }

 private:
  at::Tensor weight_prepacked_;  // [K/8, N] int32, rows in act-order
  ActPerm act_perm_;             // the closure, as a registered member
  int64_t size_k_ = 0, size_n_ = 0, group_size_ = 0;

  GRAPHKEEP_DESCRIBE(MacheteLinearMethod, (weight_prepacked_, gk::derived_weight), act_perm_, size_k_, size_n_,
                     group_size_)
};

class MacheteW4A16Linear : public torch::nn::Module, public DescribedLayer<MacheteW4A16Linear> {
 public:
  MacheteW4A16Linear(int64_t in, int64_t out, int64_t group_size, c10::Device device);

  void process_weights_after_loading() override;

  at::Tensor forward(const at::Tensor& x);  // [M, in] -> [M, out]

  const MacheteLinearMethod& quant_method() const { return *quant_method_; }

 private:
  at::Tensor qweight_;  // [in/8, out] int32
  at::Tensor scales_;   // [in/gs, out] float32
  at::Tensor g_idx_;    // [in] int32
  std::unique_ptr<MacheteLinearMethod> quant_method_;
  int64_t in_, out_, group_size_;

  GRAPHKEEP_DESCRIBE_DERIVED(MacheteW4A16Linear, (torch::nn::Module, DescribedLayer<MacheteW4A16Linear>),
                             (qweight_, gk::parameter), (scales_, gk::parameter), (g_idx_, gk::parameter),
                             quant_method_, in_, out_, group_size_)
};

}  // namespace gk::quant
