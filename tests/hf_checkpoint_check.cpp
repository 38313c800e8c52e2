// The C++ half of tests/hf_checkpoint_interop.py: reads a Hugging Face model
// directory with gk::HfCheckpointSource and prints what it found.
//
//   hf_checkpoint_check DIR
//
// Tab-separated lines:
//   file    NAME                                      files(), in order
//   info    NAME  FILE  DTYPE  [d0,d1,...]            tensors(), in order
//   tensor  NAME  DTYPE  [d0,...]  NBYTES  FNV1A64-HEX  zero-copy|copied
//                                                     next(), in order
// On a gk::Error, the message goes to stderr and the exit code is 2.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>

#include "tensor_digest.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

namespace {

using gk::testing::fnv1a64;

std::string dtype_name(at::ScalarType type) {
  const auto d = gk::to_safetensors_dtype(type);
  return d ? std::string(gk::safetensors_dtype_name(*d)) : "?";
}

std::string shape_of(at::IntArrayRef sizes) {
  std::string shape = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) shape += ',';
    shape += std::to_string(sizes[i]);
  }
  return shape + "]";
}

// True when `p` lies in a file mapping of this process under `dir`.
bool in_mapping_under(const void* p, const std::string& dir) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    if (line.find(dir) == std::string::npos) continue;
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi) == 2 && a >= lo && a < hi) return true;
  }
  return false;
}

int run(const std::string& dir) {
  gk::HfCheckpointSource src(dir);
  for (const auto& f : src.files()) std::cout << "file\t" << f << '\n';
  for (const auto& t : src.tensors())
    std::cout << "info\t" << t.name << '\t' << t.file << '\t' << dtype_name(t.dtype) << '\t'
              << shape_of(t.shape) << '\n';
  while (auto t = src.next()) {
    // The mapping names the file by its path, which lies under `dir` unless
    // the shards are links; then only "copied" vs "zero-copy" loses meaning.
    const bool mapped = t->value.nbytes() > 0 && in_mapping_under(t->value.const_data_ptr(), dir);
    std::cout << "tensor\t" << t->name << '\t' << dtype_name(t->value.scalar_type()) << '\t'
              << shape_of(t->value.sizes()) << '\t' << t->value.nbytes() << '\t' << fnv1a64(t->value)
              << '\t' << (mapped ? "zero-copy" : "copied") << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hf_checkpoint_check DIR\n";
    return 64;
  }
  try {
    return run(argv[1]);
  } catch (const gk::Error& e) {
    std::cerr << e.what() << '\n';
    return 2;
  }
}
