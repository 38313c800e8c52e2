// Safetensors: the header parser against hostile bytes, the writer and the
// memory-mapped source (round trips of every dtype, zero-copy lifetime).
#include "gk_test.h"
#include "temp_dir.h"

#include <graphkeep/sources/safetensors_format.h>
#include <graphkeep/sources/safetensors_source.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace {

constexpr std::string_view kLabel = "safetensors file 'hostile'";

// A file: the 8-byte length (of `header`, unless `length` says otherwise),
// `header`, then `data_size` zero bytes. Exactly sized, so a read past the
// end is out of bounds of the allocation.
std::vector<std::byte> file_of(std::string_view header, std::size_t data_size = 0,
                               std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::vector<std::byte> out(8 + header.size() + data_size, std::byte{0});
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::vector<std::byte> raw(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());  // memcpy from nullptr is UB even for 0 bytes
  return out;
}

// The message of the gk::WeightError the parser raises (without the
// "graphkeep: " prefix and the source location what() adds), or "".
std::string error_of(const std::vector<std::byte>& file) {
  try {
    (void)gk::parse_safetensors_header(file, kLabel);
  } catch (const gk::WeightError& e) {
    return e.message();
  }
  return {};
}

// The bytes raise gk::WeightError whose message starts with the label and
// contains `needle`.
#define CHECK_REJECTS(file, needle)                                                  \
  do {                                                                               \
    const std::string st_msg_ = error_of(file);                                      \
    INFO("message: " << st_msg_);                                                    \
    CHECK_MESSAGE(st_msg_.rfind(kLabel, 0) == 0, "expected a gk::WeightError");      \
    CHECK_MESSAGE(st_msg_.find(needle) != std::string::npos,                         \
                  "expected the message to contain \"" << needle << "\"");           \
  } while (0)

std::string entry(std::string_view dtype, std::string_view shape, std::uint64_t b,
                  std::uint64_t e) {
  return "{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) +
         ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

using gk::testing::TempDir;

// The file's size, or -1 when it does not exist.
long long file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() &&
         (ca.nbytes() == 0 || std::memcmp(ca.const_data_ptr(), cb.const_data_ptr(), ca.nbytes()) == 0);
}

// Random bit patterns (NaNs and all) of `dtype` with `shape`; 0/1 for BOOL.
at::Tensor random_of(gk::SafetensorsDtype dtype, std::vector<int64_t> shape) {
  const at::ScalarType st = gk::to_scalar_type(dtype);
  if (st == at::kBool) return at::randint(0, 2, shape, at::kByte).to(at::kBool);
  const auto itemsize = static_cast<int64_t>(gk::safetensors_itemsize(dtype));
  std::vector<int64_t> bytes_shape = shape;
  if (bytes_shape.empty()) bytes_shape.push_back(1);
  bytes_shape.back() *= itemsize;
  at::Tensor t = at::randint(0, 256, bytes_shape, at::kByte).view(st);
  return shape.empty() ? t.reshape({}) : t;
}

// True while the page holding `p` is mapped in this process.
bool page_mapped(const void* p) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto* base = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~(page - 1));
  unsigned char vec = 0;
  return ::mincore(base, 1, &vec) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// The parser
// ---------------------------------------------------------------------------

