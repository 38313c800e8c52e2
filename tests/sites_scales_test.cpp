// Failure sites 3, 7, 8 and 9 (padding, quantized attention weights, MoE
// scales): each as a registered class, on the CPU replay backend (suite cpu)
// and on real CUDA graphs (suite gpu, ctest label gpu).
#include "site_harness.h"

#include <graphkeep/quant/catalog.h>
#include <graphkeep/kernels/padded_moe.h>
#include <graphkeep/quant/fp8_mla_attention.h>
#include <graphkeep/quant/moe_scales_b12x.h>
#include <graphkeep/quant/nvfp4_cutlass_moe.h>

// The number formats the kernels decode (host side here: the checkpoint
// quantizer and the codec checks).
#include <graphkeep/numerics/nvfp4_codec.h>

#include <c10/util/Float8_e4m3fn.h>

#include <cmath>
#include <set>

namespace {

namespace codec = gk::quant::codec;
using gk::quant::MlaWeightFormat;

// Deterministic weights: distinct per tensor (phase) and per step.
at::Tensor wave(std::vector<int64_t> shape, double phase, int step) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::sin(at::arange(n, at::kFloat) * 0.37 + phase + 0.11 * step).reshape(shape);
}

// The offline NVFP4 quantizer that produces the checkpoints of sites 8 and 9:
// w [E, M, K] -> e2m1 codes packed two per byte, e4m3 scales per 16-block,
// and per-expert global scales (dequantization multipliers, amax / (448*6)).
struct Nvfp4Weights {
  at::Tensor packed, block_scale, global_scale;
};
Nvfp4Weights quantize_nvfp4(const at::Tensor& w) {
  const int64_t E = w.size(0), M = w.size(1), K = w.size(2), B = codec::kNvfp4Block;
  Nvfp4Weights q;
  q.global_scale = (w.abs().amax(at::IntArrayRef{1, 2}) / (codec::kFp8Max * codec::kFp4Max)).contiguous();
  q.packed = at::zeros({E, M, K / 2}, at::kByte);
  q.block_scale = at::empty({E, M, K / B}, at::kByte);
  const float* wp = w.data_ptr<float>();
  std::uint8_t* pp = q.packed.data_ptr<std::uint8_t>();
  std::uint8_t* sp = q.block_scale.data_ptr<std::uint8_t>();
  for (int64_t e = 0; e < E; ++e) {
    const float gs = q.global_scale.data_ptr<float>()[e];
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < K / B; ++b) {
        const float* blk = wp + (e * M + m) * K + b * B;
        float amax = 0.f;
        for (int64_t i = 0; i < B; ++i) amax = std::max(amax, std::fabs(blk[i]));
        const std::uint8_t s = codec::fp8_e4m3_encode(amax / codec::kFp4Max / gs);
        sp[(e * M + m) * (K / B) + b] = s;
        const float sv = codec::fp8_e4m3_decode(s) * gs;
        for (int64_t i = 0; i < B; ++i) {
          const int64_t col = b * B + i;
          const std::uint8_t c = sv == 0.f ? 0 : codec::fp4_e2m1_encode(blk[i] / sv);
          pp[(e * M + m) * (K / 2) + col / 2] |= static_cast<std::uint8_t>((col & 1) ? c << 4 : c);
        }
      }
  }
  return q;
}

// NVFP4 as the format defines it, in ATen ops only (no codec): v [..., n] is
// scaled by gscale, split into 16-blocks with e4m3 scales amax/6, rounded to
// the nearest e2m1 value, and dequantized again.
at::Tensor fp4_round(const at::Tensor& v) {
  const at::Tensor grid = at::tensor({0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f});
  const at::Tensor idx = (v.abs().clamp_max(6.f).unsqueeze(-1) - grid).abs().argmin(-1);
  return at::sign(v) * grid.index_select(0, idx.reshape({-1})).reshape(v.sizes());
}
at::Tensor nvfp4_roundtrip(const at::Tensor& v, double gscale) {
  const at::Tensor b = v.reshape({-1, codec::kNvfp4Block}) * gscale;
  const at::Tensor sf = (b.abs().amax({1}, true) / codec::kFp4Max).to(at::kFloat8_e4m3fn).to(at::kFloat);
  const at::Tensor codes = at::where(sf == 0, at::zeros_like(b), fp4_round(b / at::where(sf == 0, at::ones_like(sf), sf)));
  return (codes * sf / gscale).reshape(v.sizes());
}

