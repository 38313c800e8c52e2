#!/usr/bin/env python3
"""Weight patches across implementations (label unit; see docs/delta.md).

    python3 tests/delta_interop.py BUILD/tools/gk-patch docs/delta.md

Two Hugging Face-style checkpoint directories (a sharded base, a target with
changes of every density and dtype, -0.0 and NaN payloads among them) are
written with safetensors.torch.save_file. Then:

(a) `gk-patch diff` writes a patch; the Python `safetensors` package reads
    it, and everything in it is checked against what this script computes on
    its own: the header, which tensors and indices changed (bitwise), the
    values, the encodings, and the content hashes recomputed from their
    definition in plain Python integers;
(b) `gk-patch apply` writes a directory equal to the target bitwise, with the
    base's layout (files, tensor order, metadata, index, config.json);
    `gk-patch stats --json` reports the counts; the patch writes NaN and
    infinities (random bits), so apply and verify refuse it without
    --allow-non-finite;
(c) docs/delta.md's Python writer (run as written there) writes a patch that
    gk-patch applies, with the same header as gk-patch's; docs/delta.md's
    Python apply reproduces the target from gk-patch's patch;
(d) bad patches written from Python (another base, an index out of range,
    repeated or unsorted indices, int64 indices for a small tensor, a wrong
    value, version 2) are refused by gk-patch apply with the file and the
    tensor named, and nothing is written;
(e) non-finite values: patches writing a NaN (bf16) or +Inf and -Inf
    (float32) are refused by verify and apply, naming the file, the tensor,
    the element (the index written to, not the position among the values)
    and the value, and pass with --allow-non-finite; stats counts them per
    tensor and in the totals (none for an integer tensor holding a NaN's
    bits); a finite patch passes verify, and stats counts 0.

A missing `safetensors`, `numpy` or `torch` module is a failure
(scripts/setup.sh installs them).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401  (save_file needs it)
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - environment problem
    print(f"delta_interop: FAILED: cannot import a reference ({e}).\n"
          f"  Install with scripts/setup.sh or: {sys.executable} -m pip install safetensors numpy",
          file=sys.stderr)
    sys.exit(1)

BLOCK = 64 * 1024
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
ST_NAME = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
           torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
           torch.float64: "F64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}

checks = 0
failures = []


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def raw(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def ref_content_hash(t):
    """gk-sum64 v1 from the definition in plain integers (not the snippet under test's NumPy)."""
    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    data = raw(t)
    h = mix(len(data) ^ 0x27D4EB2F165667C5)
    for j in range(0, len(data), 8):
        h = (h + mix((int.from_bytes(data[j:j + 8], "little") + (j // 8 + 1) * 0x9E3779B97F4A7C15) & mask)) & mask
    return f"{h:016x}"


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


def random_tensor(dtype, shape, g):
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).to(torch.bool)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n * itemsize,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)


def changed(t, count, g):
    """t with `count` random elements given other bits."""
    flat = t.contiguous().reshape(-1).view(BITS[t.element_size()]).clone()
    pos = torch.randperm(flat.numel(), generator=g)[:count]
    flip = torch.ones(count, dtype=flat.dtype) if t.dtype == torch.bool else \
        torch.randint(1, 256, (count,), generator=g).to(flat.dtype)
    flat[pos] ^= flip
    return flat.view(t.dtype).reshape(t.shape)


def write_checkpoint(d, tensors, shards):
    """A save_pretrained-like directory: shards + index when shards > 1, and config.json."""
    os.makedirs(d)
    names = sorted(tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "gk-delta-test"}, f)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: tensors[n] for n in part}, os.path.join(d, file), metadata={"format": "pt", "shard": str(s)})
        weight_map.update({n: file for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def load_dir(d):
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def non_finite(t):
    """The flat positions of t's NaN and infinite values (none for integer dtypes)."""
    if not t.is_floating_point():
        return torch.empty(0, dtype=torch.long)
    f = t.float() if t.element_size() == 1 else t  # float8: no isfinite of its own
    return torch.nonzero(~torch.isfinite(f.reshape(-1))).reshape(-1)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def snippet(doc, marker):
    text = open(doc, encoding="utf-8").read()
    m = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.S)
    if m is None:
        raise SystemExit(f"delta_interop: no python block after {marker} in {doc}")
    env = {}
    exec(compile(m.group(1), f"{doc}:{marker}", "exec"), env)
    return env


def main():
    gk_patch, doc = sys.argv[1], sys.argv[2]
    g = torch.Generator().manual_seed(42)
    base = {
        "model.embed_tokens.weight": random_tensor(torch.bfloat16, (300, 64), g),
        "model.layers.0.mlp.down_proj.weight": random_tensor(torch.bfloat16, (64, 256), g),
        "model.layers.0.self_attn.qkv.weight": random_tensor(torch.float16, (192, 64), g),
        "model.layers.0.input_layernorm.weight": random_tensor(torch.float32, (64,), g),
        "model.layers.0.mlp.scale": random_tensor(torch.float8_e4m3fn, (128, 64), g),
        "model.layers.0.mlp.q8": random_tensor(torch.int8, (40, 40), g),
        "model.layers.0.counts": random_tensor(torch.int32, (40, 40), g),
        "model.layers.0.mask": random_tensor(torch.bool, (17,), g),
        "model.norm.weight": random_tensor(torch.float64, (64,), g),
        "model.big": random_tensor(torch.uint8, (3, 70000), g),  # > 64 KiB: several hash blocks
        "lm_head.weight": random_tensor(torch.bfloat16, (300, 64), g),
    }
    target = {n: t.clone() for n, t in base.items()}
    target["model.embed_tokens.weight"] = changed(base["model.embed_tokens.weight"], 192, g)  # 1%
    target["model.layers.0.mlp.down_proj.weight"] = changed(base["model.layers.0.mlp.down_proj.weight"], 1, g)
    target["model.layers.0.self_attn.qkv.weight"] = changed(base["model.layers.0.self_attn.qkv.weight"], 6144, g)
    target["model.layers.0.mlp.q8"] = changed(base["model.layers.0.mlp.q8"], 1600, g)  # 100%
    target["model.layers.0.counts"] = changed(base["model.layers.0.counts"], 800, g)  # 50% of int32: sparse
    target["model.layers.0.mask"] = changed(base["model.layers.0.mask"], 3, g)
    target["model.big"] = changed(base["model.big"], 500, g)
    norm = base["model.layers.0.input_layernorm.weight"].clone()
    norm[0], norm[1] = 0.0, float("nan")
    base["model.layers.0.input_layernorm.weight"] = norm
    tnorm = norm.clone()
    tnorm[0] = -0.0  # equal as numbers, not as bits
    tnorm.view(torch.int32)[1] = 0x7FC00001  # another NaN payload
    target["model.layers.0.input_layernorm.weight"] = tnorm
    # unchanged: fp8 scale, f64 norm, lm_head

    # What changed, computed here.
    expect = {}
    for n in base:
        bits = BITS[base[n].element_size()]
        idx = torch.nonzero(base[n].reshape(-1).view(bits) != target[n].reshape(-1).view(bits)).reshape(-1)
        if idx.numel():
            expect[n] = idx
    check(sorted(expect) == sorted(n for n in base if n not in
                                   ("model.layers.0.mlp.scale", "model.norm.weight", "lm_head.weight")),
          f"the test's own change set: {sorted(expect)}")
    check(expect["model.layers.0.input_layernorm.weight"].tolist() == [0, 1], "-0.0 and a NaN payload are changes")

    with tempfile.TemporaryDirectory() as tmp:
        bdir, tdir = os.path.join(tmp, "step-1"), os.path.join(tmp, "step-2")
        write_checkpoint(bdir, base, shards=3)
        write_checkpoint(tdir, target, shards=1)
        patch = os.path.join(tmp, "p.safetensors")

        # (a) gk-patch diff, read by the reference implementation
        r = run(gk_patch, "diff", bdir, tdir, patch, "--base-id", "s1", "--target-id", "s2")
        check(r.returncode == 0, f"gk-patch diff: {r.returncode} {r.stderr}")
        with safe_open(patch, "pt") as f:
            header = json.loads(f.metadata()["gk_patch"])
            file_tensors = {k: f.get_tensor(k) for k in f.keys()}
        check(header["format"] == "gk-patch" and header["version"] == 1, f"format/version: {header}")
        check(header["base"] == "s1" and header["target"] == "s2", "version ids")
        check(header["hash"] == "gk-sum64 v1", "hash name")
        check(sorted(header["tensors"]) == sorted(expect), f"entries {sorted(header['tensors'])}")
        want_files = set()
        for n, idx in expect.items():
            e = header["tensors"].get(n, {})
            t, b = target[n], base[n]
            itemsize, numel = t.element_size(), t.numel()
            dense = idx.numel() * (4 + itemsize) > numel * itemsize
            check(e.get("encoding") == ("dense" if dense else "sparse"), f"{n}: encoding {e.get('encoding')}")
            check(e.get("dtype") == ST_NAME[t.dtype] and e.get("shape") == list(t.shape), f"{n}: dtype/shape")
            check(e.get("count") == (numel if dense else idx.numel()), f"{n}: count {e.get('count')}")
            check(e.get("base_hash") == ref_content_hash(b), f"{n}: base hash {e.get('base_hash')}")
            check(e.get("target_hash") == ref_content_hash(t), f"{n}: target hash {e.get('target_hash')}")
            if dense:
                want_files.add(f"{n}::dense")
                check(bits_equal(file_tensors.get(f"{n}::dense", torch.empty(0)), t), f"{n}: dense values")
            else:
                want_files |= {f"{n}::indices", f"{n}::values"}
                i = file_tensors.get(f"{n}::indices", torch.empty(0))
                check(i.dtype == torch.int32 and i.tolist() == idx.tolist(), f"{n}: indices")
                v = file_tensors.get(f"{n}::values", torch.empty(0))
                want_v = t.reshape(-1).view(BITS[itemsize])[idx].view(t.dtype)
                check(bits_equal(v, want_v), f"{n}: values")
        check(set(file_tensors) == want_files, f"file tensors {sorted(file_tensors)}")
        check(header["tensors"]["model.layers.0.mlp.q8"]["encoding"] == "dense", "100% int8 is dense")
        check(header["tensors"]["model.layers.0.counts"]["encoding"] == "sparse", "50% int32 is sparse")
        check(header["tensors"]["model.layers.0.self_attn.qkv.weight"]["encoding"] == "dense", "50% f16 is dense")

        # (b) gk-patch apply, stats, verify
        # What the patch writes that is not finite, computed here: per tensor,
        # the count, and the first such tensor (by name) with its element.
        nf_count, nf_first = {}, None
        for n in sorted(header["tensors"]):
            dense = f"{n}::dense" in file_tensors
            values = file_tensors[f"{n}::dense" if dense else f"{n}::values"]
            pos = non_finite(values)
            nf_count[n] = pos.numel()
            if pos.numel() and nf_first is None:
                first = int(pos[0])
                nf_first = (n, first if dense else int(file_tensors[f"{n}::indices"][first]))
        check(nf_count["model.layers.0.input_layernorm.weight"] == 1, "the NaN payload is a non-finite value")
        check(nf_count["model.layers.0.counts"] == 0 and nf_count["model.layers.0.mlp.q8"] == 0,
              "integer tensors have no non-finite values")
        out = os.path.join(tmp, "out")
        r = run(gk_patch, "apply", bdir, patch, out)
        check(r.returncode == 2 and f"patch file '{patch}'" in r.stderr and
              f"tensor '{nf_first[0]}': the patch writes a non-finite value (" in r.stderr and
              f" at element {nf_first[1]} of " in r.stderr and "--allow-non-finite" in r.stderr,
              f"apply of a patch writing NaN: {r.returncode} {r.stderr!r}")
        check(not os.path.exists(out), "apply of a patch writing NaN: written")
        r = run(gk_patch, "apply", bdir, patch, out, "--allow-non-finite")
        check(r.returncode == 0, f"gk-patch apply: {r.returncode} {r.stderr}")
        check(f"{sum(nf_count.values())} non-finite values written" in r.stdout, f"apply: {r.stdout}")
        got = load_dir(out) if os.path.isdir(out) else {}
        check(sorted(got) == sorted(target), "apply: the tensor set")
        check(all(bits_equal(got[n], target[n]) for n in got), "apply: every tensor bitwise equal to the target")
        check(sorted(os.listdir(out)) == sorted(os.listdir(bdir)), f"apply: layout {sorted(os.listdir(out))}")
        for file in os.listdir(bdir):
            if file.endswith(".safetensors"):
                with safe_open(os.path.join(bdir, file), "pt") as a, safe_open(os.path.join(out, file), "pt") as b:
                    check(list(a.keys()) == list(b.keys()) and a.metadata() == b.metadata(), f"apply: {file}")
            else:
                check(open(os.path.join(bdir, file)).read() == open(os.path.join(out, file)).read(), f"copy {file}")
        r = run(gk_patch, "stats", patch, "--json")
        check(r.returncode == 0, f"gk-patch stats: {r.stderr}")
        stats = json.loads(r.stdout) if r.returncode == 0 else {"totals": {}, "tensors": []}
        check(stats["totals"].get("tensors") == len(expect), "stats: tensors")
        check(stats["totals"].get("payload_bytes") == sum(t.numel() * t.element_size() for t in file_tensors.values()),
              "stats: payload bytes")
        down = [t for t in stats["tensors"] if t["name"] == "model.layers.0.mlp.down_proj.weight"]
        check(len(down) == 1 and down[0]["count"] == 1 and abs(down[0]["density"] - 1 / (64 * 256)) < 1e-12,
              "stats: density of a one-element change")
        check(set(stats["totals"]) == {"tensors", "count", "numel", "density", "payload_bytes", "dense_bytes",
                                       "file_bytes", "non_finite"}, f"stats: totals keys {sorted(stats['totals'])}")
        check(all(set(t) == {"name", "encoding", "dtype", "shape", "numel", "count", "density", "payload_bytes",
                             "dense_bytes", "base_hash", "target_hash", "non_finite"} for t in stats["tensors"]),
              "stats: tensor keys")
        check({t["name"]: t["non_finite"] for t in stats["tensors"]} == nf_count,
              f"stats: non-finite per tensor {[(t['name'], t['non_finite']) for t in stats['tensors']]} != {nf_count}")
        check(stats["totals"].get("non_finite") == sum(nf_count.values()), "stats: non-finite total")
        r = run(gk_patch, "stats", patch)
        check(r.returncode == 0 and "total: 8 tensors" in r.stdout and
              f"{sum(nf_count.values())} non-finite values written" in r.stdout, f"stats text: {r.stdout[-200:]}")
        r = run(gk_patch, "verify", bdir, patch)
        check(r.returncode == 2 and f"tensor '{nf_first[0]}': the patch writes a non-finite value" in r.stderr,
              f"gk-patch verify of a patch writing NaN: {r.returncode} {r.stderr!r}")
        r = run(gk_patch, "verify", bdir, patch, "--allow-non-finite")
        check(r.returncode == 0, f"gk-patch verify: {r.stderr}")
        r = run(gk_patch, "apply", bdir, patch, out)  # exists already
        check(r.returncode == 2 and "exists" in r.stderr, f"apply over an existing directory: {r.stderr}")

        # (c) docs/delta.md's Python writer, applied by gk-patch; its apply, on gk-patch's patch
        writer = snippet(doc, "<!-- gk-patch-python-snippet -->")
        pypatch = os.path.join(tmp, "py.safetensors")
        writer["write_gk_patch"](pypatch, base, target, "s1", "s2")
        with safe_open(pypatch, "pt") as f:
            py_header = json.loads(f.metadata()["gk_patch"])
        check(py_header == header, "the snippet's header equals gk-patch's")
        out2 = os.path.join(tmp, "out2")
        r = run(gk_patch, "apply", bdir, pypatch, out2, "--allow-non-finite")
        check(r.returncode == 0, f"gk-patch apply of the Python patch: {r.stderr}")
        got = load_dir(out2) if os.path.isdir(out2) else {}
        check(sorted(got) == sorted(target) and all(bits_equal(got[n], target[n]) for n in got),
              "the Python patch reproduces the target")
        applier = snippet(doc, "<!-- gk-patch-python-apply -->")
        weights = {n: t.clone() for n, t in base.items()}
        applier["apply_gk_patch"](patch, weights)
        check(all(bits_equal(weights[n], target[n]) for n in target), "the Python apply reproduces the target")

        # (d) bad patches from Python: refused, file and tensor named, nothing written
        def bad(name, edit_tensors, edit_header, tensor, needle):
            tensors = {k: v.clone() for k, v in file_tensors.items()}
            h = json.loads(json.dumps(header))
            edit_tensors(tensors)
            edit_header(h)
            path = os.path.join(tmp, f"bad_{name}.safetensors")
            save_file(tensors, path, metadata={"gk_patch": json.dumps(h)})
            dest = os.path.join(tmp, f"out_{name}")
            r = run(gk_patch, "apply", bdir, path, dest)
            check(r.returncode == 2, f"{name}: exit {r.returncode}")
            named = f"'{tensor}'" in r.stderr if tensor else True
            check(f"patch file '{path}'" in r.stderr and named and needle in r.stderr,
                  f"{name}: message {r.stderr!r}")
            check(not os.path.exists(dest), f"{name}: {dest} was written")

        def nothing(_):
            pass

        emb = "model.embed_tokens.weight"

        def set_index(pos, value):
            def edit(ts):
                ts[f"{emb}::indices"][pos] = value
            return edit

        bad("index_range", set_index(-1, 300 * 64), nothing, emb, "index 19200 is out of range [0, 19200)")
        bad("index_negative", set_index(0, -5), nothing, emb, "index -5 is out of range")
        first = int(file_tensors[f"{emb}::indices"][0])
        bad("index_repeated", set_index(1, first), nothing, emb, "appears twice")
        bad("index_unsorted", lambda ts: ts[f"{emb}::indices"].copy_(ts[f"{emb}::indices"].flip(0)), nothing, emb,
            "indices must be sorted ascending")

        def wide(ts):
            ts[f"{emb}::indices"] = ts[f"{emb}::indices"].long()
        bad("index_int64", wide, nothing, f"{emb}::indices", "is I64 [192] but the header implies I32 [192]")

        def wrong_value(ts):
            v = ts[f"{emb}::values"].view(torch.int16)
            v[3] ^= 1
        bad("value", wrong_value, nothing, emb, "after the patch its content hash is")
        bad("version", nothing, lambda h: h.update(version=2), "", "format version 2")
        bad("shape", nothing, lambda h: h["tensors"][emb].update(shape=[64, 300]), emb,
            "is BFloat16 [64, 300] in the patch but BFloat16 [300, 64] in the model")
        # another base: the target directory
        dest = os.path.join(tmp, "out_other_base")
        r = run(gk_patch, "apply", tdir, patch, dest)
        check(r.returncode == 2 and "the patch was made from other weights: apply it to version 's1'" in r.stderr,
              f"other base: {r.stderr!r}")
        check(not os.path.exists(dest), "other base: written")

        # (e) non-finite values: refused unless --allow-non-finite, counted by stats
        fbase = {"w": (torch.arange(32, dtype=torch.float32) / 8).to(torch.bfloat16).reshape(4, 8),
                 "n": torch.linspace(-1, 1, 16, dtype=torch.float32),
                 "c": torch.arange(8, dtype=torch.int32)}
        fdir = os.path.join(tmp, "finite-1")
        write_checkpoint(fdir, fbase, shards=1)

        def patch_to(name, edit):
            t = {k: v.clone() for k, v in fbase.items()}
            edit(t)
            tdir_ = os.path.join(tmp, f"{name}-2")
            write_checkpoint(tdir_, t, shards=1)
            path = os.path.join(tmp, f"{name}.safetensors")
            r = run(gk_patch, "diff", fdir, tdir_, path, "--sparse")
            check(r.returncode == 0, f"{name}: gk-patch diff: {r.stderr}")
            return path, t

        def edit_nan(t):  # values at positions 0, 1, 2 of "w": the NaN is position 2, element 9
            t["w"].view(-1)[2], t["w"].view(-1)[3], t["w"].view(-1)[9] = 0.5, -1.0, float("nan")
            t["c"][1] = 0x7FC00000  # a NaN's bits, in an integer tensor: a plain number

        def edit_inf(t):
            t["n"][4], t["n"][11], t["n"][13] = 2.0, float("inf"), float("-inf")

        def edit_finite(t):
            t["w"].view(-1)[0] = 3.0
            t["n"][0] = -3.0e38

        def stats_of(path):
            r = run(gk_patch, "stats", path, "--json")
            check(r.returncode == 0, f"stats {path}: {r.stderr}")
            s = json.loads(r.stdout) if r.returncode == 0 else {"totals": {}, "tensors": []}
            return {t["name"]: t.get("non_finite") for t in s["tensors"]}, s["totals"].get("non_finite")

        cases = [("nan", edit_nan, "w", "(nan at element 9 of [4, 8];", {"w": 1, "c": 0}, 1),
                 ("inf", edit_inf, "n", "(inf at element 11 of [16];", {"n": 2}, 2)]
        for name, edit, tensor, needle, per_tensor, total in cases:
            path, t = patch_to(name, edit)
            check(stats_of(path) == (per_tensor, total), f"{name}: stats {stats_of(path)}")
            for cmd in ("verify", "apply"):
                dest = os.path.join(tmp, f"out_{name}_{cmd}")
                r = run(gk_patch, cmd, fdir, path, *([dest] if cmd == "apply" else []))
                check(r.returncode == 2, f"{name}: {cmd} exit {r.returncode}")
                check(f"patch file '{path}': tensor '{tensor}': the patch writes a non-finite value {needle}" in
                      r.stderr and "--allow-non-finite" in r.stderr, f"{name}: {cmd} message {r.stderr!r}")
                check(not os.path.exists(dest), f"{name}: {cmd} wrote {dest}")
                r = run(gk_patch, cmd, fdir, path, *([dest] if cmd == "apply" else []), "--allow-non-finite")
                check(r.returncode == 0 and f"{total} non-finite values" in r.stdout,
                      f"{name}: {cmd} --allow-non-finite: {r.returncode} {r.stdout!r} {r.stderr!r}")
            got = load_dir(dest) if os.path.isdir(dest) else {}
            check(sorted(got) == sorted(t) and all(bits_equal(got[n], t[n]) for n in got),
                  f"{name}: apply --allow-non-finite reproduces the target")
        r = run(gk_patch, "stats", os.path.join(tmp, "nan.safetensors"))
        check(r.returncode == 0 and "1 non-finite values written" in r.stdout, f"nan: stats text {r.stdout!r}")
        path, _ = patch_to("finite", edit_finite)
        check(stats_of(path) == ({"w": 0, "n": 0}, 0), f"finite: stats {stats_of(path)}")
        r = run(gk_patch, "verify", fdir, path)
        check(r.returncode == 0 and "non-finite" not in r.stdout + r.stderr,
              f"finite: verify {r.returncode} {r.stdout!r} {r.stderr!r}")

        leftovers = [f for f in os.listdir(tmp) if "gk-patch" in f]
        check(not leftovers, f"staging directories left behind: {leftovers}")

    print(f"delta_interop: {checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