TEST_CASE("the parser reads entries, offsets and metadata of a valid header") {
  const std::string h = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":" + entry("F32", "[2,3]", 8, 32) +
                        ",\"a\":" + entry("I64", "[1]", 0, 8) + ",\"s\":" + entry("BF16", "[]", 32, 34) +
                        ",\"e\":" + entry("U8", "[0,5]", 34, 34) + "}      ";
  const auto file = file_of(h, 34);
  const gk::SafetensorsHeader p = gk::parse_safetensors_header(file, kLabel);
  CHECK(p.header_size == h.size());
  CHECK(p.data_offset == 8 + h.size());
  CHECK(p.data_size == 34);
  REQUIRE(p.tensors.size() == 4);
  // file order
  CHECK(p.tensors[0].name == "a");
  CHECK(p.tensors[1].name == "b");
  CHECK(p.tensors[2].name == "s");
  CHECK(p.tensors[3].name == "e");
  CHECK(p.tensors[1].dtype == gk::SafetensorsDtype::f32);
  CHECK(p.tensors[1].shape == std::vector<int64_t>{2, 3});
  CHECK(p.tensors[1].numel() == 6);
  CHECK(p.tensors[1].begin == 8);
  CHECK(p.tensors[1].end == 32);
  CHECK(p.tensors[2].shape.empty());
  CHECK(p.tensors[2].numel() == 1);
  CHECK(p.tensors[3].numel() == 0);
  CHECK(p.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  REQUIRE(p.find("s") != nullptr);
  CHECK(p.find("s")->dtype == gk::SafetensorsDtype::bf16);
  CHECK(p.find("missing") == nullptr);

  // no tensors at all; metadata null
  CHECK(gk::parse_safetensors_header(file_of("{}"), kLabel).tensors.empty());
  CHECK(gk::parse_safetensors_header(file_of("{\"__metadata__\":null}   "), kLabel).metadata.empty());
  // every dtype name maps back
  for (const auto d : gk::safetensors_dtypes())
    CHECK(gk::safetensors_dtype_from_name(gk::safetensors_dtype_name(d)) == d);
}

TEST_CASE("the parser rejects a file too short or a header length past the end") {
  CHECK_REJECTS(raw(""), "0 bytes, shorter than the 8-byte header length");
  CHECK_REJECTS(raw(std::string_view("\x02\0\0\0\0\0\0", 7)), "7 bytes, shorter than the 8-byte header length");
  CHECK_REJECTS(file_of("{}", 0, 3), "header length 3 runs past the end of the file (2 bytes");
  CHECK_REJECTS(file_of("{}", 0, 100'000'000), "header length 100000000 runs past the end of the file");
  // Over the reference implementation's limit of 100,000,000 bytes: rejected
  // before anything is read (tests/safetensors_interop.py checks the limit
  // against the reference itself).
  CHECK_REJECTS(file_of("{}", 0, 100'000'001),
                "the header length 100000001 bytes exceeds the format's limit of 100000000 bytes");
  CHECK_REJECTS(file_of("{}", 0, std::numeric_limits<std::uint64_t>::max()),
                "header length 18446744073709551615 bytes exceeds the format's limit");
  CHECK_REJECTS(file_of("{}", 0, std::uint64_t{1} << 63), "exceeds the format's limit");
}

TEST_CASE("the parser rejects a header that is not a JSON object") {
  CHECK_REJECTS(file_of(""), "the header is not valid JSON");
  CHECK_REJECTS(file_of("{\"a\":"), "the header is not valid JSON");
  CHECK_REJECTS(file_of("{} x"), "the header is not valid JSON");
  // nlohmann's parser stops at a NUL byte as if the input ended there
  CHECK_REJECTS(file_of(std::string("{}\0\0\0\0\0\0", 8)), "a NUL byte at offset 2");
  CHECK_REJECTS(file_of(std::string("{}\0{\"w\":3}", 10)), "a NUL byte at offset 2");
  CHECK_REJECTS(file_of("{\"\xff\":1}"), "the header is not valid JSON");  // invalid UTF-8
  CHECK_REJECTS(file_of("{\"a\":1e999}"), "the header is not valid JSON");  // number overflow
  CHECK_REJECTS(file_of("\xEF\xBB\xBF{}"), "it starts with a UTF-8 byte order mark");
  CHECK_REJECTS(file_of("[1,2]"), "the header is JSON but not an object (it is array)");
  CHECK_REJECTS(file_of("null"), "not an object (it is null)");
  CHECK_REJECTS(file_of("\"{}\""), "not an object (it is string)");
  CHECK_REJECTS(file_of(std::string(100, '[') + std::string(100, ']')), "not an object");
  CHECK_REJECTS(file_of(std::string(5000, '[') + std::string(5000, ']')), "nests arrays or objects deeper than 127");
}

TEST_CASE("the parser rejects tensor entries with missing or ill-typed fields") {
  CHECK_REJECTS(file_of("{\"w\":3}"), "tensor 'w' is described by a JSON number, not an object");
  CHECK_REJECTS(file_of("{\"w\":[]}"), "tensor 'w' is described by a JSON array");
  CHECK_REJECTS(file_of("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                "tensor 'w' has no \"dtype\" field");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
                "tensor 'w' has no \"shape\" field");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4),
                "tensor 'w' has no \"data_offsets\" field");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                "tensor 'w': \"dtype\" is 32, not a string");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "{}", 0, 4) + "}", 4),
                "tensor 'w': \"shape\" is object, not an array of integers");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[1.5]", 0, 4) + "}", 4),
                "tensor 'w': shape entry 1.5 is not an integer");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[\"1\"]", 0, 4) + "}", 4),
                "tensor 'w': shape entry \"1\" is not an integer");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4),
                "tensor 'w': \"data_offsets\" is [0], not an array [begin, end]");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4),
                "not an array [begin, end]");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", 4),
                "not an array [begin, end]");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4),
                "tensor 'w': data_offsets end is \"4\", not an integer");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4),
                "tensor 'w': data_offsets begin is negative (-4)");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4),
                "data_offsets end is 4.0, not an integer");
}

