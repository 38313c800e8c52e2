// The .safetensors header parser. No Torch: the fuzz target
// (tests/fuzz/safetensors_header_fuzz.cpp) compiles this file with clang and
// sanitizers on its own.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/safetensors_format.h>

#include "json_depth.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

namespace gk {
namespace {

using nlohmann::json;

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  std::size_t itemsize;
};

constexpr std::array<DtypeInfo, 12> kDtypes = {{
    {SafetensorsDtype::boolean, "BOOL", 1},
    {SafetensorsDtype::u8, "U8", 1},
    {SafetensorsDtype::i8, "I8", 1},
    {SafetensorsDtype::i16, "I16", 2},
    {SafetensorsDtype::i32, "I32", 4},
    {SafetensorsDtype::i64, "I64", 8},
    {SafetensorsDtype::f16, "F16", 2},
    {SafetensorsDtype::bf16, "BF16", 2},
    {SafetensorsDtype::f32, "F32", 4},
    {SafetensorsDtype::f64, "F64", 8},
    {SafetensorsDtype::f8_e4m3, "F8_E4M3", 1},
    {SafetensorsDtype::f8_e5m2, "F8_E5M2", 1},
}};

constexpr std::array<SafetensorsDtype, kDtypes.size()> kDtypeList = [] {
  std::array<SafetensorsDtype, kDtypes.size()> out{};
  for (std::size_t i = 0; i < kDtypes.size(); ++i) out[i] = kDtypes[i].dtype;
  return out;
}();

const DtypeInfo& info(SafetensorsDtype d) {
  const auto i = static_cast<std::size_t>(d);
  GK_INTERNAL_ASSERT(i < kDtypes.size() && kDtypes[i].dtype == d, "dtype ", i);
  return kDtypes[i];
}

std::string supported_dtype_names() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

// Note [Bounded messages]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Error messages quote the offending JSON value, but json::dump() recurses
// once per nesting level: a hostile "shape": [[[[...]]]] a million deep
// overflowed the stack (found by the fuzz target). brief() renders scalars
// and flat arrays only, and cuts long text.
std::string cut(std::string s, std::size_t max = 80) {
  if (s.size() > max) {
    s.resize(max);
    s += "...";
  }
  return s;
}

std::string brief(const json& v) {
  if (v.is_array()) {
    const bool flat = v.size() <= 8 && std::none_of(v.begin(), v.end(), [](const json& x) {
                        return x.is_structured();
                      });
    if (flat) return cut(v.dump());
    return "an array of " + std::to_string(v.size()) + " elements";
  }
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " members";
  return cut(v.dump());  // a scalar: no recursion
}

// A JSON integer that is not unsigned: negative, or nlohmann's "-0".
std::string negative_str(const json& v) {
  return v.is_number_integer() && v.get<std::int64_t>() == 0 ? "-0" : brief(v);
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    if (i == 16 && shape.size() > 17) {
      out += "... (" + std::to_string(shape.size()) + " dimensions)";
      break;
    }
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Key bookkeeping for the parser callback: one set of seen keys per open JSON
// object, so a key repeated in any object is caught (nlohmann keeps the last
// one silently).
struct DuplicateKeys {
  std::vector<std::set<std::string>> open;
  std::string top_key;  // the current key of the outermost object (the tensor's name)
  struct Found {
    bool outermost;      // a tensor name (or "__metadata__") appears twice
    std::string parent;  // else: the outermost key it is nested in
    std::string key;
  };
  std::optional<Found> first;

  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open.empty()) break;
        const std::string& k = parsed.get_ref<const std::string&>();
        const bool outermost = open.size() == 1;
        if (!open.back().insert(k).second && !first) first = Found{outermost, top_key, k};
        if (outermost) top_key = k;
        break;
      }
      default:
        break;
    }
    return true;
  }
};

