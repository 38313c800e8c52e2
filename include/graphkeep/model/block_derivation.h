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
//   - the source is a 2-D checkpoint parameter of the layer, [N, K], or a
//     contiguous 2-D view of all of one (a stack of experts [E, R, C] seen
//     as [E * R, C]), that PWAL leaves as loaded, and block_rows divides
//     N, block_cols K;
//   - `fn` takes B blocks of the source, [B, block_rows, block_cols], in any
//     order and any number, and returns one tensor per output, in order:
//       same_as_source             B blocks of the output's elements (any
//                                  shape of B * block_rows * block_cols
//                                  elements, in the blocks' row-major order);
//                                  the output is [N, K] like the source;
//       one_per_block              B x per_block values (per_block is the
//                                  BlockOutput's, 1 unless said); the
//                                  output is [N / block_rows, K / block_cols,
//                                  per_block] in any shape of that many
//                                  elements, row-major over the blocks, each
//                                  block's values together;
//       one_per_block_transposed   B x per_block values; the output is
//                                  [K / block_cols, per_block, N / block_rows]
//                                  (per-group scales stored group-major with
//                                  per_block 1; int4 packed eight to an int32
//                                  along K, GPTQ's [K / 8, N], with blocks of
//                                  1 x g and per_block g / 8);
//   - PWAL builds each output exactly as `fn` does over all blocks, and
//     each block's values depend on that block of the source alone;
//   - PWAL refuses no values of the source: a patch lands through `fn`
//     without PWAL, so a check PWAL makes of the values (a scale that must
//     be positive) would not run. Declare such a member only if `fn` gives
//     a usable output for every input, or leave it undeclared.
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

// A derived tensor of the layer (the field's current value) and its layout:
// for the one_per_block layouts, `per_block` values per block (packed words,
// a scale and a zero point); same_as_source ignores it.
struct BlockOutput {
  at::Tensor tensor;
  BlockLayout layout = BlockLayout::same_as_source;
  std::int64_t per_block = 1;
};

// blocks [B, block_rows, block_cols] of the source -> one tensor per output.
using BlockFn = std::function<std::vector<at::Tensor>(const at::Tensor& blocks)>;

// A tensor shaped as the source, of any dtype -> the output's elements, of
// that dtype (Note [Layout derivations]).
using LayoutFn = std::function<at::Tensor(const at::Tensor& source)>;

struct BlockDerivation {
  std::string name;  // what it computes, for messages ("fp8 per row")
  at::Tensor source;
  std::int64_t block_rows = 1, block_cols = 1;
  std::vector<BlockOutput> outputs;
  BlockFn fn;
};

struct LayoutDerivation {
  std::string name;  // what it does, for messages ("shuffle into tiles")
  at::Tensor source, output;
  LayoutFn fn;
};

// Note [Layout derivations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A member declared by_layout() holds elements of one checkpoint parameter
// of the layer, moved: AITER's shuffle of expert weights into tiles, a
// transpose of group scales, a pad, a permutation by fixed indices, one
// value broadcast over channels. The layer binds it in
// declare_derivations() with the function that does the moving:
//
//   d.layout("shuffle into 16x16 tiles", w13_weight_, w13_shuffled_, [=](const at::Tensor& w) {
//     return w.view({E, 2, N / R, R, K / C, C}).permute({0, 2, 4, 1, 3, 5}).contiguous();
//   });
//
// The contract: `fn` only moves elements (views, permute, narrow, cat or
// stack of its input's pieces, index_select with fixed indices, expand) and
// may fill constants (a pad); it works for a source of any dtype, and
// PWAL builds the output exactly as fn(parameter) and refuses no values
// (a patch moves them without PWAL). prepare() runs fn on
// three tensors of element indices to learn which source element each
// output element holds, and refuses a function whose outputs are not
// moved elements or constants (a DeclarationError naming the member); it
// keeps, per output element, its source index, sorted (8 bytes per output
// element: Note [Patches through layout derivations]). Every full reload
// compares fn(parameter) with what PWAL built, bit for bit.
//
// What ReloadableLayer::declare_derivations() fills.
class Derivations {
 public:
  struct Shape {
    std::int64_t rows, cols;
  };
  void blocks(std::string name, const at::Tensor& source, Shape block, std::vector<BlockOutput> outputs, BlockFn fn) {
    list_.push_back({std::move(name), source, block.rows, block.cols, std::move(outputs), std::move(fn)});
  }
  // `output` (a member declared by_layout()) is fn(source) (Note [Layout
  // derivations]).
  void layout(std::string name, const at::Tensor& source, const at::Tensor& output, LayoutFn fn) {
    layouts_.push_back({std::move(name), source, output, std::move(fn)});
  }
  const std::vector<BlockDerivation>& list() const { return list_; }
  const std::vector<LayoutDerivation>& layouts() const { return layouts_; }

 private:
  std::vector<BlockDerivation> list_;
  std::vector<LayoutDerivation> layouts_;
};

}  // namespace gk
