#include <graphkeep/check.h>

namespace gk::detail {

void internal_fail(const char* func, const char* file, int line, const char* condition,
                   const std::string& message) {
  throw InternalError(concat("graphkeep internal error (a bug in graphkeep, please report it): ",
                          condition, " failed in ", func, " at ", file, ":", line,
                          message.empty() ? "" : ": ", message));
}

}  // namespace gk::detail
