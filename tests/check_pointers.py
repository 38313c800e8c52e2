#!/usr/bin/env python3
"""Every pointer in the repository's comments and docs resolves.

A comment or doc that names a file is a pointer the next reader follows. This
check reads the comments of the sources (C++ and CUDA, Python, shell, CMake,
suppression files) and the whole text of the Markdown docs, and reports, as
FILE:LINE: message,

  - a repository path that does not exist: a path whose first folder is one
    of the repository's folders (`reload/slot_plan.cpp`, `graphkeep/core/check.h`,
    `engine/llm.h`), resolved against the repository root, `include/`, the
    file's own folder, or as the tail of a tracked path; globs, placeholders
    and alternatives (`tests/*.py`, `include/graphkeep/<layer>/`,
    `docs/{reload,sites}.md`) must match;
  - a file name with a source or doc extension that no tracked file has
    (`gk_test.h` is one), unless it is one of EXTERNAL_FILES below;
  - a path that climbs out of the file's folder with `..` (the repository is
    all a reader has: write paths from the root; a Markdown link may climb,
    to a file of the repository), and an absolute path into a machine's own
    folders (a workspace, a home);
  - a reference to a Note that no file defines, or not the file it names
    (a Note is defined by a comment line holding only its title);
  - an issue number (the word issue followed by a number, or a number after
    a hash sign in parentheses): the repository has no issue tracker.

  python3 tests/check_pointers.py [--root DIR]   check every tracked file
  python3 tests/check_pointers.py --self-test    the checker against fixtures
                                                 that must fail, and clean ones

Exit status: 0 clean, 1 bad pointers (all of them listed), 2 usage error.
The ctest `docs.pointers` runs the check and `docs.pointers_self_test` the
self-test (label unit).
"""
import argparse
import fnmatch
import io
import os
import re
import subprocess
import sys
import tempfile
import tokenize

# File names that comments and docs name but that are not this repository's
# files: other projects' headers, and files a command or a program makes.
# Add one only with where it comes from.
EXTERNAL_FILES = {
    "cuda.h", "cudaTypedefs.h", "driver_types.h",  # the CUDA toolkit
    "stdlib.h",                          # the C library
    "ProcessGroupGloo.hpp",              # PyTorch's c10d
    "tu.cpp",                            # bench/compile_cost's generated translation unit
    "graphkeepConfig.cmake", "graphkeepTargets.cmake",  # the package cmake --install writes
    "modeling_rope_utils.py",            # Hugging Face transformers
}

# Extensions of the files a bare file name is checked for (data files a
# program writes, such as out.json, are named freely).
SOURCE_EXTS = ("h", "hpp", "cpp", "cc", "cu", "cuh", "py", "sh", "cmake", "md")
FILE_NAME = re.compile(r"(?<![\w.+/-])([A-Za-z_][\w+-]*(?:\.[\w+-]+)*\.(?:%s))(?![\w/-])" % "|".join(SOURCE_EXTS))
# A path with at least one slash: components of word characters, dots, *
# globs, <placeholders> and {a,b} alternatives; a trailing :LINE is allowed.
_PART = r"(?:[\w.+*-]|<[\w -]*>|\{[\w.,-]*\})+"
PATH = re.compile(r"(?<![\w.+/<>*:{}-])((?:\.\.?/)*%s(?:/%s)+/?|(?:\.\./)+%s)" % (_PART, _PART, _PART))
# An absolute path into a machine's own folders (a workspace, a home): what
# one machine had beside the checkout. (/tmp/x, /usr/include and a usage
# example's /models/x are not pointers into anything.)
ABSOLUTE = re.compile(r"(?<![\w.:/~*<>{}()$-])(/(?:work|home|root|mnt|shared|srv|scratch)/[\w./-]*[\w])")
# An issue number: the word issue(s) and a number, or a bare (#N).
ISSUE = re.compile(r"\bissues?\s+(?:nos?\.?\s*)?#?\d+|\(#\d+\)", re.IGNORECASE)
URL = re.compile(r"\b[a-z][\w+.-]*://\S+|\bwww\.\S+", re.IGNORECASE)
# A Markdown link target relative to the document, allowed to climb with ..
MD_LINK = re.compile(r"\]\((\.\./[^)\s]+)\)")
NOTE_REF = re.compile(r"Note \[([^\]]+)\](?:\s+in\s+`?([\w./-]+\.\w+)`?)?")
SKIP_DIRS = ("docs/data/", "tests/fuzz/corpus/")


# --- comments of each kind of file, as (line number, text) ---------------------

