// The C++ half of tests/content_hash_interop.py, which checks graphkeep's
// content hash against one computed in Python from its definition.
//
//   content_hash_check FILE.safetensors
//
// prints one line per tensor of FILE (read with gk::SafetensorsSource):
//   NAME<TAB>HASH (16 hex digits, gk::format_content_hash)
// On a gk::Error, the message goes to stderr and the exit code is 2.
#include <graphkeep/core/check.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/sources/safetensors_source.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: content_hash_check FILE.safetensors\n";
    return 1;
  }
  try {
    gk::SafetensorsSource src(argv[1]);
    while (auto t = src.next())
      std::cout << t->name << '\t' << gk::format_content_hash(gk::content_hash(t->value)) << '\n';
  } catch (const gk::Error& e) {
    std::cerr << e.what() << '\n';
    return 2;
  }
  return 0;
}
