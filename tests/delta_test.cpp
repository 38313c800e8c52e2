// Weight patches (graphkeep/delta/): make_patch -> apply_patch reproducing the
// target bitwise at densities 0, one element, 1%, 50% and 100% for every
// dtype; the file round trip; every bad patch refused with the patch and the
// tensor named and nothing written (in place: rolled back bitwise); bad patch
// files; the non-finite values a patch writes (non_finite_values). The suite
// "gpu delta" makes and applies patches on the device (test_delta_gpu, label
// gpu). tests/delta_interop.py covers the gk-patch tool
// and the Python `safetensors` package both ways.
#include "gk_test.h"
#include "temp_dir.h"

#include <graphkeep/delta/apply_patch.h>
#include <graphkeep/delta/detail/word_diff.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/non_finite.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/sum64.h>
#include <graphkeep/sources/safetensors_source.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <random>
#include <string>
#include <vector>

namespace {

using gk::testing::TempDir;

at::ScalarType int_of(std::size_t itemsize) {
  return itemsize == 1 ? at::kByte : itemsize == 2 ? at::kShort : itemsize == 4 ? at::kInt : at::kLong;
}

// A tensor's elements as integers of its element size (a flat copy).
at::Tensor bits(const at::Tensor& t) {
  return t.contiguous().reshape(-1).view(int_of(t.element_size())).cpu();
}

bool bits_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(bits(a), bits(b));
}

// Random bit patterns (NaNs and all) of `type`.
at::Tensor random_tensor(at::ScalarType type, std::vector<std::int64_t> shape, at::Generator& g) {
  if (type == at::kBool) return at::randint(0, 2, shape, g, at::TensorOptions(at::kByte)).to(at::kBool);
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  const auto itemsize = static_cast<std::int64_t>(c10::elementSize(type));
  return at::randint(0, 256, {n * itemsize}, g, at::TensorOptions(at::kByte)).view(type).reshape(shape);
}

// `base` with `count` random elements changed to other bits; the changed
// flat positions, ascending.
std::pair<at::Tensor, std::vector<std::int64_t>> change(const at::Tensor& base, std::int64_t count, at::Generator& g) {
  const at::Tensor pos = std::get<0>(at::randperm(base.numel(), g, at::TensorOptions(at::kLong)).narrow(0, 0, count).sort());
  at::Tensor b = bits(base).clone();
  // XOR with 1..255 (bool: 1) flips at least one bit of the low byte.
  const at::Tensor flip = base.scalar_type() == at::kBool
                              ? at::ones({count}, b.options())
                              : at::randint(1, 256, {count}, g, at::TensorOptions(at::kLong)).to(b.scalar_type());
  b.index_put_({pos}, at::bitwise_xor(b.index({pos}), flip));
  std::vector<std::int64_t> positions(pos.const_data_ptr<std::int64_t>(), pos.const_data_ptr<std::int64_t>() + count);
  return {b.view(base.scalar_type()).reshape(base.sizes()), positions};
}

std::vector<std::int64_t> as_vector(const at::Tensor& idx) {
  const at::Tensor l = idx.to(at::kCPU, at::kLong).contiguous();
  return {l.const_data_ptr<std::int64_t>(), l.const_data_ptr<std::int64_t>() + l.numel()};
}

// Deep copies, to compare against after a refusal.
std::vector<gk::NamedTensor> clone_all(const std::vector<gk::NamedTensor>& ts) {
  std::vector<gk::NamedTensor> out;
  for (const auto& t : ts) out.push_back({t.name, t.value.clone(), t.shard});
  return out;
}
bool all_bits_equal(const std::vector<gk::NamedTensor>& a, const std::vector<gk::NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || !bits_equal(a[i].value, b[i].value)) return false;
  return true;
}

// A small model: three tensors, and a target in which two of them changed.
struct Weights {
  std::vector<gk::NamedTensor> base, target;
};
Weights small_model(std::uint64_t seed = 1) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  Weights w;
  w.base = {{"layers.0.mlp.weight", random_tensor(at::kBFloat16, {64, 48}, g)},
            {"layers.0.norm.weight", random_tensor(at::kFloat, {48}, g)},
            {"embed.weight", random_tensor(at::kBFloat16, {100, 48}, g)}};
  w.target = clone_all(w.base);
  w.target[0].value = change(w.base[0].value, 30, g).first;
  w.target[2].value = change(w.base[2].value, 7, g).first;
  return w;
}

gk::Patch small_patch(const Weights& w) {
  return gk::make_patch(w.base, w.target, {.base_version = "v1", .target_version = "v2"});
}

// The message of the gk::WeightError `f` throws ("" when none).
template <class F>
std::string weight_error(F&& f) {
  return gk::testing::message_of<gk::WeightError>(std::forward<F>(f));
}

// `patch` is refused with a message naming its label, the tensor and
// `needle`, by validate_patch, apply_patch (inputs untouched) and
// apply_patch_in_place (tensors bitwise as before).
void check_refused(const gk::Patch& patch, const std::vector<gk::NamedTensor>& tensors, const std::string& tensor,
                   const std::string& needle) {
  const std::vector<gk::NamedTensor> before = clone_all(tensors);
  for (int mode = 0; mode < 2; ++mode) {
    const std::string msg = weight_error([&] {
      if (mode == 0) (void)gk::apply_patch(patch, tensors);
      else gk::apply_patch_in_place(patch, tensors);
    });
    INFO((mode == 0 ? "apply_patch" : "apply_patch_in_place") << ": " << msg);
    CHECK(msg.find(patch.label) != std::string::npos);
    if (!tensor.empty()) CHECK(msg.find("'" + tensor + "'") != std::string::npos);
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(all_bits_equal(tensors, before));
  }
}