TEST_CASE("the parser rejects unknown dtypes and bad shapes") {
  CHECK_REJECTS(file_of("{\"w\":" + entry("F7", "[1]", 0, 1) + "}", 1),
                "tensor 'w' has unknown dtype 'F7' (supported: BOOL, U8, I8");
  CHECK_REJECTS(file_of("{\"w\":" + entry("f32", "[1]", 0, 4) + "}", 4), "unknown dtype 'f32'");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[2,-1]", 0, 4) + "}", 4),
                "tensor 'w' has a negative dimension (-1)");
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[-0]", 0, 0) + "}"), "negative dimension (-0)");
  // one dimension beyond int64
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[9223372036854775808]", 0, 1) + "}", 1),
                "tensor 'w': dimension 9223372036854775808 overflows int64");
  // the element count overflows int64
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[4294967296,4294967296]", 0, 1) + "}", 1),
                "tensor 'w': integer overflow in the number of elements");
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[3,3074457345618258603]", 0, 1) + "}", 1),
                "integer overflow in the number of elements");
  // the element count fits but its byte size does not
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[4611686018427387904]", 0, 4) + "}", 4),
                "tensor 'w': integer overflow in its byte size");
  CHECK_REJECTS(file_of("{\"w\":" + entry("I64", "[1152921504606846976]", 0, 8) + "}", 8),
                "integer overflow in its byte size");
  // a zero dimension makes any product zero: no overflow, no bytes
  const auto ok = file_of("{\"w\":" + entry("F64", "[0,9223372036854775807,9223372036854775807]", 0, 0) + "}");
  CHECK(gk::parse_safetensors_header(ok, kLabel).tensors.at(0).numel() == 0);
}

TEST_CASE("the parser rejects byte counts and offsets that do not fit") {
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[2]", 0, 4) + "}", 4),
                "tensor 'w': byte count mismatch: data_offsets [0, 4] hold 4 bytes but shape [2] "
                "of F32 needs 8");
  CHECK_REJECTS(file_of("{\"w\":" + entry("BF16", "[3]", 0, 8) + "}", 8), "byte count mismatch");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[1]", 8, 4) + "}", 8),
                "tensor 'w': data_offsets [8, 4] end before they begin");
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[2]", 0, 8) + "}", 4),
                "tensor 'w': data_offsets [0, 8] lie outside the data section (4 bytes)");
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[4]", 18446744073709551611ull, 18446744073709551615ull) + "}", 4),
                "lie outside the data section");
  CHECK_REJECTS(file_of("{\"w\":" + entry("U8", "[0]", 5, 5) + "}", 4), "lie outside the data section");
}

