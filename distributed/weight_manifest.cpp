// The manifest of a full checkpoint (weight_manifest.h): built, serialized,
// parsed, compared.
#include <graphkeep/distributed/weight_manifest.h>

#include <graphkeep/core/check.h>

#include "wire.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace gk {

using detail::concat;
using namespace detail::wire;

WeightManifest::WeightManifest(std::vector<WeightEntry> entries) : entries_(std::move(entries)) {
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const std::string& n = entries_[i].name;
    GK_CHECK(WeightError, !n.empty() && n.find_first_of("\t\n") == std::string::npos,
             "manifest tensor name '", n, "' is empty or has a tab or newline");
    GK_CHECK(WeightError, i == 0 || entries_[i - 1].name != n, "manifest lists '", n, "' twice");
    for (auto d : entries_[i].shape)
      GK_CHECK(WeightError, d >= 0, "manifest tensor '", n, "' has a negative size");
  }
}

WeightManifest WeightManifest::of(const std::vector<NamedTensor>& tensors) {
  std::vector<WeightEntry> e;
  e.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    GK_CHECK(WeightError, t.shard == 0, "a manifest describes whole tensors; '", t.name, "' is shard ",
             t.shard);
    GK_CHECK(WeightError, t.value.defined(), "manifest tensor '", t.name, "' is undefined");
    e.push_back({t.name, t.value.sizes().vec(), t.value.scalar_type()});
  }
  return WeightManifest(std::move(e));
}

std::int64_t WeightManifest::index_of(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const WeightEntry& e, std::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != name) return -1;
  return it - entries_.begin();
}

std::size_t WeightManifest::total_bytes() const {
  std::size_t n = 0;
  for (const auto& e : entries_) n += static_cast<std::size_t>(numel_of(e.shape)) * c10::elementSize(e.dtype);
  return n;
}

std::string WeightManifest::serialize() const {
  std::string out;
  for (const auto& e : entries_) out += concat(e.name, '\t', c10::toString(e.dtype), '\t', shape_str(e.shape), '\n');
  return out;
}

std::uint64_t WeightManifest::hash() const {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : serialize()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

WeightManifest WeightManifest::parse(std::string_view text) {
  std::vector<WeightEntry> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    GK_CHECK(WeightError, eol != std::string_view::npos, "malformed manifest: unterminated line");
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    const std::size_t t1 = line.find('\t');
    const std::size_t t2 = t1 == std::string_view::npos ? t1 : line.find('\t', t1 + 1);
    GK_CHECK(WeightError, t2 != std::string_view::npos, "malformed manifest line '", line, "'");
    WeightEntry e;
    e.name = std::string(line.substr(0, t1));
    const std::string_view dt = line.substr(t1 + 1, t2 - t1 - 1);
    bool found = false;
    for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions) && !found; ++i) {
      const auto st = static_cast<at::ScalarType>(i);
      if (dt == c10::toString(st)) {
        e.dtype = st;
        found = true;
      }
    }
    GK_CHECK(WeightError, found, "malformed manifest: unknown dtype '", dt, "'");
    std::string shape(line.substr(t2 + 1));
    GK_CHECK(WeightError, shape.size() >= 2 && shape.front() == '[' && shape.back() == ']',
             "malformed manifest shape '", shape, "'");
    std::istringstream is(shape.substr(1, shape.size() - 2));
    std::string tok;
    while (std::getline(is, tok, ',')) e.shape.push_back(std::stoll(tok));
    out.push_back(std::move(e));
  }
  return WeightManifest(std::move(out));
}

std::string WeightManifest::diff(const WeightManifest& reference, const WeightManifest& mine, std::size_t limit) {
  std::vector<std::string> d;
  std::size_t i = 0, j = 0;
  const auto& a = reference.entries_;
  const auto& b = mine.entries_;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].name < b[j].name)) {
      d.push_back(concat("'", a[i].name, "' is on the trainer but not here"));
      ++i;
    } else if (i == a.size() || b[j].name < a[i].name) {
      d.push_back(concat("'", b[j].name, "' is here but not on the trainer"));
      ++j;
    } else {
      if (a[i].shape != b[j].shape)
        d.push_back(concat("'", a[i].name, "' has shape ", shape_str(a[i].shape), " on the trainer but ",
                           shape_str(b[j].shape), " here"));
      if (a[i].dtype != b[j].dtype)
        d.push_back(concat("'", a[i].name, "' has dtype ", c10::toString(a[i].dtype), " on the trainer but ",
                           c10::toString(b[j].dtype), " here"));
      ++i;
      ++j;
    }
  }
  std::string out;
  for (std::size_t k = 0; k < d.size() && k < limit; ++k) out += (k ? "; " : "") + d[k];
  if (d.size() > limit) out += concat("; ... (", d.size() - limit, " more)");
  return out;
}

}  // namespace gk
