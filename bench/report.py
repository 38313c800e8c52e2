#!/usr/bin/env python3
"""Turns benchmark JSON into the tables of docs/performance.md and a plot.

    python3 bench/report.py --reload gpu_reload.json [--reload-cpu cpu_reload.json]
        [--plan plan_resolution.json] [--manifest manifest_extract.json]
        --machine "H200 ..." --commit abc123 --out docs/performance.md --plot docs/reload_vs_size.png

Every number is printed as measured in one run, and every comparison is a
ratio against a baseline measured in that same run.
"""
import argparse
import datetime
import json


def mib(b):
    return b / 1048576.0


def reload_table(j):
    rows = ["| layers | dim | slots | model (MiB) | reload (ms) | floor (ms) | reload / floor | load + PWAL, no graphkeep (ms) | reload / (load + PWAL) | reload + recapture (ms) | recapture / reload | peak above model (MiB) | largest layer (MiB) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in j["models"]:
        peak = f'{mib(m["peak_extra_bytes"]):.2f}' if "peak_extra_bytes" in m else "-"
        lp = f'{m["load_pwal_ms"]:.2f} | {m["overhead_vs_load_pwal"]:.2f}' if "load_pwal_ms" in m else "- | -"
        rows.append(f'| {m["layers"]} | {m["dim"]} | {m["slots"]} | {mib(m["model_bytes"]):.2f} | {m["reload_ms"]:.2f} | '
                    f'{m["floor_ms"]:.2f} | {m["overhead_vs_floor"]:.2f} | {lp} | {m["reload_recapture_ms"]:.2f} | '
                    f'{m["speedup_vs_recapture"]:.1f} | {peak} | {mib(m["largest_layer_bytes"]):.2f} |')
    return "\n".join(rows)


PHASES = ["detach", "load", "pwal", "check", "copy", "verify"]


def phase_table(j):
    rows = ["| layers | dim | " + " | ".join(PHASES) + " | graphkeep's own steps (detach + check + copy + verify) |",
            "| ---: | ---: | " + " | ".join("---:" for _ in PHASES) + " | ---: |"]
    for m in j["models"]:
        if "phases_ms" not in m:
            continue
        ph = m["phases_ms"]
        own = sum(ph[k] for k in ("detach", "check", "copy", "verify"))
        rows.append(f'| {m["layers"]} | {m["dim"]} | ' + " | ".join(f"{ph[k]:.2f}" for k in PHASES) + f" | {own:.2f} |")
    return "\n".join(rows)


def copy_table(j):
    rows = ["| slots | MiB | per-slot copy_ (GB/s) | _foreach_copy_ (GB/s) | gk::copy_slots (GB/s) | gk::SlotCopyPlan::run (GB/s) | plain copy, same bytes (GB/s) | per-slot / ceiling | _foreach_copy_ / ceiling | gk::copy_slots / ceiling | SlotCopyPlan / ceiling |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    nan = float("nan")
    for c in j["copy_back"]:
        rows.append(f'| {c["slots"]} | {mib(c["bytes"]):.2f} | {c["naive_GBps"]:.1f} | {c.get("foreach_GBps", nan):.1f} | '
                    f'{c["batched_GBps"]:.1f} | {c.get("prepared_GBps", nan):.1f} | {c["ceiling_GBps"]:.1f} | '
                    f'{c["naive_vs_ceiling"]:.2f} | {c.get("foreach_vs_ceiling", nan):.2f} | {c["batched_vs_ceiling"]:.2f} | '
                    f'{c.get("prepared_vs_ceiling", nan):.2f} |')
    return "\n".join(rows)


def plan_table(j):
    by = {}
    for b in j["benchmarks"]:
        name, arg = b["name"].split("/")[:2]
        by.setdefault(int(arg), {})[name] = b
    rows = ["| slots requested | slots | plan: ns per slot | full walk: ns per slot | walk / plan |",
            "| ---: | ---: | ---: | ---: | ---: |"]
    for arg in sorted(by):
        p, w = by[arg]["BM_PlanResolve"], by[arg]["BM_FullWalk"]
        pn, wn = p["ns_per_slot"] * 1e9, w["ns_per_slot"] * 1e9
        rows.append(f'| {arg} | {int(p["slots"])} | {pn:.1f} | {wn:.1f} | {wn / pn:.1f} |')
    return "\n".join(rows)


def plot(jsons, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, j in jsons:
        xs = [mib(m["model_bytes"]) for m in j["models"]]
        ax.plot(xs, [m["reload_ms"] for m in j["models"]], "o-", label=f"graphkeep reload ({label})")
        ax.plot(xs, [m["floor_ms"] for m in j["models"]], "k--", label=f"floor: new bytes loaded once ({label})")
        if all("load_pwal_ms" in m for m in j["models"]):
            ax.plot(xs, [m["load_pwal_ms"] for m in j["models"]], "x-.", label=f"load + PWAL without graphkeep ({label})")
        ax.plot(xs, [m["reload_recapture_ms"] for m in j["models"]], "s:", label=f"reload + recapture ({label})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model size (MiB of captured tensors)")
    ax.set_ylabel("time per weight update (ms)")
    ax.set_title("Reload time against model size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reload", help="bench_reload JSON from the GPU")
    ap.add_argument("--reload-cpu", help="bench_reload JSON from the CPU")
    ap.add_argument("--plan", help="bench_plan_resolution JSON (Google Benchmark)")
    ap.add_argument("--machine", default="")
    ap.add_argument("--cpu-machine", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--plot")
    ap.add_argument("--sections", help="write the generated tables to this file (markdown fragment)")
    a = ap.parse_args()
    parts = [f"_Generated by bench/report.py on {a.date} from commit {a.commit}._\n"]
    plots = []
    if a.reload:
        j = json.load(open(a.reload))
        parts += [f"### Reload on {a.machine} ({j['device']}, medians of {j['reps']})\n", reload_table(j), "",
                  f"### Where a reload's time goes on {a.machine} (host ms per phase, medians)\n", phase_table(j), "",
                  "### Copy-back throughput on " + a.machine + "\n", copy_table(j), ""]
        plots.append(("GPU", j))
    if a.reload_cpu:
        j = json.load(open(a.reload_cpu))
        parts += [f"### Reload on {a.cpu_machine} (CPU replay backend, medians of {j['reps']})\n", reload_table(j), ""]
        plots.append(("CPU", j))
    if a.plan:
        parts += [f"### Slot resolution per reload ({a.cpu_machine})\n", plan_table(json.load(open(a.plan))), ""]
    text = "\n".join(parts)
    if a.sections:
        open(a.sections, "w").write(text)
    else:
        print(text)
    if a.plot and plots:
        plot(plots, a.plot)


if __name__ == "__main__":
    main()
