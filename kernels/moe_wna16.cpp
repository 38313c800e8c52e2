// Site 11: the RDNA3 WNA16 kernel with its own scratch, and its layer (moe_wna16.h);
// the CPU twin of moe_rdna3_wna16_kernel (kernels/cuda/moe_fused.cu).
#include <graphkeep/kernels/moe_wna16.h>
#include <graphkeep/runtime/device.h>

#include "cuda/moe_launch.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
namespace {

using namespace detail;

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

}  // namespace

// --- site 11: kernel-owned scratch ---------------------------------------------------

Rdna3Wna16Kernel::Rdna3Wna16Kernel(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                                   int64_t max_tokens, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), max_tokens_(max_tokens) {
  // Fresh scratch on every PWAL, like vLLM's layer.rdna3_w1_buf = torch.empty(...).
  rdna3_w1_buf_ = at::empty({max_tokens, 2 * inter, hidden}, on(device));
  rdna3_act_buf_ = at::empty({max_tokens, hidden}, on(device));
}

at::Tensor Rdna3Wna16Kernel::apply(const at::Tensor& x, const at::Tensor& logits, const at::Tensor& w13_q,
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

Rdna3Wna16Moe::Rdna3Wna16Moe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                             int64_t max_tokens, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), max_tokens_(max_tokens) {
  check_routing("Rdna3Wna16Moe", num_experts, topk);
  GK_CHECK(DeclarationError, max_tokens >= 1, "Rdna3Wna16Moe: need max_tokens >= 1, got ", max_tokens);
  const int64_t E = num_experts, K = hidden, N = inter;
  w13_qweight_ = checkpoint_param("w13_qweight", {E, 2 * N, K}, at::kChar, device);
  w13_scales_ = checkpoint_param("w13_scales", {E, 2 * N}, at::kFloat, device);
  w2_qweight_ = checkpoint_param("w2_qweight", {E, K, N}, at::kChar, device);
  w2_scales_ = checkpoint_param("w2_scales", {E, K}, at::kFloat, device);
}

void Rdna3Wna16Moe::process_weights_after_loading() {
  kernel_ = Rdna3Wna16Kernel(num_experts_, hidden_, inter_, topk_, max_tokens_, w13_qweight_.device());
}

at::Tensor Rdna3Wna16Moe::forward(const at::Tensor& x, const at::Tensor& logits) {
  return kernel_.apply(x, logits, w13_qweight_, w13_scales_, w2_qweight_, w2_scales_);
}

}  // namespace gk::kernels
