#!/usr/bin/env python3
"""Writes broken copies of a reference directory (make_reference.py's DIR) for
the engine's negative tests (tests/examples.cmake).

    make_bad_checkpoints.py REF OUT

Copies of REF/step1, each a reload the engine must refuse
(hf.check.llama.refused_reloads):
      OUT/missing_shard  the index names model-00002-of-00003.safetensors, which is absent
      OUT/wrong_shape    layer 0's k_proj.weight has half its rows
      OUT/model_type     config.json says "mistral"
      OUT/rope_scaling   config.json has a rope_scaling the engine does not implement (yarn)
      OUT/rope_changed   config.json has a rope_scaling the engine implements (linear), unlike the served model
      OUT/max_position   config.json's max_position_embeddings (8) is below the engine's max_len (16)
Copies of REF with NaN or Inf where gk-hf-check must notice them, however the
difference is reduced (hf.check.llama.nonfinite_*):
      OUT/nan_weights    step1's checkpoint has every tensor NaN (step0, step2 and the reference unchanged)
      OUT/nan_logits     transformers' step1 logits hold one NaN, at a prefill position
      OUT/inf_logits     transformers' step2 logits hold one +Inf, at a decode position
"""
import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ref, out = sys.argv[1], sys.argv[2]


def copy(name, what=""):
    """OUT/name, a fresh copy of REF/what (REF itself when what is empty)."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(os.path.join(ref, what), d)
    return d


def edit_config(d, **changes):
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    c.update(changes)
    with open(p, "w") as f:
        json.dump(c, f, indent=2)


def rewrite(path, edit):
    """Loads the safetensors file `path`, lets `edit` change its dict, writes it back."""
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata=metadata)


# --- refused reloads ----------------------------------------------------------
d = copy("missing_shard", "step1")
os.remove(os.path.join(d, "model-00002-of-00003.safetensors"))

d = copy("wrong_shape", "step1")
with open(os.path.join(d, "model.safetensors.index.json")) as f:
    index = json.load(f)
name = "model.layers.0.self_attn.k_proj.weight"


def halve(t):
    t[name] = t[name][: t[name].shape[0] // 2].contiguous()


rewrite(os.path.join(d, index["weight_map"][name]), halve)

edit_config(copy("model_type", "step1"), model_type="mistral")
edit_config(copy("rope_scaling", "step1"),
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
edit_config(copy("rope_changed", "step1"), rope_scaling={"rope_type": "linear", "factor": 2.0})
edit_config(copy("max_position", "step1"), max_position_embeddings=8)

# --- non-finite values ----------------------------------------------------------
step1 = os.path.join(copy("nan_weights"), "step1")
shards = [f for f in os.listdir(step1) if f.endswith(".safetensors")]
assert shards, f"no safetensors file in {step1}"
for shard in shards:
    rewrite(os.path.join(step1, shard), lambda t: t.update({k: torch.full_like(v, float("nan")) for k, v in t.items()}))


def poison(key, index, value):
    def edit(t):
        t[key] = t[key].clone()
        t[key][index] = value
    return edit


# Positions: gk-hf-check prefills tokens 0..3 and decodes the rest.
rewrite(os.path.join(copy("nan_logits"), "reference.safetensors"), poison("step1.logits", (0, 2, 7), float("nan")))
rewrite(os.path.join(copy("inf_logits"), "reference.safetensors"), poison("step2.logits", (1, 6, 3), float("inf")))
print("wrote", out)
