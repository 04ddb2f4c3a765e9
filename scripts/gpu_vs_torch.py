#!/usr/bin/env python3
"""zinc's CUDA forward against PyTorch on the same GPU (scripts/gpu-check.sh).

For the committed fixtures tests/fixtures/tiny-llama and tiny-qwen2, the mean
next-token cross-entropy over the windows of tests/fixtures/tokens.tok:
  - `zinc eval --device cuda --dtype f32|bf16` on the folder;
  - transformers on the GPU with the folder loaded in float32 / bfloat16;
  - the float64 reference in the fixture (reference.json "eval_loss").
fp32 must agree with PyTorch to 1e-4 relative, bf16 to 2e-2; each is also
printed against the float64 reference. The training path on the GPU is the
gpu suite's train_hf_gpu test (10 AdamW steps against PyTorch's fixture).
Usage: python3 scripts/gpu_vs_torch.py PATH/TO/zinc
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_tokens(path):
    """tests/fixtures/tokens.tok (docs/tokens.md, version 1, 16-bit ids)."""
    with open(path, "rb") as f:
        head = f.read(8 + 24)
        if head[:8] != b"ZNTOKENS":
            sys.exit("%s: not a zinc token file" % path)
        version, width, count, vocab, _ = struct.unpack("<IIQII", head[8:])
        if version != 1 or width != 2:
            sys.exit("%s: version %d, width %d: expected 1, 2" % (path, version, width))
        return list(struct.unpack("<%dH" % count, f.read(2 * count)))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    zinc = os.path.abspath(sys.argv[1])
    import torch
    import transformers
    # GPU_VS_TORCH_DEVICE=cpu checks the script itself on a machine without a
    # GPU (zinc's host backend against torch on the CPU)
    on_cpu = os.environ.get("GPU_VS_TORCH_DEVICE") == "cpu"
    dev = torch.device("cpu" if on_cpu else "cuda")
    fx = os.path.join(ROOT, "tests", "fixtures")
    tok = os.path.join(fx, "tokens.tok")
    ids = read_tokens(tok)
    bad = 0
    print("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__,
                                             "cpu" if on_cpu else torch.cuda.get_device_name(0)))
    for kind in ("llama", "qwen2"):
        d = os.path.join(fx, "tiny-" + kind)
        ref = json.load(open(os.path.join(d, "reference.json")))
        seq, batch = ref["seq_len"], ref["batch"]
        # zinc eval's windows: seq + 1 ids each, in file order
        x = torch.tensor([ids[w * seq: w * seq + seq] for w in range(batch)], device=dev)
        y = torch.tensor([ids[w * seq + 1: w * seq + seq + 1] for w in range(batch)], device=dev)
        for name, tdt, tol in (("f32", torch.float32, 1e-4), ("bf16", torch.bfloat16, 2e-2)):
            r = subprocess.run([zinc, "eval", "--model", d, "--data", tok, "--seq-len", str(seq),
                                "--batch", str(batch), "--device", "host" if on_cpu else "cuda",
                                "--dtype", name,
                                "--json"], capture_output=True, text=True)
            if r.returncode:
                print("tiny-%s %s: zinc eval failed:\n%s%s" % (kind, name, r.stdout, r.stderr))
                bad += 1
                continue
            zl = json.loads(r.stdout)["loss"]
            m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=tdt).to(dev).eval()
            with torch.no_grad():
                logits = m(input_ids=x).logits.float()
            tl = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   y.reshape(-1)).item()
            rel = abs(zl - tl) / abs(tl)
            ok = rel <= tol
            bad += not ok
            print("tiny-%-5s %-4s zinc %.6f  torch on the GPU %.6f (rel %.1e)  float64 "
                  "reference %.6f  %s" % (kind, name, zl, tl, rel, ref["eval_loss"],
                                          "ok" if ok else "FAIL"))
            del m
    print("%d comparison(s) failed" % bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
