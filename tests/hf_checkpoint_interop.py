#!/usr/bin/env python3
"""Interop of gk::HfCheckpointSource with Hugging Face model directories
written by the reference implementations.

    python3 tests/hf_checkpoint_interop.py BUILD/tests/hf_checkpoint_check

(a) a state dict of every dtype, sharded the way transformers' save_pretrained
    does (shards written by safetensors.torch.save_file, named
    model-0000i-of-0000N.safetensors; model.safetensors.index.json holding
    {"metadata": {"total_size": N}, "weight_map": {...}} with sorted keys,
    indent 2): the C++ checker must list the shards in order, yield every
    tensor bit for bit (zero copy), file by file in each file's data order;
(b) the same state dict as one model.safetensors, without an index;
(c) huggingface_hub.save_torch_state_dict, when huggingface_hub is
    installed (the library transformers itself calls to shard);
(d) transformers' save_pretrained of a tiny LlamaForCausalLM in bfloat16,
    max_shard_size="20KB", when transformers is installed: every tensor of
    the model's state dict round-trips bit for bit;
(e) directories broken after the reference wrote them (a shard removed, the
    index naming a tensor its shard lacks): the checker fails naming them.

(a), (b) and (e) need `safetensors`, `numpy` and `torch` (scripts/setup.sh
installs them): their absence is a failure (tests/support/gk_interop.py). (c) and (d) are skipped with a
note when their package is absent.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from gk_interop import DTYPES, Checks, describe, random_tensor, torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

INDEX = "model.safetensors.index.json"
check = Checks()


def run_checker(checker, directory):
    p = subprocess.run([checker, directory], capture_output=True, text=True)
    out = {"files": [], "info": [], "tensors": []}
    for line in p.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "file":
            out["files"].append(f[1])
        elif f[0] == "info":
            out["info"].append((f[1], f[2], f[3], f[4]))
        elif f[0] == "tensor":
            out["tensors"].append((f[1], tuple(f[2:6]), f[6]))
    return p, out


def header_order(path):
    """The tensor names of a .safetensors file, in data order (read from its header)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return [k for k, _ in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))]


def save_sharded_like_transformers(state_dict, directory, max_shard_bytes):
    """What transformers' save_pretrained writes for safetensors: shards filled
    in state-dict order up to max_shard_bytes (a tensor larger than that alone
    in its shard), named model-0000i-of-0000N.safetensors, metadata
    {"format": "pt"}, and the index with total_size and sorted keys."""
    shards, current, size = [], {}, 0
    for name, t in state_dict.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += nbytes
    if current:
        shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.contiguous() for k, v in shard.items()}, os.path.join(directory, file),
                  metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = file
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(directory, INDEX), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return len(shards)


