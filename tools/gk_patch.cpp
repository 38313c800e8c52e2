// gk-patch: weight patches between Hugging Face checkpoint directories
// (graphkeep/delta/, docs/delta.md).
//
//   gk-patch diff BASE_DIR TARGET_DIR OUT.safetensors [--base-id ID] [--target-id ID]
//                 [--sparse | --dense] [--record-unchanged] [--device cpu|cuda]
//       the patch from BASE_DIR's weights to TARGET_DIR's (same tensor names,
//       shapes and dtypes); version ids default to the directories' names
//   gk-patch apply BASE_DIR PATCH OUT_DIR [--device cpu|cuda] [--allow-non-finite]
//       BASE_DIR's checkpoint with PATCH applied, written to OUT_DIR (which must
//       not exist) with BASE_DIR's layout: the same safetensors files, tensor
//       order and metadata, the index and every other top-level file copied.
//       Every check (Note [Apply is transactional]) passes before anything is
//       written, and OUT_DIR appears at once (a temporary directory renamed).
//       A patch that writes a NaN or an infinity is refused, as the reload
//       engine refuses it at stage time, unless --allow-non-finite (the
//       engine's ReloadOptions::allow_non_finite).
//   gk-patch verify BASE_DIR PATCH [--device cpu|cuda] [--allow-non-finite]
//       apply's checks, without writing anything
//   gk-patch stats PATCH [--json]
//       per tensor: encoding, dtype, shape, changed elements, density, bytes,
//       non-finite values written; totals
//
// Exit status: 0 on success, 1 for a usage error, 2 for a graphkeep error
// (the message, naming the tensor and the file, on stderr).
#include <graphkeep/core/check.h>
#include <graphkeep/delta/apply_patch.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/non_finite.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

// POSIX file operations (libtorch exports its own std::filesystem symbols,
// which interpose on libstdc++'s: see tests/safetensors_test.cpp's TempDir).
std::string trim_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}
std::string basename_of(const std::string& path) {
  const std::string p = trim_slashes(path);
  const std::size_t cut = p.rfind('/');
  return cut == std::string::npos ? p : p.substr(cut + 1);
}
std::string dirname_of(const std::string& path) {
  const std::string p = trim_slashes(path);
  const std::size_t cut = p.rfind('/');
  return cut == std::string::npos ? "." : (cut == 0 ? "/" : p.substr(0, cut));
}
bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void copy_file(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  GK_CHECK(gk::WeightError, in >= 0, "gk-patch: cannot open '", from, "': ", std::strerror(errno));
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    GK_THROW(gk::WeightError, "gk-patch: cannot create '", to, "': ", std::strerror(err));
  }
  std::vector<char> buf(1 << 20);
  bool ok = true;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0 || ::write(out, buf.data(), static_cast<std::size_t>(n)) != n) {
      ok = false;
      break;
    }
  }
  ::close(in);
  ok = ::close(out) == 0 && ok;
  GK_CHECK(gk::WeightError, ok, "gk-patch: copying '", from, "' to '", to, "' failed: ", std::strerror(errno));
}

// A directory created next to its final place and renamed there once
// complete; removed with its files unless commit() ran.
class StagingDir {
 public:
  explicit StagingDir(const std::string& final_path) : final_(trim_slashes(final_path)) {
    GK_CHECK(gk::WeightError, !exists(final_), "gk-patch: '", final_, "' exists; give a new directory to write");
    std::string tmpl = dirname_of(final_) + "/." + basename_of(final_) + ".gk-patch-XXXXXX";
    GK_CHECK(gk::WeightError, ::mkdtemp(tmpl.data()) != nullptr, "gk-patch: cannot create a directory next to '",
             final_, "': ", std::strerror(errno));
    path_ = tmpl;
  }
  ~StagingDir() {
    if (committed_) return;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ::unlink(file(e->d_name).c_str());
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void commit() {
    GK_CHECK(gk::WeightError, ::rename(path_.c_str(), final_.c_str()) == 0, "gk-patch: cannot rename '", path_,
             "' to '", final_, "': ", std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string final_, path_;
  bool committed_ = false;
};

// Every tensor of a checkpoint directory (zero copy), on `device`.
std::vector<gk::NamedTensor> load_all(gk::HfCheckpointSource& src, c10::Device device) {
  std::vector<gk::NamedTensor> out;
  while (auto t = src.next()) {
    if (!device.is_cpu()) t->value = t->value.to(device);
    out.push_back(std::move(*t));
  }
  return out;
}

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // --name value, or --flag ""
};

int usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "gk-patch: %s\n", why);
  std::fputs(
      "usage:\n"
      "  gk-patch diff BASE_DIR TARGET_DIR OUT.safetensors [--base-id ID] [--target-id ID]\n"
      "                [--sparse | --dense] [--record-unchanged] [--device cpu|cuda]\n"
      "  gk-patch apply BASE_DIR PATCH OUT_DIR [--device cpu|cuda] [--allow-non-finite]\n"
      "  gk-patch verify BASE_DIR PATCH [--device cpu|cuda] [--allow-non-finite]\n"
      "  gk-patch stats PATCH [--json]\n",
      why != nullptr ? stderr : stdout);
  return why != nullptr ? 1 : 0;
}

