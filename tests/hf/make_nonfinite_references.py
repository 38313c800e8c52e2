#!/usr/bin/env python3
"""Copies of a reference directory (make_reference.py's DIR) with NaN or Inf
where a checker must notice them (tests/examples.cmake, hf.check.llama.nonfinite_*).

    make_nonfinite_references.py REF OUT
      OUT/nan_weights  step1's checkpoint has every tensor NaN (step0, step2 and
                       the reference unchanged)
      OUT/nan_logits   transformers' step1 logits hold one NaN, at a prefill position
      OUT/inf_logits   transformers' step2 logits hold one +Inf, at a decode position

gk-hf-check must fail on each: a NaN or an Inf on either side is no match,
however the difference is reduced.
"""
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ref, out = sys.argv[1], sys.argv[2]


def copy(name):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(ref, d)
    return d


def rewrite(path, edit):
    """Loads the safetensors file `path`, lets `edit` change its dict, writes it back."""
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata=metadata)


d = copy("nan_weights")
step1 = os.path.join(d, "step1")
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
