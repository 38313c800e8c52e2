// bench/bench_args.h: the command line of the engine benches (gk-decode-bench,
// gk-online-bench, bench_delta): the flags they share, and a walk over argv.
//
//   gkbench::CommonArgs c(/*default_batch=*/64);
//   for (gkbench::ArgWalker a(argc, argv); a.next();) {
//     if (a.common(c)) continue;
//     if (a.flag() == "--steps") steps = std::stoi(a.value());
//     else return usage();
//   }
#pragma once

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gkbench {

// --model, --format, --json, --device, --batch, --blocking-sync, --commit.
struct CommonArgs {
  explicit CommonArgs(std::int64_t default_batch) : batch(default_batch) {}
  std::string model = "tiny";
  std::string format = "dense";
  std::string json;  // rows appended here, one JSON object per line
  std::string device = "auto";
  std::int64_t batch;
  // The device's waits sleep instead of spinning (bench_sync.h): the host
  // CPU times then count the host's work, not its waits for the device.
  bool blocking_sync = false;
  // The commit the binary was built from, for the rows (--commit; else
  // $GK_COMMIT; else .gpu-bin/COMMIT, which `scripts/gpu.sh pack` writes).
  std::string commit = default_commit();

  static std::string default_commit() {
    if (const char* env = std::getenv("GK_COMMIT"); env != nullptr && *env != '\0') return env;
    std::ifstream f(".gpu-bin/COMMIT");
    std::string rev;
    if (f >> rev) return rev;
    return "unknown";
  }
};

// Today's UTC date, YYYY-MM-DD, for the rows.
inline std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

class ArgWalker {
 public:
  ArgWalker(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next flag; false past the last.
  bool next() { return ++i_ < argc_; }
  std::string flag() const { return argv_[i_]; }
  // The current flag's value (the next argument, consumed).
  std::string value() {
    if (i_ + 1 >= argc_) throw std::invalid_argument(flag() + " needs a value");
    return argv_[++i_];
  }
  // Takes the current flag into `c` when it is one of CommonArgs'.
  bool common(CommonArgs& c) {
    const std::string k = flag();
    if (k == "--model") c.model = value();
    else if (k == "--format") c.format = value();
    else if (k == "--json") c.json = value();
    else if (k == "--device") c.device = value();
    else if (k == "--batch") c.batch = std::stoll(value());
    else if (k == "--blocking-sync") c.blocking_sync = true;
    else if (k == "--commit") c.commit = value();
    else return false;
    return true;
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace gkbench