c10::Device device_of(const Args& a) {
  const auto it = a.options.find("--device");
  return c10::Device(it == a.options.end() ? std::string("cpu") : it->second);
}

int diff(const Args& a) {
  gk::HfCheckpointSource base_src(a.positional[0]), target_src(a.positional[1]);
  const c10::Device device = device_of(a);
  const std::vector<gk::NamedTensor> base = load_all(base_src, device), target = load_all(target_src, device);
  gk::MakePatchOptions o;
  o.base_version = a.options.count("--base-id") ? a.options.at("--base-id") : basename_of(a.positional[0]);
  o.target_version = a.options.count("--target-id") ? a.options.at("--target-id") : basename_of(a.positional[1]);
  if (a.options.count("--sparse")) o.encoding = gk::MakePatchOptions::Encoding::sparse;
  if (a.options.count("--dense")) o.encoding = gk::MakePatchOptions::Encoding::dense;
  o.record_unchanged = a.options.count("--record-unchanged") > 0;
  o.share_dense = true;  // the targets are read-only file mappings
  const gk::Patch p = gk::make_patch(base, target, o);
  gk::write_patch(a.positional[2], p);
  std::size_t changed = 0;
  for (const gk::PatchEntry& e : p.entries) changed += static_cast<std::size_t>(e.count());
  std::printf("gk-patch: %zu of %zu tensors changed, %zu elements stored, %zu payload bytes -> %s\n",
              p.entries.size(), base.size(), changed, p.payload_bytes(), a.positional[2].c_str());
  return 0;
}

// The non-finite values the patch writes, when it writes any: refused
// (gk::WeightError naming the patch file, the first such tensor, its element
// and value) unless `allow`; allowed, their number.
std::int64_t refuse_non_finite(const gk::Patch& patch, bool allow) {
  const std::vector<gk::NonFiniteValues> nf = gk::non_finite_values(patch);
  std::int64_t values = 0, tensors = 0;
  for (const gk::NonFiniteValues& v : nf) {
    values += v.count;
    tensors += v.count > 0 ? 1 : 0;
  }
  if (allow || values == 0) return values;
  for (std::size_t k = 0; k < nf.size(); ++k) {
    if (nf[k].count == 0) continue;
    const gk::PatchEntry& e = patch.entries[k];
    GK_THROW(gk::WeightError, patch.label, ": tensor '", e.name, "': the patch writes a non-finite value (",
             nf[k].first_value, " at element ", nf[k].first_element, " of ", c10::IntArrayRef(e.shape),
             "; non-finite values written: ", nf[k].count, " in this tensor, ", values, " in ", tensors,
             " of the patch's tensors): refused, nothing was written. A diverged trainer writes such updates, and "
             "the reload engine refuses them at stage time; to apply the patch anyway, pass --allow-non-finite (the "
             "engine's ReloadOptions::allow_non_finite)");
  }
  return values;
}

