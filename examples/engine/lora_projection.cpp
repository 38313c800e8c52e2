// A LoRA adapter's A and B on one projection, in the decode graphs (lora_projection.h).
#include "lora_projection.h"

#include "fused_ops.h"
#include "layer_ops.h"
#include "part_timer.h"

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <utility>

namespace demo {

// Note [LoRA in the decode graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Unmerged: y = x W^T + scale (x A^T) B^T, per targeted part of a fused
// projection (q, k and v of qkv_proj). The A of every part are one
// parameter, so the shrink is one GEMM for the projection: t = x A^T [T,
// parts rank]. The adapter's bytes are nothing beside the model's (80 MiB
// beside 15 GiB at 8B); what it costs is its small GEMMs and their launches.
// Three ways, chosen by LoraProjection::set_kernels (docs/lora.md has what
// each cost on the GPU):
//   - aten: per part a GEMM t_p B_p^T and an add into a copy of y in the
//     model's dtype (as PEFT computes it): 2 + 2 parts launches per
//     projection. The CPU path, the reference, always runs this.
//   - fused_expand: the expand and its add as one kernel
//     (fused::lora_expand: a dot product of rank terms per output element in
//     float32, rounded once): two launches beside the base GEMM.
//   - joined: the shrink GEMM, a [T, K] x [K, parts rank] product, is
//     mostly latency (cuBLAS runs it at a small share of the bandwidth, and
//     a split-K kernel of our own was slower still). So A's checkpoint
//     tensors become the last checkpoint tensors of the base weight's own
//     parameter ("q_proj.lora_A.weight" after q, k and v of qkv_proj): the
//     parameter is [W; A], [N + parts rank, K], and one GEMM yields y and t
//     side by side, reading W and A once; the shrink costs parts rank more
//     output columns of a GEMM that reads K x N anyway. lora_expand then
//     reads both column ranges of that output (row stride N + parts rank).
//     Nothing new for graphkeep: a parameter made of several checkpoint
//     tensors (q/k/v) is what the reload engine already loads, adopts,
//     hashes and patches by name, so a full reload, a weight patch and an
//     adapter swap (a patch of A's and B's tensors) land in [W; A] as in
//     any fused parameter. Only a dense base weight joins: a quantized
//     format never multiplies by its checkpoint-format weight, and takes
//     fused_expand.
// The setting is read when a projection is built and when a graph is
// captured: set it before building an engine.
namespace {
std::atomic<LoraProjection::Kernels> g_kernels{LoraProjection::Kernels::joined};
}  // namespace

void LoraProjection::set_kernels(Kernels k) { g_kernels.store(k); }
LoraProjection::Kernels LoraProjection::kernels() { return g_kernels.load(); }

LoraProjection::LoraProjection(torch::nn::Module& module, const std::string& param,
                               const std::optional<LoraConfig>& config, const std::vector<Part>& parts,
                               std::int64_t in, at::TensorOptions options, bool dense_base)
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
  joined_ = dense_base && kernels() == Kernels::joined;
  if (!joined_) a_ = module.register_parameter(param + "_lora_A", at::zeros({a_rows(), in}, options), false);
  b_ = module.register_parameter(param + "_lora_B", at::zeros({rows, rank_}, options), false);
}

void LoraProjection::append_checkpoint_params(std::vector<gk::CheckpointParam>& out) const {
  if (!active()) return;
  const at::ScalarType dt = b_->scalar_type();
  std::vector<gk::CheckpointTensor> a;
  gk::CheckpointParam b{param_ + "_lora_B", {}};
  for (std::size_t p = 0; p < names_.size(); ++p) {
    a.push_back({names_[p] + ".lora_A.weight", {rank_, in_}, dt});
    b.tensors.push_back({names_[p] + ".lora_B.weight", {sizes_[p], rank_}, dt});
  }
  if (joined_) {
    const auto base = std::find_if(out.begin(), out.end(), [&](const gk::CheckpointParam& cp) { return cp.param == param_; });
    GK_CHECK(gk::StateError, base != out.end(), "LoRA on '", param_,
             "': A joins the base weight's checkpoint parameter, which is not listed before it");
    base->tensors.insert(base->tensors.end(), a.begin(), a.end());
  } else {
    out.push_back({param_ + "_lora_A", std::move(a)});
  }
  out.push_back(std::move(b));
}

at::Tensor LoraProjection::base_weight(const at::Tensor& dense) const {
  return joined_ ? dense.narrow(0, 0, dense.size(0) - a_rows()) : dense;
}

at::Tensor LoraProjection::a_of(const at::Tensor& dense) const {
  return joined_ ? dense.narrow(0, dense.size(0) - a_rows(), a_rows()) : *a_;
}

void LoraProjection::append_tensors(const std::string& prefix, const at::Tensor& dense,
                                    std::vector<gk::NamedTensor>& out) const {
  if (!active()) return;
  const at::Tensor a = a_of(dense);
  std::int64_t brow = 0;
  for (std::size_t p = 0; p < names_.size(); ++p) {
    out.push_back({prefix + "." + names_[p] + ".lora_A.weight", a.narrow(0, static_cast<std::int64_t>(p) * rank_, rank_), 0});
    out.push_back({prefix + "." + names_[p] + ".lora_B.weight", b_->narrow(0, brow, sizes_[p]), 0});
    brow += sizes_[p];
  }
}

at::Tensor LoraProjection::project(const char* name, const char* lora_name, const at::Tensor& x,
                                   const ProjectionWeights& w, const at::Tensor& dense) const {
  if (joined_ && kernels() == Kernels::joined && fused::supported(x)) {
    const std::int64_t n = dense.size(0) - a_rows();
    const at::Tensor ya = at::mm(x, dense.t());  // [T, N + parts rank]: y, then t = x A^T
    mark_part(demo::Part::lora);  // closed by the caller's next mark (part_timer.h)
    return fused::lora_expand(ya.narrow(1, 0, n), ya.narrow(1, n, a_rows()), *b_, offsets_, sizes_, rank_, scale_);
  }
  const at::Tensor y = w.apply(name, x, base_weight(dense));
  return active() ? adapt(lora_name, x, y, a_of(dense)) : y;
}

at::Tensor LoraProjection::adapt(const char* name, const at::Tensor& x, const at::Tensor& y, const at::Tensor& a) const {
  mark_part(demo::Part::lora);  // closed by the caller's next mark (part_timer.h)
  if (kernels() != Kernels::aten && fused::supported(y))
    return fused::lora_expand(y, at::mm(x, a.t()), *b_, offsets_, sizes_, rank_, scale_);
  return layer_ops::op(name, {x, y, a, *b_}, y.sizes(), y.options(),
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