// A hand-made patch whose entries write NaN and infinities in every way the
// dtypes allow (non_finite_values' cases), sorted by name; and what
// non_finite_values must find in each entry, in order.
struct NonFiniteCase {
  gk::Patch patch;
  std::vector<gk::NonFiniteValues> want;
};
NonFiniteCase non_finite_patch() {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto sparse = [](std::string name, std::int64_t numel, std::vector<std::int64_t> idx, at::Tensor values) {
    gk::PatchEntry e;
    e.name = std::move(name);
    e.shape = {numel};
    e.dtype = values.scalar_type();
    e.indices = at::tensor(idx, at::kLong).to(at::kInt);
    e.values = std::move(values);
    return e;
  };
  NonFiniteCase c;
  c.patch.label = "test patch";
  auto& es = c.patch.entries;
  // bf16, sparse: NaN at position 1 (element 7), -inf at position 3 (element 20).
  es.push_back(sparse("a.bf16", 32, {3, 7, 10, 20}, at::tensor({1.0, nan, 2.0, -inf}, at::kDouble).to(at::kBFloat16)));
  c.want.push_back({2, 7, nan});
  // float32, dense [2, 3]: -inf at element 2, NaN at element 4, +inf at element 5.
  gk::PatchEntry dense;
  dense.name = "b.f32";
  dense.shape = {2, 3};
  dense.dtype = at::kFloat;
  dense.encoding = gk::PatchEncoding::dense;
  dense.values = at::tensor({1.0, 2.0, -inf, 4.0, nan, inf}, at::kDouble).to(at::kFloat).reshape({2, 3});
  es.push_back(dense);
  c.want.push_back({3, 2, -inf});
  // float8_e4m3fn has no infinity; S.1111.111 is NaN, both signs: 1.0 (0x38),
  // -NaN (0xFF), NaN (0x7F), 448 (0x7E, the largest finite) at elements 2, 5, 9, 11.
  es.push_back(sparse("c.f8e4m3", 16, {2, 5, 9, 11},
                      at::tensor({0x38, 0xFF, 0x7F, 0x7E}, at::kByte).view(at::kFloat8_e4m3fn)));
  c.want.push_back({2, 5, -nan});
  // float8_e5m2: 1.0 (0x3C) and -inf (0xFC) at elements 0 and 4.
  es.push_back(sparse("d.f8e5m2", 8, {0, 4}, at::tensor({0x3C, 0xFC}, at::kByte).view(at::kFloat8_e5m2)));
  c.want.push_back({1, 4, -inf});
  // int32: the bits of +inf and NaN as float32 are plain integers here.
  es.push_back(sparse("e.i32", 8, {1, 2, 3},
                      at::tensor({0x7F800000, 0x7FC00000, static_cast<std::int32_t>(0xFF800000)}, at::kInt)));
  c.want.push_back({});
  // An entry that stores nothing (it only pins a base hash).
  es.push_back(sparse("f.empty", 8, {}, at::empty({0}, at::kBFloat16)));
  c.want.push_back({});
  // Finite floating-point values, the largest ones included.
  es.push_back(sparse("g.finite", 8, {0, 1, 7},
                      at::tensor({0.0, -3.0e38, 3.0e38}, at::kDouble).to(at::kFloat)));
  c.want.push_back({});
  return c;
}

}  // namespace

