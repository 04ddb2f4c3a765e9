#!/usr/bin/env python3
"""Compute stalls behind NVMe reads, from a trace of `zinc train --trace` or
`zinc bench train --trace` (Chrome trace JSON).

A compute span (track "gpu compute", "fwd bK" / "bwd bK") could have started
once the compute before it had ended and its own block's H2D copy ("h2d bK")
had landed. If it starts more than --slack-ms after that moment while a
parameter read ("params bN" on the "nvme read" track) is pending, compute
was held by something the schedule did not ask for: the stall that a host
function waiting for the read would cause on CUDA's one callback thread.
(The marks are events recorded in stream order, so such a hold shows as a
late start; the test in tests/test_train.c, whose compute is negligible,
also checks the end.) A block resident on the device (no H2D in the step)
is judged against the compute before it only; a wait for the optimizer's
update then counts too, so run this on a placement with params offloaded.

Prints the longest such delays and exits 1 when any exceeds the slack.
usage: trace_stalls.py TRACE.json [--slack-ms MS]
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        evs = json.load(f)["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in evs
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = []
    for e in evs:
        if e.get("ph") != "X":
            continue
        track, name = tracks.get(e["tid"], ""), e["name"]
        kind = None
        if track == "gpu compute" and name.split()[0] in ("fwd", "bwd"):
            kind = "c"
        elif track == "h2d" and name.startswith("h2d b"):
            kind = "h"
        elif track == "nvme read" and name.startswith("params b"):
            kind = "r"
        if kind:
            t0 = e["ts"] / 1e3
            spans.append((t0, t0 + e["dur"] / 1e3, kind, name, int(name.rsplit("b", 1)[1])))
    spans.sort()
    return spans


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--slack-ms", type=float, default=2.0)
    a = ap.parse_args()
    spans = load(a.trace)
    reads = [s for s in spans if s[2] == "r"]
    h2d = [s for s in spans if s[2] == "h"]
    comp = [s for s in spans if s[2] == "c"]
    if not comp:
        print(f"{a.trace}: no compute spans (was the run traced?)")
        return 2
    prev_end, rows, inside = None, [], 0
    for t0, t1, _, name, blk in comp:
        ready = max((h[1] for h in h2d if h[4] == blk and h[1] <= t0 + 1e-3), default=None)
        pending = [r for r in reads if r[0] < t0 < r[1]]
        inside += any(r[0] < t0 and r[1] > t1 for r in reads)
        could = max(x for x in (prev_end, ready) if x is not None) if (prev_end or ready) else None
        prev_end = t1
        if could is None or not pending:
            continue
        rows.append((t0 - could, name, t0, len(pending), t1 - t0))
    rows.sort(reverse=True)
    bad = [r for r in rows if r[0] > a.slack_ms]
    print(f"{a.trace}: {len(comp)} compute spans, {len(reads)} parameter reads, {inside} compute "
          f"spans wholly inside a pending read; {len(rows)} started while a read was pending")
    for d, name, t0, npend, dur in rows[:5]:
        print(f"  {name:10s} at {t0:10.3f} ms: started {d:8.3f} ms after it could, ran "
              f"{dur:.3f} ms ({npend} read(s) pending)")
    if bad:
        print(f"STALL: {len(bad)} compute spans held more than {a.slack_ms} ms while a read was pending")
        return 1
    print(f"ok: no compute held more than {a.slack_ms} ms behind a pending read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