json parse_json(std::span<const std::byte> header, std::string_view label) {
  const char* b = reinterpret_cast<const char*>(header.data());
  // The reference parser (serde_json) stops at 128 levels of nesting, in any
  // member, ignored ones included; nlohmann recurses without a limit.
  GK_CHECK(WeightError, detail::json_nesting_depth({b, header.size()}, kMaxSafetensorsNesting) <= kMaxSafetensorsNesting, label,
           ": the header nests arrays or objects deeper than ", kMaxSafetensorsNesting,
           " levels (the reference implementation's limit); the file is corrupt or hostile");
  // nlohmann's lexer takes a NUL byte for the end of the input, so "{}\0..."
  // would parse as "{}" and ignore the rest. No valid JSON text holds a raw
  // NUL (not even inside a string), so any is an error, as in the reference.
  if (const void* nul = std::memchr(b, 0, header.size())) {
    GK_CHECK(WeightError, false, label, ": the header is not valid JSON (it holds a NUL byte at offset ",
             static_cast<const char*>(nul) - b,
             " of the header); the file is corrupt or not a safetensors file");
  }
  // nlohmann skips a UTF-8 byte order mark; the reference does not.
  GK_CHECK(WeightError, !(header.size() >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0), label,
           ": the header is not valid JSON (it starts with a UTF-8 byte order mark); the file is "
           "corrupt or not a safetensors file");
  DuplicateKeys dup;
  json j;
  try {
    j = json::parse(b, b + header.size(),
                    [&dup](int, json::parse_event_t event, json& parsed) {
                      return dup.on_event(event, parsed);
                    });
  } catch (const json::exception& e) {
    GK_CHECK(WeightError, false, label, ": the header is not valid JSON (", cut(e.what(), 240),
             "); the file is corrupt or not a safetensors file");
  }
  GK_CHECK(WeightError, j.is_object(), label, ": the header is JSON but not an object (it is ",
           j.type_name(), "); the file is corrupt or not a safetensors file");
  if (dup.first) {
    const auto& f = *dup.first;
    GK_CHECK(WeightError, !f.outermost, label, ": the header names tensor '", f.key,
             "' twice (duplicate key); each tensor may appear once");
    GK_CHECK(WeightError, f.parent != "__metadata__", label, ": \"__metadata__\" has the key '",
             f.key, "' twice (duplicate key)");
    GK_CHECK(WeightError, false, label, ": tensor '", f.parent, "' has the key '", f.key,
             "' twice (duplicate key) in its entry");
  }
  return j;
}

// A JSON integer as uint64 / int64; `what` names it in messages.
std::uint64_t offset_value(const json& v, std::string_view label, const std::string& name,
                           const char* which) {
  GK_CHECK(WeightError, v.is_number_integer(), label, ": tensor '", name, "': data_offsets ",
           which, " is ", brief(v), ", not an integer");
  GK_CHECK(WeightError, v.is_number_unsigned(), label, ": tensor '", name, "': data_offsets ",
           which, " is negative (", negative_str(v), ")");
  return v.get<std::uint64_t>();
}

const json& member(const json& entry, const char* key, std::string_view label,
                   const std::string& name) {
  const auto it = entry.find(key);
  GK_CHECK(WeightError, it != entry.end(), label, ": tensor '", name, "' has no \"", key,
           "\" field");
  return *it;
}

SafetensorsEntry parse_entry(const std::string& name, const json& entry, std::uint64_t data_size,
                             std::string_view label) {
  GK_CHECK(WeightError, entry.is_object(), label, ": tensor '", name,
           "' is described by a JSON ", entry.type_name(),
           ", not an object with dtype, shape and data_offsets");
  SafetensorsEntry e;
  e.name = name;

  const json& dtype = member(entry, "dtype", label, name);
  GK_CHECK(WeightError, dtype.is_string(), label, ": tensor '", name, "': \"dtype\" is ",
           brief(dtype), ", not a string");
  const auto& dname = dtype.get_ref<const std::string&>();
  const auto d = safetensors_dtype_from_name(dname);
  GK_CHECK(WeightError, d.has_value(), label, ": tensor '", name, "' has unknown dtype '", cut(dname),
           "' (supported: ", supported_dtype_names(), ")");
  e.dtype = *d;

  const json& shape = member(entry, "shape", label, name);
  GK_CHECK(WeightError, shape.is_array(), label, ": tensor '", name, "': \"shape\" is ",
           shape.type_name(), ", not an array of integers");
  e.shape.reserve(shape.size());
  std::int64_t numel = 1;
  for (const json& dim : shape) {
    GK_CHECK(WeightError, dim.is_number_integer(), label, ": tensor '", name, "': shape entry ",
             brief(dim), " is not an integer");
    GK_CHECK(WeightError, dim.is_number_unsigned(), label, ": tensor '", name,
             "' has a negative dimension (", negative_str(dim), ") in its shape");
    const std::uint64_t u = dim.get<std::uint64_t>();
    GK_CHECK(WeightError, u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
             label, ": tensor '", name, "': dimension ", u,
             " overflows int64 (integer overflow in the shape)");
    const auto s = static_cast<std::int64_t>(u);
    GK_CHECK(WeightError, !__builtin_mul_overflow(numel, s, &numel), label, ": tensor '", name,
             "': integer overflow in the number of elements of its shape (at dimension ",
             e.shape.size(), ", ", s, ")");
    e.shape.push_back(s);
  }
  const auto itemsize = static_cast<std::int64_t>(safetensors_itemsize(e.dtype));
  std::int64_t nbytes = 0;
  GK_CHECK(WeightError, !__builtin_mul_overflow(numel, itemsize, &nbytes), label, ": tensor '",
           name, "': integer overflow in its byte size (", numel, " elements of ", dname, ")");

  const json& offsets = member(entry, "data_offsets", label, name);
  GK_CHECK(WeightError, offsets.is_array() && offsets.size() == 2, label, ": tensor '", name,
           "': \"data_offsets\" is ", brief(offsets), ", not an array [begin, end]");
  e.begin = offset_value(offsets[0], label, name, "begin");
  e.end = offset_value(offsets[1], label, name, "end");
  GK_CHECK(WeightError, e.begin <= e.end, label, ": tensor '", name, "': data_offsets [", e.begin,
           ", ", e.end, "] end before they begin");
  GK_CHECK(WeightError, e.end - e.begin == static_cast<std::uint64_t>(nbytes), label,
           ": tensor '", name, "': byte count mismatch: data_offsets [", e.begin, ", ", e.end,
           "] hold ", e.end - e.begin, " bytes but shape ", shape_str(e.shape), " of ", dname, " needs ",
           nbytes);
  GK_CHECK(WeightError, e.end <= data_size, label, ": tensor '", name, "': data_offsets [",
           e.begin, ", ", e.end, "] lie outside the data section (", data_size,
           " bytes); the file is truncated or corrupt");
  return e;
}

