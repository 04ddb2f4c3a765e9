#!/usr/bin/env python3
"""`zinc plot RUN.jsonl`: a run's JSON lines as an SVG picture.

- A real `zinc train --json-log` run: the picture parses as XML (SVG), the
  loss line has one vertex per step, left to right, and its heights order
  exactly as the losses do (a lower loss is drawn lower); the lr and
  tokens/s panels are there.
- A resumed run's log (steps repeated after the checkpoint) takes each
  step's last line; eval losses draw their own line; a line that is not a
  step (garbage, a line cut by a kill) is skipped with a warning naming it.
- 10000 steps are drawn with at most 2000 vertices (bucket means), still
  spanning the whole run.
- Several runs: a loss line each, and each later run's loss relative to
  the first's at the steps both have, drawn in order.
- Errors: a missing file and a file without steps name the file (exit 1),
  bad usage exits 2, an unwritable output leaves no file behind.
Usage: test_plot.py ZINC
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

zinc = os.path.realpath(sys.argv[1])
fails = 0


def check(ok, msg):
    global fails
    if not ok:
        print("FAIL:", msg)
        fails += 1


def plot(*args):
    return subprocess.run([zinc, "plot", *args], capture_output=True, text=True)


def lines_of(svg):
    """{class: [(x, y), ...]} of the picture's polylines."""
    root = ET.parse(svg).getroot()
    out = {}
    for el in root.iter():
        if el.tag.endswith("polyline"):
            pts = [tuple(map(float, p.split(","))) for p in el.get("points").split()]
            out[el.get("class")] = pts
    return out


def same_order(losses, ys):
    """A lower loss is drawn lower (a larger y in SVG), pair by pair."""
    for i in range(len(losses)):
        for j in range(len(losses)):
            if losses[i] < losses[j] and not ys[i] > ys[j]:
                return False
    return True