def cpp_comments(text):
    """// and /* */ comments of C, C++ and CUDA, skipping string and char literals."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end + len(m.group(1)) + 2
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text):
    """# comments of shell, CMake and suppression files (not inside quotes)."""
    out = []
    for number, raw in enumerate(text.split("\n"), 1):
        quote = None
        for k, c in enumerate(raw):
            if quote:
                if c == "\\":
                    continue
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or raw[k - 1] in " \t;(") and not raw.startswith("#!"):
                out.append((number, raw[k + 1:]))
                break
    return out


def python_comments(text):
    """# comments and docstrings (string statements) of Python."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return hash_comments(text)
    previous = tokenize.NEWLINE
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string[1:]))
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                           tokenize.DEDENT, tokenize.NL):
            for k, part in enumerate(tok.string.split("\n")):
                out.append((tok.start[0] + k, part))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


def whole_text(text):
    return list(enumerate(text.split("\n"), 1))


def comments_of(path, text):
    name = os.path.basename(path)
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    if ext in ("h", "hpp", "cpp", "cc", "cu", "cuh"):
        return cpp_comments(text)
    if ext == "py":
        return python_comments(text)
    if ext == "md":
        return whole_text(text)
    if ext in ("sh", "cmake", "supp") or name == "CMakeLists.txt" or name.endswith(".cmake.in") \
            or text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/sh") \
            or text.startswith("#!/bin/bash"):
        return hash_comments(text)
    return None  # not a file with comments this check reads


# --- the repository --------------------------------------------------------------

class Repo:
    def __init__(self, root, files):
        self.root = root
        self.files = sorted(set(files))
        self.dirs = set()
        for f in self.files:
            parts = f.split("/")
            for k in range(1, len(parts)):
                self.dirs.add("/".join(parts[:k]))
        self.paths = set(self.files) | self.dirs
        self.basenames = {f.rsplit("/", 1)[-1] for f in self.files}
        self.dir_names = {d.rsplit("/", 1)[-1] for d in self.dirs}

    @staticmethod
    def tracked(root):
        try:
            out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                                 check=True, capture_output=True, text=True).stdout
            files = [f for f in out.split("\n") if f and os.path.exists(os.path.join(root, f))]
        except (OSError, subprocess.CalledProcessError):
            files = []
            for d, subdirs, names in os.walk(root):
                subdirs[:] = [s for s in subdirs if not (s.startswith(".") or s.startswith("build")
                                                         or s in ("__pycache__", "out"))]
                files += [os.path.relpath(os.path.join(d, x), root) for x in names]
        return Repo(root, [f.replace(os.sep, "/") for f in files])

    def exists(self, rel, here):
        """Whether `rel` names something here: from the root, include/, the
        file's folder (`here`), or as the tail of a tracked path."""
        rel = rel.rstrip("/")
        candidates = [rel, "include/" + rel]
        if here:
            candidates.append(os.path.normpath(os.path.join(here, rel)).replace(os.sep, "/"))
        if any(c in self.paths for c in candidates):
            return True
        return any(p.endswith("/" + rel) for p in self.paths)

    def matches(self, pattern, here):
        pattern = re.sub(r"<[^<>/]*>", "*", pattern.rstrip("/"))
        for base in ("", "include/", (here + "/") if here else ""):
            if any(fnmatch.fnmatchcase(p, base + pattern) for p in self.paths):
                return True
        return any(fnmatch.fnmatchcase(p, "*/" + pattern) for p in self.paths)


# --- the check -------------------------------------------------------------------

def expand_braces(token):
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m.group(1).split(",") for x in expand_braces(token[:m.start()] + alt + token[m.end():])]


def check_path(repo, here, token):
    """A message when the repository path `token` does not resolve, else None."""
    token = re.sub(r":\d+(?:-\d+)?$", "", token).rstrip(".,;:")
    token = re.sub(r"(?:\.\.\.|…)$", "", token).rstrip("/") or token
    if token.startswith("../") or "/../" in token:
        return (f"'{token}' climbs out of its folder with '..' (outside the repository, or relative to "
                "the file): name it from the repository root, or not at all if it is not in the repository")
    token = token[2:] if token.startswith("./") else token
    first = token.split("/")[0]
    if first not in repo.dir_names and not (first == "graphkeep" and "/" in token):
        return None  # not one of this repository's folders: another project's path
    for path in expand_braces(token):
        if "*" in path or "<" in path:
            if not repo.matches(path, here):
                return f"'{path}' matches no file in the repository"
        elif not repo.exists(path, here):
            return f"'{path}' does not exist in the repository"
    return None


