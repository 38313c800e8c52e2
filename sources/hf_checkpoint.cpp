// HfCheckpointSource: a Hugging Face model directory (model.safetensors, or
// model.safetensors.index.json and its shards), validated at construction and
// streamed shard by shard through SafetensorsSource.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/hf_checkpoint.h>

#include "json_depth.h"
#include <graphkeep/sources/safetensors_source.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace gk {
namespace {

using nlohmann::json;

constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
// An index lists one short line per tensor: a few MB for the largest models.
// The bounds keep a corrupt or hostile file from exhausting memory or the
// stack (nlohmann's parser recurses once per nesting level).
constexpr std::size_t kMaxIndexBytes = 100'000'000;
constexpr std::size_t kMaxIndexNesting = 127;
constexpr std::size_t kSkipped = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kMaxProblemsListed = 10;

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// A name from a file, quoted in a message: cut short, and control characters
// escaped, so a hostile index cannot flood or garble the message.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == 200) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

enum class PathKind { missing, regular, other };

PathKind path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return PathKind::missing;  // stat follows symbolic links
  return S_ISREG(st.st_mode) ? PathKind::regular : PathKind::other;
}

// The whole file at `path` (at most kMaxIndexBytes).
std::string read_small_file(const std::string& path, const std::string& label) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GK_CHECK(WeightError, fd >= 0, label, ": cannot open it: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  GK_CHECK(WeightError, ::fstat(fd, &st) == 0, label, ": cannot stat it: ", std::strerror(errno));
  GK_CHECK(WeightError, static_cast<std::uint64_t>(st.st_size) <= kMaxIndexBytes, label, ": it is ",
           st.st_size, " bytes, over the limit of ", kMaxIndexBytes,
           " bytes for an index; the file is corrupt or not an index");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    GK_CHECK(WeightError, n >= 0, label, ": cannot read it: ", std::strerror(errno));
    if (n == 0) break;  // shrank while being read
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}


// Finds the first key repeated within one JSON object (nlohmann keeps the
// last silently, which would hide a tensor listed twice in the weight map).
struct DuplicateKeys {
  std::vector<std::set<std::string>> open;
  std::string top_key;  // the current key of the outermost object
  struct Found {
    std::size_t depth;    // 1: a key of the outermost object
    std::string parent;   // the outermost key it is nested in
    std::string key;
  };
  std::optional<Found> first;

  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open.empty()) break;
        const auto& key = parsed.get_ref<const std::string&>();
        if (open.size() == 1) top_key = key;
        if (!open.back().insert(key).second && !first)
          first = Found{open.size(), open.size() == 1 ? std::string() : top_key, key};
        break;
      }
      default: break;
    }
    return true;
  }
};

