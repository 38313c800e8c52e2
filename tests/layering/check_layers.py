#!/usr/bin/env python3
"""The layering, read from the tree (label unit; see CMakeLists.txt here).

    check_layers.py SOURCE_DIR BUILD_DIR/tests/layering/layers.txt

1. Every `#include <graphkeep/...>` in a layer's sources and public headers
   names a header of that layer or of a layer it may use (its DEPS in the
   build, transitively). The build enforces this for the sources it compiles;
   this scan also covers headers no source of the layer includes.
2. README's layer table ("## Layers": layer, folder, may use) lists exactly
   the build's layers and DEPS, in the same order.
Prints one line per problem and "N passed, M failed".
"""
import os
import re
import sys

checks = failures = 0


def check(cond, what):
    global checks, failures
    checks += 1
    if not cond:
        failures += 1
        print(f"FAIL: {what}")


def main():
    src, table_path = sys.argv[1], sys.argv[2]
    deps = {}
    order = []
    with open(table_path) as f:
        for line in f:
            name, _, rest = line.strip().partition(":")
            if name:
                deps[name] = rest.split()
                order.append(name)

    def closure(layer):
        seen, todo = {layer}, [layer]
        while todo:
            for d in deps.get(todo.pop(), []):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    def header_layer(path):
        # graphkeep/<layer>/<header>.h, or the two top-level headers
        if path == "graphkeep/registry.h":
            return "registry"
        if path == "graphkeep/catalog.h":
            return "all"
        parts = path.split("/")
        return parts[1] if len(parts) > 2 else None

    include = re.compile(r'^\s*#\s*include\s*<(graphkeep/[^>]+)>', re.M)
    scanned = 0
    for layer in order:
        if layer == "all":
            continue
        allowed = closure(layer)
        roots = [os.path.join(src, layer), os.path.join(src, "include", "graphkeep", layer)]
        if layer == "registry":
            roots.append(os.path.join(src, "include", "graphkeep", "registry.h"))
        for root in roots:
            files = [root] if os.path.isfile(root) else [
                os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns
                if n.endswith((".h", ".cpp", ".cu", ".cuh"))]
            for path in files:
                scanned += 1
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for inc in include.findall(text):
                    target = header_layer(inc)
                    check(target in allowed,
                          f"{os.path.relpath(path, src)} includes <{inc}>: layer '{layer}' may use "
                          f"{', '.join(sorted(allowed - {layer})) or 'no other layer'}, not '{target}'")
    check(scanned > 50, f"only {scanned} files scanned: is SOURCE_DIR right?")

    # README's table
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    m = re.search(r"^## Layers\n(.*?)(?=^## )", readme, re.M | re.S)
    check(m is not None, "README.md has no '## Layers' section")
    rows = []
    if m:
        for line in m.group(1).splitlines():
            r = re.match(r"^\|\s*`(\w+)`\s*\|[^|]*\|([^|]*)\|", line)
            if r:
                uses = [u.strip(" `") for u in r.group(2).split(",") if u.strip(" `—-")]
                rows.append((r.group(1), uses))
    build_rows = [(name, deps[name]) for name in order if name != "all"]
    check([r[0] for r in rows] == [r[0] for r in build_rows],
          f"README's layers {[r[0] for r in rows]} differ from the build's {[r[0] for r in build_rows]}")
    for name, uses in rows:
        check(sorted(uses) == sorted(deps.get(name, [])),
              f"README says layer '{name}' may use {uses}; the build links {deps.get(name)}")
    print(f"layering: {scanned} files scanned, {len(rows)} README rows")
    print(f"{checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