TEST_SUITE("delta") {

TEST_CASE("non_finite_values: per entry, the count and the first NaN or infinity, at its element") {
  const NonFiniteCase c = non_finite_patch();
  gk::validate_patch(c.patch);  // a well-formed patch
  const std::vector<gk::NonFiniteValues> got = gk::non_finite_values(c.patch);
  REQUIRE(got.size() == c.want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const gk::NonFiniteValues &g = got[k], &w = c.want[k];
    INFO("entry " << c.patch.entries[k].name << ": count " << g.count << ", first " << g.first_value
                  << " at element " << g.first_element);
    CHECK(g.count == w.count);
    CHECK(g.first_element == w.first_element);
    // The same value, NaN's sign included (0xFF in float8_e4m3fn is a negative NaN).
    CHECK(std::isnan(g.first_value) == std::isnan(w.first_value));
    CHECK(std::signbit(g.first_value) == std::signbit(w.first_value));
    if (!std::isnan(w.first_value)) CHECK(g.first_value == w.first_value);
  }
  // The element is the index written to, not the position among the values.
  CHECK(got[0].first_element != 1);
  // No entries, no answers.
  CHECK(gk::non_finite_values(gk::Patch{}).empty());
  // An entry whose indices and values disagree is refused, not read past its end.
  gk::Patch bad = c.patch;
  bad.entries[0].indices = bad.entries[0].indices.narrow(0, 0, 2);
  CHECK(weight_error([&] { (void)gk::non_finite_values(bad); })
            .find("test patch: tensor 'a.bf16': 2 indices but 4 values") != std::string::npos);
}

TEST_CASE("the device count's word arithmetic: changed elements and both hashes from one read of each word") {
  // The count kernel (delta/cuda/changed_elements.cu) reads 8-byte words of
  // the base and the target; per word it counts the changed elements with
  // changed_lanes and adds both hashes' terms. The same arithmetic here,
  // against at::ne and gk::content_hash.
  namespace s64 = gk::detail::sum64;
  at::Generator g = at::detail::createCPUGenerator(41);
  for (const at::ScalarType dtype : {at::kByte, at::kBFloat16, at::kFloat, at::kLong}) {
    for (const std::int64_t numel : {1, 3, 7, 8, 9, 1000, 4099}) {
      INFO("dtype " << dtype << " numel " << numel);
      const std::int64_t e = static_cast<std::int64_t>(c10::elementSize(dtype));
      const at::Tensor base = at::randint(0, 256, {numel * e}, g, at::kByte).view(dtype);
      at::Tensor target = base.clone();
      at::Tensor bytes = target.view(at::kByte);
      for (std::int64_t i = 0; i < numel; i += 3) {  // every third element: one flipped bit, in any of its bytes
        const std::int64_t at_byte = i * e + (i / 3) % e;
        bytes[at_byte] = bytes[at_byte].item<int>() ^ (1 << (i % 8));
      }
      const auto* b = static_cast<const unsigned char*>(base.const_data_ptr());
      const auto* t = static_cast<const unsigned char*>(target.const_data_ptr());
      const std::uint64_t n = static_cast<std::uint64_t>(numel * e);
      std::int64_t count = 0;
      std::uint64_t hb = s64::length_term(n), ht = s64::length_term(n);
      for (std::uint64_t j = 0; j < s64::words_of(n); ++j) {
        const std::uint64_t wb = s64::word_at(b, n, j, s64::HostLoad{}), wt = s64::word_at(t, n, j, s64::HostLoad{});
        count += gk::detail::changed_lanes(wb ^ wt, static_cast<int>(e));
        hb += s64::word_term(wb, j);
        ht += s64::word_term(wt, j);
      }
      const at::Tensor bits_b = base.view(at::kByte).view({numel, e}), bits_t = target.view(at::kByte).view({numel, e});
      CHECK(count == at::ne(bits_b, bits_t).any(1).sum().item<std::int64_t>());
      CHECK(count == (numel + 2) / 3);
      CHECK(hb == gk::content_hash(base));
      CHECK(ht == gk::content_hash(target));
    }
  }
  // Every lane position and width: one changed bit anywhere in a lane counts once.
  for (int e : {1, 2, 4, 8})
    for (int bit = 0; bit < 64; ++bit) {
      CHECK(gk::detail::changed_lanes(std::uint64_t{1} << bit, e) == 1);
      CHECK(gk::detail::changed_lanes(~std::uint64_t{0}, e) == 8 / e);
      CHECK(gk::detail::changed_lanes(0, e) == 0);
    }
}

TEST_CASE("make_patch -> apply_patch reproduces the target bitwise at every density and dtype") {
  const std::vector<at::ScalarType> dtypes = {at::kBFloat16, at::kHalf, at::kFloat, at::kDouble,
                                              at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kByte, at::kChar,
                                              at::kShort, at::kInt, at::kLong, at::kBool};
  at::Generator g = at::detail::createCPUGenerator(3);
  TempDir dir("gk_delta");
  REQUIRE(!dir.path.empty());
  int cases = 0;
  for (const at::ScalarType dtype : dtypes) {
    const std::vector<std::int64_t> shape = {37, 129};
    const std::int64_t numel = 37 * 129;
    for (const std::int64_t count : {std::int64_t{0}, std::int64_t{1}, numel / 100, numel / 2, numel}) {
      INFO("dtype " << dtype << ", " << count << " of " << numel << " elements changed");
      const at::Tensor base = random_tensor(dtype, shape, g);
      const auto [target, positions] = change(base, count, g);
      const at::Tensor other = random_tensor(at::kFloat, {5}, g);  // never changes
      const std::vector<gk::NamedTensor> b = {{"w", base}, {"other", other}};
      const std::vector<gk::NamedTensor> t = {{"w", target}, {"other", other.clone()}};
      const gk::Patch p = gk::make_patch(b, t, {.base_version = "a", .target_version = "b"});
      CHECK(p.base_version == "a");
      CHECK(p.target_version == "b");
      gk::validate_patch(p);
      if (count == 0) {
        CHECK(p.entries.empty());
      } else {
        REQUIRE(p.entries.size() == 1);
        const gk::PatchEntry& e = p.entries[0];
        CHECK(e.name == "w");
        CHECK(e.shape == shape);
        CHECK((e.dtype == dtype));
        CHECK((e.count() == (e.encoding == gk::PatchEncoding::dense ? numel : count)));
        // Sparse unless indices (int32) and values would outweigh the tensor.
        const auto itemsize = static_cast<std::int64_t>(c10::elementSize(dtype));
        const bool dense = count * (4 + itemsize) > numel * itemsize;
        CHECK((e.encoding == (dense ? gk::PatchEncoding::dense : gk::PatchEncoding::sparse)));
        if (!dense) {
          CHECK((e.indices.scalar_type() == at::kInt));
          CHECK(as_vector(e.indices) == positions);
          CHECK(bits_equal(e.values, target.reshape(-1).index_select(0, at::tensor(positions, at::kLong))));
          CHECK(e.payload_bytes() == static_cast<std::size_t>(count * (4 + itemsize)));
        }
        CHECK(e.base_hash == gk::content_hash(base));
        CHECK(e.target_hash == gk::content_hash(target));
      }
      // Out of place, in place, and through a file.
      const std::vector<gk::NamedTensor> out = gk::apply_patch(p, b);
      CHECK(bits_equal(out[0].value, target));
      CHECK(out[1].value.is_same(other));  // untouched: the same tensor
      CHECK(bits_equal(b[0].value, base));  // the input is not written
      const std::string path = dir.file("p.safetensors");  // replaced each case (a rename)
      gk::write_patch(path, p);
      const gk::Patch q = gk::read_patch(path);
      std::vector<gk::NamedTensor> in_place = clone_all(b);
      gk::apply_patch_in_place(q, in_place);
      CHECK(bits_equal(in_place[0].value, target));
      CHECK(bits_equal(in_place[1].value, other));
      ++cases;
    }
  }
  CHECK(cases == 60);
}

TEST_CASE("a change is a change of bits: -0.0, NaN payloads") {
  const at::Tensor base = at::tensor({0x00000000, 0x7FC00000, 0x3F800000, 0x7FC00001}, at::kInt).view(at::kFloat);
  const at::Tensor target = at::tensor({static_cast<std::int32_t>(0x80000000), 0x7FC00002, 0x3F800000, 0x7FC00001},
                                       at::kInt)
                                .view(at::kFloat);
  const gk::Patch p = gk::make_patch({{"x", base}}, {{"x", target}}, {.encoding = gk::MakePatchOptions::Encoding::sparse});
  REQUIRE(p.entries.size() == 1);
  // 0.0 -> -0.0 and one NaN -> another changed; 1.0 and the same NaN did not.
  CHECK(as_vector(p.entries[0].indices) == std::vector<std::int64_t>{0, 1});
  const auto out = gk::apply_patch(p, {{"x", base}});
  CHECK(bits_equal(out[0].value, target));
  // Negative: a numeric comparison gets both wrong (0.0 == -0.0; NaN != NaN).
  CHECK_FALSE(at::ne(base[0], target[0]).item<bool>());
  CHECK(at::ne(base[3], target[3]).item<bool>());
  // The same NaN bits are no change.
  CHECK(gk::make_patch({{"x", base}}, {{"x", base.clone()}}).entries.empty());
}

TEST_CASE("a patch file round trips, and any safetensors reader sees its format") {
  const Weights w = small_model();
  gk::Patch p = gk::make_patch(w.base, w.target, {.base_version = "step-41", .target_version = "step-42",
                                                  .record_unchanged = true});
  REQUIRE(p.entries.size() == 3);
  TempDir dir("gk_delta");
  const std::string path = dir.file("step-42.safetensors");
  gk::write_patch(path, p);
  const gk::Patch q = gk::read_patch(path);
  CHECK(q.label == "patch file '" + path + "'");
  CHECK(q.version == 1);
  CHECK(q.base_version == "step-41");
  CHECK(q.target_version == "step-42");
  REQUIRE(q.entries.size() == p.entries.size());
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const gk::PatchEntry &a = p.entries[i], &b = q.entries[i];
    CHECK(a.name == b.name);
    CHECK(a.shape == b.shape);
    CHECK((a.dtype == b.dtype));
    CHECK((a.encoding == b.encoding));
    CHECK(a.base_hash == b.base_hash);
    CHECK(a.target_hash == b.target_hash);
    CHECK(bits_equal(a.indices, b.indices));
    CHECK(bits_equal(a.values, b.values));
  }
  CHECK(q.find("layers.0.norm.weight")->count() == 0);  // unchanged, recorded
  CHECK(q.find("missing") == nullptr);
  // The file as the safetensors layer reads it: suffixed tensors, the header in "gk_patch".
  gk::SafetensorsSource src(path);
  std::vector<std::string> names;
  for (const auto& e : src.entries()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"embed.weight::indices", "embed.weight::values",
                                          "layers.0.mlp.weight::indices", "layers.0.mlp.weight::values",
                                          "layers.0.norm.weight::indices", "layers.0.norm.weight::values"});
  REQUIRE(src.metadata().count("gk_patch") == 1);
  const std::string& header = src.metadata().at("gk_patch");
  CHECK(header.find("\"format\":\"gk-patch\"") != std::string::npos);
  CHECK(header.find("\"hash\":\"gk-sum64 v1\"") != std::string::npos);
  CHECK(header.find("\"base_hash\":\"" + gk::format_content_hash(p.entries[0].base_hash) + "\"") != std::string::npos);
  // The patch pins the unchanged tensor too: applied to another norm weight, refused.
  std::vector<gk::NamedTensor> other = clone_all(w.base);
  other[1].value[0] = 5.0f;
  check_refused(q, other, "layers.0.norm.weight", "base hash is");
}

