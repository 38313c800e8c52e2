// HfCheckpointSource: Hugging Face model directories (one model.safetensors,
// or an index and its shards) written here with gk::write_safetensors and a
// hand-written index; every way such a directory can be wrong, refused at
// construction; check() against the model's expectations; streaming one
// shard at a time. tests/hf_checkpoint_interop.py reads directories written
// by the reference (safetensors, transformers).
#include "gk_test.h"
#include "temp_dir.h"

#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/safetensors_source.h>

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using gk::testing::TempDir;

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() &&
         (ca.nbytes() == 0 || std::memcmp(ca.const_data_ptr(), cb.const_data_ptr(), ca.nbytes()) == 0);
}

// Random bit patterns (NaNs and all) of `type`.
at::Tensor random_bits(at::ScalarType type, std::vector<int64_t> shape) {
  if (type == at::kBool) return at::randint(0, 2, shape, at::kByte).to(at::kBool);
  const auto itemsize = static_cast<int64_t>(c10::elementSize(type));
  std::vector<int64_t> bytes_shape = shape;
  bytes_shape.back() *= itemsize;
  return at::randint(0, 256, bytes_shape, at::kByte).view(type);
}

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
  return buf;
}

// The index as transformers' save_pretrained writes it (member order and
// formatting aside): {"metadata": {"total_size": N}, "weight_map": {...}}.
std::string index_json(const std::vector<std::pair<std::string, std::string>>& weight_map,
                       long long total_size = 0) {
  std::ostringstream os;
  os << "{\n  \"metadata\": {\n    \"total_size\": " << total_size << "\n  },\n  \"weight_map\": {";
  for (std::size_t i = 0; i < weight_map.size(); ++i)
    os << (i ? "," : "") << "\n    \"" << weight_map[i].first << "\": \"" << weight_map[i].second << "\"";
  os << "\n  }\n}\n";
  return os.str();
}

// A three-shard checkpoint: written by the test, remembered by name.
struct Sharded {
  std::vector<std::vector<gk::NamedTensor>> shards;  // shard i -> its tensors, in file order
  std::map<std::string, at::Tensor> all;
  std::vector<std::pair<std::string, std::string>> weight_map;  // as written to the index

  // Shard 1 holds the tensors named last alphabetically, so file order and
  // name order differ; the index lists the names shuffled.
  explicit Sharded(const TempDir& dir) {
    shards = {
        {{"model.layers.1.mlp.down_proj.weight", random_bits(at::kBFloat16, {8, 16})},
         {"model.layers.1.self_attn.rotary_emb.inv_freq", at::arange(4, at::kFloat)},
         {"model.norm.weight", random_bits(at::kFloat, {16})}},
        {{"model.layers.0.mlp.down_proj.weight", random_bits(at::kBFloat16, {8, 16})},
         {"model.layers.0.self_attn.rotary_emb.inv_freq", at::arange(4, at::kFloat)},
         {"model.layers.0.self_attn.qkv_proj.weight", random_bits(at::kHalf, {48, 16})},
         {"model.layers.0.flag", random_bits(at::kBool, {3})}},
        {{"lm_head.weight", random_bits(at::kFloat, {32, 16})},
         {"model.embed_tokens.weight", random_bits(at::kFloat, {32, 16})},
         {"model.layers.0.step", at::scalar_tensor(7, at::kLong)}},
    };
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string file = shard_name(static_cast<int>(s) + 1, 3);
      gk::write_safetensors(dir.file(file), shards[s], {{"format", "pt"}});
      for (const auto& t : shards[s]) {
        all[t.name] = t.value;
        weight_map.emplace_back(t.name, file);
      }
    }
    std::swap(weight_map[0], weight_map[5]);
    std::swap(weight_map[2], weight_map[8]);
    dir.write("model.safetensors.index.json", index_json(weight_map, 12345));
  }
  // Every tensor's name, in file order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& s : shards)
      for (const auto& t : s) out.push_back(t.name);
    return out;
  }
};

// The message (without "graphkeep: " and the location) of the gk::WeightError
// `f` raises, or "<no error>".
template <class F>
std::string weight_error(F&& f) {
  try {
    f();
  } catch (const gk::WeightError& e) {
    return e.message();
  }
  return "<no error>";
}

#define CHECK_HAS(msg, needle)                                                                   \
  CHECK_MESSAGE((msg).find(needle) != std::string::npos, "expected \"" << (needle) << "\" in:\n" \
                                                                       << (msg))