// The index's weight map, Hugging Face tensor name -> shard file name, with
// every problem of the file reported against `label`.
std::map<std::string, std::string> parse_index(const std::string& path, const std::string& label) {
  const std::string text = read_small_file(path, label);
  GK_CHECK(WeightError, detail::json_nesting_depth(text, kMaxIndexNesting) <= kMaxIndexNesting, label,
           ": it nests arrays or objects deeper than ", kMaxIndexNesting,
           " levels; the file is corrupt or not an index");
  // nlohmann's lexer takes a NUL byte for the end of the input; no valid JSON holds one.
  if (const void* nul = std::memchr(text.data(), 0, text.size())) {
    GK_THROW(WeightError, label, ": it is not valid JSON (a NUL byte at offset ",
             static_cast<const char*>(nul) - text.data(), ")");
  }
  DuplicateKeys dup;
  json j;
  try {
    j = json::parse(text, [&dup](int, json::parse_event_t event, json& parsed) {
      return dup.on_event(event, parsed);
    });
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 240) what = what.substr(0, 240) + "...";
    GK_THROW(WeightError, label, ": it is not valid JSON (", what, ")");
  }
  GK_CHECK(WeightError, j.is_object(), label, ": it is JSON but not an object (it is ", j.type_name(),
           "); an index is {\"metadata\": {...}, \"weight_map\": {tensor: file}}");
  if (dup.first) {
    const auto& f = *dup.first;
    GK_CHECK(WeightError, !(f.depth == 2 && f.parent == "weight_map"), label, ": \"weight_map\" lists tensor ",
             quote(f.key), " twice (duplicate key); each tensor may appear once");
    GK_THROW(WeightError, label, ": the key ", quote(f.key), " appears twice in ",
             f.depth == 1 ? std::string("the outermost object") : "\"" + f.parent + "\"",
             " (duplicate key)");
  }
  const auto meta = j.find("metadata");
  GK_CHECK(WeightError, meta == j.end() || meta->is_object() || meta->is_null(), label,
           ": \"metadata\" is a JSON ", meta->type_name(), ", not an object");
  const auto wm = j.find("weight_map");
  GK_CHECK(WeightError, wm != j.end(), label,
           ": it has no \"weight_map\"; an index is {\"metadata\": {...}, \"weight_map\": {tensor: file}}");
  GK_CHECK(WeightError, wm->is_object(), label, ": \"weight_map\" is a JSON ", wm->type_name(),
           ", not an object {tensor: file}");
  GK_CHECK(WeightError, !wm->empty(), label, ": \"weight_map\" lists no tensors");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : wm->items()) {
    GK_CHECK(WeightError, file.is_string(), label, ": \"weight_map\" gives tensor ", quote(name),
             " the file ", file.is_structured() ? std::string("(a JSON ") + file.type_name() + ")" : file.dump(),
             ", not a file name");
    const auto& f = file.get_ref<const std::string&>();
    GK_CHECK(WeightError, !f.empty(), label, ": \"weight_map\" gives tensor ", quote(name),
             " an empty file name");
    // Shards are files of the checkpoint's own directory: a name that could
    // lead elsewhere (a parent-folder step, an absolute path, a subfolder) is
    // refused.
    GK_CHECK(WeightError,
             f.find('/') == std::string::npos && f.find("..") == std::string::npos &&
                 f.find('\0') == std::string::npos,
             label, ": \"weight_map\" puts tensor ", quote(name), " in file ", quote(f),
             ", which is not a plain file name in the checkpoint directory ('/' and \"..\" are "
             "refused); the index is corrupt or hostile");
    out.emplace(name, f);
  }
  return out;
}

}  // namespace