TEST_CASE("the parser rejects overlapping ranges, gaps and unused trailing bytes") {
  CHECK_REJECTS(file_of("{\"a\":" + entry("F32", "[2]", 0, 8) + ",\"b\":" + entry("F32", "[2]", 4, 12) + "}", 12),
                "tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))");
  // the same range twice
  CHECK_REJECTS(file_of("{\"a\":" + entry("F32", "[2]", 0, 8) + ",\"b\":" + entry("I32", "[2]", 0, 8) + "}", 8),
                "tensor 'b' (bytes [0, 8)) overlaps tensor 'a'");
  // an empty tensor inside another one
  CHECK_REJECTS(file_of("{\"a\":" + entry("F32", "[2]", 0, 8) + ",\"e\":" + entry("F32", "[0]", 4, 4) + "}", 8),
                "tensor 'e' (bytes [4, 4)) overlaps tensor 'a'");
  CHECK_REJECTS(file_of("{\"a\":" + entry("F32", "[1]", 0, 4) + ",\"b\":" + entry("F32", "[1]", 8, 12) + "}", 12),
                "bytes [4, 8) of the data section belong to no tensor (a gap before tensor 'b')");
  CHECK_REJECTS(file_of("{\"b\":" + entry("F32", "[1]", 4, 8) + "}", 8),
                "bytes [0, 4) of the data section belong to no tensor (a gap before tensor 'b')");
  CHECK_REJECTS(file_of("{\"a\":" + entry("F32", "[1]", 0, 4) + "}", 6),
                "the data section has 2 trailing bytes after the last tensor 'a'");
  CHECK_REJECTS(file_of("{}", 3), "3 trailing bytes after the last tensor (the file has no tensors)");
}

TEST_CASE("the parser rejects duplicate keys that a JSON parser would silently merge") {
  CHECK_REJECTS(file_of("{\"w\":" + entry("F32", "[1]", 0, 4) + ",\"w\":" + entry("F32", "[1]", 0, 4) + "}", 4),
                "the header names tensor 'w' twice (duplicate key)");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                "tensor 'w' has the key 'dtype' twice");
  CHECK_REJECTS(file_of("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}"),
                "\"__metadata__\" has the key 'k' twice");
}

TEST_CASE("the parser survives deeply nested values without overflowing the stack") {
  // Found by the fuzz target: quoting such a value in a message used
  // json::dump(), which recurses once per level (Note [Bounded messages]).
  // Deeper than 127 levels is rejected before parsing, as the reference
  // does; the messages below quote values nested up to that limit.
  const std::string deeper = std::string(200000, '[') + std::string(200000, ']');
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":" + deeper + "}}", 1),
                "nests arrays or objects deeper than 127 levels");
  const std::string deep = std::string(120, '[') + std::string(120, ']');
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"U8\",\"shape\":[" + deep + "],\"data_offsets\":[0,1]}}", 1),
                "tensor 'w': shape entry an array of 1 elements is not an integer");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":" + deep + ",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                "\"dtype\" is an array of 1 elements, not a string");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":" + deep + "}}", 1),
                "\"data_offsets\" is an array of 1 elements");
  CHECK_REJECTS(file_of("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + deep + ",1]}}", 1),
                "data_offsets begin is an array of 1 elements, not an integer");
  std::string obj;
  for (int i = 0; i < 120; ++i) obj += "{\"a\":";
  obj += "1" + std::string(120, '}');
  CHECK_REJECTS(file_of("{\"__metadata__\":{\"k\":" + obj + "}}"),
                "\"__metadata__\" entry 'k' is an object of 1 members, not a string");
  // long values are cut in messages
  const std::string msg = error_of(file_of("{\"w\":" + entry(std::string(100000, 'x'), "[1]", 0, 1) + "}", 1));
  CHECK(msg.find("unknown dtype 'xxxx") != std::string::npos);
  CHECK(msg.size() < 400);
}

