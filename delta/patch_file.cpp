// Patch files: write_patch and read_patch (Note [Patch format v1] in
// graphkeep/delta/patch.h), over the sources layer's safetensors writer and
// memory-mapped reader.
#include <graphkeep/core/check.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "patch_errors.h"

namespace gk {

namespace {

using nlohmann::json;

std::string file_tensor_name(const std::string& entry, std::string_view suffix) {
  return entry + std::string(suffix);
}

json header_of(const Patch& patch) {
  json tensors = json::object();
  for (const PatchEntry& e : patch.entries) {
    tensors[e.name] = {{"dtype", std::string(safetensors_dtype_name(*to_safetensors_dtype(e.dtype)))},
                       {"shape", e.shape},
                       {"encoding", std::string(patch_encoding_name(e.encoding))},
                       {"count", e.count()},
                       {"base_hash", format_content_hash(e.base_hash)},
                       {"target_hash", format_content_hash(e.target_hash)}};
  }
  return {{"format", "gk-patch"},
          {"version", patch.version},
          {"base", patch.base_version},
          {"target", patch.target_version},
          {"hash", std::string(kContentHashName)},
          {"tensors", std::move(tensors)}};
}

// The members of `object` are exactly `names` (what: where, for the error).
void check_members(const json& object, std::initializer_list<std::string_view> names, const std::string& what) {
  for (const auto& [key, value] : object.items()) {
    (void)value;
    GK_CHECK(WeightError, std::find(names.begin(), names.end(), key) != names.end(), what, " has the member \"", key,
             "\", which format version 1 does not have");
  }
  for (const std::string_view n : names)
    GK_CHECK(WeightError, object.contains(n), what, " lacks the member \"", n, "\"");
}

const json& member(const json& object, std::string_view name, json::value_t type, const std::string& what) {
  const json& v = object.at(name);
  const bool ok = type == json::value_t::number_unsigned ? v.is_number_integer() && v.get<std::int64_t>() >= 0
                                                         : v.type() == type;
  GK_CHECK(WeightError, ok, what, ": \"", name, "\" is ", v.dump(), ", not ",
           type == json::value_t::string          ? "a string"
           : type == json::value_t::array         ? "an array"
           : type == json::value_t::object        ? "an object"
           : type == json::value_t::number_unsigned ? "a non-negative integer"
                                                  : "of the right type");
  return v;
}

PatchEntry entry_of(const std::string& name, const json& j, const std::string& label) {
  const std::string what = detail::concat(label, ": the header's entry for tensor '", name, "'");
  GK_CHECK(WeightError, j.is_object(), what, " is ", j.dump(), ", not an object");
  check_members(j, {"dtype", "shape", "encoding", "count", "base_hash", "target_hash"}, what);
  PatchEntry e;
  e.name = name;
  const std::string dtype = member(j, "dtype", json::value_t::string, what).get<std::string>();
  const auto st = safetensors_dtype_from_name(dtype);
  GK_CHECK(WeightError, st.has_value(), what, ": unknown dtype \"", dtype, "\"");
  e.dtype = to_scalar_type(*st);
  for (const json& d : member(j, "shape", json::value_t::array, what)) {
    GK_CHECK(WeightError, d.is_number_integer() && d.get<std::int64_t>() >= 0, what, ": the shape ",
             j.at("shape").dump(), " is not a list of non-negative integers");
    e.shape.push_back(d.get<std::int64_t>());
  }
  const std::string encoding = member(j, "encoding", json::value_t::string, what).get<std::string>();
  GK_CHECK(WeightError, encoding == "sparse" || encoding == "dense", what, ": unknown encoding \"", encoding,
           "\" (\"sparse\" or \"dense\")");
  e.encoding = encoding == "dense" ? PatchEncoding::dense : PatchEncoding::sparse;
  for (const char* key : {"base_hash", "target_hash"}) {
    const std::string text = member(j, key, json::value_t::string, what).get<std::string>();
    const auto h = parse_content_hash(text);
    GK_CHECK(WeightError, h.has_value(), what, ": \"", key, "\" is \"", text, "\", not 16 hex digits");
    (std::string_view(key) == "base_hash" ? e.base_hash : e.target_hash) = *h;
  }
  return e;
}

// The file tensor `name` has the dtype and shape the header implies.
void check_file_tensor(const SafetensorsEntry& f, at::ScalarType dtype, const std::vector<std::int64_t>& shape,
                       const std::string& label) {
  const auto want = to_safetensors_dtype(dtype);
  GK_CHECK(WeightError, want.has_value() && f.dtype == *want && f.shape == shape, label, ": tensor '", f.name,
           "' is ", safetensors_dtype_name(f.dtype), " ", c10::IntArrayRef(f.shape), " but the header implies ",
           want ? safetensors_dtype_name(*want) : "?", " ", c10::IntArrayRef(shape));
}

}  // namespace

void write_patch(const std::string& path, const Patch& patch) {
  validate_patch(patch);
  std::vector<NamedTensor> tensors;
  for (const PatchEntry& e : patch.entries) {
    if (e.encoding == PatchEncoding::dense) {
      tensors.push_back({file_tensor_name(e.name, kPatchDenseSuffix), e.values, 0});
    } else {
      tensors.push_back({file_tensor_name(e.name, kPatchIndicesSuffix), e.indices, 0});
      tensors.push_back({file_tensor_name(e.name, kPatchValuesSuffix), e.values, 0});
    }
  }
  std::string header;
  try {
    header = header_of(patch).dump();
  } catch (const json::exception& ex) {  // a name or version id that is not UTF-8
    GK_THROW(WeightError, detail::patch_label(patch), ": cannot write its header as JSON (", ex.what(),
             "); tensor names and version ids must be UTF-8");
  }
  write_safetensors(path, tensors, {{std::string(kPatchMetadataKey), header}});
}

Patch read_patch(const std::string& path) {
  SafetensorsSource src(path);
  Patch patch;
  patch.label = detail::concat("patch file '", path, "'");
  const std::string& label = patch.label;
  const auto meta = src.metadata().find(std::string(kPatchMetadataKey));
  GK_CHECK(WeightError, meta != src.metadata().end(), label, ": its __metadata__ has no \"", kPatchMetadataKey,
           "\" entry; it is not a graphkeep patch");
  const json header = json::parse(meta->second, nullptr, /*allow_exceptions=*/false);
  GK_CHECK(WeightError, !header.is_discarded(), label, ": the \"", kPatchMetadataKey, "\" header is not valid JSON");
  GK_CHECK(WeightError, header.is_object(), label, ": the \"", kPatchMetadataKey, "\" header is not a JSON object");
  const std::string what = detail::concat(label, ": the header");
  // The version first: a later format may differ in every other member.
  GK_CHECK(WeightError, header.contains("version") && header.at("version").is_number_integer(), what,
           " has no integer \"version\"");
  const auto version = header.at("version").get<std::int64_t>();
  GK_CHECK(WeightError, version == kPatchFormatVersion, label, ": format version ", version,
           "; this graphkeep reads version ", kPatchFormatVersion);
  check_members(header, {"format", "version", "base", "target", "hash", "tensors"}, what);
  const std::string format = member(header, "format", json::value_t::string, what).get<std::string>();
  GK_CHECK(WeightError, format == "gk-patch", what, ": \"format\" is \"", format, "\", not \"gk-patch\"");
  const std::string hash = member(header, "hash", json::value_t::string, what).get<std::string>();
  GK_CHECK(WeightError, hash == kContentHashName, what, ": the hashes are \"", hash, "\"; this graphkeep computes \"",
           kContentHashName, "\": make the patch again with this graphkeep (gk::make_patch, gk-patch diff)");
  patch.version = static_cast<int>(version);
  patch.base_version = member(header, "base", json::value_t::string, what).get<std::string>();
  patch.target_version = member(header, "target", json::value_t::string, what).get<std::string>();

  // Entries, in name order (a JSON object's members iterate sorted by key).
  std::map<std::string, std::size_t> entry_of_name;
  std::vector<std::int64_t> counts;
  for (const auto& [name, j] : member(header, "tensors", json::value_t::object, what).items()) {
    patch.entries.push_back(entry_of(name, j, label));
    counts.push_back(member(j, "count", json::value_t::number_unsigned, detail::concat(what, "'s entry for tensor '",
                                                                                        name, "'"))
                         .get<std::int64_t>());
    entry_of_name[name] = patch.entries.size() - 1;
  }

  // Every file tensor belongs to an entry, with the dtype and shape the header implies.
  std::map<std::string, const SafetensorsEntry*> files;
  for (const SafetensorsEntry& f : src.entries()) {
    const std::size_t cut = f.name.rfind("::");
    const std::string base = cut == std::string::npos ? f.name : f.name.substr(0, cut);
    const std::string_view suffix = cut == std::string::npos ? std::string_view() : std::string_view(f.name).substr(cut);
    const auto it = entry_of_name.find(base);
    GK_CHECK(WeightError, cut != std::string::npos && it != entry_of_name.end(), label, ": it holds tensor '", f.name,
             "', which the header does not describe");
    const PatchEntry& e = patch.entries[it->second];
    const std::int64_t count = counts[it->second];
    if (e.encoding == PatchEncoding::dense) {
      GK_CHECK(WeightError, suffix == kPatchDenseSuffix, label, ": tensor '", e.name,
               "' is a dense entry, but the file holds '", f.name, "'");
      GK_CHECK(WeightError, count == e.numel(), label, ": tensor '", e.name, "': the dense entry's count is ", count,
               " but the tensor has ", e.numel(), " elements");
      check_file_tensor(f, e.dtype, e.shape, label);
    } else {
      GK_CHECK(WeightError, suffix == kPatchIndicesSuffix || suffix == kPatchValuesSuffix, label, ": tensor '",
               e.name, "' is a sparse entry, but the file holds '", f.name, "'");
      const bool indices = suffix == kPatchIndicesSuffix;
      check_file_tensor(f, indices ? patch_index_dtype(e.numel()) : e.dtype, {count}, label);
    }
    files[f.name] = &f;
  }
  for (const PatchEntry& e : patch.entries) {
    const std::vector<std::string_view> need =
        e.encoding == PatchEncoding::dense ? std::vector<std::string_view>{kPatchDenseSuffix}
                                           : std::vector<std::string_view>{kPatchIndicesSuffix, kPatchValuesSuffix};
    for (const std::string_view s : need)
      GK_CHECK(WeightError, files.count(file_tensor_name(e.name, s)) == 1, label, ": tensor '", e.name, "' is a ",
               patch_encoding_name(e.encoding), " entry, but the file has no tensor '", file_tensor_name(e.name, s),
               "'");
  }

  // The data (zero copy).
  while (auto t = src.next()) {
    const std::size_t cut = t->name.rfind("::");
    PatchEntry& e = patch.entries[entry_of_name.at(t->name.substr(0, cut))];
    const std::string_view suffix = std::string_view(t->name).substr(cut);
    (suffix == kPatchIndicesSuffix ? e.indices : e.values) = t->value;
  }
  validate_patch(patch);
  return patch;
}

}  // namespace gk
