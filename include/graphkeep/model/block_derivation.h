// graphkeep/model/block_derivation.h
//
// Block derivations: how a layer's derived tensors follow, block by block,
// from one of its checkpoint parameters, so that a weight patch recomputes
// only the blocks it touches instead of re-running the layer's PWAL (Note
// [Declared derivations] in graphkeep/registry/role.h).
//
// A derived member says in its descriptor that it is derived by blocks; the
// layer binds it, in ReloadableLayer::declare_derivations(), to the source
// parameter, the block shape and the function that computes a batch of
// blocks. FP8 with a scale per output row:
//
//   class Fp8Linear : public torch::nn::Module, public gk::DescribedLayer<Fp8Linear> {
//     ...
//     void process_weights_after_loading() override {
//       auto [q, s] = quantize_rows(weight_);   // [N, K] -> e4m3 [N, K], float32 [N]
//       qweight_ = q, scale_ = s;
//     }
//     void declare_derivations(gk::Derivations& d) const override {
//       d.blocks("fp8 per row", weight_, {1, weight_.size(1)},
//                {{qweight_, gk::BlockLayout::same_as_source}, {scale_, gk::BlockLayout::one_per_block}},
//                [](const at::Tensor& blocks) {            // [B, 1, K]
//                  auto [q, s] = quantize_rows(blocks.flatten(0, 1));
//                  return std::vector<at::Tensor>{q, s};   // [B, 1, K] elements, [B]
//                });
//     }
//     at::Tensor weight_, qweight_, scale_;
//     GRAPHKEEP_DESCRIBE_DERIVED(Fp8Linear, (torch::nn::Module, gk::DescribedLayer<Fp8Linear>),
//                                (weight_, gk::parameter), (qweight_, gk::derived_weight.by_blocks()),
//                                (scale_, gk::scale.by_blocks()))
//   };
//
// The contract, which the engine checks bit for bit at prepare() and after
// every full reload's PWAL (a gk::DeclarationError naming the class, the
// member and the first differing element):
//   - the source is a 2-D checkpoint parameter of the layer, [N, K], that
//     PWAL leaves as loaded, and block_rows divides N, block_cols K;
//   - `fn` takes B blocks of the source, [B, block_rows, block_cols], in any
//     order and any number, and returns one tensor per output, in order:
//       same_as_source             B blocks of the output's elements (any
//                                  shape of B * block_rows * block_cols
//                                  elements, in the blocks' row-major order);
//                                  the output is [N, K] like the source;
//       one_per_block              B values; the output is [N / block_rows,
//                                  K / block_cols] in any shape of that many
//                                  elements, row-major over the blocks;
//       one_per_block_transposed   B values; the output is [K / block_cols,
//                                  N / block_rows] (per-group scales stored
//                                  group-major);
//   - PWAL builds each output exactly as `fn` does over all blocks, and
//     each block's values depend on that block of the source alone.
// At prepare(), a member declared by_blocks() that no derivation binds, a
// derivation output that is not declared by_blocks(), and a source that is
// not a checkpoint parameter are refused, naming the member. The function
// runs on the source's device; it must not synchronize with it per block.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gk {

// Where a derivation output's elements sit relative to the source's blocks.
enum class BlockLayout : std::uint8_t { same_as_source, one_per_block, one_per_block_transposed };

// A derived tensor of the layer (the field's current value) and its layout.
struct BlockOutput {
  at::Tensor tensor;
  BlockLayout layout = BlockLayout::same_as_source;
};

// blocks [B, block_rows, block_cols] of the source -> one tensor per output.
using BlockFn = std::function<std::vector<at::Tensor>(const at::Tensor& blocks)>;

struct BlockDerivation {
  std::string name;  // what it computes, for messages ("fp8 per row")
  at::Tensor source;
  std::int64_t block_rows = 1, block_cols = 1;
  std::vector<BlockOutput> outputs;
  BlockFn fn;
};

// What ReloadableLayer::declare_derivations() fills.
class Derivations {
 public:
  struct Shape {
    std::int64_t rows, cols;
  };
  void blocks(std::string name, const at::Tensor& source, Shape block, std::vector<BlockOutput> outputs, BlockFn fn) {
    list_.push_back({std::move(name), source, block.rows, block.cols, std::move(outputs), std::move(fn)});
  }
  const std::vector<BlockDerivation>& list() const { return list_; }

 private:
  std::vector<BlockDerivation> list_;
};

}  // namespace gk