// ---------------------------------------------------------------------------
// Site 3: ROCm MoE padding (the parameter's storage is swapped for a padded one)
// ---------------------------------------------------------------------------
struct PaddedMoeModel : torch::nn::Module {
  static constexpr int64_t E = 4, K = 32, N = 16, T = 6;
  std::shared_ptr<gk::kernels::PaddedMoe> moe;
  explicit PaddedMoeModel(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::kernels::PaddedMoe>(E, K, N, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"moe.w13_weight", wave({E, 2 * N, K}, 1.0, step)},
            {"moe.w2_weight", wave({E, K, N}, 2.0, step)},
            {"moe.gate", wave({E, K}, 3.0, step)}};
  }
  at::Tensor example_input(c10::Device d) const {
    return at::cos(at::arange(T * K, at::kFloat) * 0.07).reshape({T, K}).to(d);
  }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(x); }
};

// ---------------------------------------------------------------------------
// Site 7: AITER MLA FP8 / FP4 (W_K, W_V quantized in PWAL, W_K_scale, W_V_scale)
// ---------------------------------------------------------------------------
template <MlaWeightFormat F>
struct QuantMlaModel : torch::nn::Module {
  static constexpr int64_t H = 2, DN = 32, DV = 32, L = 64, T = 6;
  std::shared_ptr<gk::quant::QuantizedMlaAttention> attn;
  explicit QuantMlaModel(c10::Device d) {
    attn = register_module("attn", std::make_shared<gk::quant::QuantizedMlaAttention>(H, DN, DV, L, F, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"attn.kv_b_proj",
             at::sin(at::arange(H * (DN + DV) * L, at::kFloat).reshape({H * (DN + DV), L}) * 0.13 + step)}};
  }
  at::Tensor example_input(c10::Device d) const {
    return at::cos(at::arange(T * (H * DN + L), at::kFloat) * 0.07).reshape({T, H * DN + L}).to(d);
  }
  at::Tensor forward(const at::Tensor& x) {
    return attn->forward(sites::slice(x, 1, 0, H * DN), sites::slice(x, 1, H * DN, L));
  }
};
using MlaFp8Model = QuantMlaModel<MlaWeightFormat::fp8_e4m3>;
using MlaFp4Model = QuantMlaModel<MlaWeightFormat::mxfp4>;

// ---------------------------------------------------------------------------
// Sites 8 and 9: NVFP4 MoE checkpoints
// ---------------------------------------------------------------------------
constexpr int64_t kMoeE = 4, kMoeK = 64, kMoeN = 32, kMoeT = 6;

// Per-expert input scales (dequantization multipliers) that change per step.
at::Tensor input_scales(double base, int step) {
  return ((base + 0.1 * at::arange(kMoeE, at::kFloat) * base + 0.05 * step * base) /
          (codec::kFp8Max * codec::kFp4Max))
      .contiguous();
}
at::Tensor moe_input(c10::Device d) {
  return at::cos(at::arange(kMoeT * kMoeK, at::kFloat) * 0.07 + 0.3).reshape({kMoeT, kMoeK}).to(d);
}

// Each row's amplitude changes with the step, so that the block scale
// factors do too (a sine's amax per 16-block is near 1 whatever the phase).
at::Tensor row_gain(const at::Tensor& w, int step) {
  const int64_t rows = w.numel() / w.size(-1);
  return w * (1.0 + 0.2 * step * at::cos(at::arange(rows, at::kFloat) * 1.3)).reshape({w.size(0), w.size(1), 1});
}

