#!/usr/bin/env python3
"""Compile cost of a registry change: the same generated TUs, compiled against
two include trees ("before" and "after") in alternation.

gen_and_measure.py measures one state of include/ per run; on a shared machine
whose load drifts, two runs minutes apart differ by more than a header change
costs. This driver takes gen_and_measure.py's TUs (same generator, same
compile command, same rusage measurement) and, for every (variant, N) and
every round, compiles the TU against both trees back to back, in a random
order within the pair. The summary is the median of the paired differences
(after - before) and of each side, CPU time (user + sys) first.

  git archive <old commit> include | tar -x -C /tmp/gk_before   # "before"
  bench/compile_cost/paired.py --before /tmp/gk_before/include --after include \\
      --variants baseline,pfr,describe,describe_decl --ns 50,200 --reps 3 \\
      --json /tmp/paired.json

See docs/compile_cost.md ("Re-measure after the one-error descriptor").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_and_measure as gm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="include dir of the old state")
    ap.add_argument("--after", required=True, help="include dir of the new state")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--torch-include", default=None)
    ap.add_argument("--variants", default="baseline,pfr,describe,describe_decl")
    ap.add_argument("--ns", default="50,200")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--opt", default="-O0")
    ap.add_argument("--work-dir", default="/tmp/gk_compile_cost_paired")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tinc = args.torch_include or gm.torch_include()
    # Snapshots, as gen_and_measure.py takes one: an edit during the run cannot mix states.
    trees = {}
    for side in ("before", "after"):
        dst = work / f"include_{side}"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(args.__dict__[side], dst)
        trees[side] = ["-I" + str(dst), "-isystem", tinc,
                       "-isystem", str(Path(tinc) / "torch" / "csrc" / "api" / "include")]

    cfgs = [(v, int(n)) for v in args.variants.split(",") for n in args.ns.split(",")]
    for v, n in cfgs:
        (work / f"{v}_{n}.cpp").write_text(gm.gen_tu(v, n))
    rng = random.Random(4242)
    raw: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    for rep in range(args.reps):
        order = list(cfgs)
        rng.shuffle(order)
        for k, (v, n) in enumerate(order):
            sides = ["before", "after"]
            rng.shuffle(sides)
            pair = {}
            for side in sides:
                src = work / f"{v}_{n}.cpp"
                obj = work / f"{v}_{n}_{side}.o"
                obj.unlink(missing_ok=True)
                load = os.getloadavg()[0]
                r = gm.compile_checked(gm.compile_cmd(args.cxx, trees[side], src, obj, args.opt),
                                       f"{side} {v} N={n}")
                gm.check_object(obj, v, n)
                pair[side] = {f: round(r[f], 3) for f in gm.FIELDS} | {"load1": load}
            raw.setdefault(f"{v}|{n}", []).append(pair)
            print(f"  [{rep + 1}/{args.reps} {k + 1:2d}/{len(order)}] {v:14s} N={n:<4d} "
                  f"cpu before {pair['before']['cpu_s']:6.2f} after {pair['after']['cpu_s']:6.2f}  "
                  f"rss {pair['before']['maxrss_mb']:5.0f} / {pair['after']['maxrss_mb']:5.0f} MB  "
                  f"(load {pair['after']['load1']:.1f}, {(time.monotonic() - t0) / 60:.1f} min)",
                  flush=True)

    summary = {}
    for key, pairs in raw.items():
        v, n = key.split("|")
        s = {}
        for f in gm.FIELDS:
            b = [p["before"][f] for p in pairs]
            a = [p["after"][f] for p in pairs]
            s[f] = {"before_median": statistics.median(b), "after_median": statistics.median(a),
                    "diff_median": statistics.median(x - y for x, y in zip(a, b))}
        summary[key] = s
    base = {int(k.split("|")[1]): s for k, s in summary.items() if k.startswith("baseline|")}
    print("\nvariant          N   CPU before  CPU after  paired diff  ms/class before  after   RSS MB before  after")
    for key, s in summary.items():
        v, n = key.split("|")
        n = int(n)
        c = s["cpu_s"]
        per = ""
        if v != "baseline" and n in base:
            b0 = base[n]["cpu_s"]
            per = (f"{1000 * (c['before_median'] - b0['before_median']) / n:14.0f} "
                   f"{1000 * (c['after_median'] - b0['after_median']) / n:6.0f}")
        print(f"{v:14s} {n:4d} {c['before_median']:10.2f} {c['after_median']:10.2f} "
              f"{c['diff_median']:+11.2f}  {per:21s}  "
              f"{s['maxrss_mb']['before_median']:12.0f} {s['maxrss_mb']['after_median']:6.0f}")
    info = gm.machine_info(args.cxx)
    out = {"machine": info, "before": args.before, "after": args.after, "opt": args.opt,
           "reps": args.reps, "total_minutes": (time.monotonic() - t0) / 60,
           "summary": summary, "raw": raw}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