TEST_CASE("the parser rejects ill-typed metadata") {
  CHECK_REJECTS(file_of("{\"__metadata__\":[\"a\"]}"), "\"__metadata__\" is a JSON array, not an object of strings");
  CHECK_REJECTS(file_of("{\"__metadata__\":{\"step\":3}}"), "\"__metadata__\" entry 'step' is 3, not a string");
}

// ---------------------------------------------------------------------------
// The writer and the source
// ---------------------------------------------------------------------------

TEST_CASE("every dtype round-trips bit-exactly through write_safetensors and SafetensorsSource") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<gk::NamedTensor> written;
  for (const auto d : gk::safetensors_dtypes()) {
    const std::string n(gk::safetensors_dtype_name(d));
    written.push_back({n + ".matrix", random_of(d, {3, 5})});
    written.push_back({n + ".scalar", random_of(d, {})});
    written.push_back({n + ".empty", random_of(d, {0, 4})});
    written.push_back({n + ".transposed", random_of(d, {4, 6}).t()});  // non-contiguous input
  }
  REQUIRE_FALSE(written.back().value.is_contiguous());
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "graphkeep \"test\""}};
  gk::write_safetensors(path, written, meta);

  gk::SafetensorsSource src(path);
  CHECK(src.describe() == "safetensors file '" + path + "'");
  CHECK(src.metadata() == meta);
  CHECK(src.header().data_offset % 8 == 0);  // header padded with spaces
  // entries() lists everything up front, in insertion (= file) order
  REQUIRE(src.entries().size() == written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    const auto& e = src.entries()[i];
    CHECK(e.name == written[i].name);
    CHECK((gk::to_scalar_type(e.dtype) == written[i].value.scalar_type()));
    CHECK(at::IntArrayRef(e.shape) == written[i].value.sizes());
  }
  std::size_t i = 0;
  while (auto t = src.next()) {
    REQUIRE(i < written.size());
    INFO("tensor " << t->name);
    CHECK(t->name == written[i].name);
    CHECK(t->shard == 0);
    CHECK(t->value.device() == at::kCPU);
    CHECK(same_bytes(t->value, written[i].value));
    ++i;
  }
  CHECK(i == written.size());
  CHECK_FALSE(src.next().has_value());
}

TEST_CASE("yielded tensors point into the mapping and keep it alive after the source is gone") {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  const at::Tensor w = at::randn({256, 64});
  const at::Tensor b = at::arange(64, at::kLong);
  gk::write_safetensors(path, {{"w", w}, {"b", b}});

  at::Tensor yielded_w;
  const void* w_ptr = nullptr;
  {
    gk::SafetensorsSource src(path);
    const auto bytes = src.mapped_bytes();
    auto t = src.next();
    REQUIRE(t.has_value());
    yielded_w = t->value;
    w_ptr = yielded_w.const_data_ptr();
    const auto* p = static_cast<const std::byte*>(w_ptr);
    CHECK(p >= bytes.data());
    CHECK(p + yielded_w.nbytes() <= bytes.data() + bytes.size());
    CHECK(p == bytes.data() + src.header().data_offset + src.entries()[0].begin);
    auto t2 = src.next();
    REQUIRE(t2.has_value());
    const auto* p2 = static_cast<const std::byte*>(t2->value.const_data_ptr());
    CHECK(p2 >= bytes.data());
    CHECK(p2 < bytes.data() + bytes.size());
  }  // the source is destroyed; the tensor holds the mapping
  CHECK(page_mapped(w_ptr));
  CHECK(same_bytes(yielded_w, w));
  CHECK(yielded_w.sum().item<float>() == doctest::Approx(w.sum().item<float>()));
  yielded_w.reset();  // the last owner: the file is unmapped
  CHECK_FALSE(page_mapped(w_ptr));
}

