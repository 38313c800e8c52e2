#!/usr/bin/env python3
"""Copies a reference directory (make_reference.py's DIR) with rope_scaling set
to null in every step's config.json: what serving a Llama 3.1+ checkpoint with
plain RoPE amounts to (tests/examples.cmake, hf.check.llama_rope_llama3.plain_rope).
Against the scaled model's logits and rotary tables, gk-hf-check must fail.

    strip_rope_scaling.py REF OUT
"""
import json
import os
import shutil
import sys

ref, out = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
shutil.copytree(ref, out)
steps = sorted(d for d in os.listdir(out) if d.startswith("step") and d[4:].isdigit())
assert steps, f"no step directories in {ref}"
for step in steps:
    path = os.path.join(out, step, "config.json")
    with open(path) as f:
        config = json.load(f)
    assert config.get("rope_scaling"), f"{path} has no rope_scaling to strip"
    config["rope_scaling"] = None
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
print("wrote", out)
