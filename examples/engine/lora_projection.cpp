// A LoRA adapter's A and B on one projection, in the decode graphs (lora_projection.h).
#include "lora_projection.h"

#include "fused_ops.h"
#include "layer_ops.h"
#include "part_timer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <atomic>
#include <utility>

namespace demo {

LoraProjection::LoraProjection(torch::nn::Module& module, const std::string& param,
                               const std::optional<LoraConfig>& config, const std::vector<Part>& parts,
                               std::int64_t in, at::TensorOptions options)
    : param_(param), in_(in) {
  if (!config) return;
  std::int64_t offset = 0, rows = 0;
  for (const Part& p : parts) {
    if (config->targets_module(p.projection)) {
      names_.push_back(p.projection);
      offsets_.push_back(offset);
      sizes_.push_back(p.rows);
      rows += p.rows;
    }
    offset += p.rows;
  }
  if (names_.empty()) return;
  rank_ = config->rank;
  scale_ = config->scale();
  const std::int64_t n = static_cast<std::int64_t>(names_.size());
  a_ = module.register_parameter(param + "_lora_A", at::zeros({n * rank_, in}, options), false);
  b_ = module.register_parameter(param + "_lora_B", at::zeros({rows, rank_}, options), false);
}

void LoraProjection::append_checkpoint_params(std::vector<gk::CheckpointParam>& out) const {
  if (!active()) return;
  const at::ScalarType dt = a_->scalar_type();
  gk::CheckpointParam a{param_ + "_lora_A", {}}, b{param_ + "_lora_B", {}};
  for (std::size_t p = 0; p < names_.size(); ++p) {
    a.tensors.push_back({names_[p] + ".lora_A.weight", {rank_, in_}, dt});
    b.tensors.push_back({names_[p] + ".lora_B.weight", {sizes_[p], rank_}, dt});
  }
  out.push_back(std::move(a));
  out.push_back(std::move(b));
}

void LoraProjection::append_tensors(const std::string& prefix, std::vector<gk::NamedTensor>& out) const {
  if (!active()) return;
  std::int64_t brow = 0;
  for (std::size_t p = 0; p < names_.size(); ++p) {
    out.push_back({prefix + "." + names_[p] + ".lora_A.weight", a_->narrow(0, static_cast<std::int64_t>(p) * rank_, rank_), 0});
    out.push_back({prefix + "." + names_[p] + ".lora_B.weight", b_->narrow(0, brow, sizes_[p]), 0});
    brow += sizes_[p];
  }
}

// Note [LoRA in the decode graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Unmerged: y = x W^T + scale (x A^T) B^T, per targeted part of a fused
// projection (q, k and v of qkv_proj). The A of every part are one
// parameter, so the shrink is one GEMM for the projection: t = x A^T [T,
// parts rank]. On CUDA, the expand and the add are then one kernel
// (fused::lora_expand: a dot product of rank terms per output element in
// float32, rounded once): two launches per projection. Elsewhere, and with
// LoraProjection::set_fused_expand(false), per part a GEMM t_p B_p^T and an
// add into a copy of y in the model's dtype (as PEFT computes it): 2 + 2
// parts launches, 22 per Llama layer. The adapter's bytes are nothing (80
// MiB beside 15 GiB at 8B); its cost is its small GEMMs and launches. On the
// H200 at batch 64 (docs/lora.md), in one run: the ATen ops 1.42x the step
// without the adapter, the fused expand 1.32x; the eager part timer puts
// 3.2 ms of GPU time in the LoRA part either way, so the shrink GEMMs
// (cuBLAS on [64, K] x [K, parts rank]) are what is left to make fast. A
// split-K shrink kernel of our own (two launches: partial sums over slices
// of K, then their sum) was slower than cuBLAS's one launch on the H100
// (docs/lora.md): the next try should be one launch, fused with the expand.
// The setting is read when a graph is captured: set it before building an
// engine.
namespace {
std::atomic<bool> g_fused_expand{true};
}  // namespace

void LoraProjection::set_fused_expand(bool on) { g_fused_expand.store(on); }
bool LoraProjection::fused_expand() { return g_fused_expand.load(); }

at::Tensor LoraProjection::apply(const char* name, const at::Tensor& x, const at::Tensor& y) const {
  if (!active()) return y;
  mark_part(demo::Part::lora);  // closed by the caller's next mark (part_timer.h)
  if (fused_expand() && fused::supported(y))
    return fused::lora_expand(y, at::mm(x, a_->t()), *b_, offsets_, sizes_, rank_, scale_);
  return layer_ops::op(name, {x, y, *a_, *b_}, y.sizes(), y.options(),
                       [offsets = offsets_, sizes = sizes_, r = rank_, s = scale_](auto& in, auto& out) {
                         out[0].copy_(in[1]);
                         const at::Tensor t = at::mm(in[0], in[2].t());  // [T, parts * r]
                         std::int64_t brow = 0;
                         for (std::size_t p = 0; p < offsets.size(); ++p) {
                           const at::Tensor d = at::mm(t.narrow(1, static_cast<std::int64_t>(p) * r, r),
                                                       in[3].narrow(0, brow, sizes[p]).t());
                           out[0].narrow(1, offsets[p], sizes[p]).add_(d, s);
                           brow += sizes[p];
                         }
                       });
}

}  // namespace demo