def check_line(repo, path, text, markdown):
    """The bad pointers on one line of comment or doc, as messages."""
    here = os.path.dirname(path)
    problems = []
    text = URL.sub(" ", text)
    for m in ISSUE.finditer(text):
        problems.append(f"cites an issue number ('{m.group(0)}'): the repository has no issue tracker; "
                        "say what the change was instead")
    if markdown:  # a relative link climbs out of docs/ legitimately: resolve it from the document
        def link(m):
            target = os.path.normpath(os.path.join(here, m.group(1).split("#")[0])).replace(os.sep, "/")
            if target.startswith("../") or target not in repo.paths:
                problems.append(f"link '{m.group(1)}' does not resolve to a file of the repository")
            return "]( )"
        text = MD_LINK.sub(link, text)
    for m in ABSOLUTE.finditer(text):
        problems.append(f"'{m.group(1)}' is an absolute path outside the repository: "
                        "a reader of the repository cannot follow it")
    covered = []
    for m in PATH.finditer(text):
        covered.append((m.start(1), m.end(1)))
        problem = check_path(repo, here, m.group(1))
        if problem:
            problems.append(problem)
    for m in FILE_NAME.finditer(text):
        if any(a <= m.start(1) < b for a, b in covered):
            continue
        name = m.group(1)
        if name not in repo.basenames and name not in EXTERNAL_FILES:
            problems.append(f"'{name}': no file of that name in the repository "
                            "(if it is another project's, add it to EXTERNAL_FILES in tests/check_pointers.py)")
    return problems