TEST_CASE("the index dtype follows the element count: int32 below 2^31, int64 from there") {
  CHECK((gk::patch_index_dtype(0) == at::kInt));
  CHECK((gk::patch_index_dtype((std::int64_t{1} << 31) - 1) == at::kInt));
  CHECK((gk::patch_index_dtype(std::int64_t{1} << 31) == at::kLong));
  gk::Patch p;
  p.label = "test patch";
  gk::PatchEntry e;
  e.name = "huge";
  e.shape = {std::int64_t{1} << 31};  // 2 GiB of bytes: only the entry exists
  e.dtype = at::kByte;
  e.indices = at::tensor({std::int64_t{0}, std::int64_t{5}, (std::int64_t{1} << 31) - 1}, at::kLong);
  e.values = at::tensor({1, 2, 3}, at::kByte);
  p.entries = {e};
  gk::validate_patch(p);
  CHECK(p.entries[0].count() == 3);
  p.entries[0].indices = e.indices.to(at::kInt);
  CHECK(weight_error([&] { gk::validate_patch(p); }).find("takes int64 indices") != std::string::npos);
  p.entries[0].shape = {100};
  p.entries[0].indices = at::tensor({0, 5, 99}, at::kLong);
  CHECK(weight_error([&] { gk::validate_patch(p); }).find("tensor 'huge' (shape [100], Byte): the indices are Long; a tensor of 100 elements takes int32") != std::string::npos);
}

TEST_CASE("bad patches are refused before anything is written, naming the patch and the tensor") {
  const Weights w = small_model();
  const gk::Patch good = small_patch(w);
  REQUIRE(good.entries.size() == 2);  // embed.weight, layers.0.mlp.weight
  REQUIRE(good.entries[1].encoding == gk::PatchEncoding::sparse);
  // Positive: the good patch applies.
  CHECK(all_bits_equal(gk::apply_patch(good, w.base), w.target));

  auto with = [&](auto edit) {
    gk::Patch p = good;
    for (auto& e : p.entries) {  // the edits must not reach `good`
      if (e.indices.defined()) e.indices = e.indices.clone();
      e.values = e.values.clone();
    }
    edit(p);
    return p;
  };
  const std::string mlp = "layers.0.mlp.weight";
  SUBCASE("unknown name") {
    gk::Patch p = with([](gk::Patch& q) { q.entries[1].name = "layers.0.mlp.weight_typo"; });
    check_refused(p, w.base, "layers.0.mlp.weight_typo", "is not among the 3 tensors");
  }
  SUBCASE("index out of range, above and below") {
    check_refused(with([](gk::Patch& q) { q.entries[1].indices[-1] = 64 * 48; }), w.base, mlp,
                  "index 3072 is out of range [0, 3072)");
    check_refused(with([](gk::Patch& q) { q.entries[1].indices[0] = -1; }), w.base, mlp,
                  "index -1 is out of range [0, 3072)");
  }
  SUBCASE("duplicate index") {
    check_refused(with([](gk::Patch& q) { q.entries[1].indices[3] = q.entries[1].indices[2]; }), w.base, mlp,
                  "appears twice (positions 2 and 3)");
  }
  SUBCASE("unsorted indices") {
    gk::Patch p = with([](gk::Patch& q) {
      const at::Tensor i = q.entries[1].indices;
      const at::Tensor a = i[4].clone();
      i[4] = i[5].item<int>();
      i[5] = a.item<int>();
    });
    check_refused(p, w.base, mlp, "at position 5 follows");
  }
  SUBCASE("values and indices of different lengths") {
    check_refused(with([](gk::Patch& q) { q.entries[1].values = q.entries[1].values.narrow(0, 0, 29); }), w.base, mlp,
                  "30 indices but 29 values");
  }
  SUBCASE("dtype disagreeing: the values, and the tensor patched") {
    check_refused(with([](gk::Patch& q) { q.entries[1].values = q.entries[1].values.to(at::kHalf); }), w.base, mlp,
                  "the values are Half; they must be the tensor's dtype");
    std::vector<gk::NamedTensor> f32 = clone_all(w.base);
    f32[0].value = f32[0].value.to(at::kFloat);
    check_refused(good, f32, mlp, "is Float [64, 48] but the patch is for BFloat16 [64, 48]");
  }
  SUBCASE("shape disagreeing") {
    std::vector<gk::NamedTensor> other = clone_all(w.base);
    other[0].value = other[0].value.reshape({48, 64});
    check_refused(good, other, mlp, "is BFloat16 [48, 64] but the patch is for BFloat16 [64, 48]");
    check_refused(with([](gk::Patch& q) { q.entries[1].shape = {48, 64}; }), w.base, mlp,
                  "is BFloat16 [64, 48] but the patch is for BFloat16 [48, 64]");
  }
  SUBCASE("base hash mismatch") {
    const Weights other = small_model(2);  // same names and shapes, other values
    check_refused(good, other.base, "embed.weight", "(the patch was made from other weights: apply it to version 'v1')");
  }
  SUBCASE("target hash mismatch: one value wrong") {
    gk::Patch p = with([](gk::Patch& q) {
      at::Tensor v = q.entries[1].values.view(at::kShort);
      v[7] = v[7].item<int>() ^ 1;
    });
    check_refused(p, w.base, mlp, "after the patch its content hash is");
    // The first entry (embed.weight) was applied before the second failed, and rolled back.
    std::vector<gk::NamedTensor> t = clone_all(w.base);
    CHECK(weight_error([&] { gk::apply_patch_in_place(p, t); }).find(mlp) != std::string::npos);
    CHECK(all_bits_equal(t, w.base));
    // Negative: without the target check the wrong value goes through.
    gk::apply_patch_in_place(p, t, {.verify_target = false});
    CHECK_FALSE(all_bits_equal(t, w.target));
  }
  SUBCASE("format version, entry order, names") {
    check_refused(with([](gk::Patch& q) { q.version = 2; }), w.base, "", "format version 2; this graphkeep reads version 1");
    check_refused(with([](gk::Patch& q) { std::swap(q.entries[0], q.entries[1]); }), w.base, "embed.weight",
                  "comes after 'layers.0.mlp.weight'; entries are sorted by name");
    check_refused(with([](gk::Patch& q) { q.entries[0].name = q.entries[1].name; }), w.base, mlp, "has two entries");
    check_refused(with([](gk::Patch& q) { q.entries[0].name = "embed::weight"; }), w.base, "embed::weight",
                  "may not contain \"::\"");
  }
  SUBCASE("a dense entry of the wrong shape") {
    gk::Patch p = gk::make_patch(w.base, w.target, {.encoding = gk::MakePatchOptions::Encoding::dense});
    CHECK(all_bits_equal(gk::apply_patch(p, w.base), w.target));
    p.entries[0].values = p.entries[0].values.reshape({48, 100});
    check_refused(p, w.base, "embed.weight", "the dense values have shape [48, 100]");
  }
  SUBCASE("a non-contiguous tensor in place") {
    std::vector<gk::NamedTensor> t = clone_all(w.base);
    t[0].value = t[0].value.t().contiguous().t();  // same values, column-major
    const std::string msg = weight_error([&] { gk::apply_patch_in_place(good, t); });
    CHECK(msg.find("'layers.0.mlp.weight' is not contiguous") != std::string::npos);
    // Out of place it applies.
    CHECK(bits_equal(gk::apply_patch(good, t)[0].value, w.target[0].value));
  }
}

