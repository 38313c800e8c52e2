#!/usr/bin/env python3
"""Writes broken copies of a Hugging Face checkpoint directory for the engine's
negative tests (tests/examples.cmake, hf.check.llama.refused_reloads).

    make_bad_checkpoints.py GOOD_DIR OUT
      OUT/missing_shard  the index names model-00002-of-00003.safetensors, which is absent
      OUT/wrong_shape    layer 0's k_proj.weight has half its rows
      OUT/model_type     config.json says "mistral"
      OUT/rope_scaling   config.json has a rope_scaling the engine does not implement (yarn)
      OUT/rope_changed   config.json has a rope_scaling the engine implements (linear), unlike the served model
      OUT/max_position   config.json's max_position_embeddings (8) is below the engine's max_len (16)
"""
import json
import os
import shutil
import sys

from safetensors.torch import load_file, save_file

good, out = sys.argv[1], sys.argv[2]


def copy(name):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(good, d)
    return d


def edit_config(d, **changes):
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    c.update(changes)
    with open(p, "w") as f:
        json.dump(c, f, indent=2)


d = copy("missing_shard")
os.remove(os.path.join(d, "model-00002-of-00003.safetensors"))

d = copy("wrong_shape")
with open(os.path.join(d, "model.safetensors.index.json")) as f:
    index = json.load(f)
name = "model.layers.0.self_attn.k_proj.weight"
shard = os.path.join(d, index["weight_map"][name])
tensors = load_file(shard)
tensors[name] = tensors[name][: tensors[name].shape[0] // 2].contiguous()
save_file(tensors, shard, metadata={"format": "pt"})

edit_config(copy("model_type"), model_type="mistral")
edit_config(copy("rope_scaling"), rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
edit_config(copy("rope_changed"), rope_scaling={"rope_type": "linear", "factor": 2.0})
edit_config(copy("max_position"), max_position_embeddings=8)
print("wrote", out)