def read_comments(repo, path):
    if any(path.startswith(s) for s in SKIP_DIRS):
        return None
    try:
        with open(os.path.join(repo.root, path), encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None
    return comments_of(path, text)


def note_definitions(files):
    """{Note name: {file defining it}}: a comment line holding only the
    Note's title, or a Markdown line opening with the title and a colon."""
    defs = {}
    for path, lines in files.items():
        for _, line in lines:
            t = line.strip().lstrip("#*/ ").strip()
            m = re.fullmatch(r"Note \[([^\]]+)\]", t) or \
                (path.endswith(".md") and re.match(r"Note \[([^\]]+)\]:", t))
            if m:
                defs.setdefault(" ".join(m.group(1).split()), set()).add(path)
    return defs


def check_notes(path, lines, defs):
    """Every reference to a Note names a Note that exists (in the file it
    says, when it says `in FILE`). References may wrap over lines."""
    problems = []
    joined, starts = "", []
    for number, line in lines:
        starts.append((len(joined), number))
        joined += line.strip().lstrip("#*/ ").strip() + " "
    for m in NOTE_REF.finditer(joined):
        number = max(n for offset, n in starts if offset <= m.start())
        name = " ".join(m.group(1).split())
        if name.endswith("...") or name.endswith("…"):
            prefix = name.rstrip(".…").strip()
            where = set().union(*(v for k, v in defs.items() if k.startswith(prefix)))
        else:
            where = defs.get(name, set())
        if not where:
            problems.append((number, f"Note [{name}] is defined nowhere (a comment line 'Note [{name}]' "
                                     "with the note below it)"))
        elif m.group(2) and "." in m.group(2) and not any(w == m.group(2) or w.endswith("/" + m.group(2))
                                                          for w in where):
            problems.append((number, f"Note [{name}] is not in {m.group(2)}; it is in {', '.join(sorted(where))}"))
    return problems


def check(repo, only=None):
    files = {}
    for path in repo.files:
        lines = read_comments(repo, path)
        if lines is not None:
            files[path] = lines
    defs = note_definitions(files)
    report = []
    for path in (only or repo.files):
        if path not in files:
            continue
        found = []
        for number, line in files[path]:
            found += [(number, p) for p in check_line(repo, path, line, path.endswith(".md"))]
        found += check_notes(path, files[path], defs)
        report += [f"{path}:{number}: {p}" for number, p in sorted(found, key=lambda x: x[0])]
    return report


# --- the self-test: fixtures that must fail, and ones that must pass ------------

FIXTURE_TREE = {
    "core/check.h": "// Note [Errors]\n// ~~~~~~~~~~~~~\n// See core/check.cpp and docs/errors.md.\nint x;\n",
    "core/check.cpp": "// Uses check.h (Note [Errors] in core/check.h; Note [Err...]); GK_CHECK in\n"
                      "// graphkeep/core/check.h. A Note [Errors] that wraps: Note\n// [Errors] in check.h.\n",
    "include/graphkeep/core/check.h": "// The public header; /tmp/x and /usr/include are not pointers.\n",
    "docs/errors.md": "# Errors\nSee `core/check.h`, `tests/*.py`, `include/graphkeep/<layer>/`,\n"
                      "`docs/{errors,more}.md` and [the check](../core/check.h).\n"
                      "Note [Tolerances]: a doc defines a Note this way.\n",
    "docs/more.md": "Note [Tolerances] in docs/errors.md; at https://example.org/../x/issues/3 (a URL).\n",
    "tests/a_test.py": '"""Uses core/check.h."""\n# and docs/errors.md\nx = "../not/a/comment (issue 1)"\n',
    "scripts/run.sh": "#!/usr/bin/env bash\n# runs tests/a_test.py\necho \"# not a comment ../x\"\n",
    "CMakeLists.txt": "# docs/errors.md, cuda.h (CUDA\'s)\nset(X \"../outside\") # ${A}/work/x\n",
}
# (file, content, line, a part of the message that must be reported there)
BAD_FIXTURES = [
    ("core/bad1.cpp", "int a;\n// see ../shared/device/README.md\n", 2, "climbs out of its folder"),
    ("core/bad2.cpp", "/* moved to\n   core/engine.h */\n", 2, "'core/engine.h' does not exist"),
    ("core/bad3.h", "// the layers of core/moe_layers.cpp\n", 1, "does not exist"),
    ("core/bad4.cpp", "int b; // llm_runner.h's loop\n", 1, "'llm_runner.h': no file of that name"),
    ("core/bad5.cpp", "// Fixed in (issue 14).\n", 1, "cites an issue number"),
    ("core/bad6.cpp", "// see #14 (#14)\n", 1, "cites an issue number"),
    ("core/bad7.cpp", "// see /work/shared/notes/x.md\n", 1, "absolute path"),
    ("core/bad8.cpp", "// Note [Undo by storage] keeps it.\n", 1, "Note [Undo by storage] is defined nowhere"),
    ("core/bad9.cpp", "// (Note [Errors] in\n// core/check.cpp)\n", 1, "Note [Errors] is not in core/check.cpp"),
    ("docs/bad.md", "# T\n\nThe seed RFC (`../shared/seed/`) lists\n", 3, "climbs out of its folder"),
    ("docs/bad2.md", "Issue 16\'s engine.\n", 1, "cites an issue number"),
    ("docs/bad3.md", "All of `tests/*.cu`.\n", 1, "matches no file"),
    ("docs/bad4.md", "x\nSee [it](../core/gone.h).\n", 2, "does not resolve"),
    ("docs/bad5.md", "Rows in `docs/{errors,gone}.md`.\n", 1, "'docs/gone.md' does not exist"),
    ("tests/bad.py", '"""Checks docs/nothing.md."""\n', 1, "'docs/nothing.md' does not exist"),
    ("scripts/bad.sh", "#!/usr/bin/env bash\nx=1  # see ../shared/x\n", 2, "climbs out of its folder"),
    ("tests/CMakeLists.txt", "set(A 1) # (issue 3)\n", 1, "cites an issue number"),
]


def self_test():
    failures = {}
    with tempfile.TemporaryDirectory() as root:
        def write(rel, content):
            full = os.path.join(root, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(content)
        for rel, content in FIXTURE_TREE.items():
            write(rel, content)
        clean = check(Repo.tracked(root))
        if clean:
            failures["the clean tree"] = "reported:\n    " + "\n    ".join(clean)
        for rel, content, line, message in BAD_FIXTURES:
            write(rel, content)
            report = check(Repo.tracked(root))
            hits = [r for r in report if r.startswith(f"{rel}:{line}:") and message in r]
            others = [r for r in report if not r.startswith(rel + ":")]
            if not hits:
                failures[rel] = f"expected '{message}' at line {line}; got {report or 'nothing'}"
            elif others:
                failures[rel] = f"reports on other files: {others}"
            os.remove(os.path.join(root, rel))
    for what, why in failures.items():
        print(f"self-test FAILED: {what}: {why}")
    checks = 1 + len(BAD_FIXTURES)
    print(f"check_pointers self-test: {checks - len(failures)} of {checks} fixtures as expected "
          f"(1 clean tree, {len(BAD_FIXTURES)} bad pointers)")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--self-test", action="store_true")
    p.add_argument("files", nargs="*", help="check only these (paths from the root)")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    repo = Repo.tracked(args.root)
    if not repo.files:
        print(f"check_pointers: no files under {args.root}", file=sys.stderr)
        return 2
    report = check(repo, args.files or None)
    for r in report:
        print(r)
    print(f"check_pointers: {len(report)} bad pointer(s) in the comments and docs of "
          f"{len(args.files or repo.files)} files")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
