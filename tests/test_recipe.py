#!/usr/bin/env python3
"""`zinc train RECIPE.yaml` with LLaMA-Factory's own published recipes
(tests/fixtures/recipes, byte for byte; run by tests/venv_test.sh).

Each recipe is pointed at this machine: model_name_or_path at tiny-llama's
weights with a byte-level BPE tokenizer and a chat template trained here,
dataset_dir at local files registered under the recipe's own dataset
names (identity and alpaca_en_demo, as LLaMA-Factory's data/ has them, one
of them in sharegpt form), output_dir here, deepspeed at the committed copy
of the config it names, and cutoff_len within the model's 64 positions.
Every other line is as published. Checked:
  - it trains the epochs it asks for (steps per epoch as the HF Trainer
    counts them: ceil(windows / micro-batch) // accumulation), with its learning rate, scheduler, warmup ratio
    and batch, and leaves in output_dir what LLaMA-Factory leaves: the
    adapter (adapter_config.json with r, lora_alpha = 2 x r and every
    linear target, adapter_model.safetensors that zinc generate loads on
    the base), trainer_log.jsonl with a line per step, the loss picture;
  - the DeepSpeed recipe's val_size evaluates;
  - refused, naming file, line and key: an unknown key, another stage,
    fp16, a model that is not a local folder, a nested value.
"""
import json
import math
import os
import random
import re
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from venv_fixtures import model_folder  # noqa: E402

zinc, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
fix = os.path.join(src, "tests", "fixtures")
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what)


model = os.path.join(work, "model")
words = "the cat sat on mat what is two plus four of course hello there how are you".split()
model_folder(model, [" ".join(words)] * 40, 300, weights_of=os.path.join(fix, "tiny-llama"))

data = os.path.join(work, "data")
os.makedirs(data)
rng = random.Random(1)


def said(n):
    return " ".join(rng.choice(words) for _ in range(n))


# identity in sharegpt form, alpaca_en_demo as alpaca (LLaMA-Factory's names)
json.dump([{"conversations": [{"from": "human", "value": "who are you?"},
                              {"from": "gpt", "value": "I am " + said(4)}]} for _ in range(30)],
          open(os.path.join(data, "identity.json"), "w"))
json.dump([{"instruction": said(5), "input": said(3) if i % 2 else "", "output": said(8)}
           for i in range(40)], open(os.path.join(data, "alpaca_en_demo.json"), "w"))
