#!/usr/bin/env python3
"""Tables and a plot of the full reload's scale rows (gk-online-bench --scale-json).

    python3 bench/scale_report.py docs/data/reload_scale_h100.json [more.json ...] [--plot docs/reload_scale.png]

Each row is one reload mode of one model on one card (Note [Scale rows] in
bench/online_bench.cpp). The report prints every row, then the aims of the
per-byte work, each as a ratio measured within one run:

- a streaming reload at most 2.5x `d2d_copy_ms`, one device copy of the
  model's bytes timed by the same benchmark call;
- a staged pause, with the adopted-content check on, at most 1.3x the copy;
- graphkeep's host time per slot at most 2 us;
- the same bytes in more tensors (llama8b-e32, 11.6x the 8B's checkpoint
  tensors) at most 1.25x the 8B's reload time. Only rows of one card and one
  commit, in one file, are paired, so the two reloads met the same machine.

A ratio that is not finite is reported as missed. The plot puts the reload
time over the copy against the checkpoint's tensor count, one series per card
and mode.
"""
import argparse
import json
import math


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def verdict(v, limit):
    if v is None:
        return "n/a"
    ok = math.isfinite(v) and v <= limit  # NaN or inf is a miss, never a pass
    return f"{v:.2f} ({'met' if ok else 'missed'})"


def mode_label(r):
    m = r["mode"]
    if r.get("source", "adopted") == "copied":
        m += ", copied"
    if m == "staged":
        m += ", check on" if r.get("check_adopted_content") else ", check off"
    if r.get("sync") == "blocking":
        m += ", blocking waits"
    return m


def card(r):
    return r.get("gpu", "?").replace("NVIDIA ", "")


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for i, line in enumerate(f):
                if line.strip():
                    r = json.loads(line)
                    r["_file"], r["_line"] = p, i
                    rows.append(r)
    return rows


def same_bytes_pairs(rows):
    """(8B row, e32 row) pairs: one file, card, commit and mode; the e32 row the next one after its 8B row."""
    pairs = []
    streaming = [r for r in rows if r["mode"] == "streaming" and r.get("sync", "spin") == "spin"
                 and r.get("source", "adopted") == "adopted"]
    for e in (r for r in streaming if r["model"] == "llama8b-e32"):
        base = [b for b in streaming if b["model"] == "llama8b" and b["_file"] == e["_file"]
                and card(b) == card(e) and b["commit"] == e["commit"]]
        if base:
            pairs.append((min(base, key=lambda b: abs(b["_line"] - e["_line"])), e))
    return pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--plot")
    a = ap.parse_args()
    rows = load(a.json)
    cols = ["tensors", "slots", "model_bytes", "reload_ms", "pause_ms", "d2d_copy_ms", "host_us_per_slot"]
    print("| card | model | mode | " + " | ".join(cols) + " | reload / copy | pause / copy | commit | date |")
    print("| --- " * (len(cols) + 7) + "|")
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("n/a" if v is None else (f"{v / 2**30:.2f} GiB" if c == "model_bytes" else
                                                  f"{v:,}" if isinstance(v, int) else f"{v:.1f}"))
        rr, pr = ratio(r["reload_ms"], r["d2d_copy_ms"]), ratio(r["pause_ms"], r["d2d_copy_ms"])
        print(f"| {card(r)} | {r['model']}{' (' + str(r['layers']) + ' layers)' if r['model'] == 'qwen3moe30b' and r.get('layers', 48) != 48 else ''}"
              f" | {mode_label(r)} | " + " | ".join(cells) +
              f" | {'n/a' if rr is None else f'{rr:.2f}'} | {'n/a' if pr is None else f'{pr:.2f}'} | {r['commit']} | {r['date']} |")
    print()
    print("| aim | limit | card | model | measured |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        if r["mode"] == "streaming" and r.get("sync", "spin") == "spin":
            print(f"| {mode_label(r)} reload / copy | 2.5 | {card(r)} | {r['model']} | {verdict(ratio(r['reload_ms'], r['d2d_copy_ms']), 2.5)} |")
    for r in rows:
        if r["mode"] == "staged" and r.get("check_adopted_content"):
            print(f"| staged pause / copy, check on | 1.3 | {card(r)} | {r['model']} | {verdict(ratio(r['pause_ms'], r['d2d_copy_ms']), 1.3)} |")
    for r in rows:
        if r["mode"] == "streaming" and r.get("host_us_per_slot") is not None:
            waits = "" if r.get("sync") == "blocking" else ", spin waits"  # (mode_label names blocking ones)
            print(f"| host us per slot ({mode_label(r)}{waits}) | 2 | {card(r)} | {r['model']} | {verdict(r.get('host_us_per_slot'), 2.0)} |")
    for b, e in same_bytes_pairs(rows):
        print(f"| e32 / 8B reload, same bytes, {e['tensors'] / b['tensors']:.1f}x the tensors | 1.25 | {card(e)} | "
              f"llama8b-e32 ({e['commit']}) | {verdict(ratio(e['reload_ms'], b['reload_ms']), 1.25)} |")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
        series = {}
        for r in rows:
            series.setdefault((card(r), mode_label(r)), []).append(r)
        for (c, m), rs in sorted(series.items()):
            rs = sorted(rs, key=lambda r: r["tensors"])
            xs = [r["tensors"] for r in rs]
            ax.plot(xs, [ratio(r["reload_ms"], r["d2d_copy_ms"]) for r in rs], "o:", label=f"{c}: {m}")
            bx.plot(xs, [r["host_us_per_slot"] for r in rs], "o:", label=f"{c}: {m}")
            for r in rs:
                ax.annotate(r["model"], (r["tensors"], ratio(r["reload_ms"], r["d2d_copy_ms"])), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
        ax.axhline(2.5, color="gray", ls="--", lw=1)
        ax.text(300, 2.55, "aim: 2.5x the copy (streaming)", fontsize=7, color="gray")
        bx.axhline(2.0, color="gray", ls="--", lw=1)
        bx.text(300, 2.1, "aim: 2 us per slot", fontsize=7, color="gray")
        for x, t in ((ax, "reload time / one device copy of the bytes"), (bx, "host us per slot")):
            x.set_xscale("log")
            x.set_xlabel("checkpoint tensors (log scale)")
            x.set_title(t, fontsize=9)
        bx.set_yscale("log")
        ax.legend(fontsize=7)
        fig.suptitle("Full reload against the checkpoint's tensor count", fontsize=10)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    main()
