#!/usr/bin/env python3
"""Summarizes a Chrome trace saved by gkbench::KinetoTrace (bench/bench_trace.h):
the region's wall time, the device's busy time, and the top kernels, copies,
CUDA runtime calls (synchronizations and launches by count and time), CPU ops,
and graphkeep's ranges (Note [Ranges for the host's work] in
reload/trace_range.h): each range's total time and its own, the part no op,
CUDA call or inner range on its thread covers -- graphkeep's C++.

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
    print_ranges(events)


def own_times(events: list) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """Per graphkeep range name: total time, own time (not covered by the
    events nested directly in it on its thread), and count."""
    host_cats = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
    by_tid: dict = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in host_cats:
            by_tid[(e.get("pid"), e.get("tid"))].append(e)
    total, own, count = collections.Counter(), collections.Counter(), collections.Counter()
    for evs in by_tid.values():
        # Outer events first where two begin together.
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list = []  # [event, time covered by its direct children]
        def close(item) -> None:
            e, covered = item
            name = e.get("name", "")
            if e.get("cat") == "user_annotation" and name.startswith("gk."):
                total[name] += e.get("dur", 0)
                own[name] += max(0.0, e.get("dur", 0) - covered)
                count[name] += 1
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0].get("dur", 0):
                close(stack.pop())
            if stack:
                stack[-1][1] += e.get("dur", 0)
            stack.append([e, 0.0])
        while stack:
            close(stack.pop())
    return total, own, count


def print_ranges(events: list) -> None:
    total, own, count = own_times(events)
    if not total:
        return
    print(f"\n== graphkeep ranges: {sum(own.values()) / 1e3:.1f} ms of their own (not in an op, a CUDA call "
          f"or an inner range)")
    print(f"  {'own ms':>9} {'total ms':>9} {'count':>7}  range")
    for name, t in own.most_common():
        print(f"  {t / 1e3:9.2f} {total[name] / 1e3:9.2f} {count[name]:7d}  {name}")


if __name__ == "__main__":
    main()
