// graphkeep/sources/safetensors_format.h
//
// Parses and validates the header of a .safetensors file held in memory. No
// Torch dependency (the fuzz target builds it alone); SafetensorsSource in
// safetensors_source.h maps a file and turns the entries into tensors.
//
//   std::span<const std::byte> bytes = ...;  // the whole file
//   gk::SafetensorsHeader h = gk::parse_safetensors_header(bytes, "safetensors file 'a.st'");
//   for (const gk::SafetensorsEntry& e : h.tensors)
//     use(e.name, e.dtype, e.shape, bytes.subspan(h.data_offset + e.begin, e.byte_size()));
//
// The format: an 8-byte little-endian unsigned length N, N bytes of JSON (an
// object; trailing spaces allowed), then the data section. Each JSON member
// other than "__metadata__" is a tensor
//   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with [begin, end) relative to the start of the data section.
//
// Note [What the parser accepts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// It follows the reference implementation (the `safetensors` Rust crate):
// sorted by offset, the tensors' byte ranges must tile the data section
// exactly, from 0 to its end: no overlap, no gap between tensors, no unused
// bytes after the last one (the reference reports these as InvalidOffset and
// MetadataIncompleteBuffer). A tensor entry's unknown members are ignored, as
// the reference does. "__metadata__" is an object of strings, or null.
// Stricter than the reference in three points: a duplicate key in any JSON
// object is an error (the reference keeps one of two same-named tensors
// silently); dimensions must fit int64 (torch's limit; the reference allows
// up to 2^64-1 when the element count is 0); and dtypes graphkeep does not
// map to torch (U16, U32, U64, C64, F8_E8M0, F4, ...) are "unknown dtype".
// Bounded as the reference is: a header over 100,000,000 bytes, or JSON
// nested deeper than 127 levels anywhere (ignored members too), is rejected
// before any JSON is parsed (tests/safetensors_interop.py checks both
// against the reference).
// Every failure raises gk::WeightError whose message starts with the file's
// label and names the tensor; the parser never reads outside the span it is
// given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

// The element types graphkeep reads and writes, named as in the file.
enum class SafetensorsDtype : std::uint8_t {
  boolean,   // BOOL (one byte, 0 or 1)
  u8,        // U8
  i8,        // I8
  i16,       // I16
  i32,       // I32
  i64,       // I64
  f16,       // F16
  bf16,      // BF16
  f32,       // F32
  f64,       // F64
  f8_e4m3,   // F8_E4M3 (torch.float8_e4m3fn)
  f8_e5m2,   // F8_E5M2
};

// "BOOL", "U8", ... as written in a file.
std::string_view safetensors_dtype_name(SafetensorsDtype dtype);
// The dtype named `name` in a file, or std::nullopt for one graphkeep does not support.
std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name);
// Bytes per element.
std::size_t safetensors_itemsize(SafetensorsDtype dtype);
// Every supported dtype, in enum order.
std::span<const SafetensorsDtype> safetensors_dtypes();

struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::f32;
  std::vector<std::int64_t> shape;
  // The tensor's bytes are [begin, end) of the data section.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t byte_size() const { return end - begin; }
  std::int64_t numel() const;
};

struct SafetensorsHeader {
  std::uint64_t header_size = 0;  // N, the JSON's length in bytes
  std::uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  std::uint64_t data_size = 0;    // bytes from data_offset to the end of the file
  // Ordered by position in the data section (by begin, then end, then name).
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"

  // The entry named `name`, or nullptr.
  const SafetensorsEntry* find(std::string_view name) const;
};

// The reference implementation's bounds (huggingface/safetensors): a header
// of at most 100,000,000 bytes, and JSON nested at most 127 levels deep
// (serde_json's recursion limit of 128). Larger or deeper is rejected before
// the JSON is parsed.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr std::size_t kMaxSafetensorsNesting = 127;

// Parses and validates `file`, the whole file's bytes. `label` starts every
// error message (e.g. "safetensors file 'model.safetensors'"). Raises
// gk::WeightError for any malformed input; see Note [What the parser accepts].
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view label);

}  // namespace gk
