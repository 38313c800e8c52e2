#include <graphkeep/core/check.h>

namespace gk {

std::string Error::compose(const std::string& message, const SourceLocation& where) {
  static constexpr std::string_view kPrefix = "graphkeep: ";
  std::string out(kPrefix);
  // A message that carries the prefix already (built by older code or
  // another layer) gets it once.
  std::string_view m(message);
  if (m.substr(0, kPrefix.size()) == kPrefix) m.remove_prefix(kPrefix.size());
  out += m;
  if (where.file != nullptr) {
    // The file as <folder>/<name>: enough to find it, short enough to read.
    std::string_view f(where.file);
    const auto last = f.rfind('/');
    if (last != std::string_view::npos && last > 0) {
      const auto prev = f.rfind('/', last - 1);
      f = f.substr(prev == std::string_view::npos ? 0 : prev + 1);
    }
    out += "\n  (raised in ";
    out += where.function != nullptr ? where.function : "?";
    out += " at ";
    out += f;
    out += ':';
    out += std::to_string(where.line);
    out += ')';
  }
  return out;
}

}  // namespace gk

namespace gk::detail {

void internal_fail(const char* func, const char* file, int line, const char* condition,
                   const std::string& message) {
  throw InternalError(concat("internal error (a bug in graphkeep, please report it): ", condition, " failed",
                             message.empty() ? "" : ": ", message),
                      SourceLocation{func, file, line});
}

}  // namespace gk::detail