std::map<std::string, std::string> parse_metadata(const json& m, std::string_view label) {
  std::map<std::string, std::string> out;
  if (m.is_null()) return out;
  GK_CHECK(WeightError, m.is_object(), label, ": \"__metadata__\" is a JSON ", m.type_name(),
           ", not an object of strings");
  for (const auto& [k, v] : m.items()) {
    GK_CHECK(WeightError, v.is_string(), label, ": \"__metadata__\" entry '", k, "' is ",
             brief(v), ", not a string");
    out.emplace(k, v.get<std::string>());
  }
  return out;
}

}  // namespace

namespace detail {
// The deepest nesting of arrays and objects in `text`, outside strings, or
// stops counting as soon as it passes `limit` (scans without recursion, so a
// hostile header cannot exhaust the stack before the parser even starts).
std::size_t json_nesting_depth(std::string_view text, std::size_t limit) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}
}  // namespace detail

std::string_view safetensors_dtype_name(SafetensorsDtype dtype) { return info(dtype).name; }

std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

std::size_t safetensors_itemsize(SafetensorsDtype dtype) { return info(dtype).itemsize; }

std::span<const SafetensorsDtype> safetensors_dtypes() { return kDtypeList; }

std::int64_t SafetensorsEntry::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t s : shape) n *= s;  // validated by the parser not to overflow
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file,
                                           std::string_view label) {
  GK_CHECK(WeightError, file.size() >= 8, label, ": the file is ", file.size(),
           " bytes, shorter than the 8-byte header length; it is truncated or not a "
           "safetensors file");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[i]);
  const std::uint64_t rest = file.size() - 8;
  GK_CHECK(WeightError, n <= kMaxSafetensorsHeaderBytes, label, ": the header length ", n,
           " bytes exceeds the format's limit of ", kMaxSafetensorsHeaderBytes,
           " bytes (the reference implementation rejects it too); the file is corrupt or hostile");
  GK_CHECK(WeightError, n <= rest, label, ": the header length ", n,
           " runs past the end of the file (", rest,
           " bytes follow the length); the file is truncated or not a safetensors file");

  SafetensorsHeader h;
  h.header_size = n;
  h.data_offset = 8 + n;
  h.data_size = rest - n;

  const json j = parse_json(file.subspan(8, n), label);
  h.tensors.reserve(j.size());
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      h.metadata = parse_metadata(value, label);
      continue;
    }
    h.tensors.push_back(parse_entry(name, value, h.data_size, label));
  }

  // The ranges, in file order, must tile the data section exactly (see
  // Note [What the parser accepts]).
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : h.tensors) {
    GK_CHECK(WeightError, e.begin >= covered, label, ": tensor '", e.name, "' (bytes [", e.begin,
             ", ", e.end, ")) overlaps tensor '", prev ? prev->name : std::string(), "' (bytes [",
             prev ? prev->begin : 0, ", ", prev ? prev->end : 0, "))");
    GK_CHECK(WeightError, e.begin == covered, label, ": bytes [", covered, ", ", e.begin,
             ") of the data section belong to no tensor (a gap before tensor '", e.name,
             "'); safetensors requires contiguous tensor data");
    covered = e.end;
    prev = &e;
  }
  GK_CHECK(WeightError, covered == h.data_size, label, ": the data section has ",
           h.data_size - covered, " trailing bytes after the last tensor",
           prev ? " '" + prev->name + "'" : std::string(" (the file has no tensors)"),
           "; safetensors requires the tensors to fill the data section exactly");
  return h;
}

}  // namespace gk