TEST_CASE("validate_patch refuses out-of-range indices before any write") {
  // index_copy_ with an index past the end would raise (CPU) or assert on the
  // device; validate_patch refuses first, so the tensors are untouched.
  const Weights w = small_model();
  gk::Patch p = small_patch(w);
  p.entries[0].indices = p.entries[0].indices.clone();
  p.entries[0].indices[-1] = 1 << 30;
  const std::vector<gk::NamedTensor> before = clone_all(w.base);
  CHECK(weight_error([&] { gk::validate_patch(p); }).find("index 1073741824 is out of range [0, 4800)") !=
        std::string::npos);
  CHECK(all_bits_equal(w.base, before));
}

TEST_CASE("check_patch compares a patch with a model's expectations before any weight is read") {
  const Weights w = small_model();
  const gk::Patch p = small_patch(w);
  std::vector<gk::ExpectedTensor> model;
  for (const auto& t : w.base) model.push_back({t.name, t.value.sizes().vec(), t.value.scalar_type()});
  gk::check_patch(p, model);
  CHECK(weight_error([&] { gk::check_patch(p, {model[0], model[1]}); })
            .find("tensor 'embed.weight' is not a tensor of the model (an unknown name") != std::string::npos);
  model[2].dtype = at::kHalf;
  CHECK(weight_error([&] { gk::check_patch(p, model); })
            .find("'embed.weight' is BFloat16 [100, 48] in the patch but Half [100, 48] in the model") !=
        std::string::npos);
}

TEST_CASE("make_patch refuses sets that disagree") {
  const Weights w = small_model();
  auto msg = [&](std::vector<gk::NamedTensor> b, std::vector<gk::NamedTensor> t) {
    return weight_error([&] { (void)gk::make_patch(b, t); });
  };
  std::vector<gk::NamedTensor> fewer = w.target;
  fewer.pop_back();
  CHECK(msg(w.base, fewer).find("tensor 'embed.weight' is in the base but not in the target") != std::string::npos);
  CHECK(msg(fewer, w.target).find("tensor 'embed.weight' is in the target but not in the base") != std::string::npos);
  std::vector<gk::NamedTensor> reshaped = clone_all(w.target);
  reshaped[0].value = reshaped[0].value.reshape({48, 64});
  CHECK(msg(w.base, reshaped).find("'layers.0.mlp.weight' is BFloat16 [64, 48] in the base but BFloat16 [48, 64]") !=
        std::string::npos);
  std::vector<gk::NamedTensor> twice = w.base;
  twice.push_back(w.base[0]);
  CHECK(msg(twice, w.target).find("base tensor 'layers.0.mlp.weight' is given twice") != std::string::npos);
  std::vector<gk::NamedTensor> shard = w.base;
  shard[1].shard = 1;
  CHECK(msg(shard, w.target).find("is shard 1") != std::string::npos);
  const at::Tensor c = at::zeros({3}, at::kComplexFloat);
  CHECK(msg({{"c", c}}, {{"c", c}}).find("which the patch format (safetensors) does not have") != std::string::npos);
  // Positive: the same sets in another order make the same patch.
  std::vector<gk::NamedTensor> reversed(w.target.rbegin(), w.target.rend());
  const gk::Patch a = gk::make_patch(w.base, w.target), b = gk::make_patch(w.base, reversed);
  REQUIRE(a.entries.size() == b.entries.size());
  for (std::size_t i = 0; i < a.entries.size(); ++i) CHECK(a.entries[i].target_hash == b.entries[i].target_hash);
}

