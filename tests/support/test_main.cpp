// The doctest main shared by every test binary.
//
//   --gk-gpu          the binary runs its gpu test suites: without a CUDA
//                     device it exits with 77 (ctest: skipped)
//   --gk-child=NAME   runs the child scenario NAME (GK_TEST_CHILD) instead of
//                     the tests: for checks that must run in a separate
//                     process (an illegal memory access, a hang guard)
// A binary containing GK_TEST_REQUIRES_GPU() behaves as if --gk-gpu were given.
#include "gk_test.h"

#include <graphkeep/runtime/device.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <sys/wait.h>

namespace gk::testing {

bool cuda_available() { return gk::runtime::cuda_device_available(); }

namespace {
std::map<std::string, int (*)()>& children() {
  static std::map<std::string, int (*)()> m;
  return m;
}
}  // namespace

ChildRegistrar::ChildRegistrar(const char* name, int (*fn)()) { children()[name] = fn; }

ChildResult run_child(const std::string& name) {
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  ChildResult r;
  if (n <= 0) return r;
  const std::string cmd = std::string(exe.data(), static_cast<std::size_t>(n)) + " --gk-child=" + name + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) r.output += buf.data();
  const int status = pclose(p);
  r.exited = WIFEXITED(status);
  r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
  r.signaled = WIFSIGNALED(status);
  return r;
}

}  // namespace gk::testing

extern "C" __attribute__((weak)) int gk_test_requires_gpu();

int main(int argc, char** argv) {
  bool gpu = gk_test_requires_gpu != nullptr && gk_test_requires_gpu() != 0;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gk-gpu") == 0) {
      gpu = true;
      continue;
    }
    if (std::strncmp(argv[i], "--gk-child=", 11) == 0) {
      const std::string name = argv[i] + 11;
      auto it = gk::testing::children().find(name);
      if (it == gk::testing::children().end()) {
        std::fprintf(stderr, "no child scenario '%s'\n", name.c_str());
        return 2;
      }
      return it->second();
    }
    args.push_back(argv[i]);
  }
  if (gpu && !gk::testing::cuda_available()) {
    std::printf("no CUDA device: skipping the gpu tests of this binary\n");
    return 77;
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  return context.run();
}