TEST_CASE("a tensor whose data is not aligned to its element size is copied") {
  TempDir dir;
  const std::string path = dir.file("odd.safetensors");
  const at::Tensor flag = at::ones({1}, at::kBool);
  const at::Tensor f = at::randn({5});
  const at::Tensor d = at::randn({3}, at::kDouble);
  gk::write_safetensors(path, {{"flag", flag}, {"f", f}, {"d", d}});  // f at byte 1, d at 21
  gk::SafetensorsSource src(path);
  REQUIRE(src.entries().at(1).begin == 1);
  const auto bytes = src.mapped_bytes();
  auto in_mapping = [&](const at::Tensor& t) {
    const auto* p = static_cast<const std::byte*>(t.const_data_ptr());
    return p >= bytes.data() && p < bytes.data() + bytes.size();
  };
  auto a = src.next();
  auto b = src.next();
  auto c = src.next();
  REQUIRE((a && b && c));
  CHECK(in_mapping(a->value));          // one byte per element: always aligned
  CHECK_FALSE(in_mapping(b->value));    // copied
  CHECK_FALSE(in_mapping(c->value));
  CHECK(reinterpret_cast<std::uintptr_t>(b->value.const_data_ptr()) % 4 == 0);
  CHECK(same_bytes(a->value, flag));
  CHECK(same_bytes(b->value, f));
  CHECK(same_bytes(c->value, d));
}

TEST_CASE("the source names the file in its errors") {
  TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  const std::string missing_msg = "safetensors file '" + missing + "': cannot open it: No such file";
  GK_CHECK_THROWS_WITH_SUBSTR(gk::SafetensorsSource{missing}, gk::WeightError, missing_msg);
  GK_CHECK_THROWS_WITH_SUBSTR(gk::SafetensorsSource{dir.path}, gk::WeightError,
                              "not a regular file");
  const std::string empty = dir.file("empty.safetensors");
  std::ofstream(empty).close();
  const std::string empty_msg = "safetensors file '" + empty + "': the file is 0 bytes, shorter";
  GK_CHECK_THROWS_WITH_SUBSTR(gk::SafetensorsSource{empty}, gk::WeightError, empty_msg);
  const std::string bad = dir.file("bad.safetensors");
  {
    const auto bytes = file_of("{\"w\":" + entry("F32", "[2]", 0, 8) + "}", 4);
    std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  const std::string bad_msg = "safetensors file '" + bad + "': tensor 'w': data_offsets [0, 8] lie outside";
  GK_CHECK_THROWS_WITH_SUBSTR(gk::SafetensorsSource{bad}, gk::WeightError, bad_msg);
}

TEST_CASE("write_safetensors rejects what the format cannot hold") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const at::Tensor x = at::ones({2});
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(path, {{"a", x}, {"a", x}}), gk::WeightError,
                              "tensor 'a' is given twice");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(path, {{"a", x, 1}}), gk::WeightError,
                              "tensor 'a' is shard 1");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(path, {{"__metadata__", x}}), gk::WeightError,
                              "cannot be named '__metadata__'");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}),
                              gk::WeightError, "tensor 'c' has dtype ComplexFloat");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(path, {{"u", at::Tensor()}}), gk::WeightError,
                              "tensor 'u' is undefined");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::write_safetensors(dir.file("no/such/dir/w.safetensors"), {{"a", x}}),
                              gk::WeightError, "cannot create");
  CHECK(file_size(path) == -1);  // nothing half-written

  // an empty file is valid: no tensors, no data
  gk::write_safetensors(path, {});
  gk::SafetensorsSource src(path);
  CHECK(src.entries().empty());
  CHECK_FALSE(src.next().has_value());
  CHECK(file_size(path) == 16);  // length + "{}" padded to 8
}