std::string hf_label(const TempDir& dir) { return "Hugging Face checkpoint '" + dir.path + "'"; }

// Shard files of `dir` mapped into this process now (from /proc/self/maps).
std::set<std::string> mapped_files_under(const std::string& dir) {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto p = line.find(dir + "/");
    if (p != std::string::npos) out.insert(line.substr(p));
  }
  return out;
}

std::string strip_model_skip_rotary(std::string_view hf) {
  if (hf.ends_with(".rotary_emb.inv_freq")) return "";
  if (hf.starts_with("model.")) hf.remove_prefix(6);
  return std::string(hf);
}

std::vector<gk::ExpectedTensor> expectations_of(const gk::HfCheckpointSource& src) {
  std::vector<gk::ExpectedTensor> out;
  for (const auto& t : src.tensors()) out.push_back({t.name, t.shape, t.dtype});
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

TEST_CASE("a directory with one model.safetensors yields every tensor bitwise, without an index") {
  TempDir dir;
  const std::vector<gk::NamedTensor> written = {
      {"model.embed_tokens.weight", random_bits(at::kBFloat16, {10, 4})},
      {"model.norm.weight", random_bits(at::kFloat, {4})},
      {"lm_head.weight", random_bits(at::kHalf, {10, 4})},
      {"scale", random_bits(at::kFloat8_e4m3fn, {2, 2})},
  };
  gk::write_safetensors(dir.file("model.safetensors"), written);
  dir.write("config.json", "{\"model_type\": \"llama\"}");  // other files are ignored

  gk::HfCheckpointSource src(dir.path);
  CHECK(src.describe() == hf_label(dir));
  CHECK(src.files() == std::vector<std::string>{"model.safetensors"});
  REQUIRE(src.tensors().size() == written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CHECK(src.tensors()[i].name == written[i].name);
    CHECK(src.tensors()[i].file == "model.safetensors");
    CHECK(at::IntArrayRef(src.tensors()[i].shape) == written[i].value.sizes());
    CHECK((src.tensors()[i].dtype == written[i].value.scalar_type()));
  }
  std::size_t i = 0;
  while (auto t = src.next()) {
    REQUIRE(i < written.size());
    CHECK(t->name == written[i].name);
    CHECK(t->shard == 0);
    CHECK(same_bytes(t->value, written[i].value));
    ++i;
  }
  CHECK(i == written.size());
  CHECK_FALSE(src.next().has_value());
  // A trailing slash on the directory is fine.
  gk::HfCheckpointSource slash(dir.path + "/");
  CHECK(slash.tensors().size() == written.size());
  CHECK(slash.next().has_value());
}

TEST_CASE("three shards and an index: every tensor yielded once, bitwise, in files() order") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path);
  CHECK(src.files() == std::vector<std::string>{shard_name(1, 3), shard_name(2, 3), shard_name(3, 3)});
  // tensors(): file by file, in each file's order, each with its file.
  const auto names = ck.names();
  REQUIRE(src.tensors().size() == names.size());
  for (std::size_t i = 0, s = 0, k = 0; i < names.size(); ++i, ++k) {
    if (k == ck.shards[s].size()) ++s, k = 0;
    CHECK(src.tensors()[i].name == names[i]);
    CHECK(src.tensors()[i].file == shard_name(static_cast<int>(s) + 1, 3));
  }
  std::vector<std::string> yielded;
  while (auto t = src.next()) {
    INFO("tensor " << t->name);
    REQUIRE(ck.all.count(t->name) == 1);
    CHECK(same_bytes(t->value, ck.all.at(t->name)));
    CHECK(t->value.device() == at::kCPU);
    yielded.push_back(t->name);
  }
  CHECK(yielded == names);  // the order of files(), then of each file; not by name
  CHECK_FALSE(src.next().has_value());
}

