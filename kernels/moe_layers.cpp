// The MoE layers of sites 2, 4, 10 and 11, the RDNA3 WNA16 kernel object
// (site 11), and the CPU twins of the fused per-token kernels of
// kernels/cuda/moe_fused.cu (same scalar code, moe_common.h).
#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/kernels/moe_cutlass.h>
#include <graphkeep/kernels/moe_shuffle.h>
#include <graphkeep/kernels/moe_w4a8.h>
#include <graphkeep/kernels/moe_wna16.h>

#include "cuda/moe_common.h"
#include "cuda/moe_launch.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace gk::kernels {
namespace {

using hostrt::reads;
using hostrt::writes;
namespace mc = gk::kernels::moe;

// The CPU twin of moe_shuffled_kernel.
void shuffled_cpu(const float* x, const float* logits, const float* w13s, const float* w2s, float* y, int64_t T,
                  int64_t E, int64_t K, int64_t N, int64_t topk) {
  std::vector<int32_t> ids(static_cast<std::size_t>(topk));
  std::vector<float> gates(static_cast<std::size_t>(topk)), h(static_cast<std::size_t>(topk * N));
  for (int64_t t = 0; t < T; ++t) {
    mc::route_token(logits + t * E, E, topk, ids.data(), gates.data());
    for (int64_t i = 0; i < topk * N; ++i) h[i] = mc::shuffled_hidden(x + t * K, w13s, ids[i / N], i % N, N, K);
    for (int64_t c = 0; c < K; ++c) y[t * K + c] = mc::shuffled_output(h.data(), ids.data(), gates.data(), w2s, c, topk, N, K);
  }
}

// The CPU twin of moe_rdna3_wna16_kernel: stages into the scratch, then reads it.
void rdna3_wna16_cpu(const float* x, const float* logits, const int8_t* w13q, const float* w13s, const int8_t* w2q,
                     const float* w2s, float* w1_buf, float* act_buf, float* y, int64_t T, int64_t E, int64_t K,
                     int64_t N, int64_t topk) {
  std::vector<int32_t> ids(static_cast<std::size_t>(topk));
  std::vector<float> gates(static_cast<std::size_t>(topk)), h(static_cast<std::size_t>(topk * N));
  for (int64_t t = 0; t < T; ++t) {
    float* act = act_buf + t * K;
    float* w1 = w1_buf + t * 2 * N * K;
    mc::route_token(logits + t * E, E, topk, ids.data(), gates.data());
    for (int64_t c = 0; c < K; ++c) act[c] = mc::round_bf16(x[t * K + c]);
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t e = ids[j];
      for (int64_t i = 0; i < 2 * N * K; ++i) w1[i] = mc::dequant_int8(w13q[e * 2 * N * K + i], w13s[e * 2 * N + i / K]);
      for (int64_t n = 0; n < N; ++n) h[j * N + n] = mc::staged_hidden(act, w1, n, N, K);
    }
    for (int64_t c = 0; c < K; ++c)
      y[t * K + c] = mc::wna16_output(h.data(), ids.data(), gates.data(), w2q, w2s, c, topk, N, K);
  }
}

void check_inputs(const char* layer, const at::Tensor& x, const at::Tensor& logits, int64_t K, int64_t E) {
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && logits.dim() == 2 && logits.size(0) == x.size(0) && logits.size(1) == E &&
               x.scalar_type() == at::kFloat && logits.scalar_type() == at::kFloat && x.is_contiguous() &&
               logits.is_contiguous(),
           layer, ": x must be a contiguous float [T, ", K, "] and logits [T, ", E, "], got ", x.sizes(), " and ",
           logits.sizes());
}

at::TensorOptions on(c10::Device device, at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().dtype(dtype).device(device);
}

// The int4 checkpoint layout (uint8 [E, R, C/2], low nibble = even column)
// repacked 8 per int32 word in the kernel's nibble order (moe_common.h
// int4_slot): int32 [E, R, C/8].
at::Tensor pack_int4(const at::Tensor& q) {
  const int64_t E = q.size(0), R = q.size(1), C = q.size(2) * 2;
  const at::Tensor v = q.to(at::kLong);
  const at::Tensor nib = at::stack({v.bitwise_and(15), v.bitwise_right_shift(4)}, -1).reshape({E, R, C / 8, 8});
  std::vector<int64_t> mult(8);
  for (int64_t j = 0; j < 8; ++j) mult[j] = int64_t{1} << (4 * mc::int4_slot(j));
  const at::Tensor m = at::tensor(mult, at::TensorOptions().dtype(at::kLong)).to(q.device());
  return (nib * m).sum(-1).to(at::kInt).contiguous();  // wraps modulo 2^32: the word's bit pattern
}

}  // namespace

