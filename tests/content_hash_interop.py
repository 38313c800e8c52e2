#!/usr/bin/env python3
"""graphkeep's content hash ("gk-xxh64-blocks v1") against the same function
written here with the `xxhash` PyPI package (its own copy of the reference
xxHash, not the libxxhash graphkeep links).

    python3 tests/content_hash_interop.py BUILD/tests/content_hash_check

Tensors of edge sizes and every safetensors dtype are written with
safetensors.torch.save_file; the C++ checker hashes each with
gk::content_hash; every hash must equal Python's. A missing `xxhash`,
`safetensors`, `numpy` or `torch` module is a failure (scripts/setup.sh
installs them).
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401  (save_file needs it)
    import torch
    import xxhash
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover - environment problem
    print(f"content_hash_interop: FAILED: cannot import a reference ({e}).\n"
          f"  Install with scripts/setup.sh or: {sys.executable} -m pip install xxhash safetensors numpy",
          file=sys.stderr)
    sys.exit(1)

BLOCK = 64 * 1024


def content_hash(data: bytes) -> int:
    """gk-xxh64-blocks v1 (docs/delta.md): XXH64 of each 64 KiB block, seed 0;
    then XXH64 of the digests as little-endian uint64, seed = the byte length."""
    digests = b"".join(xxhash.xxh64_intdigest(data[i:i + BLOCK], seed=0).to_bytes(8, "little")
                       for i in range(0, len(data), BLOCK))
    return xxhash.xxh64_intdigest(digests, seed=len(data))


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
                print(f"FAIL: {name}: graphkeep {got.get(name)}, Python xxhash {want}", file=sys.stderr)
    # Negative: the function here is sensitive to what the definition says
    # (a seed-0 outer hash would be another function), so agreement means something.
    data = tensor_bytes(tensors[f"bytes_{BLOCK}"])
    checks += 1
    if xxhash.xxh64_intdigest(xxhash.xxh64_intdigest(data).to_bytes(8, "little"), seed=0) == content_hash(data):
        failures += 1
        print("FAIL: the outer seed does not matter?", file=sys.stderr)
    print(f"content_hash_interop: {len(tensors)} tensors, {checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