// Site 8: FlashInfer B12x (swizzled w13_sf_mma / w2_sf_mma, fc1/fc2 input scales).
struct B12xModel : torch::nn::Module {
  std::shared_ptr<gk::quant::B12xNvfp4Moe> moe;
  explicit B12xModel(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::quant::B12xNvfp4Moe>(kMoeE, kMoeK, kMoeN, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    const Nvfp4Weights w13 = quantize_nvfp4(row_gain(wave({kMoeE, 2 * kMoeN, kMoeK}, 1.0, step), step));
    const Nvfp4Weights w2 = quantize_nvfp4(row_gain(wave({kMoeE, kMoeK, kMoeN}, 2.0, step), step));
    return {{"moe.w13_weight", w13.packed},        {"moe.w13_weight_scale", w13.block_scale},
            {"moe.w13_weight_scale_2", w13.global_scale}, {"moe.w13_input_scale", input_scales(1.0, step)},
            {"moe.w2_weight", w2.packed},          {"moe.w2_weight_scale", w2.block_scale},
            {"moe.w2_weight_scale_2", w2.global_scale},   {"moe.w2_input_scale", input_scales(40.0, step)},
            {"moe.gate", wave({kMoeE, kMoeK}, 3.0, step)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(x); }
};

// Site 9: compressed-tensors NVFP4 CUTLASS MoE (g1/g2_alphas, a1/a2_gscale).
struct Nvfp4MoeModel : torch::nn::Module {
  std::shared_ptr<gk::quant::Nvfp4CutlassMoe> moe;
  explicit Nvfp4MoeModel(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::quant::Nvfp4CutlassMoe>(kMoeE, kMoeK, kMoeN, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    const Nvfp4Weights w13 = quantize_nvfp4(wave({kMoeE, 2 * kMoeN, kMoeK}, 1.5, step));
    const Nvfp4Weights w2 = quantize_nvfp4(wave({kMoeE, kMoeK, kMoeN}, 2.5, step));
    return {{"moe.w13_weight", w13.packed},
            {"moe.w13_weight_scale", w13.block_scale},
            {"moe.w13_weight_global_scale", w13.global_scale},
            {"moe.w13_input_global_scale", input_scales(1.0, step)},
            {"moe.w2_weight", w2.packed},
            {"moe.w2_weight_scale", w2.block_scale},
            {"moe.w2_weight_global_scale", w2.global_scale},
            {"moe.w2_input_global_scale", input_scales(40.0, step)},
            {"moe.gate", wave({kMoeE, kMoeK}, 3.5, step)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(x); }
};

template <class Model>
std::shared_ptr<Model> loaded(c10::Device d, int step) {
  auto m = std::make_shared<Model>(d);
  gk::InMemorySource src(m->checkpoint(step));
  gk::load_weights(*m, src);
  return m;
}

// The same model, built fresh with step's weights, on CPU and on CUDA: the
// CPU twin and the CUDA kernel compute the same function, bit for bit.
template <class Model>
void cpu_equals_cuda(int step) {
  const at::Tensor in = Model(sites::cpu()).example_input(sites::cpu());
  const at::Tensor a = sites::fresh_output<Model>(sites::cpu(), step, in);
  const at::Tensor b = sites::fresh_output<Model>(sites::gpu(), step, in.to(sites::gpu()));
  INFO("max |cpu - cuda| = " << (a - b).abs().max().item<float>());
  CHECK(a.sizes() == b.sizes());
  CHECK(at::equal(a, b));
  CHECK(a.abs().sum().item<float>() > 0.f);
}

// Which experts the top-1 router picks for the example input (to make sure
// a test exercises more than one expert).
std::set<int64_t> routed_experts(const at::Tensor& x, const at::Tensor& gate) {
  std::set<int64_t> out;
  const at::Tensor xc = x.to(at::kCPU).contiguous(), g = gate.to(at::kCPU).contiguous();
  for (int64_t t = 0; t < xc.size(0); ++t)
    out.insert(codec::route_top1(xc.data_ptr<float>() + t * xc.size(1), g.data_ptr<float>(), g.size(0), g.size(1)));
  return out;
}

}  // namespace

// ===========================================================================
// The codec: the number formats the kernels decode
// ===========================================================================
TEST_SUITE("cpu") {
  TEST_CASE("codec: fp8 e4m3fn decode and encode agree with c10::Float8_e4m3fn") {
    int decode_mismatch = 0;
    for (int c = 0; c < 256; ++c) {
      const float ref = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(c), c10::Float8_e4m3fn::from_bits()));
      const float mine = codec::fp8_e4m3_decode(static_cast<std::uint8_t>(c));
      const bool ok = std::isnan(ref) ? std::isnan(mine) : codec::bits_of(ref) == codec::bits_of(mine);
      decode_mismatch += ok ? 0 : 1;
    }
    CHECK(decode_mismatch == 0);
    // encode: a dense sweep of [-447, 447] and of the subnormal range
    int encode_mismatch = 0, checked = 0;
    auto check_one = [&](float v) {
      ++checked;
      if (codec::fp8_e4m3_encode(v) != c10::Float8_e4m3fn(v).x) ++encode_mismatch;
    };
    for (int i = -200000; i <= 200000; ++i) check_one(static_cast<float>(i) * 0.002235f);
    for (int i = -40000; i <= 40000; ++i) check_one(static_cast<float>(i) * 4.1e-7f);
    for (int c = 0; c < 256; ++c) {  // every representable value and every midpoint
      const float v = codec::fp8_e4m3_decode(static_cast<std::uint8_t>(c));
      const float w = codec::fp8_e4m3_decode(static_cast<std::uint8_t>(c + 1));
      if (std::isnan(v) || std::fabs(v) >= 448.f) continue;
      check_one(v);
      if (!std::isnan(w) && (c & 0x7F) != 0x7F && std::fabs(w) < 448.f) check_one(0.5f * (v + w));
    }
    CAPTURE(checked);
    CHECK(encode_mismatch == 0);
    // saturation (c10 turns >= 480 into NaN; the kernels' quantizer clamps like vLLM)
    CHECK(codec::fp8_e4m3_encode(1000.f) == 0x7E);
    CHECK(codec::fp8_e4m3_encode(-1e30f) == 0xFE);
    CHECK(codec::fp8_e4m3_encode(INFINITY) == 0x7E);
    CHECK(codec::fp8_e4m3_encode(NAN) == 0x7F);
  }

  TEST_CASE("codec: fp4 e2m1, e8m0 and the 128x4 scale swizzle") {
    const float values[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    for (int c = 0; c < 16; ++c) {
      CAPTURE(c);
      const float v = codec::fp4_e2m1_decode(static_cast<std::uint8_t>(c));
      CHECK(v == ((c & 8) ? -values[c & 7] : values[c & 7]));
      CHECK(codec::fp4_e2m1_encode(v) == c);
    }
    // ties to the even code, saturation
    CHECK(codec::fp4_e2m1_encode(0.25f) == 0);
    CHECK(codec::fp4_e2m1_encode(0.75f) == 2);
    CHECK(codec::fp4_e2m1_encode(1.25f) == 2);
    CHECK(codec::fp4_e2m1_encode(1.75f) == 4);
    CHECK(codec::fp4_e2m1_encode(2.5f) == 4);
    CHECK(codec::fp4_e2m1_encode(3.5f) == 6);
    CHECK(codec::fp4_e2m1_encode(5.f) == 6);
    CHECK(codec::fp4_e2m1_encode(5.01f) == 7);
    CHECK(codec::fp4_e2m1_encode(-100.f) == 15);
    CHECK(codec::fp4_e2m1_encode(0.26f) == 1);
    // e8m0 and the MX scale choice
    CHECK(codec::e8m0_decode(127) == 1.f);
    CHECK(codec::e8m0_decode(130) == 8.f);
    CHECK(codec::e8m0_decode(120) == std::ldexp(1.f, -7));
    CHECK(codec::mxfp4_scale_for(6.f) == 127);    // 6 / 2^0 = 6
    CHECK(codec::mxfp4_scale_for(0.9f) == 124);   // floor(log2 0.9) = -1 -> 2^-3: 0.9 * 8 = 7.2 -> 6
    CHECK(codec::mxfp4_scale_for(0.f) == 0);
    // the swizzle: a known offset, a bijection onto the padded tile space,
    // and swizzle_sf_128x4 / unswizzle_sf_128x4 invert each other
    CHECK(codec::nvfp4_sf_offset_128x4(33, 5, 2) == 533);
    CHECK(codec::nvfp4_sf_offset_128x4(128, 0, 2) == 1024);
    std::set<int64_t> offsets;
    for (int64_t m = 0; m < 256; ++m)
      for (int64_t k = 0; k < 8; ++k) offsets.insert(codec::nvfp4_sf_offset_128x4(m, k, 2));
    CHECK(offsets.size() == 2048);
    CHECK(*offsets.begin() == 0);
    CHECK(*offsets.rbegin() == 2047);
    const at::Tensor sf = (at::arange(2 * 200 * 6, at::kInt) * 7 % 251 + 1).to(at::kByte).reshape({2, 200, 6});
    const at::Tensor sw = gk::quant::swizzle_sf_128x4(sf);
    CHECK(sw.sizes().vec() == std::vector<int64_t>{2, 256 * 8});
    CHECK(at::equal(gk::quant::unswizzle_sf_128x4(sw, 200, 6), sf));
    CHECK(sw.sum().item<int64_t>() == sf.to(at::kLong).sum().item<int64_t>());  // padding is zero
  }

  TEST_CASE("the scales catalog lists the site classes") {
    using R = gk::Registry<gk::concat_t<gk::TypeList<gk::kernels::PaddedMoe>, gk::quant::ScalesTypes>>;
    static_assert(R::size == 4);
    CHECK(R::names[0] == "PaddedMoe");
    CHECK(R::table().size() > 4 * 4);
  }
}

// ===========================================================================
// Site 3
// ===========================================================================
TEST_SUITE("cpu") {
  TEST_CASE("site 3 padded MoE (parameter storage swapped by PWAL): positive") {
    sites::positive<PaddedMoeModel>(sites::cpu());
  }
  TEST_CASE("site 3 padded MoE: negative (copy-back of the parameter disabled)") {
    sites::negative_unprotected<PaddedMoeModel>(sites::cpu(), "moe.w13_weight");
  }
  TEST_CASE("site 3 padded MoE: the reload copies into the captured padded storage") {
    using M = PaddedMoeModel;
    sites::Rig<M> rig(sites::cpu());
    const at::Tensor& w = rig.model->moe->w13_weight();
    const int64_t pad = rig.model->moe->pad_elements();
    CHECK(pad == gk::kernels::PaddedMoe::kPadBytes / 4);
    CHECK(w.strides().vec() == std::vector<int64_t>{2 * M::N * (M::K + pad), M::K + pad, 1});
    CHECK(w.sizes().vec() == std::vector<int64_t>{M::E, 2 * M::N, M::K});
    const void* ptr = w.data_ptr();
    const std::size_t nbytes = w.storage().nbytes();
    CHECK(routed_experts(rig.input, rig.model->checkpoint(1)[2].value).size() > 1);
    rig.reload(1);
    CHECK(w.data_ptr() == ptr);
    CHECK(w.storage().nbytes() == nbytes);
    CHECK(w.strides().vec() == std::vector<int64_t>{2 * M::N * (M::K + pad), M::K + pad, 1});
    CHECK(at::equal(w, rig.model->checkpoint(1)[0].value));
    const at::Tensor whole = w.as_strided({M::E, 2 * M::N, M::K + pad}, w.strides());
    CHECK(at::equal(whole.narrow(2, M::K, pad), at::zeros({M::E, 2 * M::N, pad})));
  }
}
TEST_SUITE("gpu") {
  TEST_CASE("site 3 padded MoE on CUDA graphs: positive") { sites::positive<PaddedMoeModel>(sites::gpu()); }
  TEST_CASE("site 3 padded MoE on CUDA graphs: negative (copy-back of the parameter disabled)") {
    sites::negative_unprotected<PaddedMoeModel>(sites::gpu(), "moe.w13_weight");
  }
  TEST_CASE("site 3 padded MoE: CPU twin and CUDA kernel agree bitwise") { cpu_equals_cuda<PaddedMoeModel>(1); }
}

// ===========================================================================
// Site 7
// ===========================================================================
GK_TEST_CHILD(scales_mla_hidden_k_scale) {
  return sites::replay_after_hidden_reload_child<MlaFp8Model>("attn.W_K_scale_");
}

TEST_SUITE("cpu") {
  TEST_CASE("site 7 MLA FP8 W_K/W_V + scales: positive") { sites::positive<MlaFp8Model>(sites::cpu()); }
  TEST_CASE("site 7 MLA MXFP4 W_K/W_V + scales: positive") { sites::positive<MlaFp4Model>(sites::cpu()); }
  TEST_CASE("site 7 MLA FP8: negative (W_K_scale copy-back disabled)") {
    sites::negative_unprotected<MlaFp8Model>(sites::cpu(), "attn.W_K_scale_");
  }
  TEST_CASE("site 7 MLA MXFP4: negative (W_V codes copy-back disabled)") {
    sites::negative_unprotected<MlaFp4Model>(sites::cpu(), "attn.W_V_");
  }
  TEST_CASE("site 7 MLA MXFP4: negative (W_V_scale copy-back disabled)") {
    sites::negative_unprotected<MlaFp4Model>(sites::cpu(), "attn.W_V_scale_");
  }
  TEST_CASE("site 7 MLA FP8: negative (W_K_scale undeclared)") {
    sites::negative_undeclared<MlaFp8Model>(sites::cpu(), "attn.W_K_scale_");
  }
  TEST_CASE("site 7 MLA FP8: codes decode like torch's float8_e4m3fn; the kernel computes the documented attention") {
    using M = MlaFp8Model;
    auto m = loaded<M>(sites::cpu(), 1);
    const auto& a = *m->attn;
    CHECK((a.w_k().scalar_type() == at::kByte));
    CHECK(a.w_k().sizes().vec() == std::vector<int64_t>{M::H, M::L, M::DN});
    CHECK(a.w_k_scale().sizes().vec() == std::vector<int64_t>{M::H, M::L});
    const at::Tensor wk = a.w_k().view(at::kFloat8_e4m3fn).to(at::kFloat) * a.w_k_scale().unsqueeze(-1);  // [H, L, dn]
    const at::Tensor wv = a.w_v().view(at::kFloat8_e4m3fn).to(at::kFloat) * a.w_v_scale().unsqueeze(-1);  // [H, dv, L]
    // quantization error of an e4m3 code: at most half a step (2^-4 relative) plus the subnormal step
    const at::Tensor kv = m->checkpoint(1)[0].value.view({M::H, M::DN + M::DV, M::L});
    CHECK(at::allclose(wk, kv.narrow(1, 0, M::DN).transpose(1, 2), 0.0625, 1e-5));
    CHECK(at::allclose(wv, kv.narrow(1, M::DN, M::DV), 0.0625, 1e-5));
    CHECK_FALSE(at::equal(wk, kv.narrow(1, 0, M::DN).transpose(1, 2)));  // really quantized
    const at::Tensor x = m->example_input(sites::cpu());
    const at::Tensor y = m->forward(x);
    const at::Tensor q = x.narrow(1, 0, M::H * M::DN).reshape({M::T, M::H, M::DN});
    const at::Tensor c = x.narrow(1, M::H * M::DN, M::L);
    at::Tensor ref = at::empty({M::T, M::H, M::DV});
    for (int64_t t = 0; t < M::T; ++t)
      for (int64_t h = 0; h < M::H; ++h) {
        const at::Tensor qa = at::mv(wk[h], q[t][h]);                   // [L]
        const at::Tensor ct = c.narrow(0, 0, t + 1);                     // [t+1, L]
        const at::Tensor score = at::mv(ct, qa) * 0.125;                 // [t+1]
        const at::Tensor o = at::mv(ct.t(), score);                      // [L]
        ref[t][h] = at::mv(wv[h], o);                                    // [dv]
      }
    CHECK(at::allclose(y, ref.reshape({M::T, M::H * M::DV}), 1e-4, 1e-4));
  }
  TEST_CASE("site 7 MLA MXFP4: nibbles and e8m0 scales") {
    using M = MlaFp4Model;
    auto m = loaded<M>(sites::cpu(), 0);
    const auto& a = *m->attn;
    CHECK(a.w_k().sizes().vec() == std::vector<int64_t>{M::H, M::L, M::DN / 2});
    CHECK((a.w_k_scale().scalar_type() == at::kByte));
    CHECK(a.w_k_scale().sizes().vec() == std::vector<int64_t>{M::H, M::L, M::DN / 32});
    CHECK(a.w_v_scale().sizes().vec() == std::vector<int64_t>{M::H, M::DV, M::L / 32});
    // dequantize W_V by hand and compare with the float projection (e2m1 keeps ~1 significant bit)
    const at::Tensor codes = a.w_v().to(at::kInt);
    const at::Tensor lo = codes.bitwise_and(15), hi = codes.bitwise_right_shift(4);
    const at::Tensor nib = at::stack({lo, hi}, -1).reshape({M::H, M::DV, M::L});
    at::Tensor deq = at::empty({M::H, M::DV, M::L});
    for (int64_t i = 0; i < deq.numel(); ++i) {
      const int64_t r = i / M::L, l = i % M::L;
      deq.data_ptr<float>()[i] =
          codec::fp4_e2m1_decode(static_cast<std::uint8_t>(nib.data_ptr<int>()[i])) *
          codec::e8m0_decode(a.w_v_scale().reshape({-1, M::L / 32}).data_ptr<std::uint8_t>()[r * (M::L / 32) + l / 32]);
    }
    const at::Tensor kv = m->checkpoint(0)[0].value.view({M::H, M::DN + M::DV, M::L});
    const at::Tensor ref = kv.narrow(1, M::DN, M::DV);
    CHECK((deq - ref).abs().max().item<float>() <= 0.5f);  // amax <= 1: step <= 0.5 at the top binade
    CHECK((deq - ref).abs().mean().item<float>() < 0.1f);
  }
}
TEST_SUITE("gpu") {
  TEST_CASE("site 7 MLA FP8 on CUDA graphs: positive") { sites::positive<MlaFp8Model>(sites::gpu()); }
  TEST_CASE("site 7 MLA MXFP4 on CUDA graphs: positive") { sites::positive<MlaFp4Model>(sites::gpu()); }
  TEST_CASE("site 7 MLA FP8 on CUDA graphs: negative (W_K_scale copy-back disabled)") {
    sites::negative_unprotected<MlaFp8Model>(sites::gpu(), "attn.W_K_scale_");
  }
  TEST_CASE("site 7 MLA MXFP4 on CUDA graphs: negative (W_V_scale copy-back disabled)") {
    sites::negative_unprotected<MlaFp4Model>(sites::gpu(), "attn.W_V_scale_");
  }
  TEST_CASE("site 7 MLA FP8 on CUDA graphs: negative (W_K_scale undeclared)") {
    sites::negative_undeclared<MlaFp8Model>(sites::gpu(), "attn.W_K_scale_");
  }
  TEST_CASE("site 7 MLA FP8 on CUDA graphs: replay after a hidden reload reads a stale or freed scale") {
    sites::check_child_shows_failure(gk::testing::run_child("scales_mla_hidden_k_scale"));
  }
  TEST_CASE("site 7 MLA FP8 and MXFP4: CPU twin and CUDA kernel agree bitwise") {
    cpu_equals_cuda<MlaFp8Model>(1);
    cpu_equals_cuda<MlaFp4Model>(1);
  }
}

// ===========================================================================
// Site 8
// ===========================================================================
GK_TEST_CHILD(scales_b12x_hidden_sf) { return sites::replay_after_hidden_reload_child<B12xModel>("moe.w13_sf_mma_"); }

TEST_SUITE("cpu") {
  TEST_CASE("site 8 B12x MoE swizzled scale factors + fc2 input scale: positive") {
    sites::positive<B12xModel>(sites::cpu());
  }
  TEST_CASE("site 8 B12x MoE: negative (w13_sf_mma copy-back disabled)") {
    sites::negative_unprotected<B12xModel>(sites::cpu(), "moe.w13_sf_mma_");
  }
  TEST_CASE("site 8 B12x MoE: negative (fc2_input_scale copy-back disabled)") {
    sites::negative_unprotected<B12xModel>(sites::cpu(), "moe.fc2_input_scale_");
  }
  TEST_CASE("site 8 B12x MoE: negative (w13_sf_mma undeclared)") {
    sites::negative_undeclared<B12xModel>(sites::cpu(), "moe.w13_sf_mma_");
  }
  TEST_CASE("site 8 B12x MoE: PWAL swizzles the checkpoint's scale factors and reduces the input scales") {
    auto m = loaded<B12xModel>(sites::cpu(), 1);
    const auto& moe = *m->moe;
    const int64_t ksf = kMoeK / codec::kNvfp4Block;
    CHECK(moe.w13_sf_mma().sizes().vec() == std::vector<int64_t>{kMoeE, codec::nvfp4_sf_swizzled_size(2 * kMoeN, ksf)});
    CHECK(at::equal(gk::quant::unswizzle_sf_128x4(moe.w13_sf_mma(), 2 * kMoeN, ksf), moe.w13_weight_scale()));
    CHECK_FALSE(at::equal(moe.w13_sf_mma().reshape({-1}).narrow(0, 0, moe.w13_weight_scale().numel()),
                          moe.w13_weight_scale().reshape({-1})));  // really swizzled
    CHECK(moe.fc2_input_scale().item<float>() == 1.f / input_scales(40.0, 1).max().item<float>());
    CHECK(moe.fc1_input_scale().item<float>() == 1.f / input_scales(1.0, 1).max().item<float>());
    CHECK(routed_experts(m->example_input(sites::cpu()), m->checkpoint(1)[8].value).size() > 1);
  }
}
TEST_SUITE("gpu") {
  TEST_CASE("site 8 B12x MoE on CUDA graphs: positive") { sites::positive<B12xModel>(sites::gpu()); }
  TEST_CASE("site 8 B12x MoE on CUDA graphs: negative (w13_sf_mma copy-back disabled)") {
    sites::negative_unprotected<B12xModel>(sites::gpu(), "moe.w13_sf_mma_");
  }
  TEST_CASE("site 8 B12x MoE on CUDA graphs: negative (fc2_input_scale copy-back disabled)") {
    sites::negative_unprotected<B12xModel>(sites::gpu(), "moe.fc2_input_scale_");
  }
  TEST_CASE("site 8 B12x MoE on CUDA graphs: negative (w13_sf_mma undeclared)") {
    sites::negative_undeclared<B12xModel>(sites::gpu(), "moe.w13_sf_mma_");
  }
  TEST_CASE("site 8 B12x MoE on CUDA graphs: replay after a hidden reload reads stale or freed scale factors") {
    sites::check_child_shows_failure(gk::testing::run_child("scales_b12x_hidden_sf"));
  }
  TEST_CASE("site 8 B12x MoE: CPU twin and CUDA kernel agree bitwise") { cpu_equals_cuda<B12xModel>(1); }
}

// ===========================================================================
// Site 9
// ===========================================================================
GK_TEST_CHILD(scales_nvfp4_hidden_alphas) {
  return sites::replay_after_hidden_reload_child<Nvfp4MoeModel>("moe.g1_alphas_");
}

TEST_SUITE("cpu") {
  TEST_CASE("site 9 NVFP4 CUTLASS MoE alphas + global scales: positive") {
    sites::positive<Nvfp4MoeModel>(sites::cpu());
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE: negative (g1_alphas copy-back disabled)") {
    sites::negative_unprotected<Nvfp4MoeModel>(sites::cpu(), "moe.g1_alphas_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE: negative (a2_gscale copy-back disabled)") {
    sites::negative_unprotected<Nvfp4MoeModel>(sites::cpu(), "moe.a2_gscale_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE: negative (g1_alphas undeclared)") {
    sites::negative_undeclared<Nvfp4MoeModel>(sites::cpu(), "moe.g1_alphas_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE: PWAL's alphas and gscales; output close to the float MoE") {
    auto m = loaded<Nvfp4MoeModel>(sites::cpu(), 1);
    const auto ck = m->checkpoint(1);
    const auto& moe = *m->moe;
    CHECK(at::equal(moe.g1_alphas(), ck[3].value * ck[2].value));
    CHECK(at::equal(moe.g2_alphas(), ck[7].value * ck[6].value));
    CHECK(at::equal(moe.a1_gscale(), 1.f / ck[3].value));
    CHECK(at::equal(moe.a2_gscale(), 1.f / ck[7].value));
    const at::Tensor x = m->example_input(sites::cpu());
    CHECK(routed_experts(x, ck[8].value).size() > 1);
    // An independent NVFP4 emulation in ATen ops (round to nearest on the e2m1
    // grid, e4m3 through at::kFloat8_e4m3fn), not the codec the kernels use:
    // quantize the float weights and each activation as the format defines,
    // then run the float MoE on the dequantized values (same routing).
    const at::Tensor w13 = wave({kMoeE, 2 * kMoeN, kMoeK}, 1.5, 1), w2 = wave({kMoeE, kMoeK, kMoeN}, 2.5, 1);
    at::Tensor ref = at::empty({kMoeT, kMoeK}), emulated = at::empty({kMoeT, kMoeK});
    for (int64_t t = 0; t < kMoeT; ++t) {
      const int64_t e = codec::route_top1(x.data_ptr<float>() + t * kMoeK, ck[8].value.data_ptr<float>(), kMoeE, kMoeK);
      const at::Tensor h = at::mv(w13[e], x[t]);
      ref[t] = at::mv(w2[e], at::relu(h.narrow(0, 0, kMoeN)) * h.narrow(0, kMoeN, kMoeN));
      const at::Tensor w13q = nvfp4_roundtrip(w13[e], 1.0 / ck[2].value[e].item<double>());
      const at::Tensor w2q = nvfp4_roundtrip(w2[e], 1.0 / ck[6].value[e].item<double>());
      const at::Tensor hq = at::mv(w13q, nvfp4_roundtrip(x[t], moe.a1_gscale()[e].item<double>()));
      const at::Tensor aq = at::relu(hq.narrow(0, 0, kMoeN)) * hq.narrow(0, kMoeN, kMoeN);
      emulated[t] = at::mv(w2q, nvfp4_roundtrip(aq, moe.a2_gscale()[e].item<double>()));
    }
    const at::Tensor y = m->forward(x);
    const double rel = ((y - emulated).norm() / emulated.norm()).item<double>();
    const double rel_float = ((y - ref).norm() / ref.norm()).item<double>();
    CAPTURE(rel);
    CAPTURE(rel_float);
    CHECK(rel < 1e-3);        // the format's function, up to float summation order
    CHECK(rel_float > 0.05);  // and really quantized: these sine weights and inputs cancel in every dot
                              // product, so fp4 rounding moves the output far from the float MoE
  }
}
TEST_SUITE("gpu") {
  TEST_CASE("site 9 NVFP4 CUTLASS MoE on CUDA graphs: positive") { sites::positive<Nvfp4MoeModel>(sites::gpu()); }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE on CUDA graphs: negative (g1_alphas copy-back disabled)") {
    sites::negative_unprotected<Nvfp4MoeModel>(sites::gpu(), "moe.g1_alphas_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE on CUDA graphs: negative (a2_gscale copy-back disabled)") {
    sites::negative_unprotected<Nvfp4MoeModel>(sites::gpu(), "moe.a2_gscale_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE on CUDA graphs: negative (g1_alphas undeclared)") {
    sites::negative_undeclared<Nvfp4MoeModel>(sites::gpu(), "moe.g1_alphas_");
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE on CUDA graphs: replay after a hidden reload reads stale or freed alphas") {
    sites::check_child_shows_failure(gk::testing::run_child("scales_nvfp4_hidden_alphas"));
  }
  TEST_CASE("site 9 NVFP4 CUTLASS MoE: CPU twin and CUDA kernel agree bitwise") { cpu_equals_cuda<Nvfp4MoeModel>(1); }
}
