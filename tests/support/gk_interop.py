"""What the interop tests (tests/safetensors_interop.py,
tests/hf_checkpoint_interop.py) share: the reference implementation's import
guard, the safetensors dtype table, the check counter, and a tensor's bytes
and digest as the C++ checkers print them (tests/support/tensor_digest.h).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
    from gk_interop import torch, DTYPES, Checks, describe

Importing it imports torch, numpy and safetensors: a missing one is a
failure of the calling test (exit 1), not a skip: scripts/setup.sh installs
them, so their absence means the environment is broken.
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")  # torch warns when numpy is absent

try:
    import numpy  # noqa: F401  (safetensors.torch.save_file needs it)
    import safetensors  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch
except ImportError as e:  # pragma: no cover - environment problem
    _tool = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "interop"
    print(f"{_tool}: FAILED: cannot import the reference implementation ({e}).\n"
          f"  Install it with scripts/setup.sh or: {sys.executable} -m pip install safetensors numpy",
          file=sys.stderr)
    sys.exit(1)

# The safetensors dtype names and torch's dtypes.
DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
NAME_OF = {v: k for k, v in DTYPES.items()}


class Checks:
    """Counts checks and keeps the failed ones; each failure is printed."""

    def __init__(self):
        self.count = 0
        self.failures = []

    def __call__(self, cond, what):
        self.count += 1
        if not cond:
            self.failures.append(what)
            print(f"FAIL: {what}", file=sys.stderr)

    def summary(self):
        """Prints the counts; the exit status of the test."""
        print(f"{self.count - len(self.failures)} passed, {len(self.failures)} failed")
        return 1 if self.failures else 0


def tensor_bytes(t):
    """The tensor's bytes in row-major order."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def fnv1a64(data):
    """FNV-1a 64 of the bytes, as 16 hex digits (tests/support/tensor_digest.h)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def describe(t):
    """(dtype name, shape, byte count, digest): the fields a C++ checker prints."""
    shape = "[" + ",".join(str(s) for s in t.shape) + "]"
    data = tensor_bytes(t)
    return (NAME_OF[t.dtype], shape, str(len(data)), fnv1a64(data))


def random_tensor(dtype, shape, gen):
    """Random bit patterns (NaNs, infinities, subnormals) of `dtype`."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen, dtype=torch.uint8).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)