json.dump({"identity": {"file_name": "identity.json", "formatting": "sharegpt",
                        "columns": {"messages": "conversations"}},
           "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}},
          open(os.path.join(data, "dataset_info.json"), "w"))


def localize(name, out, extra=""):
    text = open(os.path.join(fix, "recipes", name)).read()
    text = re.sub(r"(?m)^model_name_or_path: .*$", "model_name_or_path: " + model, text)
    text = re.sub(r"(?m)^cutoff_len: .*$", "cutoff_len: 48\ndataset_dir: " + data, text)
    text = re.sub(r"(?m)^output_dir: .*$", "output_dir: " + out, text)
    text = re.sub(r"(?m)^deepspeed: .*$", "deepspeed: " + os.path.join(
        fix, "ds-configs", "llamafactory-ds_z3_config.json"), text)
    path = os.path.join(work, name)
    open(path, "w").write(text + extra)
    return path


def train(path, *args):
    return subprocess.run([zinc, "train", path] + list(args), capture_output=True, text=True,
                          cwd=work)


# the LoRA SFT recipe
out = os.path.join(work, "saves", "lora")
r = train(localize("qwen2.5_lora_sft.yaml", out))
check(r.returncode == 0, "qwen2.5_lora_sft.yaml: exit %d: %s" % (r.returncode, r.stderr[-2000:]))
m = re.search(r"epochs +3 x (\d+) steps per epoch \((\d+) windows of 48 tokens, global batch 8\)"
              r" = (\d+) steps", r.stdout)
check(m is not None, "no epochs line: %s" % r.stdout[:3000])
if m:
    per, windows, steps = map(int, m.groups())
    # the HF Trainer: len(dataloader) // accumulation, the dataloader's
    # batches ceil(windows / micro-batch 1)
    check(per == windows // 8 and steps == 3 * per,
          "epochs: %d per epoch of %d windows, %d steps" % (per, windows, steps))
    log = [json.loads(x) for x in open(os.path.join(out, "trainer_log.jsonl"))]
    check(len(log) == steps, "trainer_log.jsonl has %d lines, %d steps" % (len(log), steps))
    # cosine with warmup_ratio 0.1: the HF Trainer's ceil(0.1 x steps) warmup steps from 0
    w = math.ceil(0.1 * steps)
    want = [1e-4 * s / w if s < w else
            1e-4 * 0.5 * (1 + math.cos(math.pi * (s - w) / (steps - w))) for s in range(steps)]
    check(all(abs(x["lr"] - y) <= 1e-9 + 1e-6 * y for x, y in zip(log, want)),
          "lr: %s vs %s" % ([x["lr"] for x in log[:4]], want[:4]))
check("micro 1 [default: derived] x accumulation 8" in r.stdout or
      re.search(r"micro 1 .*x accumulation 8", r.stdout), "batch: %s" % r.stdout[:2000])
check("accepted, changing nothing zinc computes: trust_remote_code" in r.stdout,
      "notes line: %s" % r.stdout[:1500])
cfgp = os.path.join(out, "adapter_config.json")
ac = json.load(open(cfgp)) if os.path.exists(cfgp) else {}
check(ac.get("r") == 8 and ac.get("lora_alpha") == 16 and ac.get("peft_type") == "LORA" and
      sorted(ac.get("target_modules", [])) == sorted(["q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"]),
      "adapter_config.json: %s" % ac)
g = subprocess.run([zinc, "generate", "--model", model, "--adapter", out, "--device", "host",
                    "--ids", "5,6,7", "--max-new-tokens", "4", "--json"], capture_output=True,
                   text=True)
check(g.returncode == 0 and len(json.loads(g.stdout or "{}").get("ids", [])) == 4,
      "the adapter does not load on the base: %s" % g.stderr)
svg = os.path.join(out, "training_loss.svg")
check(os.path.exists(svg) and open(svg).read().startswith("<svg") and "polyline" in open(svg).read(),
      "plot_loss: no picture at %s" % svg)

# the DeepSpeed ZeRO-3 recipe, with val_size and eval steps
out3 = os.path.join(work, "saves", "ds3")
r = train(localize("llama3_lora_sft_ds3.yaml", out3))
check(r.returncode == 0, "llama3_lora_sft_ds3.yaml: exit %d: %s" % (r.returncode,
                                                                     r.stderr[-2000:]))
check("DeepSpeed config" in r.stdout and "eval loss" in r.stdout,
      "ds3 recipe: %s" % r.stdout[-1500:])
check(os.path.exists(os.path.join(out3, "adapter_model.safetensors")), "ds3: no adapter")

# val_size as a number of examples (LLaMA-Factory's integer val_size): the
# eval file holds exactly that many documents
out4 = os.path.join(work, "saves", "count")
p4 = localize("llama3_lora_sft_ds3.yaml", out4)
text = open(p4).read().replace("val_size: 0.1", "val_size: 7")
open(p4, "w").write(text)
r = train(p4)
check(r.returncode == 0 and re.search(r"zinc-eval\.rank0\.tok: 7 documents", r.stdout),
      "val_size 7: exit %d: %s" % (r.returncode, r.stdout[-1500:] + r.stderr[-500:]))

# refusals, each naming file, line and key
for extra, rc, want in (
        ("\nfreeze_trainable_layers: 2\n", 1, "freeze_trainable_layers: not a LLaMA-Factory"),
        ("\nfp16: true\n", 1, "fp16: fp16 training is not implemented"),
        ("\nlora_target:\n  - q_proj\n", 1, "a list"),
):
    p = localize("qwen2.5_lora_sft.yaml", os.path.join(work, "x"), extra)
    r = train(p)
    check(r.returncode == rc and want in r.stderr and "qwen2.5_lora_sft.yaml:" in r.stderr,
          "refusal %r: exit %d: %s" % (extra, r.returncode, r.stderr))
p = localize("qwen2.5_lora_sft.yaml", os.path.join(work, "x"))
text = open(p).read().replace("stage: sft", "stage: dpo")
open(p, "w").write(text)
r = train(p)
check(r.returncode == 1 and ":6: stage: stage 'dpo'" in r.stderr, "stage dpo: %s" % r.stderr)
text = open(p).read().replace("stage: dpo", "stage: sft").replace(
    "model_name_or_path: " + model, "model_name_or_path: Qwen/Qwen2.5-3B-Instruct")
open(p, "w").write(text)
r = train(p)
check(r.returncode == 1 and "huggingface-cli download" in r.stderr, "hub id: %s" % r.stderr)

print("recipes: %d failures" % fails)
sys.exit(1 if fails else 0)
