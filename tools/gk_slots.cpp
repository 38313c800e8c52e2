// gk-slots: lists every slot that the project's registered kernel and
// quantization types declare, so a reviewer sees what graphkeep protects.
//
//   gk-slots            aligned text
//   gk-slots --json     JSON ({"slots": [...]})
//   gk-slots --types    the registered type names only
//   gk-slots --rerun    per type, the derived members without a declared
//                       derivation: a weight patch touching a layer that
//                       holds one re-runs its PWAL (Note [Declared
//                       derivations] in graphkeep/registry/role.h)
#include <graphkeep/catalog.h>
#include <graphkeep/registry/table_format.h>

#include <cstdio>
#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  using R = gk::Registry<gk::ProjectTypes>;
  static constexpr auto table = R::table();
  bool json = false, types = false, rerun = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--types") == 0) {
      types = true;
    } else if (std::strcmp(argv[i], "--rerun") == 0) {
      rerun = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::puts("usage: gk-slots [--json | --types | --rerun]\n"
                "Lists every slot of graphkeep's registered kernel and quantization types;\n"
                "--rerun: per type, the derived members that make a weight patch re-run PWAL.");
      return 0;
    } else {
      std::fprintf(stderr, "gk-slots: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  if (types) {
    for (std::string_view n : R::names) std::cout << n << "\n";
    return 0;
  }
  if (rerun) {
    const auto forced = gk::forces_rerun(table);
    std::string_view type;
    for (const gk::TableEntry* e : forced) {
      if (e->root != type) std::cout << (type = e->root) << ": a patch re-runs PWAL (undeclared derivations)\n";
      std::cout << "  " << e->path() << " (" << gk::to_string(e->role.role) << ")\n";
    }
    std::cout << forced.size() << " derived slots without a declared derivation\n";
    return 0;
  }
  std::cout << (json ? gk::format_table_json(table) : gk::format_table_text(table));
  if (!json) std::cout << R::size << " types, " << table.size() << " slots\n";
  return 0;
}