TEST_CASE("a patch owns its data unless share_dense") {
  const Weights w = small_model();
  std::vector<gk::NamedTensor> target = clone_all(w.target);
  const gk::Patch owned = gk::make_patch(w.base, target, {.encoding = gk::MakePatchOptions::Encoding::dense});
  const gk::Patch shared =
      gk::make_patch(w.base, target, {.encoding = gk::MakePatchOptions::Encoding::dense, .share_dense = true});
  target[2].value.zero_();  // embed.weight, written after the patches were made
  CHECK(bits_equal(owned.find("embed.weight")->values, w.target[2].value));
  CHECK(bits_equal(shared.find("embed.weight")->values, target[2].value));
  CHECK(weight_error([&] { (void)gk::apply_patch(shared, w.base); }).find("after the patch its content hash is") !=
        std::string::npos);
}

TEST_CASE("bad patch files are refused, naming the file and the tensor") {
  const Weights w = small_model();
  const gk::Patch p = small_patch(w);
  TempDir dir("gk_delta");
  const std::string path = dir.file("bad.safetensors");
  // The good file's tensors and header, to edit.
  gk::write_patch(path, p);
  std::vector<gk::NamedTensor> tensors;
  std::map<std::string, std::string> meta;
  {
    gk::SafetensorsSource src(path);
    meta = src.metadata();
    while (auto t = src.next()) tensors.push_back({t->name, t->value.clone(), 0});
  }
  const std::string header = meta.at("gk_patch");
  auto replaced = [&](std::string from, std::string to) {
    std::string h = header;
    const std::size_t at = h.find(from);
    REQUIRE(at != std::string::npos);
    return h.replace(at, from.size(), to);
  };
  auto refusal = [&](const std::vector<gk::NamedTensor>& ts, const std::map<std::string, std::string>& m) {
    gk::write_safetensors(path, ts, m);
    return weight_error([&] { (void)gk::read_patch(path); });
  };
  auto check_msg = [&](const std::string& msg, const std::string& needle) {
    INFO("message: " << msg);
    CHECK(msg.find("patch file '" + path + "'") != std::string::npos);
    CHECK(msg.find(needle) != std::string::npos);
  };
  // Positive: the unedited tensors and header read back.
  CHECK(refusal(tensors, meta).empty());

  check_msg(refusal(tensors, {{"format", "pt"}}), "has no \"gk_patch\" entry; it is not a graphkeep patch");
  check_msg(refusal(tensors, {{"gk_patch", "{not json"}}), "header is not valid JSON");
  check_msg(refusal(tensors, {{"gk_patch", replaced("\"version\":1", "\"version\":2")}}),
            "format version 2; this graphkeep reads version 1");
  check_msg(refusal(tensors, {{"gk_patch", replaced("\"version\":1", "\"version\":1,\"extra\":0")}}),
            "has the member \"extra\", which format version 1 does not have");
  check_msg(refusal(tensors, {{"gk_patch", replaced("\"format\":\"gk-patch\",", "")}}), "lacks the member \"format\"");
  check_msg(refusal(tensors, {{"gk_patch", replaced("gk-sum64 v1", "sha256")}}),
            "the hashes are \"sha256\"; this graphkeep computes \"gk-sum64 v1\"");
  // A patch of the earlier hash function is refused by its name.
  check_msg(refusal(tensors, {{"gk_patch", replaced("gk-sum64 v1", "gk-xxh64-blocks v1")}}),
            "the hashes are \"gk-xxh64-blocks v1\"; this graphkeep computes \"gk-sum64 v1\"");
  check_msg(refusal(tensors, {{"gk_patch", replaced("\"encoding\":\"sparse\"", "\"encoding\":\"rle\"")}}),
            "tensor 'embed.weight': unknown encoding \"rle\"");
  const std::string h0 = gk::format_content_hash(p.entries[0].base_hash);
  check_msg(refusal(tensors, {{"gk_patch", replaced(h0, "xyz")}}), "\"base_hash\" is \"xyz\", not 16 hex digits");
  check_msg(refusal(tensors, {{"gk_patch", replaced("\"count\":7", "\"count\":8")}}),
            "tensor 'embed.weight::indices' is I32 [7] but the header implies I32 [8]");
  // The file's tensors against the header.
  std::vector<gk::NamedTensor> extra = tensors;
  extra.push_back({"stray", at::zeros({2}), 0});
  check_msg(refusal(extra, meta), "it holds tensor 'stray', which the header does not describe");
  std::vector<gk::NamedTensor> missing(tensors.begin() + 1, tensors.end());
  check_msg(refusal(missing, meta), "tensor 'embed.weight' is a sparse entry, but the file has no tensor 'embed.weight::indices'");
  std::vector<gk::NamedTensor> wide = tensors;
  wide[0].value = wide[0].value.to(at::kLong);  // embed.weight::indices as I64 for a small tensor
  check_msg(refusal(wide, meta), "tensor 'embed.weight::indices' is I64 [7] but the header implies I32 [7]");
  std::vector<gk::NamedTensor> dense_named = tensors;
  dense_named[0].name = "embed.weight::dense";
  check_msg(refusal(dense_named, meta), "is a sparse entry, but the file holds 'embed.weight::dense'");
  // Index order, from a file: validated like an in-memory patch.
  std::vector<gk::NamedTensor> unsorted = tensors;
  unsorted[0].value = unsorted[0].value.flip(0).contiguous();
  check_msg(refusal(unsorted, meta), "tensor 'embed.weight' (shape [100, 48], 4800 elements): index");
}

}  // TEST_SUITE("delta")

