#!/usr/bin/env python3
"""Development-time reference for tests/test_moe_topk.c: torch.topk's
indices (largest first, on the CPU) over rows full of ties, which a
mixture-of-experts router meets when its logits are equal (a
zero-initialized router ties every expert). torch picks among equal
values by the libstdc++ algorithms ATen's CPU topk runs (partial_sort when
k * 64 <= n, else nth_element then sort), not by the lower index; zinc's
routing (src/model/model_moe.c) does the same steps. Writes
tests/fixtures/topk-ties.json. Needs torch; never run by the tests."""
import json
import os
import random
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    rnd = random.Random(56)
    rows = []
    for n in (2, 3, 4, 5, 8, 16, 17, 33, 64, 128, 129):
        for k in (1, 2, 3, 4, 8):
            if k > n:
                continue
            for _ in range(3):
                levels = rnd.choice([1, 2, 3, 5])
                vals = [rnd.randint(0, levels - 1) / 8.0 for _ in range(n)]
                idx = torch.topk(torch.tensor(vals, dtype=torch.float32), k).indices.tolist()
                rows.append({"k": k, "values": vals, "indices": idx})
    out = os.path.join(ROOT, "tests", "fixtures", "topk-ties.json")
    with open(out, "w") as f:
        json.dump({"generator": "scripts/gen_topk_ties.py", "torch": torch.__version__,
                   "rows": rows}, f)
    print("%s: %d rows" % (out, len(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