HfCheckpointSource::HfCheckpointSource(std::string dir,
                                       std::function<std::string(std::string_view)> rename)
    : dir_(std::move(dir)) {
  const std::string label = describe();
  {
    struct stat st {};
    GK_CHECK(WeightError, !dir_.empty() && ::stat(dir_.c_str(), &st) == 0, label,
             ": cannot open the directory: ", dir_.empty() ? "the path is empty" : std::strerror(errno));
    GK_CHECK(WeightError, S_ISDIR(st.st_mode), label, ": not a directory");
  }
  const PathKind single = path_kind(path_of(std::string(kSingleFile)));
  const PathKind index = path_kind(path_of(std::string(kIndexFile)));
  GK_CHECK(WeightError, single != PathKind::missing || index != PathKind::missing, label,
           ": the directory has neither ", kSingleFile, " nor ", kIndexFile,
           "; it is not a Hugging Face safetensors checkpoint (PyTorch .bin weights are not read)");
  GK_CHECK(WeightError, single == PathKind::missing || index == PathKind::missing, label,
           ": the directory has both ", kSingleFile, " and ", kIndexFile,
           "; which one is the checkpoint is ambiguous (save_pretrained writes one and removes the "
           "other): remove the stale one");
  const bool indexed = index != PathKind::missing;
  const std::string main_file(indexed ? kIndexFile : kSingleFile);
  GK_CHECK(WeightError, path_kind(path_of(main_file)) == PathKind::regular, label, ": '", main_file,
           "' is not a regular file");

  // Hugging Face name -> file, from the index; or every tensor of the one file.
  std::map<std::string, std::string> weight_map;
  if (indexed) {
    const std::string index_label = label + ": index '" + main_file + "'";
    weight_map = parse_index(path_of(main_file), index_label);
    std::set<std::string> files;
    for (const auto& [name, file] : weight_map) files.insert(file);
    files_.assign(files.begin(), files.end());  // sorted: model-00001-of-0000N first
    for (const auto& file : files_)
      GK_CHECK(WeightError, path_kind(path_of(file)) != PathKind::missing, label, ": shard ",
               quote(file), " that the index names (for tensor ",
               quote(std::find_if(weight_map.begin(), weight_map.end(),
                                   [&](const auto& kv) { return kv.second == file; })
                          ->first),
               " and others it lists there) is missing from the directory");
  } else {
    files_.emplace_back(kSingleFile);
  }

  // Every shard's header: each shard is mapped, parsed and released in turn.
  std::vector<std::vector<SafetensorsEntry>> headers;
  headers.reserve(files_.size());
  for (const auto& file : files_) {
    SafetensorsSource src(path_of(file));
    headers.push_back(src.entries());
  }

  // Where each tensor is, so a tensor stored twice is named with both files.
  std::unordered_map<std::string_view, std::vector<std::size_t>> where;
  for (std::size_t s = 0; s < headers.size(); ++s)
    for (const auto& e : headers[s]) where[e.name].push_back(s);
  for (std::size_t s = 0; s < headers.size(); ++s) {
    for (const auto& e : headers[s]) {
      const auto& in = where[e.name];
      GK_CHECK(WeightError, in.size() == 1, label, ": tensor ", quote(e.name), " appears in ",
               in.size(), " shards (", quote(files_[in[0]]), " and ", quote(files_[in[1]]),
               "); each tensor may appear once");
      if (!indexed) continue;
      const auto it = weight_map.find(e.name);
      GK_CHECK(WeightError, it != weight_map.end(), label, ": shard ", quote(files_[s]),
               " holds tensor ", quote(e.name), ", which the index does not list; the index and "
               "the shards disagree (a mixed or interrupted save?)");
      GK_CHECK(WeightError, it->second == files_[s], label, ": tensor ", quote(e.name),
               " is in shard ", quote(files_[s]), " but the index lists it under ",
               quote(it->second), "; the index and the shards disagree (a mixed or interrupted save?)");
    }
  }
  for (const auto& [name, file] : weight_map)
    GK_CHECK(WeightError, where.count(name) != 0, label, ": the index lists tensor ", quote(name),
             " in shard ", quote(file), ", but the shard lacks it");

  // Engine names, in streaming order.
  std::unordered_map<std::string, std::size_t> by_engine_name;
  shards_.reserve(files_.size());
  for (std::size_t s = 0; s < files_.size(); ++s) {
    Shard sh;
    sh.file = files_[s];
    sh.first = tensors_.size();
    sh.header = std::move(headers[s]);
    sh.index.reserve(sh.header.size());
    for (const auto& e : sh.header) {
      std::string name = rename ? rename(e.name) : e.name;
      if (name.empty()) {
        sh.index.push_back(kSkipped);
        continue;
      }
      const auto [it, fresh] = by_engine_name.emplace(name, tensors_.size());
      GK_CHECK(WeightError, fresh, label, ": tensors ", quote(hf_names_[it->second]), " (in ",
               quote(tensors_[it->second].file), ") and ", quote(e.name), " (in ",
               quote(files_[s]), ") are both renamed to ", quote(name),
               "; the rename must map different tensors to different names");
      sh.index.push_back(tensors_.size());
      tensors_.push_back(HfTensorInfo{std::move(name), files_[s], e.shape, to_scalar_type(e.dtype)});
      hf_names_.push_back(e.name);
    }
    sh.count = tensors_.size() - sh.first;
    shards_.push_back(std::move(sh));
  }
}

HfCheckpointSource::~HfCheckpointSource() = default;

