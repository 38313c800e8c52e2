#!/usr/bin/env python3
"""Summarizes a Chrome trace saved by gkbench::KinetoTrace (bench/bench_trace.h):
the region's wall time, the device's busy time, and the top kernels, copies,
CUDA runtime calls (synchronizations and launches by count and time) and CPU ops.

    python3 bench/trace_summary.py trace.json [--top 25]
"""
import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    events = [e for e in json.load(open(a.trace)).get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        print("no complete events")
        return
    by_cat: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    begin = min(e["ts"] for e in events)
    end = max(e["ts"] + e.get("dur", 0) for e in events)
    device_spans = []
    for e in events:
        cat = e.get("cat", "?")
        name = e.get("name", "?")[:110]
        by_cat[cat][name] += e.get("dur", 0)
        counts[cat][name] += 1
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            device_spans.append((e["ts"], e["ts"] + e.get("dur", 0)))
    device_spans.sort()
    busy, cur_b, cur_e = 0.0, None, None
    for b, e in device_spans:
        if cur_e is None or b > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_b
            cur_b, cur_e = b, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_b
    print(f"region {(end - begin) / 1e3:.1f} ms; device busy {busy / 1e3:.1f} ms "
          f"({len(device_spans)} kernels, copies and memsets)")
    for cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op"):
        if cat not in by_cat:
            continue
        total = sum(by_cat[cat].values())
        n = sum(counts[cat].values())
        print(f"\n== {cat}: {n} events, {total / 1e3:.1f} ms")
        for name, dur in by_cat[cat].most_common(a.top):
            print(f"  {dur / 1e3:9.2f} ms {counts[cat][name]:7d}x  {name}")


if __name__ == "__main__":
    main()
