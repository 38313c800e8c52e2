// graphkeep/registry/table_format.h
//
// Renders slot tables for people (aligned text) and tools (JSON):
//
//   std::cout << gk::format_table_text(gk::Registry<ProjectTypes>::table());
#pragma once

#include <graphkeep/registry/slot_table.h>

#include <span>
#include <string>
#include <vector>

namespace gk {

// One line per entry: type, path, kind, role, init, patch, reason.
std::string format_table_text(std::span<const TableEntry> entries);
// {"slots": [{"type":..., "path":..., "owner":..., "kind":..., "role":..., "init":..., "patch":..., "reason":...}]}
std::string format_table_json(std::span<const TableEntry> entries);

// What a weight patch does with an entry (Note [Declared derivations] in
// role.h): "from_shapes" for a declared derivation, "re-run"
// for a derived member without one (a patch touching its layer re-runs
// PWAL), "-" for a member that is not derived.
std::string patch_column(const TableEntry& e);
// The entries whose column is "re-run", in order.
std::vector<const TableEntry*> forces_rerun(std::span<const TableEntry> entries);

}  // namespace gk
