// tests/support/gk_test.h
//
// The one header every graphkeep test includes first (it is also the tests'
// precompiled header).
//
// Note [doctest vs glog CHECK]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch's c10/util/Logging.h defines glog-style CHECK, CHECK_EQ, ...
// macros. Included after doctest, they silently replace doctest's: a test
// then aborts the process on failure, or passes without counting an
// assertion. So this header includes the torch headers first, removes every
// macro name the two libraries share, and only then includes doctest. ctest
// additionally fails any test binary whose summary counts zero assertions
// (FAIL_REGULAR_EXPRESSION in tests/CMakeLists.txt).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <torch/nn/module.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT
#undef CHECK_NOTNULL
#undef CHECK_FALSE
#undef CHECK_MESSAGE
#undef CHECK_THROWS
#undef CHECK_THROWS_AS
#undef CHECK_NOTHROW
#undef REQUIRE
#undef WARN

#include <doctest/doctest.h>

#include <graphkeep/core/check.h>
#include <graphkeep/reload/testing.h>

#include <string>

namespace gk::testing {

// True when a CUDA device is usable in this process.
bool cuda_available();

// Child scenarios: code that must run in a separate process of the same test
// binary (an expected illegal memory access, a crash that must not take the
// test runner down). Define with GK_TEST_CHILD(name) { ...; return code; }.
struct ChildRegistrar {
  ChildRegistrar(const char* name, int (*fn)());
};
struct ChildResult {
  bool exited = false, signaled = false;
  int exit_code = -1;
  std::string output;
};
// Runs this binary with --gk-child=name and collects its output.
ChildResult run_child(const std::string& name);

// The message of the exception `f` throws, or "" if it throws none.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}

// A fault hook that throws std::runtime_error("injected <point> failure on
// <layer>") at one fault point of one layer.
inline EngineHooks fault_at(FaultPoint point, std::string layer) {
  EngineHooks h;
  h.fault = [point, layer = std::move(layer)](FaultPoint s, const std::string& l) {
    if (s == point && l == layer)
      throw std::runtime_error("injected " + std::string(to_string(s)) + " failure on " + l);
  };
  return h;
}

}  // namespace gk::testing

// Put once into a test binary whose tests need a CUDA device: without one the
// binary reports "skipped" to ctest instead of running.
#define GK_TEST_REQUIRES_GPU() \
  extern "C" int gk_test_requires_gpu() { return 1; }

#define GK_TEST_CHILD(name)                                                     \
  static int gk_child_##name();                                                 \
  static const ::gk::testing::ChildRegistrar gk_child_reg_##name(#name, &gk_child_##name); \
  static int gk_child_##name()

// Checks that `expr` throws `E` and that its message contains `needle`.
#define GK_CHECK_THROWS_WITH_SUBSTR(expr, E, needle)                                   \
  do {                                                                                 \
    const std::string gk_msg_ = ::gk::testing::message_of<E>([&] { (void)(expr); });   \
    INFO("message: " << gk_msg_);                                                      \
    CHECK_MESSAGE(gk_msg_.find(needle) != std::string::npos,                           \
                  "expected " #E " containing \"" << needle << "\"");                   \
  } while (0)
