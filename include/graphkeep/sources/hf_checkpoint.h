// graphkeep/sources/hf_checkpoint.h
//
// A weight source for a Hugging Face model directory: the safetensors weights
// that `save_pretrained` writes, either one file or shards with an index.
//
//   // Engine names are the Hugging Face names minus "model."; the rotary
//   // tables are recomputed by the engine, so they are skipped.
//   gk::HfCheckpointSource src("/models/llama-3-8b", [](std::string_view hf) -> std::string {
//     if (hf.ends_with(".rotary_emb.inv_freq")) return "";
//     if (hf.starts_with("model.")) hf.remove_prefix(6);
//     return std::string(hf);
//   });
//   src.check(model_expectations);   // every shape and dtype, before any data is read
//   engine.reload(src);              // or: while (auto t = src.next()) { ... t->name, t->value ... }
//
// The directory holds either
//   model.safetensors                      one file, or
//   model.safetensors.index.json           {"metadata": {...}, "weight_map": {tensor: file}}
//   model-00001-of-00003.safetensors ...   and the shards it names.
// A directory with both is refused as ambiguous (save_pretrained removes the
// other form when it writes one). Shard files may be symbolic links (the
// Hugging Face cache's snapshot folders link into its blobs); the names in
// the index may not leave the directory.
//
// Note [Validated at construction, streamed shard by shard]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The constructor reads the index and every shard's header (each shard is
// mapped in turn and released; no tensor data is read) and fails closed with a
// gk::WeightError naming the directory, the file and the tensor when: the
// directory has neither file above (or both); the index is not JSON, has no
// "weight_map" object of strings, or lists a tensor twice; a file name in the
// index contains '/' or ".."; a shard the index names is missing or is not a
// valid safetensors file; a tensor the index lists is not in its shard; a
// shard holds a tensor the index does not list, or lists under another file;
// `rename` maps two tensors to one engine name. So a bad directory is refused
// before the first weight is yielded, and check() can compare the whole
// checkpoint with the model before any data is read.
//
// next() then streams the files in files() order: it maps one shard through a
// SafetensorsSource, yields its tensors (zero copy: see Note [Zero-copy
// tensors from a mapping] in safetensors_source.h), and drops the shard's
// source before mapping the next one, so the source itself holds at most one
// shard mapped; a yielded tensor keeps its shard's mapping alive for as long
// as the tensor lives. A shard whose header changed since construction (the
// directory was rewritten underneath) raises gk::WeightError.
#pragma once

#include <graphkeep/sources/safetensors_format.h>
#include <graphkeep/sources/weight_source.h>

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

class SafetensorsSource;

// One tensor of a checkpoint: its engine name (after rename), the file that
// holds it (a name in the checkpoint directory, as the index writes it), its
// shape and dtype as the file's header gives them.
struct HfTensorInfo {
  std::string name;
  std::string file;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
};

// A tensor the model expects: engine name, shape, dtype.
struct ExpectedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
};

class HfCheckpointSource final : public WeightSource {
 public:
  // `dir` holds model.safetensors, or model.safetensors.index.json and the
  // shards it names. `rename` maps a Hugging Face tensor name to the name the
  // engine expects (identity when empty); returning "" skips the tensor (e.g.
  // a rotary inv_freq). It is called once per tensor, at construction.
  // gk::WeightError for a directory that is not a valid checkpoint (see Note
  // [Validated at construction, streamed shard by shard]).
  explicit HfCheckpointSource(std::string dir,
                              std::function<std::string(std::string_view)> rename = {});
  ~HfCheckpointSource() override;
  HfCheckpointSource(const HfCheckpointSource&) = delete;
  HfCheckpointSource& operator=(const HfCheckpointSource&) = delete;

  // The next tensor, named after rename, shard by shard in files() order and
  // in file order within a shard (the order of tensors()); skipped tensors are
  // not yielded.
  std::optional<NamedTensor> next() override;
  // "Hugging Face checkpoint '<dir>'"
  std::string describe() const override;

  // Every tensor next() yields, in that order, named after rename, with its file.
  const std::vector<HfTensorInfo>& tensors() const { return tensors_; }
  // The safetensors files (names in the directory), in streaming order:
  // "model.safetensors", or the index's shards sorted by name.
  const std::vector<std::string>& files() const { return files_; }
  const std::string& dir() const { return dir_; }

  // Compares the headers with what the model expects, before any data is
  // read. Raises gk::WeightError listing the problems (up to 10, then "and N
  // more"): a tensor whose shape or dtype differs (naming the tensor, its file,
  // expected and actual), a tensor the model expects that the checkpoint
  // lacks, one the checkpoint has that the model does not expect, and a name
  // `expected` holds twice. Skipped tensors (renamed to "") are not compared.
  void check(const std::vector<ExpectedTensor>& expected) const;

 private:
  struct Shard {
    std::string file;
    std::size_t first = 0;  // its tensors in tensors_: [first, first + count)
    std::size_t count = 0;
    // The header as read at construction, in file order, and for each entry
    // its index in tensors_ (or max() when rename skips it).
    std::vector<SafetensorsEntry> header;
    std::vector<std::size_t> index;
  };

  std::string path_of(const std::string& file) const;
  void open_shard();

  std::string dir_;
  std::vector<std::string> files_;
  std::vector<HfTensorInfo> tensors_;
  std::vector<std::string> hf_names_;  // parallel to tensors_
  std::vector<Shard> shards_;          // parallel to files_

  // Streaming state: the shard being read and its position.
  std::size_t shard_ = 0;
  std::size_t entry_ = 0;
  std::unique_ptr<SafetensorsSource> open_;
};

}  // namespace gk