// --- site 2: shuffled expert weights ------------------------------------------------

template <bool H>
ShuffledMoeT<H>::ShuffledMoeT(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk) {
  GK_CHECK(DeclarationError,
           topk >= 1 && topk <= num_experts && inter % mc::kShuffleRows == 0 && inter % mc::kShuffleCols == 0 &&
               hidden % mc::kShuffleRows == 0 && hidden % mc::kShuffleCols == 0,
           "ShuffledMoe: hidden (", hidden, ") and inter (", inter, ") must be multiples of ", mc::kShuffleRows,
           " and ", mc::kShuffleCols, ", and 1 <= topk <= experts");
  w13_weight_ = register_parameter("w13_weight", at::zeros({num_experts * 2 * inter, hidden}, on(device)), false);
  w2_weight_ = register_parameter("w2_weight", at::zeros({num_experts * hidden, inter}, on(device)), false);
}

template <bool H>
std::vector<CheckpointParam> ShuffledMoeT<H>::checkpoint_params() const {
  CheckpointParam w13{"w13_weight", {}}, w2{"w2_weight", {}};
  for (int64_t e = 0; e < num_experts_; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    w13.tensors.push_back({p + "w1", {inter_, hidden_}, at::kFloat});
    w13.tensors.push_back({p + "w3", {inter_, hidden_}, at::kFloat});
    w2.tensors.push_back({p + "w2", {hidden_, inter_}, at::kFloat});
  }
  return {w13, w2};
}

template <bool H>
void ShuffledMoeT<H>::process_weights_after_loading() {
  const int64_t E = num_experts_, K = hidden_, N = inter_, R = mc::kShuffleRows, C = mc::kShuffleCols;
  // New tensors every time, as AITER's shuffle_weight (contiguous() would
  // return a view of the parameter when a permutation happens to be trivial).
  // [E, 2(w1|w3), N/R, R, K/C, C] -> [E, N/R, K/C, 2, R, C]
  w13_shuffled_ =
      w13_weight_.view({E, 2, N / R, R, K / C, C}).permute({0, 2, 4, 1, 3, 5}).clone(at::MemoryFormat::Contiguous);
  // [E, K/R, R, N/C, C] -> [E, K/R, N/C, R, C]
  w2_shuffled_ =
      w2_weight_.view({E, K / R, R, N / C, C}).permute({0, 1, 3, 2, 4}).clone(at::MemoryFormat::Contiguous);
}

template <bool H>
at::Tensor ShuffledMoeT<H>::forward(const at::Tensor& x, const at::Tensor& logits) {
  check_inputs("ShuffledMoe", x, logits, hidden_, num_experts_);
  const int64_t T = x.size(0), E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  at::Tensor y = runtime::empty({T, K}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* lp = logits.data_ptr<float>();
  const float* w13 = w13_shuffled_.data_ptr<float>();
  const float* w2 = w2_shuffled_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_shuffled", x, cuda::launch_moe_shuffled(xp, lp, w13, w2, yp, T, E, K, N, topk, runtime::cuda_stream(x)));
  } else {
    hostrt::launch("moe_shuffled", {reads(x), reads(logits), reads(w13_shuffled_), reads(w2_shuffled_), writes(y)},
                   [=] { shuffled_cpu(xp, lp, w13, w2, yp, T, E, K, N, topk); });
  }
  return y;
}

template class ShuffledMoeT<false>;
template class ShuffledMoeT<true>;

// --- site 4: CUTLASS-style grouped GEMM, experts object with stride arrays -------

template <bool H>
CutlassMoeT<H>::CutlassMoeT(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk) {
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts, "CutlassMoe: need 1 <= topk <= experts");
  w13_weight_ = register_parameter("w13_weight", at::zeros({num_experts, 2 * inter, hidden}, on(device)), false);
  w2_weight_ = register_parameter("w2_weight", at::zeros({num_experts, hidden, inter}, on(device)), false);
}

