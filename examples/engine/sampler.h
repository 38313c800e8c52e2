// examples/engine/sampler.h
//
// Choosing the next tokens on the device: greedy, or seeded sampling with
// temperature, top-k and top-p, as ops over the logits that a graph (CUDA
// or the CPU replay backend) captures like the decoder's; only the token
// ids leave the device. LlmEngine::decode() serves it
// (Note [Sampling on the device] in sampler.cpp).
//
//   demo::SamplingRows rows = demo::SamplingRows::make(64, device);   // static I/O of the graphs
//   rows.set({.temperature = 0.8, .top_k = 50, .top_p = 0.95, .seed = 7}, 64);
//   at::Tensor ids = demo::sample_tokens(logits, positions, rows);    // [64] int32, on the device
//   at::Tensor greedy = demo::greedy_tokens(logits);                  // argmax, [64] int32
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace demo {

struct SamplingParams {
  double temperature = 0;  // 0: greedy (argmax of the logits); else the logits are divided by it
  std::int64_t top_k = 0;  // keep the k most likely tokens; 0: every token
  double top_p = 1;        // then the fewest most likely tokens whose probability reaches top_p, in (0, 1]
  std::uint64_t seed = 0;  // row b of a batch draws from the stream of seed + b (and its position)

  bool greedy() const { return temperature <= 0; }
  bool operator==(const SamplingParams&) const = default;
  // Refuses values outside the ranges above (gk::StateError naming the field).
  void check() const;
};

// The per-row sampling parameters as device tensors [rows]: static inputs of
// the sampling graphs, written by set() before a replay.
struct SamplingRows {
  at::Tensor temperature;  // float32; 0: greedy
  at::Tensor top_k;        // int64; 0: every token
  at::Tensor top_p;        // float32
  at::Tensor seed;         // int64 (the seed's bits)

  static SamplingRows make(std::int64_t rows, c10::Device device);
  // Rows 0..n-1 take `p` (row b the seed p.seed + b); the rest are greedy.
  void set(const SamplingParams& p, std::int64_t n);
  SamplingRows narrow(std::int64_t n) const;  // rows 0..n-1 (views)
};

// logits [B, V] float32 -> the argmax of each row [B] int32 (the first
// maximum on ties), as one op.
at::Tensor greedy_tokens(const at::Tensor& logits);

// logits [B, V] float32, positions [B] int64 (each row's position: the
// stream's counter) -> [B] int32: a greedy row's argmax, else a draw from
// softmax(logits / temperature) restricted by top-k, then top-p; as one op.
at::Tensor sample_tokens(const at::Tensor& logits, const at::Tensor& positions, const SamplingRows& rows);

namespace detail {
// The hash behind the draws (for the tests): mix32 of each element of x
// (int64 holding values in [0, 2^32)), as int64 ATen ops on any device.
at::Tensor mix32(const at::Tensor& x);
// One key per row from its seed and position [B] int64 -> [B] int64 in [0, 2^32).
at::Tensor row_keys(const at::Tensor& seed, const at::Tensor& positions);
// -log(-log(u)) of each token id's uniform u in (0, 1): ids [B, V] int64,
// keys [B] -> [B, V] float32. ATen ops; the CUDA path's kernel computes the
// same hash (fused::gumbel_noise).
at::Tensor gumbel_noise_reference(const at::Tensor& ids, const at::Tensor& keys);
}  // namespace detail

}  // namespace demo
