// tests/support/toy_model.h
//
// A small but real model for the reload tests: two quantized-style linear
// layers whose PWAL rebuilds a registered kernel object (derived weights,
// scales, a permutation and a lock workspace), and a plain module with a
// parameter. Every computation launches through gk::hostrt with raw pointers,
// so a host capture burns addresses in exactly like a CUDA graph.
#pragma once

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/reload/reload_engine.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace toy {

// y[m, j] = scale[j] * sum_k x[m, k] * q[j, k], visiting output channels in
// the order of `perm`. Each channel takes its lock (must be 0 at launch) and
// releases it; a nonzero lock is a "timeout": the channel's outputs are NaN.
inline void row_scale_cpu(const float* x, const float* q, const float* scale, const int64_t* perm, int32_t* locks,
                          float* y, int64_t m, int64_t n, int64_t k) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = perm[r];
    if (locks[j] != 0) {
      for (int64_t i = 0; i < m; ++i) y[i * n + j] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    locks[j] += 1;
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) acc += x[i * k + c] * q[j * k + c];
      y[i * n + j] = acc * scale[j];
    }
    locks[j] -= 1;
  }
}

// The kernel object PWAL rebuilds. The negative tests treat its lock
// workspace as undeclared (gk::testing::EngineHooks::undeclared_members) to show that the
// capture manifest catches what the registry was told to ignore.
class RowScaleKernel {
 public:
  RowScaleKernel() = default;
  explicit RowScaleKernel(const at::Tensor& weight, int64_t pad = 0) : n_(weight.size(0)), k_(weight.size(1)) {
    scale_ = weight.abs().amax(1).clamp_min(1e-6f);
    q_ = (weight / scale_.unsqueeze(1)).contiguous();
    if (pad > 0) q_ = at::cat({q_, at::zeros({pad, k_})}).contiguous();
    perm_ = at::argsort(scale_, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    locks_ = at::zeros({n_}, at::kInt);
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor y = gk::hostrt::empty({x.size(0), n_}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* qp = q_.data_ptr<float>();
    const float* sp = scale_.data_ptr<float>();
    const int64_t* pp = perm_.data_ptr<int64_t>();
    int32_t* lp = locks_.data_ptr<int32_t>();
    float* yp = y.data_ptr<float>();
    const int64_t m = x.size(0), n = n_, k = k_;
    gk::hostrt::launch("row_scale_gemm",
                       {gk::hostrt::reads(x), gk::hostrt::reads(q_), gk::hostrt::reads(scale_),
                        gk::hostrt::reads(perm_), gk::hostrt::writes(locks_), gk::hostrt::writes(y)},
                       [=] { row_scale_cpu(xp, qp, sp, pp, lp, yp, m, n, k); });
    return y;
  }

  at::Tensor& locks() { return locks_; }
  at::Tensor& scale() { return scale_; }
  int64_t& n() { return n_; }

 private:
  at::Tensor q_;
  at::Tensor scale_;
  at::Tensor perm_;
  at::Tensor locks_;
  int64_t n_ = 0, k_ = 0;

  GRAPHKEEP_DESCRIBE(RowScaleKernel, (q_, gk::derived_weight), (scale_, gk::scale), (perm_, gk::permutation),
                     (locks_, gk::workspace(gk::Init::zero)), n_, k_)
};

// Knobs the fault and mismatch tests turn.
struct Faults {
  bool throw_in_pwal = false;
  int64_t pad_on_pwal = 0;       // makes q_ taller: a shape mismatch
  bool change_config = false;    // PWAL changes a configuration value: a mismatch
  friend bool operator==(const Faults&, const Faults&) = default;
};

class ToyLinear : public torch::nn::Module, public gk::DescribedLayer<ToyLinear> {
 public:
  ToyLinear(int64_t in, int64_t out, int64_t shards = 1) : in_(in), out_(out), shards_(shards) {
    weight_ = checkpoint_param("weight", {{"weight", {out, in}, at::kFloat, shards, 0}}, at::kCPU);
  }

  void process_weights_after_loading() override {
    if (faults.throw_in_pwal) throw std::runtime_error("injected PWAL failure");
    kernel_ = std::make_unique<RowScaleKernel>(weight_, faults.pad_on_pwal);
    if (faults.change_config) changed_ += 1;
  }

  at::Tensor forward(const at::Tensor& x) { return kernel_->forward(x); }

  RowScaleKernel& kernel() { return *kernel_; }
  const at::Tensor& weight() const { return weight_; }
  Faults faults;

 private:
  at::Tensor weight_;
  std::unique_ptr<RowScaleKernel> kernel_;
  int64_t in_, out_, shards_;
  int64_t changed_ = 0;  // a configuration value PWAL may change (see Faults::change_config)

  GRAPHKEEP_DESCRIBE_DERIVED(ToyLinear, (torch::nn::Module, gk::DescribedLayer<ToyLinear>), (weight_, gk::parameter),
                             kernel_, in_, out_, shards_, changed_, faults)
};

// A plain module (no ReloadableLayer): its parameter reloads as is.
class PlainScale : public torch::nn::Module {
 public:
  explicit PlainScale(int64_t n) { gamma = register_parameter("gamma", at::ones({n}), false); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    gk::hostrt::launch_aten("aten::mul", {x, gamma}, {y},
                            [](auto& in, auto& out) { at::mul_out(out[0], in[0], in[1]); });
    return y;
  }
  at::Tensor gamma;
};

class ToyModel : public torch::nn::Module {
 public:
  ToyModel(int64_t d = 8, int64_t h = 16, int64_t shards = 1) : d_(d), h_(h) {
    l1 = register_module("l1", std::make_shared<ToyLinear>(d, h, shards));
    norm = register_module("norm", std::make_shared<PlainScale>(h));
    l2 = register_module("l2", std::make_shared<ToyLinear>(h, d, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return l2->forward(norm->forward(l1->forward(x))); }

  // Deterministic checkpoint for a step: distinct values per tensor and step.
  std::vector<gk::NamedTensor> checkpoint(int step, int64_t shards = 1) const {
    auto wave = [&](int64_t r, int64_t c, double phase) {
      return at::sin(at::arange(r * c, at::kFloat).reshape({r, c}) * 0.37 + phase + 0.11 * step);
    };
    std::vector<gk::NamedTensor> out;
    at::Tensor w1 = wave(h_, d_, 1.0);
    for (int64_t s = 0; s < shards; ++s) out.push_back({"l1.weight", w1.chunk(shards, 0)[s].contiguous(), s});
    out.push_back({"norm.gamma", 1.0 + 0.5 * at::cos(at::arange(h_, at::kFloat) + 0.2 * step), 0});
    out.push_back({"l2.weight", wave(d_, h_, 2.0), 0});
    return out;
  }

  std::shared_ptr<ToyLinear> l1, l2;
  std::shared_ptr<PlainScale> norm;

 private:
  int64_t d_, h_;
};

// The output of a freshly built model loaded with step's weights (eager).
inline at::Tensor fresh_output(int step, const at::Tensor& input, int64_t d = 8, int64_t h = 16) {
  auto m = std::make_shared<ToyModel>(d, h);
  gk::InMemorySource src(m->checkpoint(step));
  gk::load_weights(*m, src);
  return m->forward(input);
}

// The first byte of every planned slot's captured storage.
inline std::vector<std::uintptr_t> captured_addresses(const gk::SlotPlan& plan) {
  std::vector<std::uintptr_t> out;
  for (const auto& l : plan.layers())
    for (const auto& s : l.slots) out.push_back(s.storage_begin());
  return out;
}

}  // namespace toy
