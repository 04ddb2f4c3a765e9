#!/usr/bin/env python3
"""Development-time check (transformers and torch, .venv-fixtures; never run
by CI): a model zinc fine-tuned and exported plainly is a folder that
transformers uses as it is, and its greedy `generate` stops at eos.

1. A model folder: tests/fixtures/tiny-llama's weights, a BPE tokenizer
   trained here with a ChatML template (tests/venv_fixtures.py), and a
   generation_config.json naming <|im_end|> and <|endoftext|> as eos.
2. zinc prepare: 64 chats "what is two plus two" -> "four, of course"; zinc
   train 80 steps with a checkpoint; zinc export (fp32, no --merge: plain).
3. transformers: AutoTokenizer and AutoModelForCausalLM load the export;
   the chat template renders; greedy generate (max_new_tokens 40) ends with
   an eos id before the limit, and the text is the trained answer.
4. zinc generate on the same export gives the same ids, token for token.

Usage: .venv-fixtures/bin/python scripts/check_export_transformers.py BUILD/zinc
Prints the figures for bench/results/export-transformers.md; exit 1 on a
failed check.
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "tests"))
from venv_fixtures import model_folder  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

zinc = os.path.realpath(sys.argv[1])
fails = 0


def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print("FAIL:", what)


def run(*args):
    r = subprocess.run([zinc, *args], capture_output=True, text=True)
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
        sys.exit("zinc %s: exit %d" % (args[0], r.returncode))
    return r.stdout


work = tempfile.mkdtemp(prefix="export-hf-")
base = os.path.join(work, "base")
Q, A = "what is two plus two", "four, of course"
tok = model_folder(base, [Q, A, "the cat sat on the mat"] * 40, 300,
                   weights_of=os.path.join(root, "tests", "fixtures", "tiny-llama"))
im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
json.dump({"eos_token_id": [im_end, eot], "pad_token_id": eot},
          open(os.path.join(base, "generation_config.json"), "w"))
with open(os.path.join(work, "chats.jsonl"), "w") as f:
    for _ in range(64):
        f.write(json.dumps({"messages": [{"role": "user", "content": Q},
                                         {"role": "assistant", "content": A}]}) + "\n")
run("prepare", os.path.join(work, "chats.jsonl"), "--model", base, "--out",
    os.path.join(work, "train.tok"))
ck = os.path.join(work, "ckpt")
run("train", "--model", base, "--data", os.path.join(work, "train.tok"), "--steps", "80",
    "--set", "train.device=\"host\"", "--set", "optimizer.params.lr=0.003",
    "--set", "scheduler.type=\"WarmupLR\"", "--set", "train.checkpoint.dir=\"%s\"" % ck,
    "--set", "train.log_every=100")
out = os.path.join(work, "export")
run("export", ck, "--out", out, "--dtype", "fp32")
print("export holds:", " ".join(sorted(os.listdir(out))))

t = AutoTokenizer.from_pretrained(out)
m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
prompt = t.apply_chat_template([{"role": "user", "content": Q}], add_generation_prompt=True,
                               tokenize=False)
ids = t(prompt, return_tensors="pt", add_special_tokens=False).input_ids
with torch.no_grad():
    g = m.generate(ids, max_new_tokens=40, do_sample=False)
new = g[0, ids.shape[1]:].tolist()
text = t.decode(new, skip_special_tokens=True)
eos = m.generation_config.eos_token_id
eos = eos if isinstance(eos, list) else [eos]
print("transformers %s: %d new ids %s, text %r, eos %s" % (transformers.__version__, len(new),
                                                          new, text, eos))
check(sorted(eos) == sorted([im_end, eot]), "the export's eos ids: %s" % eos)
check(len(new) < 40 and new[-1] in eos, "generate did not stop at eos: %s" % new)
check(text == A, "the answer: %r" % text)

z = json.loads(run("generate", "--model", out, "--device", "host", "--chat", Q,
                   "--max-new-tokens", "40", "--json"))
print("zinc generate: ids %s" % z.get("ids"))
check(z.get("ids") == new, "zinc generate's ids differ from transformers': %s vs %s"
      % (z.get("ids"), new))
subprocess.run(["rm", "-rf", work])
print("export/transformers: %s" % ("ok" if not fails else "%d failures" % fails))
sys.exit(1 if fails else 0)
