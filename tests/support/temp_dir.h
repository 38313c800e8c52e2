// tests/support/temp_dir.h: a fresh directory for a test, removed with what
// is in it (files, and the files of its subdirectories one level down).
// POSIX only: libtorch.so's copy of std::filesystem interposes on
// libstdc++'s and crashes (tests/safetensors_test.cpp).
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace gk::testing {

class TempDir {
 public:
  explicit TempDir(const char* prefix = "gk_test") {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() { remove(path_, 1); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Empty when the directory could not be created.
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  static void remove(const std::string& dir, int depth) {
    if (dir.empty()) return;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        const std::string p = dir + "/" + e->d_name;
        struct stat st {};
        if (depth > 0 && ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove(p, depth - 1);
        else ::unlink(p.c_str());
      }
      ::closedir(d);
    }
    ::rmdir(dir.c_str());
  }
  std::string path_;
};

}  // namespace gk::testing
