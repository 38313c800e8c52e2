"""graphkeep._C shares the process's C++ runtime: the libstdc++.so that torch
loads, not a copy of its own.

Why this is checked: on the GPU machine the extension that pip built there
crashed inside ReloadEngine::track() (docs/gpu-runs.md, 2026-12-05 16:31 and
16:38 UTC) in frames that carry names of libstdc++'s internals defined inside
_C.so itself (std::codecvt<char16_t, char, mbstate_t>::do_in and the stream
insertion of an unsigned long): two copies of the C++ runtime's locale and
stream machinery in one process. The cause (2026-12-06 06:10): that
machine's compiler wrapper puts a folder holding libstdc++.a and no
libstdc++.so first on the library path, so -lstdc++ linked the archive; Note
[The extension on the shared libstdc++] in python/CMakeLists.txt links the
shared runtime instead, and the test passed there after it. The extension
built on the development machine defines none of them. This test reads _C.so's dynamic symbol table (ELF64,
with the standard library only) and fails, naming the symbols, where the
extension defines what only libstdc++'s own objects define; its negative case
reads libstdc++.so itself, which must.
"""
import ctypes.util
import os
import struct

import pytest

import graphkeep._C

# Defined only by libstdc++'s compiled objects (no header instantiates them).
RUNTIME_ONLY = {
    "_ZNSt6locale7classicEv": "std::locale::classic()",
    "_ZNSt8ios_base4InitC1Ev": "std::ios_base::Init::Init()",
    "_ZNKSt7codecvtIDsc11__mbstate_tE5do_inERS0_PKcS4_RS4_PDsS6_RS6_":
        "std::codecvt<char16_t, char, mbstate_t>::do_in",
}


def defined_dynamic_symbols(path):
    """The names of the symbols an ELF64 little-endian shared object defines
    in its dynamic symbol table (section index not SHN_UNDEF)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF", f"{path}: not an ELF file"
    assert data[4] == 2 and data[5] == 1, f"{path}: not ELF64 little-endian"
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], 24):
            st_name, _info, _other, st_shndx, _value, _size = struct.unpack_from("<IBBHQQ", data, off)
            if st_shndx == 0 or st_name == 0:
                continue
            start = strtab[4] + st_name
            names.add(data[start:data.index(b"\0", start)].decode("ascii", "replace"))
    return names


def runtime_copies(path):
    return sorted(RUNTIME_ONLY[n] for n in defined_dynamic_symbols(path) & RUNTIME_ONLY.keys())


def test_the_extension_defines_none_of_libstdcxx_own_symbols():
    found = runtime_copies(graphkeep._C.__file__)
    assert not found, (
        f"{graphkeep._C.__file__} defines {', '.join(found)}: part of libstdc++ was linked into the "
        "extension (a static libstdc++: look for -static-libstdc++ in LDFLAGS or the link line), beside the "
        "libstdc++.so torch loads; two copies of its locale and streams in one process crash (docs/gpu-runs.md, "
        "2026-12-05 16:31). Link the extension against the shared libstdc++.")


def test_the_check_sees_libstdcxx_itself():
    # Negative: libstdc++.so defines every one of them, and the check says so.
    path = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libstdc++.so" in line:
                path = line.split()[-1]
                break
    path = path or ctypes.util.find_library("stdc++")
    if path is None or not os.path.isabs(path):
        pytest.skip("no libstdc++.so mapped in this process")
    assert runtime_copies(path) == sorted(RUNTIME_ONLY.values())