// ---------------------------------------------------------------------------
// On the device (label gpu)
// ---------------------------------------------------------------------------
TEST_SUITE("gpu delta") {

TEST_CASE("make_patch on the device equals make_patch on the host; apply on the device reproduces the target") {
  REQUIRE(gk::testing::cuda_available());
  at::Generator g = at::detail::createCPUGenerator(30);
  std::vector<gk::NamedTensor> base, target, dbase, dtarget;
  const std::vector<at::ScalarType> dtypes = {at::kBFloat16, at::kHalf, at::kFloat, at::kFloat8_e4m3fn, at::kInt};
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    const at::Tensor b = random_tensor(dtypes[i], {257, 300}, g);
    const std::int64_t count = std::vector<std::int64_t>{0, 1, 771, 257 * 150, 257 * 300}[i];
    const at::Tensor t = change(b, count, g).first;
    const std::string name = "t" + std::to_string(i);
    base.push_back({name, b});
    target.push_back({name, t});
    dbase.push_back({name, b.cuda()});
    dtarget.push_back({name, t.cuda()});
  }
  const gk::Patch host = gk::make_patch(base, target, {.record_unchanged = true});
  const gk::Patch dev = gk::make_patch(dbase, dtarget, {.record_unchanged = true});
  REQUIRE(host.entries.size() == dev.entries.size());
  for (std::size_t i = 0; i < host.entries.size(); ++i) {
    const gk::PatchEntry &h = host.entries[i], &d = dev.entries[i];
    INFO("tensor " << h.name);
    CHECK(d.values.is_cuda());
    CHECK((h.encoding == d.encoding));
    CHECK(h.base_hash == d.base_hash);
    CHECK(h.target_hash == d.target_hash);
    CHECK(bits_equal(h.indices.defined() ? h.indices : at::zeros({0}), d.indices.defined() ? d.indices : at::zeros({0})));
    CHECK(bits_equal(h.values, d.values));
  }
  // Device patch onto device tensors, host patch onto device tensors, both ways.
  std::vector<gk::NamedTensor> t1 = clone_all(dbase), t2 = clone_all(dbase);
  gk::apply_patch_in_place(dev, t1);
  gk::apply_patch_in_place(host, t2);
  CHECK(all_bits_equal(t1, target));
  CHECK(all_bits_equal(t2, target));
  const auto out = gk::apply_patch(dev, dbase);
  CHECK(all_bits_equal(out, target));
  CHECK(out[1].value.is_cuda());
  // Through a file: write_patch copies the device tensors to the host.
  TempDir dir("gk_delta_gpu");
  gk::write_patch(dir.file("p.safetensors"), dev);
  CHECK(all_bits_equal(gk::apply_patch(gk::read_patch(dir.file("p.safetensors")).to(at::kCUDA), dbase), target));
}

// Note [Changed elements on the device]: tasks of 65,536 elements, many
// pairs per launch, every element size.
TEST_CASE("make_patch's device kernels equal the host's on many tensors and on tensors of many tasks") {
  REQUIRE(gk::testing::cuda_available());
  at::Generator g = at::detail::createCPUGenerator(41);
  std::mt19937_64 rng(41);
  std::vector<gk::NamedTensor> base, target, dbase, dtarget;
  const std::vector<at::ScalarType> dtypes = {at::kBFloat16, at::kFloat8_e4m3fn, at::kFloat, at::kLong, at::kHalf};
  auto add = [&](const std::string& name, at::ScalarType type, std::int64_t n, std::int64_t count) {
    const at::Tensor b = random_tensor(type, {n}, g);
    const at::Tensor t = change(b, count, g).first;
    base.push_back({name, b});
    target.push_back({name, t});
    dbase.push_back({name, b.cuda()});
    dtarget.push_back({name, t.cuda()});
  };
  for (int k = 0; k < 300; ++k) {  // a MoE's many small experts, some unchanged
    const auto n = static_cast<std::int64_t>(1 + rng() % 5000);
    add("e" + std::to_string(1000 + k), dtypes[static_cast<std::size_t>(k) % dtypes.size()], n,
        static_cast<std::int64_t>(rng() % (static_cast<std::uint64_t>(n) / 20 + 1)));
  }
  add("big.bf16", at::kBFloat16, 3'000'001, 30'000);  // 46 tasks, 1 %
  add("big.fp32", at::kFloat, 200'003, 100'000);      // 4 tasks, 50 %: dense
  add("big.u8", at::kFloat8_e4m3fn, 1 << 17, 1);      // 2 tasks, one change
  for (std::size_t k : {3u, 150u}) {  // two pairs left on the host: the same chunk takes both paths
    dbase[k].value = base[k].value;
    dtarget[k].value = target[k].value;
  }
  std::map<std::string, c10::Device> device_of;
  for (const gk::NamedTensor& t : dbase) device_of.emplace(t.name, t.value.device());
  const gk::Patch host = gk::make_patch(base, target, {.record_unchanged = true});
  const gk::Patch dev = gk::make_patch(dbase, dtarget, {.record_unchanged = true});
  REQUIRE(host.entries.size() == dev.entries.size());
  int sparse = 0;
  for (std::size_t i = 0; i < host.entries.size(); ++i) {
    const gk::PatchEntry &h = host.entries[i], &d = dev.entries[i];
    INFO("tensor " << h.name);
    REQUIRE(h.name == d.name);
    CHECK((h.encoding == d.encoding));
    CHECK(h.target_hash == d.target_hash);
    if (h.encoding == gk::PatchEncoding::sparse) {
      ++sparse;
      CHECK(d.indices.device() == device_of.at(d.name));
      CHECK((d.indices.scalar_type() == h.indices.scalar_type()));
      CHECK(bits_equal(h.indices, d.indices));
    }
    CHECK(bits_equal(h.values, d.values));
  }
  CHECK(sparse > 250);
  CHECK(all_bits_equal(gk::apply_patch(dev, dbase), target));
  // Note [One allocation per chunk]: the device's sparse entries are views
  // of one allocation, each piece aligned as the allocator's blocks are.
  std::set<const void*> storages;
  for (const gk::PatchEntry& d : dev.entries)
    if (d.encoding == gk::PatchEncoding::sparse && d.values.is_cuda()) {
      storages.insert(d.values.storage().data());
      storages.insert(d.indices.storage().data());
      CHECK(reinterpret_cast<std::uintptr_t>(d.values.const_data_ptr()) % 512 == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(d.indices.const_data_ptr()) % 512 == 0);
    }
  CHECK(storages.size() == 1);
}

TEST_CASE("non_finite_values on the device equals non_finite_values on the host") {
  REQUIRE(gk::testing::cuda_available());
  const NonFiniteCase c = non_finite_patch();
  const gk::Patch dev = c.patch.to(at::kCUDA);
  REQUIRE(dev.entries[0].values.is_cuda());
  const std::vector<gk::NonFiniteValues> host = gk::non_finite_values(c.patch), got = gk::non_finite_values(dev);
  REQUIRE(got.size() == host.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO("entry " << c.patch.entries[k].name);
    CHECK(got[k].count == c.want[k].count);
    CHECK(got[k].count == host[k].count);
    CHECK(got[k].first_element == host[k].first_element);
    CHECK(std::isnan(got[k].first_value) == std::isnan(host[k].first_value));
    CHECK(std::signbit(got[k].first_value) == std::signbit(host[k].first_value));
  }
}

TEST_CASE("bad device patches are refused on the host with no device-side assert, and roll back") {
  REQUIRE(gk::testing::cuda_available());
  const Weights w = small_model();
  std::vector<gk::NamedTensor> dbase;
  for (const auto& t : w.base) dbase.push_back({t.name, t.value.cuda()});
  gk::Patch p = small_patch(w).to(at::kCUDA);
  p.entries[1].indices[-1] = 1 << 30;  // out of range, on the device
  check_refused(p, dbase, "layers.0.mlp.weight", "index 1073741824 is out of range [0, 3072)");
  // The device is fine afterwards (a device-side assert would poison the context).
  CHECK(at::ones({16}, at::kCUDA).sum().item<float>() == 16.0f);
  gk::Patch wrong = small_patch(w).to(at::kCUDA);
  wrong.entries[1].values = wrong.entries[1].values.clone();
  const at::Tensor v = wrong.entries[1].values.view(at::kShort);
  v[0] = v[0].item<int>() ^ 1;
  check_refused(wrong, dbase, "layers.0.mlp.weight", "after the patch its content hash is");
  std::vector<gk::NamedTensor> t = clone_all(dbase);
  gk::apply_patch_in_place(small_patch(w).to(at::kCUDA), t);
  CHECK(all_bits_equal(t, w.target));
}

}  // TEST_SUITE("gpu delta")

