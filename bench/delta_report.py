#!/usr/bin/env python3
"""The weight patches' aims, row by row (bench_delta --json rows).

    python3 bench/delta_report.py docs/data/delta_h100_1207.json [more.json ...]

Each row is one patch of one model on one card (bench/delta_bench.cpp). For
every row the report prints the aims that apply to it, each as a ratio of two
figures measured in that same run:

- every row: `exact` true (the patched model equals a full reload of the
  target, bitwise);
- Llama-3-8B bf16: at 1 % `update_ms` at most 2.5x `d2d_copy_ms` (one device
  copy of the model's bytes, timed by the same call); at a real AdamW step
  at most 3.5x; `pause_ms` at most 0.4x `full_pause_ms`; `make_patch_ms` at
  most 40;
- the Qwen3-30B-A3B-like MoE bf16 (1 % and AdamW): `layers_rerun` 0,
  `update_ms` at most 3x `d2d_copy_ms`, `make_patch_ms` at most 300;
- Llama-3-8B FP8 made from bf16: `layers_rerun` 0, `update_ms` at most
  `full_update_ms`;
- every row: `host_us_per_tensor` at most 2. Where the row's waits spun
  (`sync` "spin", bench/bench_sync.h) that figure counts the host's waits for
  the device too; rows of `--blocking-sync` count its work alone.

A figure that is missing or not finite counts as missed, never as met. A
MoE row with fewer layers than the model's 48 (`model_layers`: the half MoE
an H100 holds) is reported, and marked as not the whole model.
"""
import argparse
import json
import math


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def aim(name, value, limit, unit=""):
    """One aim: (name, text, met). value/limit not finite -> missed."""
    ok = finite(value) and finite(limit) and value <= limit
    shown = f"{value:.2f}{unit}" if finite(value) else "missing"
    return name, f"{shown} (aim <= {limit:g}{unit})" if finite(limit) else shown, ok


def ratio(a, b):
    return a / b if finite(a) and finite(b) and b > 0 else float("nan")


def aims_of(r):
    model, fmt, change = r.get("model"), r.get("format"), str(r.get("change"))
    adamw = change.startswith("adamw")
    one_pct = change == "0.01"
    out = [("exact", str(r.get("exact")), r.get("exact") is True)]
    d2d = r.get("d2d_copy_ms")
    if model == "llama8b" and fmt == "dense":
        if one_pct:
            out.append(aim("update / d2d copy", ratio(r.get("update_ms"), d2d), 2.5, "x"))
            out.append(aim("pause / full pause", ratio(r.get("pause_ms"), r.get("full_pause_ms")), 0.4, "x"))
        if adamw:
            out.append(aim("update / d2d copy", ratio(r.get("update_ms"), d2d), 3.5, "x"))
        out.append(aim("make_patch_ms", r.get("make_patch_ms"), 40, " ms"))
    elif model == "qwen3moe30b" and fmt == "dense":
        out.append(aim("layers_rerun", r.get("layers_rerun"), 0))
        out.append(aim("update / d2d copy", ratio(r.get("update_ms"), d2d), 3, "x"))
        out.append(aim("make_patch_ms", r.get("make_patch_ms"), 300, " ms"))
    elif model == "llama8b" and fmt == "fp8":
        out.append(aim("layers_rerun", r.get("layers_rerun"), 0))
        out.append(aim("update / full update", ratio(r.get("update_ms"), r.get("full_update_ms")), 1, "x"))
    out.append(aim("host_us_per_tensor", r.get("host_us_per_tensor"), 2, " us"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    a = ap.parse_args()
    met = missed = 0
    for path in a.rows:
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            layers = r.get("model_layers")
            part = ""
            if r.get("model") == "qwen3moe30b" and finite(layers) and layers < 48:
                part = f" ({layers} of 48 layers: not the whole model)"
            print(f"{path}: {r.get('model')} {r.get('format')} {r.get('change')} on {r.get('gpu', r.get('device'))}, "
                  f"commit {r.get('commit')}, {r.get('date', '')}, waits {r.get('sync', 'spin')}{part}")
            for name, text, ok in aims_of(r):
                print(f"  {'met   ' if ok else 'MISSED'} {name}: {text}")
                met, missed = met + ok, missed + (not ok)
    print(f"{met} aims met, {missed} missed")


if __name__ == "__main__":
    main()