TEST_CASE("rename maps names and skips the tensors it maps to an empty name") {
  TempDir dir;
  const Sharded ck(dir);
  std::vector<std::string> asked;
  gk::HfCheckpointSource src(dir.path, [&](std::string_view hf) {
    asked.emplace_back(hf);
    return strip_model_skip_rotary(hf);
  });
  CHECK(asked == ck.names());  // once per tensor, at construction
  std::vector<std::string> expected;
  for (const auto& n : ck.names())
    if (!strip_model_skip_rotary(n).empty()) expected.push_back(strip_model_skip_rotary(n));
  REQUIRE(expected.size() == ck.names().size() - 2);
  std::vector<std::string> listed;
  for (const auto& t : src.tensors()) listed.push_back(t.name);
  CHECK(listed == expected);
  CHECK(src.tensors().front().name == "layers.1.mlp.down_proj.weight");
  CHECK(src.tensors().front().file == shard_name(1, 3));

  std::vector<std::string> yielded;
  while (auto t = src.next()) {
    yielded.push_back(t->name);
    const std::string hf = t->name == "lm_head.weight" ? t->name : "model." + t->name;
    REQUIRE(ck.all.count(hf) == 1);
    CHECK(same_bytes(t->value, ck.all.at(hf)));
  }
  CHECK(yielded == expected);
  CHECK(asked.size() == ck.names().size());  // not called again while streaming
}

TEST_CASE("shard files may be symbolic links, as in the Hugging Face cache's snapshot folders") {
  TempDir blobs, snapshot;
  const at::Tensor w = random_bits(at::kFloat, {3, 5});
  gk::write_safetensors(blobs.file("blob-1"), {{"w", w}});
  REQUIRE(::symlink(blobs.file("blob-1").c_str(), snapshot.file(shard_name(1, 1)).c_str()) == 0);
  blobs.write("blob-2", index_json({{"w", shard_name(1, 1)}}));
  REQUIRE(::symlink(blobs.file("blob-2").c_str(), snapshot.file("model.safetensors.index.json").c_str()) == 0);
  gk::HfCheckpointSource src(snapshot.path);
  auto t = src.next();
  REQUIRE(t.has_value());
  CHECK(same_bytes(t->value, w));
}

TEST_CASE("streaming maps one shard at a time, and yielded tensors outlive the source") {
  TempDir dir;
  const Sharded ck(dir);
  CHECK(mapped_files_under(dir.path).empty());
  std::vector<gk::NamedTensor> kept;
  {
    gk::HfCheckpointSource src(dir.path);
    CHECK(mapped_files_under(dir.path).empty());  // construction read the headers and let go
    std::set<std::string> seen;
    std::size_t most = 0;
    while (auto t = src.next()) {
      const auto now = mapped_files_under(dir.path);
      most = std::max(most, now.size());
      seen.insert(now.begin(), now.end());
      // Zero copy: the tensor's data lies in the shard's mapping.
      const auto* p = static_cast<const char*>(t->value.const_data_ptr());
      bool inside = false;
      std::ifstream maps("/proc/self/maps");
      for (std::string line; std::getline(maps, line);) {
        if (line.find(dir.path) == std::string::npos) continue;
        unsigned long long lo = 0, hi = 0;
        std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi);
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        inside = inside || (a >= lo && a < hi);
      }
      CHECK_MESSAGE(inside, "tensor " << t->name << " is not in a shard's mapping");
    }  // each yielded tensor is dropped here
    CHECK(most == 1);
    CHECK(seen.size() == 3);
    CHECK(mapped_files_under(dir.path).empty());

    // Tensors kept past the source keep their shard mapped, and only theirs.
    gk::HfCheckpointSource again(dir.path);
    for (int i = 0; i < 4; ++i) kept.push_back(*again.next());  // shard 1's three and shard 2's first
  }
  CHECK(mapped_files_under(dir.path).size() == 2);
  for (const auto& t : kept) CHECK(same_bytes(t.value, ck.all.at(t.name)));
  kept.clear();
  CHECK(mapped_files_under(dir.path).empty());
}

// ---------------------------------------------------------------------------
// check()
// ---------------------------------------------------------------------------

TEST_CASE("check() passes on the model's own expectations") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path, strip_model_skip_rotary);
  auto expected = expectations_of(src);
  std::reverse(expected.begin(), expected.end());  // order does not matter
  CHECK(weight_error([&] { src.check(expected); }) == "<no error>");
  // check() reads no data: the source still yields everything afterwards.
  std::size_t n = 0;
  while (src.next()) ++n;
  CHECK(n == expected.size());
}

TEST_CASE("check() names the tensor, its file, and both shapes for a wrong shape") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path, strip_model_skip_rotary);
  auto expected = expectations_of(src);
  for (auto& e : expected)
    if (e.name == "layers.0.self_attn.qkv_proj.weight") e.shape = {16, 48};
  const std::string msg = weight_error([&] { src.check(expected); });
  CHECK_HAS(msg, hf_label(dir) + " does not match the model: 1 problem\n");
  CHECK_HAS(msg, "tensor 'layers.0.self_attn.qkv_proj.weight' (Hugging Face name "
                 "'model.layers.0.self_attn.qkv_proj.weight') in '" + shard_name(2, 3) +
                 "' has shape [48, 16], but the model expects [16, 48]");
}

