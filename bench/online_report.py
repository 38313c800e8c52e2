#!/usr/bin/env python3
"""Tables and a plot of gk-online-bench's rows (bench/online_bench.cpp).

    python3 bench/online_report.py docs/data/online_h200.json [--plot docs/online_h200.png]

Prints the markdown tables of docs/performance.md's section "Online reload at
8B and 30B-MoE shapes": the measurements, and each aim of the online reload
(stage beside serving, a short commit pause, no recapture) as a ratio
measured within one run.
"""
import argparse
import json


def fmt(v, p=1):
    return "n/a" if v is None else f"{v:.{p}f}"


def label(r):
    s = f"{r['model']} {r['format']}"
    if r["model"] == "tiny" and r.get("slots"):
        s += f" ({r['slots']} slots)"
    if r.get("streaming_only"):
        s += " (streaming only)"
    if r.get("stage_device_share", 1.0) < 1.0:
        s += f" (stage share {r['stage_device_share']:.2f})"
    return s


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.json) if l.strip()]
    cols = ["weights_gib", "graphs", "recapture_all_ms", "d2d_copy_ms", "pinned_h2d_ms", "reload_gpu_source_ms",
            "reload_gpu_source_copy_ms", "reload_pinned_source_ms", "reload_safetensors_ms",
            "load_pwal_no_graphkeep_ms", "stage_ms", "pause_ms", "decode_tok_s_idle", "decode_tok_s_during_stage",
            "peak_above_model_gib", "largest_layer_gib", "host_us_per_slot"]
    print("| model | " + " | ".join(cols) + " |")
    print("| --- " * (len(cols) + 1) + "|")
    for r in rows:
        print(f"| {label(r)} | " + " | ".join(fmt(r.get(c), 2 if c.endswith("gib") else 1) for c in cols) + " |")
    print()
    # The aims are about the served models; a tiny row (--layers) measures host work only.
    rows = [r for r in rows if r["model"] != "tiny"]
    aims = [
        ("pause_ms / d2d_copy_ms", "<= 1.3", lambda r: ratio(r["pause_ms"], r["d2d_copy_ms"]), lambda x: x <= 1.3),
        ("recapture_all_ms / reload_gpu_source_ms", ">= 100 (8B bf16)",
         lambda r: ratio(r["recapture_all_ms"], r["reload_gpu_source_ms"]), lambda x: x >= 100),
        ("reload_gpu_source_ms / load_pwal_no_graphkeep_ms", "<= 1.05",
         lambda r: ratio(r["reload_gpu_source_ms"], r["load_pwal_no_graphkeep_ms"]), lambda x: x <= 1.05),
        ("decode_tok_s_during_stage / decode_tok_s_idle", ">= 0.7",
         lambda r: ratio(r["decode_tok_s_during_stage"], r["decode_tok_s_idle"]), lambda x: x >= 0.7),
        ("host_us_per_slot", "<= 2", lambda r: r["host_us_per_slot"], lambda x: x <= 2),
        ("peak_above_model_gib / largest_layer_gib", "<= 1.1",
         lambda r: ratio(r["peak_above_model_gib"], r["largest_layer_gib"]), lambda x: x <= 1.1),
    ]
    print("| aim | target | " + " | ".join(label(r) for r in rows) + " |")
    print("| --- " * (len(rows) + 2) + "|")
    for name, target, f, ok in aims:
        cells = []
        for r in rows:
            v = f(r)
            applies = not name.startswith("recapture") or (r["model"] == "llama8b" and r["format"] == "dense")
            verdict = f" ({'met' if ok(v) else 'missed'})" if v is not None and applies else ""
            cells.append("n/a" if v is None else f"{v:.2f}{verdict}")
        print(f"| {name} | {target} | " + " | ".join(cells) + " |")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        keys = ["recapture_all_ms", "reload_pinned_source_ms", "reload_gpu_source_copy_ms",
                "load_pwal_no_graphkeep_ms", "reload_gpu_source_ms", "stage_ms", "pause_ms", "d2d_copy_ms"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(rows)
        for i, r in enumerate(rows):
            vals = [r.get(k) or 0 for k in keys]
            ax.bar([x + i * w for x in range(len(keys))], vals, w, label=label(r))
        ax.set_yscale("log")
        ax.set_xticks([x + 0.4 - w / 2 for x in range(len(keys))])
        ax.set_xticklabels([k.replace("_ms", "") for k in keys], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("ms (log scale)")
        ax.set_title("Online reload on one H200: what serving pays (pause) against the alternatives")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    main()
