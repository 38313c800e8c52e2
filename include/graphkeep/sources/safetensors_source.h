// graphkeep/sources/safetensors_source.h
//
// Reads and writes .safetensors checkpoints. SafetensorsSource memory-maps a
// file and yields its tensors without copying them; write_safetensors writes
// a file that the reference implementation (and SafetensorsSource) reads.
//
//   gk::write_safetensors("w.safetensors", {{"layers.0.qkv.weight", w}}, {{"format", "pt"}});
//
//   gk::SafetensorsSource src("w.safetensors");
//   for (const gk::SafetensorsEntry& e : src.entries()) plan(e.name, e.shape, e.dtype);
//   while (auto t = src.next()) { ... t->name, t->value ... }
//
// Note [Zero-copy tensors from a mapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The file is opened read-only and mapped with mmap(PROT_READ, MAP_PRIVATE).
// A yielded tensor is at::from_blob over the mapping, with a deleter that
// holds a shared_ptr to it: the mapping lives until the source and every
// tensor it yielded are gone, so tensors may outlive the source. The tensors
// are CPU tensors over read-only memory: read them (copy them into a slot,
// .to(device), .clone()), but never write to them in place, which faults.
// Truncating or rewriting the file while it is mapped is undefined (SIGBUS);
// replace checkpoints by writing a new file and renaming it, as
// write_safetensors does.
//
// Two kinds of tensor are copied instead: one whose data is not aligned to
// its element size (the format does not require alignment, and a writer that
// keeps insertion order, like write_safetensors, can produce it after an odd
// number of one-byte elements), and one with no elements. Both are fresh CPU
// tensors that own their memory.
#pragma once

#include <graphkeep/sources/safetensors_format.h>
#include <graphkeep/sources/weight_source.h>

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gk {

// The at::ScalarType of a safetensors dtype (F8_E4M3 is at::kFloat8_e4m3fn).
at::ScalarType to_scalar_type(SafetensorsDtype dtype);
// The safetensors dtype of `type`, or std::nullopt when the format has none
// that graphkeep supports (complex, unsigned 16/32/64-bit, ...).
std::optional<SafetensorsDtype> to_safetensors_dtype(at::ScalarType type);

namespace detail {
class MappedFile;
}  // namespace detail

// Yields the tensors of a .safetensors file in file order, without copying
// (see Note [Zero-copy tensors from a mapping]). The constructor maps the
// file and validates the whole header (gk::WeightError if it is malformed).
class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(std::string path);
  ~SafetensorsSource() override;
  SafetensorsSource(const SafetensorsSource&) = delete;
  SafetensorsSource& operator=(const SafetensorsSource&) = delete;

  std::optional<NamedTensor> next() override;
  // "safetensors file '<path>'"
  std::string describe() const override;

  // Every tensor of the file, in the order next() yields them.
  const std::vector<SafetensorsEntry>& entries() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsHeader& header() const { return header_; }
  // The mapped bytes of the whole file.
  std::span<const std::byte> mapped_bytes() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<const detail::MappedFile> file_;
  SafetensorsHeader header_;
  std::size_t pos_ = 0;
};

// Writes `tensors` to `path` as a .safetensors file: the header lists them in
// order, the data section holds them contiguously in the same order, and
// `metadata` becomes "__metadata__" (omitted when empty). Tensors on another
// device are copied to the CPU and non-contiguous ones made contiguous. The
// file is written next to `path` and renamed over it, so a reader never sees
// a partial file. gk::WeightError for a duplicate name, a shard other than 0
// (the format stores whole tensors), a dtype the format lacks, a non-strided
// tensor, or an I/O failure.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace gk