// BASE_DIR's tensors with the patch applied (every check passed); `non_finite`
// receives the number of non-finite values it writes (refused unless
// --allow-non-finite).
std::vector<gk::NamedTensor> patched(gk::HfCheckpointSource& src, const std::string& patch_path, const Args& a,
                                     std::int64_t& non_finite) {
  const c10::Device device = device_of(a);
  gk::Patch patch = gk::read_patch(patch_path);
  std::vector<gk::ExpectedTensor> expected;
  for (const gk::HfTensorInfo& t : src.tensors()) expected.push_back({t.name, t.shape, t.dtype});
  gk::check_patch(patch, expected);  // before any weight is read
  if (!device.is_cpu()) patch = patch.to(device);
  std::vector<gk::NamedTensor> result = gk::apply_patch(patch, load_all(src, device));
  // Last, once every check of the format and the hashes passed: a patch made
  // from other weights is named as such, whatever values it holds.
  non_finite = refuse_non_finite(patch, a.options.count("--allow-non-finite") > 0);
  return result;
}

int apply(const Args& a) {
  gk::HfCheckpointSource src(a.positional[0]);
  const std::string out_dir = a.positional[2];
  GK_CHECK(gk::WeightError, !exists(out_dir), "gk-patch: '", out_dir, "' exists; give a new directory to write");
  std::int64_t non_finite = 0;
  const std::vector<gk::NamedTensor> result = patched(src, a.positional[1], a, non_finite);
  std::map<std::string, const at::Tensor*> by_name;
  for (const gk::NamedTensor& t : result) by_name[t.name] = &t.value;

  StagingDir stage(out_dir);
  for (const std::string& file : src.files()) {
    // The shard as it was: its tensor order and metadata.
    const gk::SafetensorsSource shard(src.dir() + "/" + file);
    std::vector<gk::NamedTensor> tensors;
    for (const gk::SafetensorsEntry& e : shard.entries()) tensors.push_back({e.name, *by_name.at(e.name), 0});
    gk::write_safetensors(stage.file(file), tensors, shard.metadata());
  }
  // The index and every other regular top-level file (config.json, tokenizer, ...).
  DIR* d = ::opendir(src.dir().c_str());
  GK_CHECK(gk::WeightError, d != nullptr, "gk-patch: cannot list '", src.dir(), "': ", std::strerror(errno));
  std::vector<std::string> others;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    struct stat st {};
    if (name.ends_with(".safetensors") || ::stat((src.dir() + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    others.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : others) copy_file(src.dir() + "/" + name, stage.file(name));
  stage.commit();
  std::printf("gk-patch: wrote %s (%zu files)", out_dir.c_str(), src.files().size() + others.size());
  if (non_finite > 0)
    std::printf(", %lld non-finite values written (--allow-non-finite)", static_cast<long long>(non_finite));
  std::printf("\n");
  return 0;
}

int verify(const Args& a) {
  gk::HfCheckpointSource src(a.positional[0]);
  std::int64_t non_finite = 0;
  (void)patched(src, a.positional[1], a, non_finite);
  std::printf("gk-patch: %s applies to %s", a.positional[1].c_str(), a.positional[0].c_str());
  if (non_finite > 0)
    std::printf(" (it writes %lld non-finite values, allowed by --allow-non-finite)",
                static_cast<long long>(non_finite));
  std::printf("\n");
  return 0;
}

int stats(const Args& a) {
  const gk::Patch p = gk::read_patch(a.positional[0]);
  const std::vector<gk::NonFiniteValues> nf = gk::non_finite_values(p);
  nlohmann::json tensors = nlohmann::json::array();
  std::int64_t stored = 0, elements = 0, non_finite = 0;
  std::size_t dense_bytes = 0;
  for (std::size_t k = 0; k < p.entries.size(); ++k) {
    const gk::PatchEntry& e = p.entries[k];
    const std::size_t full = static_cast<std::size_t>(e.numel()) * c10::elementSize(e.dtype);
    stored += e.count();
    elements += e.numel();
    dense_bytes += full;
    non_finite += nf[k].count;
    tensors.push_back({{"name", e.name},
                       {"encoding", std::string(gk::patch_encoding_name(e.encoding))},
                       {"dtype", std::string(c10::toString(e.dtype))},
                       {"shape", e.shape},
                       {"numel", e.numel()},
                       {"count", e.count()},
                       {"density", e.numel() > 0 ? static_cast<double>(e.count()) / static_cast<double>(e.numel()) : 0.0},
                       {"payload_bytes", e.payload_bytes()},
                       {"dense_bytes", full},
                       {"base_hash", gk::format_content_hash(e.base_hash)},
                       {"target_hash", gk::format_content_hash(e.target_hash)},
                       {"non_finite", nf[k].count}});
  }
  struct stat st {};
  const std::size_t file_bytes = ::stat(a.positional[0].c_str(), &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
  const nlohmann::json totals = {
      {"tensors", p.entries.size()},
      {"count", stored},
      {"numel", elements},
      {"density", elements > 0 ? static_cast<double>(stored) / static_cast<double>(elements) : 0.0},
      {"payload_bytes", p.payload_bytes()},
      {"dense_bytes", dense_bytes},
      {"file_bytes", file_bytes},
      {"non_finite", non_finite}};
  if (a.options.count("--json")) {
    std::cout << nlohmann::json{{"base", p.base_version}, {"target", p.target_version}, {"tensors", tensors},
                                {"totals", totals}}
                     .dump(2)
              << '\n';
    return 0;
  }
  std::cout << "patch " << a.positional[0] << ": '" << p.base_version << "' -> '" << p.target_version << "'\n";
  std::cout << std::left << std::setw(48) << "tensor" << std::setw(8) << "enc" << std::setw(14) << "dtype"
            << std::right << std::setw(14) << "changed" << std::setw(14) << "elements" << std::setw(10) << "density"
            << std::setw(14) << "bytes" << std::setw(12) << "non-finite" << '\n';
  for (const auto& t : tensors) {
    std::ostringstream density;
    density << std::fixed << std::setprecision(3) << 100.0 * t["density"].get<double>() << '%';
    std::cout << std::left << std::setw(48) << t["name"].get<std::string>() << std::setw(8)
              << t["encoding"].get<std::string>() << std::setw(14) << t["dtype"].get<std::string>() << std::right
              << std::setw(14) << t["count"].get<std::int64_t>() << std::setw(14) << t["numel"].get<std::int64_t>()
              << std::setw(10) << density.str() << std::setw(14) << t["payload_bytes"].get<std::size_t>()
              << std::setw(12) << t["non_finite"].get<std::int64_t>() << '\n';
  }
  std::ostringstream density;
  density << std::fixed << std::setprecision(3) << 100.0 * totals["density"].get<double>() << '%';
  std::cout << "total: " << p.entries.size() << " tensors, " << stored << " of " << elements
            << " elements stored (" << density.str() << "), payload " << p.payload_bytes() << " bytes of "
            << dense_bytes << " dense bytes, file " << file_bytes << " bytes, " << non_finite
            << " non-finite values written\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("no command");
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") return usage(nullptr);
  Args a;
  static const std::map<std::string, bool> kTakesValue = {
      {"--base-id", true}, {"--target-id", true}, {"--device", true},         {"--sparse", false},
      {"--dense", false},  {"--json", false},     {"--record-unchanged", false}, {"--allow-non-finite", false}};
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    if (!s.starts_with("--")) {
      a.positional.push_back(s);
      continue;
    }
    const auto it = kTakesValue.find(s);
    if (it == kTakesValue.end()) return usage(("unknown option " + s).c_str());
    if (it->second && i + 1 >= argc) return usage((s + " needs a value").c_str());
    a.options[s] = it->second ? argv[++i] : "";
  }
  const std::map<std::string, std::pair<std::size_t, int (*)(const Args&)>> commands = {
      {"diff", {3, diff}}, {"apply", {3, apply}}, {"verify", {2, verify}}, {"stats", {1, stats}}};
  const auto c = commands.find(cmd);
  if (c == commands.end()) return usage(("unknown command " + cmd).c_str());
  if (a.positional.size() != c->second.first) return usage(("wrong number of arguments for " + cmd).c_str());
  if (a.options.count("--sparse") && a.options.count("--dense")) return usage("--sparse and --dense exclude each other");
  try {
    return c->second.second(a);
  } catch (const gk::Error& e) {
    std::cerr << e.what() << '\n';
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "gk-patch: " << e.what_without_backtrace() << '\n';
    return 2;
  }
}
