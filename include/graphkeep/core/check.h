// graphkeep/core/check.h
//
// The error family of graphkeep and the one check macro that raises it.
//
// Every error names the thing that is wrong (a slot path, a weight name, a
// shape, a kernel name) and says what to do. The kind of error tells the
// caller who must act:
//
//   gk::DeclarationError  a class is annotated wrongly; fix the class
//   gk::WeightError       the weight set is incomplete or bad; fix the source
//   gk::MismatchError     PWAL changed a slot's layout; recapture the graphs
//                         (graphkeep/reload/errors.h: the reload layer's own)
//   gk::DriftError        a captured address is no longer covered; a bug,
//                         the engine refuses to replay
//   gk::StateError        the call is not allowed in the current state
//   gk::InternalError     an invariant of graphkeep itself broke (a bug)
//
// Usage:
//
//   GK_CHECK(gk::WeightError, value.sizes() == expected,
//            "weight '", name, "' has shape ", value.sizes(),
//            " but the model expects ", expected);
//   GK_THROW(gk::StateError, "replay refused: ", reason);
//
// Messages start with what is wrong, without a prefix: Error adds
// "graphkeep: " and the source location (function, file, line) itself.
//   GK_INTERNAL_ASSERT(plan.size() == n, "plan has ", plan.size(), " slots");
//
// The message arguments are streamed into the message only when the check
// fails, so a check on a hot path costs one branch (see Note [Lazy messages]).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gk {

enum class ErrorKind { declaration, weights, mismatch, drift, state, internal };

// Where an error was raised (GK_CHECK and GK_THROW fill it in).
struct SourceLocation {
  const char* function = nullptr;
  const char* file = nullptr;
  int line = 0;
};

// The base of every graphkeep error. what() reads
//   graphkeep: <message>
//     (raised in <function> at <folder>/<file>:<line>)
// the prefix written here once, for every error; message() and where() give
// the parts.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, SourceLocation where = {})
      : std::runtime_error(compose(message, where)), kind_(kind), message_(std::move(message)), where_(where) {}
  ErrorKind kind() const noexcept { return kind_; }
  // The message alone: no prefix, no location.
  const std::string& message() const noexcept { return message_; }
  const SourceLocation& where() const noexcept { return where_; }

 private:
  static std::string compose(const std::string& message, const SourceLocation& where);
  ErrorKind kind_;
  std::string message_;
  SourceLocation where_;
};

class DeclarationError : public Error {
 public:
  explicit DeclarationError(std::string m, SourceLocation w = {}) : Error(ErrorKind::declaration, std::move(m), w) {}
};
class WeightError : public Error {
 public:
  explicit WeightError(std::string m, SourceLocation w = {}) : Error(ErrorKind::weights, std::move(m), w) {}
};
class StateError : public Error {
 public:
  explicit StateError(std::string m, SourceLocation w = {}) : Error(ErrorKind::state, std::move(m), w) {}
};
class InternalError : public Error {
 public:
  explicit InternalError(std::string m, SourceLocation w = {}) : Error(ErrorKind::internal, std::move(m), w) {}
};

namespace detail {

// Note [Lazy messages]
// ~~~~~~~~~~~~~~~~~~~~
// GK_CHECK expands to `if (cond) {} else fail(...)`: the arguments are only
// evaluated and streamed when the condition is false, and `fail` is out of
// line and [[noreturn]], so the fast path is a single predictable branch.
template <class... Args>
std::string concat(const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  }
}

// Throws E(message, extra..., location). Out of line in spirit: only the
// failure path calls it.
template <class E, class... Extra>
[[noreturn]] void fail(const char* func, const char* file, int line, std::string message, Extra&&... extra) {
  throw E(std::move(message), std::forward<Extra>(extra)..., SourceLocation{func, file, line});
}

[[noreturn]] void internal_fail(const char* func, const char* file, int line,
                                const char* condition, const std::string& message);

}  // namespace detail
}  // namespace gk

#if defined(__GNUC__)
#define GK_UNLIKELY(x) __builtin_expect(static_cast<bool>(x), 0)
#define GK_LIKELY(x) __builtin_expect(static_cast<bool>(x), 1)
#else
#define GK_UNLIKELY(x) (x)
#define GK_LIKELY(x) (x)
#endif

// Raises `ErrorType` (one of the gk error classes) with the streamed message
// when `cond` is false. For user input and model state, not for invariants.
#define GK_CHECK(ErrorType, cond, ...)                                              \
  if (GK_LIKELY(cond)) {                                                            \
  } else                                                                            \
    ::gk::detail::fail<ErrorType>(__func__, __FILE__, __LINE__,                     \
                                  ::gk::detail::concat(__VA_ARGS__))

// Raises `ErrorType` with the streamed message, unconditionally.
#define GK_THROW(ErrorType, ...) \
  ::gk::detail::fail<ErrorType>(__func__, __FILE__, __LINE__, ::gk::detail::concat(__VA_ARGS__))

// An invariant of graphkeep itself; failing it is a graphkeep bug.
#define GK_INTERNAL_ASSERT(cond, ...)                                               \
  if (GK_LIKELY(cond)) {                                                            \
  } else                                                                            \
    ::gk::detail::internal_fail(__func__, __FILE__, __LINE__, #cond,                \
                                ::gk::detail::concat(__VA_ARGS__))