template <bool H>
std::vector<CheckpointParam> CutlassMoeT<H>::checkpoint_params() const {
  return {{"w13_weight", {{"w13_weight", {num_experts_, 2 * inter_, hidden_}, at::kFloat}}},
          {"w2_weight", {{"w2_weight", {num_experts_, hidden_, inter_}, at::kFloat}}}};
}

template <bool H>
void CutlassMoeT<H>::process_weights_after_loading() {
  // vLLM rebuilds moe_kernel (and with it the experts object and its strides) on every PWAL.
  experts_ = std::make_unique<CutlassExpertsT<H>>(num_experts_, hidden_, inter_, topk_, w13_weight_.device());
}

template <bool H>
at::Tensor CutlassMoeT<H>::forward(const at::Tensor& x, const at::Tensor& logits) {
  check_inputs("CutlassMoe", x, logits, hidden_, num_experts_);
  GK_CHECK(StateError, experts_ != nullptr, "CutlassMoe: forward before process_weights_after_loading");
  return experts_->apply({x, logits, w13_weight_, w2_weight_, {}, {}});
}

template class CutlassMoeT<false>;
template class CutlassMoeT<true>;

// --- site 10: W4A8 grouped GEMM, a/c/s stride arrays -----------------------------------

template <bool H>
W4A8MoeT<H>::W4A8MoeT(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group,
                      c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), group_(group) {
  GK_CHECK(DeclarationError,
           topk >= 1 && topk <= num_experts && group > 0 && hidden % 8 == 0 && inter % 8 == 0 && hidden % group == 0 &&
               inter % group == 0,
           "W4A8Moe: hidden (", hidden, ") and inter (", inter, ") must be multiples of 8 and of the group size (",
           group, "), and 1 <= topk <= experts");
  const int64_t E = num_experts, K = hidden, N = inter, G = group;
  w13_qweight_ = register_parameter("w13_qweight", at::zeros({E, 2 * N, K / 2}, on(device, at::kByte)), false);
  w13_scales_ = register_parameter("w13_scales", at::zeros({E, 2 * N, K / G}, on(device)), false);
  w2_qweight_ = register_parameter("w2_qweight", at::zeros({E, K, N / 2}, on(device, at::kByte)), false);
  w2_scales_ = register_parameter("w2_scales", at::zeros({E, K, N / G}, on(device)), false);
}

template <bool H>
std::vector<CheckpointParam> W4A8MoeT<H>::checkpoint_params() const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, G = group_;
  return {{"w13_qweight", {{"w13_qweight", {E, 2 * N, K / 2}, at::kByte}}},
          {"w13_scales", {{"w13_scales", {E, 2 * N, K / G}, at::kFloat}}},
          {"w2_qweight", {{"w2_qweight", {E, K, N / 2}, at::kByte}}},
          {"w2_scales", {{"w2_scales", {E, K, N / G}, at::kFloat}}}};
}

template <bool H>
void W4A8MoeT<H>::process_weights_after_loading() {
  // vLLM: cutlass_encode_and_reorder_int4b / cutlass_pack_scale_fp8, then a new experts object.
  w13_packed_ = pack_int4(w13_qweight_);
  w2_packed_ = pack_int4(w2_qweight_);
  // clone, not contiguous(): with a single group the transpose is trivial and
  // contiguous() would return a view of the checkpoint parameter.
  w13_scales_t_ = w13_scales_.transpose(1, 2).clone(at::MemoryFormat::Contiguous);  // [E, K/G, 2N]
  w2_scales_t_ = w2_scales_.transpose(1, 2).clone(at::MemoryFormat::Contiguous);    // [E, N/G, K]
  experts_ = std::make_unique<CutlassW4A8ExpertsT<H>>(num_experts_, hidden_, inter_, topk_, group_,
                                                      w13_qweight_.device());
}

template <bool H>
at::Tensor W4A8MoeT<H>::forward(const at::Tensor& x, const at::Tensor& logits) {
  check_inputs("W4A8Moe", x, logits, hidden_, num_experts_);
  GK_CHECK(StateError, experts_ != nullptr, "W4A8Moe: forward before process_weights_after_loading");
  return experts_->apply({x, logits, w13_packed_, w2_packed_, w13_scales_t_, w2_scales_t_});
}

template class W4A8MoeT<false>;
template class W4A8MoeT<true>;

// --- site 11: kernel-owned scratch ---------------------------------------------------