TEST_CASE("check() names the tensor, its file, and both dtypes for a wrong dtype") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path);
  auto expected = expectations_of(src);
  for (auto& e : expected)
    if (e.name == "model.embed_tokens.weight") e.dtype = at::kBFloat16;
  const std::string msg = weight_error([&] { src.check(expected); });
  CHECK_HAS(msg, "1 problem\n");
  CHECK_HAS(msg, "tensor 'model.embed_tokens.weight' in '" + shard_name(3, 3) +
                 "' has dtype Float, but the model expects BFloat16");
  CHECK(msg.find("Hugging Face name") == std::string::npos);  // no rename: not repeated
}

TEST_CASE("check() reports a tensor the model expects that the checkpoint lacks") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path, strip_model_skip_rotary);
  auto expected = expectations_of(src);
  expected.push_back({"layers.2.mlp.down_proj.weight", {8, 16}, at::kBFloat16});
  const std::string msg = weight_error([&] { src.check(expected); });
  CHECK_HAS(msg, "1 problem\n");
  CHECK_HAS(msg, "tensor 'layers.2.mlp.down_proj.weight' (shape [8, 16], dtype BFloat16) is expected "
                 "by the model, but the checkpoint lacks it");
}

TEST_CASE("check() reports a tensor the checkpoint has that the model does not expect") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path, strip_model_skip_rotary);
  auto expected = expectations_of(src);
  std::erase_if(expected, [](const auto& e) { return e.name == "lm_head.weight"; });
  const std::string msg = weight_error([&] { src.check(expected); });
  CHECK_HAS(msg, "1 problem\n");
  CHECK_HAS(msg, "tensor 'lm_head.weight' in '" + shard_name(3, 3) +
                 "' is in the checkpoint, but the model does not expect it");
  // Skipped tensors are not in the checkpoint as far as check() is concerned.
  CHECK(msg.find("inv_freq") == std::string::npos);
}

TEST_CASE("check() lists every kind of problem, ten at most, then how many more") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path);
  std::vector<gk::ExpectedTensor> expected = expectations_of(src);
  expected[0].shape = {1};                          // shape
  expected[1].dtype = at::kDouble;                  // dtype
  expected.push_back(expected[2]);                  // listed twice
  expected.erase(expected.begin() + 3);             // unexpected
  for (int i = 0; i < 10; ++i) expected.push_back({"extra." + std::to_string(i), {2}, at::kFloat});  // missing
  const std::string msg = weight_error([&] { src.check(expected); });
  CHECK_HAS(msg, "does not match the model: 14 problems\n");
  CHECK_HAS(msg, "has shape [8, 16], but the model expects [1]");
  CHECK_HAS(msg, "has dtype Float, but the model expects Double");
  CHECK_HAS(msg, "extra.6");
  CHECK(msg.find("extra.7") == std::string::npos);  // beyond the tenth
  CHECK(msg.ends_with("\n  and 4 more"));
  CHECK_HAS(msg, "the model's expectations list tensor '" + ck.names()[2] + "' twice");
  // Exactly ten: all listed, no "more".
  REQUIRE(ck.names().size() == 10);
  const std::string ten = weight_error([&] { src.check({}); });
  CHECK_HAS(ten, "does not match the model: 10 problems\n");
  CHECK_HAS(ten, "tensor '" + ck.names()[9] + "' in '" + shard_name(3, 3) + "' is in the checkpoint");
  CHECK(ten.find("more") == std::string::npos);
}

// ---------------------------------------------------------------------------
// Refused at construction
// ---------------------------------------------------------------------------

TEST_CASE("refused: a directory with neither model.safetensors nor the index") {
  TempDir dir;
  dir.write("pytorch_model.bin", "not read");
  std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": the directory has neither model.safetensors nor "
                 "model.safetensors.index.json");
  msg = weight_error([&] { gk::HfCheckpointSource src(dir.file("absent")); });
  CHECK_HAS(msg, "Hugging Face checkpoint '" + dir.file("absent") + "': cannot open the directory");
  gk::write_safetensors(dir.file("model.safetensors"), {{"w", at::ones({2})}});
  msg = weight_error([&] { gk::HfCheckpointSource src(dir.file("model.safetensors")); });
  CHECK_HAS(msg, "model.safetensors': not a directory");
}

