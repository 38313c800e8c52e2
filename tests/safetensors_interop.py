#!/usr/bin/env python3
"""Interop of graphkeep's safetensors reader and writer with the reference
implementation (the `safetensors` PyPI package, installed by scripts/setup.sh).

    python3 tests/safetensors_interop.py BUILD/tests/safetensors_check

(a) files written by safetensors.torch.save_file are read by the C++ checker
    (gk::SafetensorsSource); each tensor's name, dtype, shape and a digest of
    its bytes must match Python's bit for bit;
(b) a file written by gk::write_safetensors is loaded with
    safetensors.torch.load_file and compared with the same recipe built here.

A missing `safetensors`, `numpy` (save_file needs it) or `torch` module is a
failure, not a skip (tests/support/gk_interop.py).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from gk_interop import DTYPES, Checks, describe, random_tensor, tensor_bytes, torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

check = Checks()


def run_checker(checker, mode, path):
    p = subprocess.run([checker, mode, path], capture_output=True, text=True)
    tensors, meta = {}, {}
    for line in p.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "tensor":
            tensors[f[1]] = (tuple(f[2:6]), f[6])
        elif f[0] == "meta":
            meta[f[1]] = f[2]
    return p, tensors, meta


def recipe():
    """Must match recipe() in safetensors_check.cpp."""
    base = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)
    real = (base - 12).to(torch.float64) * 0.375
    return {
        "bool": base.remainder(3) == 0,
        "u8": (base * 10 + 5).to(torch.uint8),
        "i8": (base - 12).to(torch.int8),
        "i16": (base * 1000 - 12000).to(torch.int16),
        "i32": (base * 100000 - 1200000).to(torch.int32),
        "i64": base * 1000000000000 - 5,
        "f16": real.to(torch.float16),
        "bf16": real.to(torch.bfloat16),
        "f32": real.to(torch.float32),
        "f64": real,
        "f8_e4m3": real.to(torch.float8_e4m3fn),
        "f8_e5m2": real.to(torch.float8_e5m2),
        "f32.transposed": (base.to(torch.float32) / 7).reshape(6, 4).t(),
        "i64.scalar": torch.tensor(-42, dtype=torch.int64),
        "f16.empty": torch.zeros(0, 3, dtype=torch.float16),
    }


def python_to_cpp(checker, tmp):
    gen = torch.Generator().manual_seed(1234)
    files = {}
    every = {}
    for i, (name, dtype) in enumerate(DTYPES.items()):
        every[f"{name.lower()}.matrix"] = random_tensor(dtype, (3, 5 + i), gen)
        every[f"{name.lower()}.vector"] = random_tensor(dtype, (7,), gen)
    every["f32.scalar"] = torch.tensor(3.25)
    every["i32.empty"] = torch.zeros(0, 4, dtype=torch.int32)
    every["bf16.big"] = random_tensor(torch.bfloat16, (64, 33), gen)
    files["every_dtype"] = (every, {"source": "python", "step": "7"})
    files["one_tensor"] = ({"w": torch.randn(4, 4, generator=gen)}, None)
    files["no_tensors"] = ({}, None)

    for stem, (tensors, meta) in files.items():
        path = os.path.join(tmp, stem + ".safetensors")
        save_file(tensors, path, metadata=meta)
        p, got, got_meta = run_checker(checker, "read", path)
        check(p.returncode == 0, f"{stem}: checker exited {p.returncode}: {p.stderr.strip()}")
        check(set(got) == set(tensors), f"{stem}: names differ: {sorted(got)} vs {sorted(tensors)}")
        for name, t in tensors.items():
            if name not in got:
                continue
            fields, how = got[name]
            check(fields == describe(t), f"{stem}/{name}: C++ read {fields}, Python has {describe(t)}")
            # The reference writer aligns every tensor, so nothing needs a copy.
            if t.numel() > 0:
                check(how == "zero-copy", f"{stem}/{name}: expected a zero-copy tensor, got {how}")
        check(got_meta == (meta or {}), f"{stem}: metadata {got_meta} vs {meta}")

    # A truncated reference file is rejected with an error naming the file.
    path = os.path.join(tmp, "every_dtype.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    cut = os.path.join(tmp, "truncated.safetensors")
    with open(cut, "wb") as f:
        f.write(data[:-3])
    p, _, _ = run_checker(checker, "read", cut)
    check(p.returncode == 2 and f"safetensors file '{cut}'" in p.stderr,
          f"truncated file: exit {p.returncode}, stderr {p.stderr.strip()!r}")


def hostile_headers(checker, tmp):
    """Bounds the reference enforces: both parsers must agree on each file."""
    import json
    import struct

    def write(name, header_bytes, data=b""):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
        return path

    def python_accepts(path):
        try:
            with safe_open(path, framework="pt") as f:
                list(f.keys())
            return True
        except Exception:  # the reference raises SafetensorError (a plain Exception subclass)
            return False

    def nested(depth):
        # A tensor entry's unknown member holds `depth - 2` nested lists: the
        # outer object and the entry itself are the first two levels.
        junk = "[" * (depth - 2) + "]" * (depth - 2)
        head = '{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":%s}}' % junk
        return head.encode()

    for depth, accepted in ((127, True), (128, False)):
        path = write(f"nested_{depth}.safetensors", nested(depth), b"\0\0\0\0")
        p, _, _ = run_checker(checker, "read", path)
        check(python_accepts(path) == accepted,
              f"nesting {depth}: the reference {'rejects' if accepted else 'accepts'} it")
        check((p.returncode == 0) == accepted and (accepted or "nests arrays or objects deeper" in p.stderr),
              f"nesting {depth}: C++ exit {p.returncode}, stderr {p.stderr.strip()[:200]!r}")
    # 100,000-deep nesting: rejected at once, without exhausting the stack.
    path = write("nested_100000.safetensors", nested(100000), b"\0\0\0\0")
    p, _, _ = run_checker(checker, "read", path)
    check(not python_accepts(path) and p.returncode == 2 and "deeper than 127" in p.stderr,
          f"nesting 100000: C++ exit {p.returncode}, stderr {p.stderr.strip()[:200]!r}")
    # A header one byte over the limit: padding spaces after a valid object.
    head = b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = write("huge_header.safetensors", head + b" " * (100_000_001 - len(head)), b"\0\0\0\0")
    p, _, _ = run_checker(checker, "read", path)
    check(not python_accepts(path), "header of 100,000,001 bytes: the reference accepts it")
    check(p.returncode == 2 and "exceeds the format's limit of 100000000 bytes" in p.stderr,
          f"header of 100,000,001 bytes: C++ exit {p.returncode}, stderr {p.stderr.strip()[:200]!r}")
    os.remove(path)


def cpp_to_python(checker, tmp):
    path = os.path.join(tmp, "from_cpp.safetensors")
    p, written, meta = run_checker(checker, "write", path)
    check(p.returncode == 0, f"writer exited {p.returncode}: {p.stderr.strip()}")
    if p.returncode != 0:
        return
    loaded = load_file(path)
    expected = recipe()
    check(set(loaded) == set(expected), f"names differ: {sorted(loaded)} vs {sorted(expected)}")
    for name, want in expected.items():
        if name not in loaded:
            continue
        got = loaded[name]
        check(got.dtype == want.dtype and got.shape == want.shape,
              f"{name}: loaded {got.dtype}{tuple(got.shape)}, expected {want.dtype}{tuple(want.shape)}")
        check(tensor_bytes(got) == tensor_bytes(want), f"{name}: values differ from the recipe")
        check(written.get(name, (None,))[0] == describe(got),
              f"{name}: C++ wrote {written.get(name)}, Python loaded {describe(got)}")
    with safe_open(path, framework="pt") as f:
        check(f.metadata() == meta == {"writer": "graphkeep", "format": "pt"},
              f"metadata {f.metadata()} vs {meta}")


def main():
    if len(sys.argv) != 2:
        print("usage: safetensors_interop.py PATH/TO/safetensors_check", file=sys.stderr)
        return 64
    checker = sys.argv[1]
    import safetensors
    print(f"reference: safetensors {safetensors.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="gk_st_interop_") as tmp:
        python_to_cpp(checker, tmp)
        cpp_to_python(checker, tmp)
        hostile_headers(checker, tmp)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
