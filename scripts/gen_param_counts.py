#!/usr/bin/env python3
"""Development-time reference for tests/test_model_config.c: the parameter
count transformers gives each real config.json in tests/fixtures/model-configs
(AutoModelForCausalLM.from_config on the meta device, so nothing is
allocated), printed as `FILE COUNT` lines. Needs torch and transformers
(scripts/requirements-fixtures.txt); never run by the tests."""
import glob
import json
import os
import sys

import torch
import transformers


def count(path):
    with open(path) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..",
                                                       "tests", "fixtures", "model-configs")
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}")
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        try:
            n = count(path)
        except Exception as e:  # a family this transformers cannot build
            print(f"{os.path.basename(path)} - ({type(e).__name__}: {e})")
            continue
        print(f"{os.path.basename(path)} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