TEST_CASE("refused: a directory with both model.safetensors and the index") {
  TempDir dir;
  const Sharded ck(dir);
  gk::write_safetensors(dir.file("model.safetensors"), {{"w", at::ones({2})}});
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": the directory has both model.safetensors and "
                 "model.safetensors.index.json; which one is the checkpoint is ambiguous");
}

TEST_CASE("refused: an index that is not valid JSON") {
  TempDir dir;
  gk::write_safetensors(dir.file(shard_name(1, 1)), {{"w", at::ones({2})}});
  const std::string label = hf_label(dir) + ": index 'model.safetensors.index.json': ";
  dir.write("model.safetensors.index.json", "{\"weight_map\": {\"w\": \"" + shard_name(1, 1) + "\"");
  CHECK_HAS(weight_error([&] { gk::HfCheckpointSource src(dir.path); }), label + "it is not valid JSON (");
  dir.write("model.safetensors.index.json", "");
  CHECK_HAS(weight_error([&] { gk::HfCheckpointSource src(dir.path); }), label + "it is not valid JSON (");
  dir.write("model.safetensors.index.json", std::string("{}\0{\"weight_map\":{}}", 20));
  CHECK_HAS(weight_error([&] { gk::HfCheckpointSource src(dir.path); }), label + "it is not valid JSON (a NUL byte");
  dir.write("model.safetensors.index.json", "[\"weight_map\"]");
  CHECK_HAS(weight_error([&] { gk::HfCheckpointSource src(dir.path); }), label + "it is JSON but not an object (it is array)");
  dir.write("model.safetensors.index.json", std::string(100000, '[') + std::string(100000, ']'));
  CHECK_HAS(weight_error([&] { gk::HfCheckpointSource src(dir.path); }),
            label + "it nests arrays or objects deeper than 127 levels");
}

TEST_CASE("refused: an index without a weight_map object of file names") {
  TempDir dir;
  gk::write_safetensors(dir.file(shard_name(1, 1)), {{"w", at::ones({2})}});
  const std::string label = hf_label(dir) + ": index 'model.safetensors.index.json': ";
  auto error_for = [&](const std::string& text) {
    dir.write("model.safetensors.index.json", text);
    return weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  };
  CHECK_HAS(error_for("{\"metadata\": {\"total_size\": 8}}"), label + "it has no \"weight_map\"");
  CHECK_HAS(error_for("{\"weight_map\": [\"w\"]}"), label + "\"weight_map\" is a JSON array, not an object");
  CHECK_HAS(error_for("{\"weight_map\": {}}"), label + "\"weight_map\" lists no tensors");
  CHECK_HAS(error_for("{\"weight_map\": {\"w\": 1}}"), label + "\"weight_map\" gives tensor 'w' the file 1, not a file name");
  CHECK_HAS(error_for("{\"weight_map\": {\"w\": \"\"}}"), label + "\"weight_map\" gives tensor 'w' an empty file name");
  CHECK_HAS(error_for("{\"metadata\": 3, \"weight_map\": {\"w\": \"" + shard_name(1, 1) + "\"}}"),
            label + "\"metadata\" is a JSON number, not an object");
}

TEST_CASE("refused: a shard the index names but the directory lacks") {
  TempDir dir;
  const Sharded ck(dir);
  ::unlink(dir.file(shard_name(2, 3)).c_str());
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": shard '" + shard_name(2, 3) + "' that the index names (for tensor '" +
                     "model.layers.0.flag' and others it lists there) is missing from the directory");
}

TEST_CASE("refused: a shard that is not a valid safetensors file, named by its path") {
  TempDir dir;
  const Sharded ck(dir);
  dir.write(shard_name(3, 3), "garbage");
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, "safetensors file '" + dir.file(shard_name(3, 3)) + "': the file is 7 bytes");
}

TEST_CASE("refused: a tensor the index lists that its shard lacks") {
  TempDir dir;
  const Sharded ck(dir);
  auto wm = ck.weight_map;
  wm.emplace_back("model.layers.0.mlp.up_proj.weight", shard_name(2, 3));
  dir.write("model.safetensors.index.json", index_json(wm));
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": the index lists tensor 'model.layers.0.mlp.up_proj.weight' in shard '" +
                     shard_name(2, 3) + "', but the shard lacks it");
}