template <bool H>
Rdna3Wna16KernelT<H>::Rdna3Wna16KernelT(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                                        int64_t max_tokens, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), max_tokens_(max_tokens) {
  // Fresh scratch on every PWAL, like vLLM's layer.rdna3_w1_buf = torch.empty(...).
  rdna3_w1_buf_ = at::empty({max_tokens, 2 * inter, hidden}, on(device));
  rdna3_act_buf_ = at::empty({max_tokens, hidden}, on(device));
}

template <bool H>
at::Tensor Rdna3Wna16KernelT<H>::apply(const at::Tensor& x, const at::Tensor& logits, const at::Tensor& w13_q,
                                       const at::Tensor& w13_scale, const at::Tensor& w2_q,
                                       const at::Tensor& w2_scale) const {
  check_inputs("Rdna3Wna16Kernel", x, logits, hidden_, num_experts_);
  const int64_t T = x.size(0), E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  GK_CHECK(WeightError, T <= max_tokens_, "Rdna3Wna16Kernel: ", T, " tokens exceed the scratch's ", max_tokens_);
  at::Tensor y = runtime::empty({T, K}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* lp = logits.data_ptr<float>();
  const int8_t* w13 = w13_q.data_ptr<int8_t>();
  const float* s13 = w13_scale.data_ptr<float>();
  const int8_t* w2 = w2_q.data_ptr<int8_t>();
  const float* s2 = w2_scale.data_ptr<float>();
  float* w1buf = rdna3_w1_buf_.data_ptr<float>();
  float* actbuf = rdna3_act_buf_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("moe_rdna3_wna16", x,
                   cuda::launch_moe_rdna3_wna16(xp, lp, w13, s13, w2, s2, w1buf, actbuf, yp, T, E, K, N, topk,
                                                runtime::cuda_stream(x)));
  } else {
    hostrt::launch("moe_rdna3_wna16",
                   {reads(x), reads(logits), reads(w13_q), reads(w13_scale), reads(w2_q), reads(w2_scale),
                    writes(rdna3_w1_buf_), writes(rdna3_act_buf_), writes(y)},
                   [=] { rdna3_wna16_cpu(xp, lp, w13, s13, w2, s2, w1buf, actbuf, yp, T, E, K, N, topk); });
  }
  return y;
}

template class Rdna3Wna16KernelT<false>;
template class Rdna3Wna16KernelT<true>;

template <bool H>
Rdna3Wna16MoeT<H>::Rdna3Wna16MoeT(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                                  int64_t max_tokens, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), max_tokens_(max_tokens) {
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts && max_tokens >= 1,
           "Rdna3Wna16Moe: need 1 <= topk <= experts and max_tokens >= 1");
  const int64_t E = num_experts, K = hidden, N = inter;
  w13_qweight_ = register_parameter("w13_qweight", at::zeros({E, 2 * N, K}, on(device, at::kChar)), false);
  w13_scales_ = register_parameter("w13_scales", at::zeros({E, 2 * N}, on(device)), false);
  w2_qweight_ = register_parameter("w2_qweight", at::zeros({E, K, N}, on(device, at::kChar)), false);
  w2_scales_ = register_parameter("w2_scales", at::zeros({E, K}, on(device)), false);
}

template <bool H>
std::vector<CheckpointParam> Rdna3Wna16MoeT<H>::checkpoint_params() const {
  const int64_t E = num_experts_, K = hidden_, N = inter_;
  return {{"w13_qweight", {{"w13_qweight", {E, 2 * N, K}, at::kChar}}},
          {"w13_scales", {{"w13_scales", {E, 2 * N}, at::kFloat}}},
          {"w2_qweight", {{"w2_qweight", {E, K, N}, at::kChar}}},
          {"w2_scales", {{"w2_scales", {E, K}, at::kFloat}}}};
}

template <bool H>
void Rdna3Wna16MoeT<H>::process_weights_after_loading() {
  kernel_ = Rdna3Wna16KernelT<H>(num_experts_, hidden_, inter_, topk_, max_tokens_, w13_qweight_.device());
}

template <bool H>
at::Tensor Rdna3Wna16MoeT<H>::forward(const at::Tensor& x, const at::Tensor& logits) {
  return kernel_.apply(x, logits, w13_qweight_, w13_scales_, w2_qweight_, w2_scales_);
}

template class Rdna3Wna16MoeT<false>;
template class Rdna3Wna16MoeT<true>;

}  // namespace gk::kernels