work = tempfile.mkdtemp(prefix="plot-", dir=".")
try:
    os.chdir(work)
    # a real run
    r = subprocess.run([zinc, "train", "--steps", "12", "--json-log", "run.jsonl",
                        "--set", "train.log_every=100"], capture_output=True, text=True)
    check(r.returncode == 0, "train: %s" % r.stderr[-800:])
    steps = [json.loads(l) for l in open("run.jsonl")]
    p = plot("run.jsonl")
    check(p.returncode == 0 and p.stdout.strip() == "run.svg", "plot: %s %s" % (p.stdout, p.stderr))
    L = lines_of("run.svg")
    loss = L.get("loss", [])
    check(len(loss) == len(steps) == 12, "loss vertices %d for %d steps" % (len(loss), len(steps)))
    check(all(loss[i][0] < loss[i + 1][0] for i in range(len(loss) - 1)), "x not increasing")
    check(same_order([s["loss"] for s in steps], [y for _, y in loss]),
          "heights do not order as the losses")
    check("lr" in L and "tps" in L and "eval" not in L, "panels: %s" % sorted(L))
    left = [n for n in os.listdir(".") if "run.svg" in n and n != "run.svg"]
    check(not left, "temporary file left: %s" % left)

    # a resumed run: steps 4 and 5 again with other losses, eval lines, a
    # garbage line and a line cut by a kill
    rows = [(1, 5.0), (2, 4.0), (3, 3.5), (4, 9.0), (5, 9.0), (4, 3.0), (5, 2.5), (6, 2.0)]
    with open("resumed.jsonl", "w") as f:
        for k, (st, lo) in enumerate(rows):
            d = {"step": st, "loss": lo, "lr": 1e-4, "seconds": 0.5, "tokens": 100}
            if st in (3, 6):
                d["eval_loss"] = lo + 0.25
            f.write(json.dumps(d) + "\n")
            if k == 2:
                f.write("not json at all\n")
        f.write('{"step": 7, "loss": 1.')
    p = plot("resumed.jsonl", "-o", "resumed.svg", "--title", "a <b> & c")
    check(p.returncode == 0, "resumed: %s" % p.stderr)
    check("2 line(s)" in p.stderr and "line 4" in p.stderr, "no warning naming the lines: %r" % p.stderr)
    L = lines_of("resumed.svg")
    loss = L.get("loss", [])
    want = [5.0, 4.0, 3.5, 3.0, 2.5, 2.0]
    check(len(loss) == 6, "resumed: %d vertices, want 6" % len(loss))
    check(len(loss) == 6 and same_order(want, [y for _, y in loss]),
          "resumed: the last line of a step does not win")
    check(len(L.get("eval", [])) == 2, "eval vertices: %s" % L.get("eval"))
    check("a &lt;b&gt; &amp; c" in open("resumed.svg").read(), "title not escaped")

    # many steps: bucket means, the whole run spanned
    with open("long.jsonl", "w") as f:
        for st in range(1, 10001):
            f.write(json.dumps({"step": st, "loss": 10.0 / st ** 0.5}) + "\n")
    p = plot("long.jsonl")
    check(p.returncode == 0, "long: %s" % p.stderr)
    loss = lines_of("long.svg").get("loss", [])
    check(0 < len(loss) <= 2000, "long: %d vertices" % len(loss))
    check(loss and loss[0][1] < loss[-1][1], "long: the curve does not fall")

    # several runs compared: each one's loss, and the later ones' loss
    # relative to the first's at the steps both have (c lacks step 3)
    base = [5.0, 4.0, 3.5, 3.0, 2.5]
    for name, f, skip in (("a", 1.0, None), ("b", 1.01, None), ("c", 0.98, 3)):
        with open(name + ".jsonl", "w") as fh:
            for st, lo in enumerate(base, 1):
                if st != skip:
                    fh.write(json.dumps({"step": st, "loss": lo * f}) + "\n")
    p = plot("a.jsonl", "b.jsonl", "c.jsonl", "-o", "cmp.svg")
    check(p.returncode == 0, "compare: %s" % p.stderr)
    L = lines_of("cmp.svg")
    check(sorted(L) == ["loss-1", "loss-2", "loss-3", "rel-2", "rel-3"], "compare: %s" % sorted(L))
    r2, r3 = L.get("rel-2", []), L.get("rel-3", [])
    check(len(r2) == 5 and len(r3) == 4, "compare: %d and %d vertices, want 5 and 4"
          % (len(r2), len(r3)))
    # +1% is drawn level above -2%, both flat
    check(r2 and r3 and max(y for _, y in r2) < min(y for _, y in r3)
          and max(y for _, y in r2) - min(y for _, y in r2) < 0.01, "compare: rel lines %s %s"
          % (r2, r3))
    check(all(n in open("cmp.svg").read() for n in ("a.jsonl", "b.jsonl", "c.jsonl")),
          "compare: the runs are not named")
    p = plot(*["a.jsonl"] * 9)
    check(p.returncode == 2, "nine runs: exit %d" % p.returncode)

    # errors
    p = plot("nosuch.jsonl")
    check(p.returncode == 1 and "nosuch.jsonl" in p.stderr, "missing file: %s" % p.stderr)
    open("empty.jsonl", "w").write('{"msg": "hello"}\n')
    p = plot("empty.jsonl")
    check(p.returncode == 1 and "no line with a step and a loss" in p.stderr
          and not os.path.exists("empty.svg"), "no steps: %s" % p.stderr)
    p = plot()
    check(p.returncode == 2, "no argument: exit %d" % p.returncode)
    p = plot("run.jsonl", "-o", "nodir/x.svg")
    check(p.returncode == 1 and "nodir/x.svg" in p.stderr and not os.path.exists("nodir"),
          "unwritable output: %s" % p.stderr)
finally:
    os.chdir("..")
    subprocess.run(["rm", "-rf", work])

print("plot: %s" % ("ok" if not fails else "%d failures" % fails))
sys.exit(1 if fails else 0)
