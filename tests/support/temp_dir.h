// tests/support/temp_dir.h
//
// A fresh directory for one test, removed with everything in it when the
// TempDir goes out of scope.
//
//   gk::testing::TempDir dir("gk_hf_");
//   gk::write_safetensors(dir.file("model.safetensors"), tensors);
//   dir.write("config.json", "{}");
//   gk::HfCheckpointSource src(dir.path);
//
// POSIX calls only: libtorch.so exports its own copy of std::filesystem's
// functions, which interpose on libstdc++'s and crash (remove_all did, in
// the safetensors tests).
#pragma once

#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gk::testing {

class TempDir {
 public:
  // Under $TMPDIR (or /tmp), named `prefix` and six random characters. The
  // path is resolved (no symbolic link in it), as /proc/self/maps names the
  // files mapped from it.
  explicit TempDir(const std::string& prefix = "gk_test_") {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("TempDir: mkdtemp(" + tmpl + ") failed: " + std::strerror(errno));
    char real[PATH_MAX];
    if (::realpath(tmpl.c_str(), real) == nullptr)
      throw std::runtime_error("TempDir: realpath(" + tmpl + ") failed: " + std::strerror(errno));
    path = real;
  }
  ~TempDir() {
    // Depth first, links not followed: files, links and folders alike.
    ::nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` in the directory.
  std::string file(const std::string& name) const { return path + "/" + name; }

  // Writes `text` to the file `name` (replacing it).
  void write(const std::string& name, const std::string& text) const {
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.good()) throw std::runtime_error("TempDir: cannot write " + file(name));
  }

  std::string path;
};

}  // namespace gk::testing
