// libFuzzer target for the .safetensors header parser
// (sources/safetensors_format.cpp). Built with clang++ and
// -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt and run by
// the ctest fuzz.safetensors_header over tests/fuzz/corpus/safetensors.
//
// A gk::WeightError is the parser's answer to bad input; anything else (a
// crash, a sanitizer report, another exception, an accepted header that
// breaks the parser's own guarantees) is a bug.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/safetensors_format.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <span>

namespace {

// What a successful parse promises: every tensor lies inside the file, the
// ranges tile the data section in order, byte counts match shapes, names are
// unique.
void check_guarantees(const gk::SafetensorsHeader& h, std::size_t file_size) {
  if (h.data_offset != 8 + h.header_size || h.data_offset + h.data_size != file_size) std::abort();
  std::uint64_t covered = 0;
  std::set<std::string> names;
  for (const auto& e : h.tensors) {
    if (e.begin != covered || e.end < e.begin || e.end > h.data_size) std::abort();
    covered = e.end;
    if (!names.insert(e.name).second) std::abort();
    std::uint64_t n = 1;
    for (const std::int64_t d : e.shape) {
      if (d < 0) std::abort();
      n *= static_cast<std::uint64_t>(d);
    }
    if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        static_cast<std::uint64_t>(e.numel()) != n ||
        n * gk::safetensors_itemsize(e.dtype) != e.byte_size())
      std::abort();
  }
  if (covered != h.data_size) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const gk::SafetensorsHeader h = gk::parse_safetensors_header(file, "fuzz input");
    check_guarantees(h, size);
  } catch (const gk::WeightError&) {
    // rejected: fine
  }
  return 0;
}
