#include <graphkeep/registry/table_format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace gk {
namespace {

std::string init_column(const TableEntry& e) {
  if (e.kind == TableEntry::Kind::tensor || e.kind == TableEntry::Kind::each)
    return e.role.graph_visible() ? std::string(to_string(e.role.effective_init())) : "-";
  return "-";
}

}  // namespace

std::string patch_column(const TableEntry& e) {
  if ((e.kind != TableEntry::Kind::tensor && e.kind != TableEntry::Kind::each) || !e.role.derived()) return "-";
  return e.role.derive == Derive::undeclared ? "re-run" : std::string(to_string(e.role.derive));
}

std::vector<const TableEntry*> forces_rerun(std::span<const TableEntry> entries) {
  std::vector<const TableEntry*> out;
  for (const TableEntry& e : entries)
    if (patch_column(e) == "re-run") out.push_back(&e);
  return out;
}

std::string format_table_text(std::span<const TableEntry> entries) {
  std::size_t wt = 4, wp = 4;
  for (const TableEntry& e : entries) {
    wt = std::max(wt, e.root.size());
    wp = std::max(wp, e.path().size());
  }
  std::ostringstream os;
  auto pad = [&](std::string_view s, std::size_t w) {
    os << s << std::string(w > s.size() ? w - s.size() : 0, ' ') << "  ";
  };
  pad("type", wt);
  pad("path", wp);
  pad("kind", 7);
  pad("role", 17);
  pad("init", 9);
  pad("patch", 11);
  os << "reason\n";
  for (const TableEntry& e : entries) {
    pad(e.root, wt);
    pad(e.path(), wp);
    pad(to_string(e.kind), 7);
    pad(e.kind == TableEntry::Kind::module || e.kind == TableEntry::Kind::dynamic
            ? std::string_view("-")
            : to_string(e.role.role),
        17);
    pad(init_column(e), 9);
    pad(patch_column(e), 11);
    os << e.role.reason << "\n";
  }
  return os.str();
}

std::string format_table_json(std::span<const TableEntry> entries) {
  nlohmann::json slots = nlohmann::json::array();
  for (const TableEntry& e : entries) {
    slots.push_back({{"type", std::string(e.root)},
                     {"path", e.path()},
                     {"owner", std::string(e.owner)},
                     {"kind", std::string(to_string(e.kind))},
                     {"role", std::string(to_string(e.role.role))},
                     {"init", init_column(e)},
                     {"patch", patch_column(e)},
                     {"reason", std::string(e.role.reason)}});
  }
  return nlohmann::json{{"slots", slots}}.dump(2);
}

}  // namespace gk
