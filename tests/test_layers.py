#!/usr/bin/env python3
"""The layer rules of src/ (each folder's meson.build states its own; DESIGN.md
draws the arrows), checked on every #include of every file in src/ and of
every public header in include/zinc/: a folder may include its own files,
the folders its rule lists, and the public headers those folders own.
An include of anything above is a failure naming the file, the line and the
rule. The config is read by the door alone: zinc/config.h belongs to the
config folder, and only run/ and cli/ (above it) may include it.

Usage: test_layers.py SRC_ROOT            check a tree (exit 0 / 1)
       test_layers.py --self-test ROOT    copy the tree, inject an upward
                                          include, and check that it fails
Exit 0 pass, 1 fail, 99 setup error (zinc's test convention)."""
import os
import re
import shutil
import sys
import tempfile

# folder -> the folders it may include (its own is always allowed). Order
# from the ground floor up; a folder lists only folders listed before it.
RULES = {
    "util": [],
    "optim": ["util"],
    "nvme": ["util"],
    "gpu": ["util", "optim"],
    "comm": ["util", "gpu"],
    "model": ["util", "optim", "gpu", "nvme"],
    "plan": ["util", "optim", "nvme"],
    "train": ["util", "optim", "nvme", "gpu", "comm", "model", "plan"],
    "ckpt": ["util", "optim", "nvme", "gpu", "comm", "model", "plan", "train"],
    "config": ["util", "optim", "nvme", "model", "plan"],
    "run": ["util", "optim", "nvme", "gpu", "comm", "model", "plan", "train", "ckpt",
            "config"],
    "bench": ["util", "optim", "nvme", "gpu", "comm", "model", "plan", "train", "ckpt",
              "config", "run"],
    "cli": ["util", "optim", "nvme", "gpu", "comm", "model", "plan", "train", "ckpt",
            "config", "run", "bench", "ALL"],
}

# public header (include/zinc/NAME.h) -> the folder that owns it
OWNER = {
    "util": "util", "topo": "util", "trace": "util",
    "optim": "optim",
    "nvme": "nvme",
    "device": "gpu",
    "comm": "comm",
    "model": "model", "safetensors": "model", "tokens": "model", "generate": "model",
    "train_model": "model",
    "plan": "plan", "cost": "plan",
    "train": "train",
    "ckpt": "ckpt",
    "config": "config",
    "run": "run", "gensession": "run", "launch": "run",
    "bench": "bench",
    "zinc": "ALL",   # the umbrella: every layer at once
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r"\.(c|h|cu|cuh)$")


def target_of(inc):
    """The folder an include reaches, or None for a build-generated or
    same-folder file."""
    if inc.startswith("zinc/"):
        name = inc[len("zinc/"):]
        name = name[:-2] if name.endswith(".h") else name
        return OWNER.get(name, "?" + inc)
    if "/" in inc:
        return inc.split("/", 1)[0]
    return None


def check(root):
    """Returns the list of violations in the tree at root."""
    bad = []
    src = os.path.join(root, "src")
    inc_dir = os.path.join(root, "include", "zinc")
    if not os.path.isdir(src) or not os.path.isdir(inc_dir):
        raise FileNotFoundError(f"{root}: no src/ or include/zinc/")
    files = []
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        if folder not in RULES:
            bad.append(f"src/{folder}/: a folder with no layer rule (add it to "
                       f"tests/test_layers.py and its meson.build)")
            continue
        for name in sorted(os.listdir(path)):
            if SOURCE.search(name):
                files.append((folder, os.path.join(path, name)))
    for name in sorted(os.listdir(inc_dir)):
        if name.endswith(".h"):
            owner = OWNER.get(name[:-2])
            if owner is None:
                bad.append(f"include/zinc/{name}: a public header no folder owns")
                continue
            files.append((owner, os.path.join(inc_dir, name)))
    for folder, path in files:
        allowed = set(RULES.get(folder, [])) | {folder}
        if folder == "ALL":
            continue
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                t = target_of(m.group(1))
                if t is None or t in allowed:
                    continue
                if t.startswith("?"):
                    why = "a public header no folder owns"
                elif t == "ALL":
                    why = "the umbrella header, which only cli/ may include"
                elif t in RULES and folder in RULES[t]:
                    why = f"{t}/ is above {folder}/"
                else:
                    why = f"{folder}/ may include only {', '.join(sorted(allowed))}"
                bad.append(f"{rel}:{n}: #include \"{m.group(1)}\": {why}")
    return bad


def self_test(root):
    """The check must fail on an upward include: gpu/ reaching the trainer."""
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("src", "include"):
            shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
        clean = check(tmp)
        if clean:
            print("self-test: the copied tree already fails:", *clean, sep="\n  ")
            return 1
        victim = os.path.join(tmp, "src", "gpu", "device.c")
        with open(victim, "a", encoding="utf-8") as f:
            f.write('\n#include "train/train-impl.h"\n')
        with open(os.path.join(tmp, "include", "zinc", "optim.h"), "a",
                  encoding="utf-8") as f:
            f.write('\n#include "zinc/config.h"\n')
        found = check(tmp)
        want = ["src/gpu/device.c", "include/zinc/optim.h"]
        missing = [w for w in want if not any(b.startswith(w) for b in found)]
        if missing:
            print("self-test: injected upward includes not caught in", *missing)
            return 1
        print("self-test: the injected includes fail as they should:", *found, sep="\n  ")
        return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) != 2:
        print(__doc__)
        return 99
    try:
        bad = check(argv[1])
    except OSError as e:
        print(f"layers: {e}")
        return 99
    for b in bad:
        print("FAIL:", b)
    print(f"layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