def compare_directory(checker, directory, state_dict, what, min_files=1):
    """Reads `directory` with the C++ checker and compares everything with
    `state_dict` and the files' own headers."""
    p, got = run_checker(checker, directory)
    check(p.returncode == 0, f"{what}: checker exited {p.returncode}: {p.stderr.strip()[:400]}")
    if p.returncode != 0:
        return
    if os.path.exists(os.path.join(directory, INDEX)):
        with open(os.path.join(directory, INDEX), encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        expected_files = sorted(set(weight_map.values()))
    else:
        weight_map = None
        expected_files = ["model.safetensors"]
    check(got["files"] == expected_files, f"{what}: files {got['files']} vs {expected_files}")
    check(len(got["files"]) >= min_files, f"{what}: {len(got['files'])} files, expected at least {min_files}")
    order = [n for f in expected_files for n in header_order(os.path.join(directory, f))]
    yielded = [name for name, _, _ in got["tensors"]]
    check(yielded == order, f"{what}: yield order {yielded[:6]}... differs from the files' data order {order[:6]}...")
    check([i[0] for i in got["info"]] == order, f"{what}: tensors() order differs from the files' data order")
    check(sorted(yielded) == sorted(state_dict), f"{what}: names differ: {sorted(set(yielded) ^ set(state_dict))}")
    for name, file, dtype, shape in got["info"]:
        if weight_map is not None:
            check(weight_map.get(name) == file, f"{what}/{name}: tensors() puts it in {file}, the index in {weight_map.get(name)}")
        if name in state_dict:
            want = describe(state_dict[name])
            check((dtype, shape) == want[:2], f"{what}/{name}: tensors() says {dtype} {shape}, Python has {want[:2]}")
    for name, fields, how in got["tensors"]:
        if name not in state_dict:
            continue
        t = state_dict[name]
        check(fields == describe(t), f"{what}/{name}: C++ read {fields}, Python has {describe(t)}")
        # The reference writer aligns every tensor, so nothing needs a copy.
        if t.numel() > 0:
            check(how == "zero-copy", f"{what}/{name}: expected a zero-copy tensor, got {how}")


def every_dtype_state_dict():
    gen = torch.Generator().manual_seed(1616)
    sd = {}
    for layer in range(3):
        for i, (name, dtype) in enumerate(DTYPES.items()):
            sd[f"model.layers.{layer}.{name.lower()}.weight"] = random_tensor(dtype, (3 + layer, 5 + i), gen)
    sd["model.embed_tokens.weight"] = random_tensor(torch.bfloat16, (64, 32), gen)
    sd["lm_head.weight"] = random_tensor(torch.bfloat16, (64, 32), gen)
    sd["model.norm.weight"] = random_tensor(torch.float32, (32,), gen)
    sd["model.scalar"] = torch.tensor(2.5)
    sd["model.empty"] = torch.zeros(0, 4, dtype=torch.int32)
    return sd


def sharded_and_single(checker, tmp):
    sd = every_dtype_state_dict()
    sharded = os.path.join(tmp, "sharded")
    os.mkdir(sharded)
    n = save_sharded_like_transformers(sd, sharded, max_shard_bytes=1500)
    check(n >= 3, f"sharded: only {n} shards written")
    compare_directory(checker, sharded, sd, "sharded", min_files=3)

    single = os.path.join(tmp, "single")
    os.mkdir(single)
    save_file(sd, os.path.join(single, "model.safetensors"), metadata={"format": "pt"})
    compare_directory(checker, single, sd, "single")
    return sd


def huggingface_hub_shards(checker, tmp, sd):
    try:
        from huggingface_hub import save_torch_state_dict
    except ImportError:
        print("note: huggingface_hub is not installed; its save_torch_state_dict check is skipped")
        return
    d = os.path.join(tmp, "hub")
    os.mkdir(d)
    save_torch_state_dict(sd, d, max_shard_size=1500)
    compare_directory(checker, d, sd, "huggingface_hub", min_files=3)


def transformers_llama(checker, tmp):
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        print("note: transformers is not installed; the save_pretrained(LlamaForCausalLM) check is skipped")
        return
    print(f"reference: transformers {transformers.__version__}")
    torch.manual_seed(16)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    d = os.path.join(tmp, "llama")
    model.save_pretrained(d, max_shard_size="20KB", safe_serialization=True)
    check(os.path.exists(os.path.join(d, INDEX)), f"llama: save_pretrained wrote no index: {sorted(os.listdir(d))}")
    sd = {k: v for k, v in model.state_dict().items()}
    compare_directory(checker, d, sd, "llama", min_files=2)


def broken_directories(checker, tmp, sd):
    # A shard removed after the reference wrote the directory.
    d = os.path.join(tmp, "broken_missing_shard")
    os.mkdir(d)
    save_sharded_like_transformers(sd, d, max_shard_bytes=1500)
    gone = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[1]
    os.remove(os.path.join(d, gone))
    p, got = run_checker(checker, d)
    check(p.returncode == 2 and f"Hugging Face checkpoint '{d}'" in p.stderr and f"shard '{gone}'" in p.stderr
          and "is missing from the directory" in p.stderr and not got["tensors"],
          f"missing shard: exit {p.returncode}, stderr {p.stderr.strip()[:300]!r}")

    # The index names a tensor its shard lacks: nothing is yielded.
    d = os.path.join(tmp, "broken_index")
    os.mkdir(d)
    save_sharded_like_transformers(sd, d, max_shard_bytes=1500)
    with open(os.path.join(d, INDEX), encoding="utf-8") as f:
        index = json.load(f)
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["model.layers.9.ghost.weight"] = first
    with open(os.path.join(d, INDEX), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
    p, got = run_checker(checker, d)
    check(p.returncode == 2 and "the index lists tensor 'model.layers.9.ghost.weight' in shard "
          f"'{first}', but the shard lacks it" in p.stderr and not got["tensors"],
          f"ghost tensor: exit {p.returncode}, stderr {p.stderr.strip()[:300]!r}")


def main():
    if len(sys.argv) != 2:
        print("usage: hf_checkpoint_interop.py PATH/TO/hf_checkpoint_check", file=sys.stderr)
        return 64
    checker = sys.argv[1]
    import safetensors
    print(f"reference: safetensors {safetensors.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="gk_hf_interop_") as tmp:
        tmp = os.path.realpath(tmp)  # as /proc/self/maps names the mapped shards
        sd = sharded_and_single(checker, tmp)
        huggingface_hub_shards(checker, tmp, sd)
        transformers_llama(checker, tmp)
        broken_directories(checker, tmp, sd)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