std::string HfCheckpointSource::describe() const { return "Hugging Face checkpoint '" + dir_ + "'"; }

std::string HfCheckpointSource::path_of(const std::string& file) const {
  return !dir_.empty() && dir_.back() == '/' ? dir_ + file : dir_ + "/" + file;
}

void HfCheckpointSource::open_shard() {
  const Shard& sh = shards_[shard_];
  auto src = std::make_unique<SafetensorsSource>(path_of(sh.file));
  // The header read at construction is what tensors() and check() promised.
  const auto& now = src->entries();
  bool same = now.size() == sh.header.size();
  for (std::size_t i = 0; same && i < now.size(); ++i) {
    const auto& a = now[i];
    const auto& b = sh.header[i];
    same = a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
           a.end == b.end;
  }
  GK_CHECK(WeightError, same, describe(), ": shard ", quote(sh.file),
           " changed since the checkpoint was opened (its header differs from the one read then); "
           "the directory was rewritten while in use");
  open_ = std::move(src);
}

std::optional<NamedTensor> HfCheckpointSource::next() {
  while (shard_ < shards_.size()) {
    const Shard& sh = shards_[shard_];
    if (entry_ < sh.header.size()) {
      if (!open_) open_shard();
      std::optional<NamedTensor> t = open_->next();
      GK_INTERNAL_ASSERT(t.has_value() && t->name == sh.header[entry_].name, "shard ", sh.file,
                         " entry ", entry_, " out of step with its source");
      const std::size_t i = sh.index[entry_++];
      if (i == kSkipped) continue;
      return NamedTensor{tensors_[i].name, std::move(t->value), 0};
    }
    // Done with this shard: release its mapping (yielded tensors keep their own).
    open_.reset();
    ++shard_;
    entry_ = 0;
  }
  return std::nullopt;
}

void HfCheckpointSource::check(const std::vector<ExpectedTensor>& expected) const {
  std::unordered_map<std::string_view, std::size_t> have;
  for (std::size_t i = 0; i < tensors_.size(); ++i) have.emplace(tensors_[i].name, i);

  std::vector<std::string> problems;
  auto where = [&](std::size_t i) {
    std::string s = "tensor " + quote(tensors_[i].name);
    if (hf_names_[i] != tensors_[i].name) s += " (Hugging Face name " + quote(hf_names_[i]) + ")";
    return s + " in " + quote(tensors_[i].file);
  };
  std::unordered_set<std::string_view> wanted;
  for (const ExpectedTensor& e : expected) {
    if (!wanted.insert(e.name).second) {
      problems.push_back("the model's expectations list tensor " + quote(e.name) + " twice");
      continue;
    }
    const auto it = have.find(e.name);
    if (it == have.end()) {
      problems.push_back("tensor " + quote(e.name) + " (shape " + shape_str(e.shape) + ", dtype " +
                         c10::toString(e.dtype) +
                         ") is expected by the model, but the checkpoint lacks it");
      continue;
    }
    const HfTensorInfo& t = tensors_[it->second];
    if (t.shape != e.shape)
      problems.push_back(where(it->second) + " has shape " + shape_str(t.shape) +
                         ", but the model expects " + shape_str(e.shape));
    if (t.dtype != e.dtype)
      problems.push_back(where(it->second) + " has dtype " + c10::toString(t.dtype) +
                         ", but the model expects " + c10::toString(e.dtype));
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (wanted.count(tensors_[i].name) == 0)
      problems.push_back(where(i) + " is in the checkpoint, but the model does not expect it");
  if (problems.empty()) return;

  std::string msg = describe() + " does not match the model: " + std::to_string(problems.size()) +
                    (problems.size() == 1 ? " problem" : " problems");
  for (std::size_t i = 0; i < problems.size() && i < kMaxProblemsListed; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kMaxProblemsListed)
    msg += "\n  and " + std::to_string(problems.size() - kMaxProblemsListed) + " more";
  GK_THROW(WeightError, msg);
}

}  // namespace gk
