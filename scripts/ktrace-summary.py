#!/usr/bin/env python3
"""Summary of a kernel timeline written with PAGODA_CUDA_KTRACE=FILE.

    scripts/ktrace-summary.py FILE [--step-start NAME | --step-end NAME] [--steps N] [--show N]

A step starts with a kernel whose name contains the --step-start NAME (default k_embed: the
first launch of a step; the greedy pick has no launch of its own where the output head takes
it), or ends with one named by --step-end. For the last N complete steps (default 5): each step's time, the time some
kernel was running, and the sum of the gaps in which none was. For the last step: per
kernel, its launches, median and total time, and the median gap before it; then its first
--show kernels in order (default 16), each with its time and the gap before it (negative:
it started before the previous one ended, as a programmatic dependent launch does).
"""
import argparse
import csv
import re
import statistics


def short(name):
    """The kernel's identifier and its template arguments, from an Itanium-mangled name."""
    m = re.match(r"_Z(\d+)", name)
    if not m:
        return name[:48]
    n = int(m.group(1))
    at = m.end()
    ident = name[at:at + n]
    rest = name[at + n:]
    # a kernel template: I <arguments> E, then v (it returns void)
    t = re.match(r"I(.*?)Ev", rest)
    if t:
        args = re.sub(r"L[a-z](\d+)E", r"\1,", t.group(1)).rstrip(",")
        return f"{ident}<{args}>"
    return ident

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--step-start", default="k_embed")
    ap.add_argument("--step-end", default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--show", type=int, default=16)
    a = ap.parse_args()
    ks = []
    with open(a.file) as f:
        for r in csv.DictReader(f):
            ks.append((int(r["start_ns"]), int(r["end_ns"]), short(r["kernel"])))
    ks.sort()
    if a.step_end:
        name = a.step_end
        ends = [i for i, k in enumerate(ks) if name in k[2]]
    else:
        name = a.step_start
        ends = [i - 1 for i, k in enumerate(ks) if name in k[2] and i > 0]
    if len(ends) < 2:
        raise SystemExit(f"fewer than two kernels named {name}: no complete step")
    print(f"{len(ks)} kernels, {len(ends)} ending a step")
    pairs = list(zip(ends[:-1], ends[1:]))[-a.steps:]
    for lo, hi in pairs:
        t0, t1 = ks[lo][1], ks[hi][1]
        busy, reach = 0, t0
        for s, e, _ in ks[lo + 1:hi + 1]:
            if e > reach:
                busy += e - max(s, reach)
                reach = e
        print(f"step {(t1 - t0) / 1e3:9.1f} us: kernels {hi - lo}, running {busy / 1e3:9.1f} us, "
              f"none running {(t1 - t0 - busy) / 1e3:7.1f} us")
    lo, hi = pairs[-1]
    by = {}
    for i in range(lo + 1, hi + 1):
        s, e, n = ks[i]
        by.setdefault(n, []).append((e - s, s - ks[i - 1][1]))
    print(f"\n{'kernel':60s} {'calls':>5s} {'med us':>8s} {'sum us':>9s} {'med gap':>8s}")
    for n, v in sorted(by.items(), key=lambda x: -sum(d for d, _ in x[1])):
        print(f"{n[:60]:60s} {len(v):5d} {statistics.median(d for d, _ in v) / 1e3:8.2f} "
              f"{sum(d for d, _ in v) / 1e3:9.1f} {statistics.median(g for _, g in v) / 1e3:8.2f}")
    print(f"\nthe last step's first {a.show} kernels: time, gap before it (us)")
    for i in range(lo + 1, min(hi + 1, lo + 1 + a.show)):
        s, e, n = ks[i]
        print(f"{n[:60]:60s} {(e - s) / 1e3:8.2f} {(s - ks[i - 1][1]) / 1e3:8.2f}")


if __name__ == "__main__":
    main()
