#!/usr/bin/env python3
"""A checkpoint rank folder's state files, wherever their bytes lie: in the
file itself (a copying save) or in pieces of the swap file a final save
linked into the folder (rank.json's "ref"), for the shell tests.

  ckpt_state.py sum RANKDIR FILE    BYTES CRC32C of FILE, as rank.json says
  ckpt_state.py kind RANKDIR FILE   "copy" or "ref"
  ckpt_state.py flip RANKDIR FILE   flips one byte in the middle of FILE's
                                    bytes (in the piece that holds it)
"""
import json
import os
import sys


def entry(rank_dir, name):
    with open(os.path.join(rank_dir, "rank.json")) as f:
        files = json.load(f)["files"]
    if name not in files:
        sys.exit("ckpt_state: %s/rank.json lists no %s" % (rank_dir, name))
    return files[name]


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("sum", "kind", "flip"):
        sys.exit(__doc__)
    cmd, rank_dir, name = sys.argv[1:]
    e = entry(rank_dir, name)
    ref = e.get("ref")
    if cmd == "sum":
        print(e["bytes"], e["crc32c"])
    elif cmd == "kind":
        print("ref" if ref else "copy")
    else:
        at = e["bytes"] // 2
        path, off = os.path.join(rank_dir, name), at
        if ref:
            for src, poff, plen in ref["pieces"]:
                if at < plen:
                    if src < 0:
                        sys.exit("ckpt_state: byte %d of %s is in a piece of zeros" % (e["bytes"] // 2, name))
                    path, off = os.path.join(rank_dir, ref["files"][src]), poff + at
                    break
                at -= plen
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))


main()