// Note [Validating indices in one pass] in delta/patch.cpp: many entries'
// indices are checked together; an entry's boundary with the next is no
// disorder, and a fault in any one entry is found and named, also one that
// its first and last index do not show.
namespace {
void check_validation_names_entries(c10::Device device) {
  std::vector<gk::NamedTensor> base, target;
  for (int k = 0; k < 40; ++k) {
    const at::Tensor b = at::zeros({64});
    at::Tensor t = b.clone();
    t[k % 5] = 3.f, t[(k * 7) % 64] = 1.f, t[63 - k % 8] = 2.f;  // each entry ends high, the next starts low
    const std::string name = (k < 10 ? "t0" : "t") + std::to_string(k);
    base.push_back({name, b, 0});
    target.push_back({name, t, 0});
  }
  gk::MakePatchOptions o;
  o.base_version = "a", o.target_version = "b";
  o.encoding = gk::MakePatchOptions::Encoding::sparse;
  const gk::Patch good = gk::make_patch(base, target, o).to(device);
  REQUIRE(good.entries.size() == 40);
  CHECK_NOTHROW(gk::validate_patch(good));
  auto edited = [&](std::size_t entry, std::int64_t position, std::int64_t value) {
    gk::Patch p = good;
    p.entries[entry].indices = p.entries[entry].indices.clone();
    p.entries[entry].indices[position] = value;
    return weight_error([&] { gk::validate_patch(p); });
  };
  const std::int64_t n20 = good.entries[20].indices.numel();
  REQUIRE(n20 >= 3);
  // Out of range in the middle: the entry's first and last index are fine.
  CHECK(edited(20, 1, 9999).find("tensor 't20' (shape [64], 64 elements): index 9999 is out of range [0, 64)") !=
        std::string::npos);
  CHECK(edited(39, good.entries[39].indices.numel() - 1, 64).find("tensor 't39'") != std::string::npos);
  CHECK(edited(0, 0, -1).find("tensor 't00' (shape [64], 64 elements): index -1 is out of range") != std::string::npos);
  CHECK(edited(20, 1, good.entries[20].indices[0].item<std::int64_t>()).find("tensor 't20'") != std::string::npos);
  CHECK(edited(20, 1, good.entries[20].indices[0].item<std::int64_t>()).find("appears twice (positions 0 and 1)") !=
        std::string::npos);
  CHECK(edited(31, 0, 63).find("tensor 't31'") != std::string::npos);  // no longer ascending
}
}  // namespace

TEST_CASE("validate_patch checks many entries' indices at once and names the entry at fault") {
  check_validation_names_entries(at::kCPU);
}

TEST_SUITE("gpu delta") {
// On a CUDA device one kernel checks every entry (Note [Validating indices
// in one pass]): the same refusals, and faults at the edges of its blocks of
// 64 Ki indices, which compare their first index with the block before.
TEST_CASE("validate_patch on the device names the entry at fault, across the kernel's blocks") {
  REQUIRE(gk::testing::cuda_available());
  check_validation_names_entries(c10::Device(c10::kCUDA, 0));
  const at::Tensor b = at::zeros({1 << 20});
  at::Tensor t = b.clone();
  t.index_fill_(0, at::arange(0, 1 << 20, 5, at::kLong), 1.f);  // 209,716 changes: four blocks
  gk::MakePatchOptions o;
  o.base_version = "a", o.target_version = "b";
  o.encoding = gk::MakePatchOptions::Encoding::sparse;
  const gk::Patch good =
      gk::make_patch({{"big", b.cuda(), 0}, {"next", b.cuda(), 0}}, {{"big", t.cuda(), 0}, {"next", t.cuda(), 0}}, o);
  REQUIRE(good.entries[0].indices.numel() == 209716);
  REQUIRE(good.entries[0].indices.is_cuda());
  CHECK_NOTHROW(gk::validate_patch(good));
  auto edited = [&](std::int64_t position, std::int64_t value) {
    gk::Patch p = good;
    p.entries[0].indices = p.entries[0].indices.clone();
    p.entries[0].indices[position] = value;
    return weight_error([&] { gk::validate_patch(p); });
  };
  // A repeat at the first index of the second block (its predecessor is the first block's last).
  CHECK(edited(65536, 5 * 65535).find("tensor 'big' (shape [1048576], 1048576 elements): index 327675 appears twice "
                                      "(positions 65535 and 65536)") != std::string::npos);
  // A descent at the very last index, and one at a block's last.
  CHECK(edited(209715, 3).find("index 3 at position 209715 follows 1048570") != std::string::npos);
  CHECK(edited(131071, 0).find("index 0 at position 131071 follows") != std::string::npos);
  // Out of range where neither end shows it.
  CHECK(edited(100000, 1 << 21).find("index 2097152 is out of range [0, 1048576)") != std::string::npos);
}
}  // TEST_SUITE("gpu delta")
