// The C++ half of tests/safetensors_interop.py, which compares graphkeep's
// safetensors reader and writer with the reference implementation.
//
//   safetensors_check read FILE    reads FILE with gk::SafetensorsSource
//   safetensors_check write FILE   writes the recipe tensors with gk::write_safetensors
//
// Both print one line per tensor, tab-separated:
//   tensor  NAME  DTYPE  [d0,d1,...]  NBYTES  FNV1A64-HEX  zero-copy|copied|written
// and one line per metadata entry: meta  KEY  VALUE.
// On a gk::Error, the message goes to stderr and the exit code is 2.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>

#include "tensor_digest.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

using gk::testing::fnv1a64;

void print(const std::string& name, const at::Tensor& t, const char* how) {
  const auto dtype = gk::to_safetensors_dtype(t.scalar_type());
  std::string shape = "[";
  for (std::size_t i = 0; i < t.sizes().size(); ++i)
    shape += (i ? "," : "") + std::to_string(t.sizes()[i]);
  shape += "]";
  std::cout << "tensor\t" << name << '\t' << (dtype ? gk::safetensors_dtype_name(*dtype) : "?")
            << '\t' << shape << '\t' << t.nbytes() << '\t' << fnv1a64(t) << '\t' << how << '\n';
}

// Must match recipe() in safetensors_interop.py.
std::vector<gk::NamedTensor> recipe() {
  const at::Tensor base = at::arange(24, at::kLong).reshape({2, 3, 4});
  const at::Tensor real = (base - 12).to(at::kDouble) * 0.375;
  std::vector<gk::NamedTensor> out = {
      {"bool", base.remainder(3) == 0},
      {"u8", (base * 10 + 5).to(at::kByte)},
      {"i8", (base - 12).to(at::kChar)},
      {"i16", (base * 1000 - 12000).to(at::kShort)},
      {"i32", (base * 100000 - 1200000).to(at::kInt)},
      {"i64", base * 1000000000000LL - 5},
      {"f16", real.to(at::kHalf)},
      {"bf16", real.to(at::kBFloat16)},
      {"f32", real.to(at::kFloat)},
      {"f64", real},
      {"f8_e4m3", real.to(at::kFloat8_e4m3fn)},
      {"f8_e5m2", real.to(at::kFloat8_e5m2)},
      {"f32.transposed", (base.to(at::kFloat) / 7).reshape({6, 4}).t()},
      {"i64.scalar", at::scalar_tensor(-42, at::kLong)},
      {"f16.empty", at::zeros({0, 3}, at::kHalf)},
  };
  return out;
}

int run(const std::string& mode, const std::string& path) {
  if (mode == "read") {
    gk::SafetensorsSource src(path);
    const auto bytes = src.mapped_bytes();
    while (auto t = src.next()) {
      const auto* p = static_cast<const std::byte*>(t->value.const_data_ptr());
      const bool inside = p != nullptr && p >= bytes.data() && p < bytes.data() + bytes.size();
      print(t->name, t->value, inside ? "zero-copy" : "copied");
    }
    for (const auto& [k, v] : src.metadata()) std::cout << "meta\t" << k << '\t' << v << '\n';
    return 0;
  }
  if (mode == "write") {
    const auto tensors = recipe();
    const std::map<std::string, std::string> meta = {{"writer", "graphkeep"}, {"format", "pt"}};
    gk::write_safetensors(path, tensors, meta);
    for (const auto& t : tensors) print(t.name, t.value, "written");
    for (const auto& [k, v] : meta) std::cout << "meta\t" << k << '\t' << v << '\n';
    return 0;
  }
  std::cerr << "usage: safetensors_check read|write FILE\n";
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_check read|write FILE\n";
    return 64;
  }
  try {
    return run(argv[1], argv[2]);
  } catch (const gk::Error& e) {
    std::cerr << e.what() << '\n';
    return 2;
  }
}