TEST_CASE("refused: a tensor in a shard that the index does not list") {
  TempDir dir;
  const Sharded ck(dir);
  auto wm = ck.weight_map;
  std::erase_if(wm, [](const auto& kv) { return kv.first == "model.norm.weight"; });
  dir.write("model.safetensors.index.json", index_json(wm));
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": shard '" + shard_name(1, 3) +
                     "' holds tensor 'model.norm.weight', which the index does not list");
}

TEST_CASE("refused: a tensor in a shard that the index lists under another file") {
  TempDir dir;
  const Sharded ck(dir);
  auto wm = ck.weight_map;
  for (auto& [name, file] : wm)
    if (name == "lm_head.weight") file = shard_name(1, 3);
  dir.write("model.safetensors.index.json", index_json(wm));
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": tensor 'lm_head.weight' is in shard '" + shard_name(3, 3) +
                     "' but the index lists it under '" + shard_name(1, 3) + "'");
}

TEST_CASE("refused: a tensor name listed twice in the index") {
  TempDir dir;
  const Sharded ck(dir);
  auto wm = ck.weight_map;
  wm.emplace_back("model.norm.weight", shard_name(1, 3));  // the same entry again
  dir.write("model.safetensors.index.json", index_json(wm));
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": index 'model.safetensors.index.json': \"weight_map\" lists tensor "
                 "'model.norm.weight' twice (duplicate key)");
}

TEST_CASE("refused: a tensor stored in two shards") {
  TempDir dir;
  const at::Tensor a = at::ones({2}), b = at::zeros({2});
  gk::write_safetensors(dir.file(shard_name(1, 2)), {{"w", a}, {"x", a}});
  gk::write_safetensors(dir.file(shard_name(2, 2)), {{"w", b}, {"y", b}});
  dir.write("model.safetensors.index.json",
            index_json({{"w", shard_name(2, 2)}, {"x", shard_name(1, 2)}, {"y", shard_name(2, 2)}}));
  const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
  CHECK_HAS(msg, hf_label(dir) + ": tensor 'w' appears in 2 shards ('" + shard_name(1, 2) + "' and '" +
                     shard_name(2, 2) + "'); each tensor may appear once");
}

TEST_CASE("refused: two Hugging Face names renamed to the same engine name") {
  TempDir dir;
  const Sharded ck(dir);
  const std::string msg = weight_error([&] {
    gk::HfCheckpointSource src(dir.path, [](std::string_view hf) -> std::string {
      return hf.ends_with("down_proj.weight") ? "down_proj.weight" : std::string(hf);
    });
  });
  CHECK_HAS(msg, hf_label(dir) + ": tensors 'model.layers.1.mlp.down_proj.weight' (in '" + shard_name(1, 3) +
                     "') and 'model.layers.0.mlp.down_proj.weight' (in '" + shard_name(2, 3) +
                     "') are both renamed to 'down_proj.weight'");
}

TEST_CASE("refused: a file name in the index that escapes the directory") {
  TempDir dir, outside;
  gk::write_safetensors(outside.file("x.safetensors"), {{"w", at::ones({2})}});
  const std::string rel = "../" + outside.path.substr(outside.path.rfind('/') + 1) + "/x.safetensors";
  for (const std::string& file : {rel, outside.file("x.safetensors"), std::string("sub/x.safetensors"),
                                  std::string(".."), std::string("model..safetensors")}) {
    INFO("file name " << file);
    dir.write("model.safetensors.index.json", index_json({{"w", file}}));
    const std::string msg = weight_error([&] { gk::HfCheckpointSource src(dir.path); });
    CHECK_HAS(msg, hf_label(dir) + ": index 'model.safetensors.index.json': \"weight_map\" puts tensor 'w' "
                   "in file '" + file + "', which is not a plain file name in the checkpoint directory");
  }
}

TEST_CASE("a shard rewritten after construction is refused while streaming") {
  TempDir dir;
  const Sharded ck(dir);
  gk::HfCheckpointSource src(dir.path);
  for (std::size_t i = 0; i < ck.shards[0].size(); ++i) REQUIRE(src.next().has_value());
  auto changed = ck.shards[1];
  changed[0].value = at::ones({16, 8}, at::kBFloat16);  // transposed shape
  gk::write_safetensors(dir.file(shard_name(2, 3)), changed);
  const std::string msg = weight_error([&] { (void)src.next(); });
  CHECK_HAS(msg, hf_label(dir) + ": shard '" + shard_name(2, 3) + "' changed since the checkpoint was opened");
}
