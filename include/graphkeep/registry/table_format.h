// graphkeep/registry/table_format.h
//
// Renders slot tables for people (aligned text) and tools (JSON):
//
//   std::cout << gk::format_table_text(gk::Registry<ProjectTypes>::table());
#pragma once

#include <graphkeep/registry/slot_table.h>

#include <span>
#include <string>

namespace gk {

// One line per entry: type, path, kind, role, init, reason.
std::string format_table_text(std::span<const TableEntry> entries);
// {"slots": [{"type":..., "path":..., "owner":..., "kind":..., "role":..., "init":..., "reason":...}]}
std::string format_table_json(std::span<const TableEntry> entries);

}  // namespace gk
