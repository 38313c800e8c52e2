#!/usr/bin/env python3
"""graphkeep's content hash ("gk-sum64 v1") against the same function
written here from its definition, twice: with NumPy arrays, and with plain
Python integers word by word; the splitmix64 outputs it builds on are checked
against their published values.

    python3 tests/content_hash_interop.py BUILD/tests/content_hash_check

Tensors of edge sizes and every safetensors dtype are written with
safetensors.torch.save_file; the C++ checker hashes each with
gk::content_hash; every hash must equal Python's. A missing `safetensors`,
`numpy` or `torch` module is a failure (scripts/setup.sh installs them).
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover - environment problem
    print(f"content_hash_interop: FAILED: cannot import a reference ({e}).\n"
          f"  Install with scripts/setup.sh or: {sys.executable} -m pip install safetensors numpy",
          file=sys.stderr)
    sys.exit(1)

BLOCK = 64 * 1024
MASK = (1 << 64) - 1
GAMMA, LENGTH_KEY = 0x9E3779B97F4A7C15, 0x27D4EB2F165667C5
# splitmix64 started from state 0: its first four outputs (Vigna's splitmix64.c; published test values).
SPLITMIX64_FROM_0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]


def mix_int(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def content_hash_int(data: bytes) -> int:
    """gk-sum64 v1 in plain integers, one word at a time (for small inputs)."""
    h = mix_int(len(data) ^ LENGTH_KEY)
    for j in range(0, len(data), 8):
        w = int.from_bytes(data[j:j + 8], "little")  # the last word zero-padded
        h = (h + mix_int((w + (j // 8 + 1) * GAMMA) & MASK)) & MASK
    return h


def mix_np(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def content_hash(data: bytes) -> int:
    """gk-sum64 v1 (docs/delta.md) with NumPy: little-endian words, the last
    one zero-padded; mix(w_j + (j + 1) * GAMMA) summed modulo 2^64, plus
    mix(length ^ LENGTH_KEY)."""
    words = np.frombuffer(data + bytes(-len(data) % 8), dtype="<u8")
    j = np.arange(1, len(words) + 1, dtype=np.uint64)
    terms = mix_np(words + j * np.uint64(GAMMA))
    return (int(terms.sum(dtype=np.uint64)) + mix_int(len(data) ^ LENGTH_KEY)) & MASK


def tensor_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def main():
    checker = sys.argv[1]
    g = torch.Generator().manual_seed(5)
    tensors = {}
    for n in [0, 1, 2, 31, 32, 33, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK + 17, 1 << 21]:
        tensors[f"bytes_{n}"] = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
    dtypes = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
    for dt in dtypes:
        itemsize = torch.empty((), dtype=dt).element_size()
        if dt == torch.bool:
            t = torch.randint(0, 2, (333, 257), generator=g, dtype=torch.uint8).to(torch.bool)
        else:
            t = torch.randint(0, 256, (333, 257 * itemsize), generator=g, dtype=torch.uint8).view(dt)
        tensors[f"dtype_{str(dt).split('.')[-1]}"] = t
    tensors["scalar_f32"] = torch.tensor(3.5)
    tensors["empty_2d"] = torch.empty((4, 0), dtype=torch.bfloat16)

    checks = failures = 0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "h.safetensors")
        save_file(tensors, path)
        r = subprocess.run([checker, path], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: content_hash_check exited {r.returncode}: {r.stderr}", file=sys.stderr)
            return 1
        got = dict(line.split("\t") for line in r.stdout.splitlines())
        for name, t in tensors.items():
            checks += 1
            want = f"{content_hash(tensor_bytes(t)):016x}"
            if got.get(name) != want:
                failures += 1
                print(f"FAIL: {name}: graphkeep {got.get(name)}, Python {want}", file=sys.stderr)
    # The building blocks: splitmix64's published outputs are the terms of
    # zero words, and the two Python versions agree on small inputs.
    for j, want in enumerate(SPLITMIX64_FROM_0):
        checks += 1
        if mix_int((j + 1) * GAMMA & MASK) != want:
            failures += 1
            print(f"FAIL: splitmix64 output {j} is {mix_int((j + 1) * GAMMA & MASK):016x}, published {want:016x}",
                  file=sys.stderr)
    for name in ["bytes_0", "bytes_1", "bytes_31", "bytes_33", "dtype_float64", "scalar_f32"]:
        checks += 1
        data = tensor_bytes(tensors[name])
        if content_hash_int(data) != content_hash(data):
            failures += 1
            print(f"FAIL: {name}: the two Python versions differ", file=sys.stderr)
    # Negative: the function here is sensitive to what the definition says
    # (the word positions and the length are in it), so agreement means something.
    data = tensor_bytes(tensors["bytes_33"])
    checks += 1
    if content_hash(data[8:16] + data[0:8] + data[16:]) == content_hash(data) or \
            content_hash(data + b"\0") == content_hash(data):
        failures += 1
        print("FAIL: the positions or the length do not matter?", file=sys.stderr)
    print(f"content_hash_interop: {len(tensors)} tensors, {checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
