#!/usr/bin/env python3
"""Print the ninja targets the tests a `meson test` selection runs need.

    suite-targets.py BUILDDIR [meson test args...]

scripts/test.sh builds only these in the builds that run one suite (the
sanitizer and fuzz builds, the second numeric path): building every target
there compiled some 250 test and benchmark objects no selected test runs
(about 4 minutes of the fresh-clone CI on 2 cores). The default build still
builds everything.

It reads the build's introspection files (meson-info/intro-tests.json,
intro-targets.json) and selects as `meson test` does: --suite S and
--no-suite S (also --suite=S), S either a suite ("unit") or project:suite
("zinc:unit"); other words are test names. Anything it does not understand
prints nothing and exits 2, and the caller then builds everything.
"""
import json
import os
import sys


def matches(suites, want):
    for s in suites:
        proj, _, name = s.partition(":")
        if want in (s, name, proj):
            return True
    return False


def main(argv):
    if len(argv) < 2:
        print("usage: suite-targets.py BUILDDIR [meson test args...]", file=sys.stderr)
        return 2
    build = argv[1]
    include, exclude, names = [], [], []
    args = argv[2:]
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--suite", "--no-suite"):
            if i + 1 >= len(args):
                return 2
            (include if a == "--suite" else exclude).append(args[i + 1])
            i += 2
            continue
        if a.startswith("--suite="):
            include.append(a.split("=", 1)[1])
        elif a.startswith("--no-suite="):
            exclude.append(a.split("=", 1)[1])
        elif a.startswith("-"):
            return 2  # an option whose effect on the selection is unknown here
        else:
            names.append(a)
        i += 1
    info = os.path.join(build, "meson-info")
    try:
        with open(os.path.join(info, "intro-tests.json")) as f:
            tests = json.load(f)
        with open(os.path.join(info, "intro-targets.json")) as f:
            targets = {t["id"]: t["filename"] for t in json.load(f)}
    except (OSError, ValueError, KeyError) as e:
        print(f"suite-targets: {build}: {e}", file=sys.stderr)
        return 2
    out = set()
    for t in tests:
        if names and t["name"] not in names:
            continue
        if include and not any(matches(t["suite"], s) for s in include):
            continue
        if any(matches(t["suite"], s) for s in exclude):
            continue
        for d in t["depends"]:
            if d not in targets:
                print(f"suite-targets: {build}: test {t['name']} depends on unknown target {d}",
                      file=sys.stderr)
                return 2
            out.update(os.path.relpath(p, build) for p in targets[d])
    if not out:
        return 2
    print("\n".join(sorted(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
