// Site 2: the MoE layer with shuffled expert weights (moe_shuffle.h), and the CPU twin
// of moe_shuffled_kernel (kernels/cuda/moe_fused.cu; same scalar code, moe_common.h).
#include <graphkeep/kernels/moe_shuffle.h>
#include <graphkeep/runtime/device.h>

#include "cuda/moe_launch.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
namespace {

using namespace detail;

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

}  // namespace

// --- site 2: shuffled expert weights ------------------------------------------------

ShuffledMoe::ShuffledMoe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk) {
  check_routing("ShuffledMoe", num_experts, topk);
  GK_CHECK(DeclarationError,
           inter % mc::kShuffleRows == 0 && inter % mc::kShuffleCols == 0 && hidden % mc::kShuffleRows == 0 &&
               hidden % mc::kShuffleCols == 0,
           "ShuffledMoe: hidden (", hidden, ") and inter (", inter, ") must be multiples of ", mc::kShuffleRows,
           " and ", mc::kShuffleCols);
  std::vector<CheckpointTensor> w13, w2;  // per expert: w1 and w3 rows, then w2
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    w13.push_back({p + "w1", {inter, hidden}, at::kFloat});
    w13.push_back({p + "w3", {inter, hidden}, at::kFloat});
    w2.push_back({p + "w2", {hidden, inter}, at::kFloat});
  }
  w13_weight_ = checkpoint_param("w13_weight", std::move(w13), device);  // [E*2N, K]
  w2_weight_ = checkpoint_param("w2_weight", std::move(w2), device);     // [E*K, N]
}

namespace {
// New tensors every time, as AITER's shuffle_weight (contiguous() would
// return a view of the parameter when a permutation happens to be trivial).
// [E, 2(w1|w3), N/R, R, K/C, C] -> [E, N/R, K/C, 2, R, C]
at::Tensor shuffle_w13(const at::Tensor& w, int64_t E, int64_t K, int64_t N) {
  const int64_t R = mc::kShuffleRows, C = mc::kShuffleCols;
  return w.view({E, 2, N / R, R, K / C, C}).permute({0, 2, 4, 1, 3, 5}).clone(at::MemoryFormat::Contiguous);
}
// [E, K/R, R, N/C, C] -> [E, K/R, N/C, R, C]
at::Tensor shuffle_w2(const at::Tensor& w, int64_t E, int64_t K, int64_t N) {
  const int64_t R = mc::kShuffleRows, C = mc::kShuffleCols;
  return w.view({E, K / R, R, N / C, C}).permute({0, 1, 3, 2, 4}).clone(at::MemoryFormat::Contiguous);
}
}  // namespace

void ShuffledMoe::process_weights_after_loading() {
  w13_shuffled_ = shuffle_w13(w13_weight_, num_experts_, hidden_, inter_);
  w2_shuffled_ = shuffle_w2(w2_weight_, num_experts_, hidden_, inter_);
}

void ShuffledMoe::declare_derivations(Derivations& d) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_;
  d.layout("AITER shuffle of w13 into tiles", w13_weight_, w13_shuffled_,
           [=](const at::Tensor& w) { return shuffle_w13(w, E, K, N); });
  d.layout("AITER shuffle of w2 into tiles", w2_weight_, w2_shuffled_,
           [=](const at::Tensor& w) { return shuffle_w2(w, E, K, N); });
}

at::Tensor ShuffledMoe::forward(const at::Tensor& x, const at::Tensor& logits) {
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

}  // namespace gk::kernels
