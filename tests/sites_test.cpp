// The known failure sites, each as a registered class, on the CPU replay
// backend (suite cpu) and on real CUDA graphs (suite gpu, ctest label gpu).
#include "site_harness.h"

#include <graphkeep/kernels/mla_attention.h>

namespace {

// Site 1: MLA absorbed W_UK_T / W_UV derived from kv_b_proj.
struct MlaModel : torch::nn::Module {
  static constexpr int64_t H = 4, DN = 8, DV = 8, L = 16, T = 5;
  std::shared_ptr<gk::kernels::MlaAttention> attn;
  explicit MlaModel(c10::Device d) { attn = register_module("attn", std::make_shared<gk::kernels::MlaAttention>(H, DN, DV, L, d)); }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"attn.kv_b_proj", at::sin(at::arange(H * (DN + DV) * L, at::kFloat).reshape({H * (DN + DV), L}) * 0.13 + step)}};
  }
  at::Tensor example_input(c10::Device d) const {
    return at::cos(at::arange(T * (H * DN + L), at::kFloat) * 0.07).reshape({T, H * DN + L}).to(d);
  }
  at::Tensor forward(const at::Tensor& x) {
    return attn->forward(sites::slice(x, 1, 0, H * DN), sites::slice(x, 1, H * DN, L));
  }
};

}  // namespace

TEST_SUITE("cpu") {
  TEST_CASE("site 1 MLA W_UV/W_UK_T: positive") { sites::positive<MlaModel>(sites::cpu()); }
  TEST_CASE("site 1 MLA W_UV/W_UK_T: negative (copy-back disabled)") {
    sites::negative_unprotected<MlaModel>(sites::cpu(), "attn.W_UV_");
  }
}

TEST_SUITE("gpu") {
  TEST_CASE("site 1 MLA W_UV/W_UK_T on CUDA graphs: positive") { sites::positive<MlaModel>(sites::gpu()); }
  TEST_CASE("site 1 MLA W_UV/W_UK_T on CUDA graphs: negative (copy-back disabled)") {
    sites::negative_unprotected<MlaModel>(sites::gpu(), "attn.W_UV_");
  }
}
