#!/usr/bin/env python3
"""`zinc generate` with text, against the HF tokenizers library itself (run
by tests/venv_test.sh with the project's .venv).

A byte-level BPE tokenizer (vocabulary within tiny-llama's 320) is trained
here and put beside tiny-llama's weights with a ChatML-style chat template
and a generation_config.json. Checked:
  - --prompt: the prompt's ids are the tokenizer's own encoding, the text
    is its decoding of the generated ids, the ids are what --ids gives for
    the same prompt ids, and the streamed text (no --json) is that text;
  - --chat: the prompt's ids are the template rendered with the generation
    prompt, then encoded;
  - --prompts (a prompt, a chat, ids) with --out: each line what the single
    runs give;
  - generation_config.json's do_sample and eos are taken, --greedy and a
    seed override them, and sampling twice with one seed agrees;
  - refusals: no tokenizer.json, an adapter for another base, a prompt
    that fills the context, a bad flag value, a malformed --prompts line.
  - zinc chat through a pseudo-terminal: each reply is what `zinc generate`
    gives for the whole history through the template (the second turn's
    prompt is the template over user, assistant, user, prefilled from where
    it leaves the first turn's cache), /reset forgets it.
"""
import json
import os
import pty
import re
import select
import time
import shutil
import subprocess
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from venv_fixtures import CHATML, model_folder  # noqa: E402

zinc, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
fix = os.path.join(src, "tests", "fixtures")
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what)


TEMPLATE = CHATML
model = os.path.join(work, "model")
tok = model_folder(model, ["the cat sat on the mat", "what is two plus two", "four, of course",
                           "hello there, how are you"] * 40, 300,
                   weights_of=os.path.join(fix, "tiny-llama"))
assert tok.get_vocab_size() <= 320
im_end = tok.token_to_id("<|im_end|>")
eot = tok.token_to_id("<|endoftext|>")
json.dump({"eos_token_id": [im_end, eot]}, open(os.path.join(model, "generation_config.json"),
                                                "w"))


def csv_rows(path):
    import csv
    with open(path) as f:
        yield from csv.DictReader(f)


def run(*args):
    return subprocess.run([zinc, "generate", "--model", model, "--device", "host"] + list(args),
                          capture_output=True, text=True)


def one(*args):
    r = run(*args, "--json")
    check(r.returncode == 0, "%s: exit %d: %s" % (args, r.returncode, r.stderr))
    return json.loads(r.stdout) if r.returncode == 0 else {}


# --prompt
prompt = "the cat sat"
g = one("--prompt", prompt, "--max-new-tokens", "12")
check(g.get("prompt_ids") == tok.encode(prompt).ids, "--prompt ids: %s vs the tokenizer's %s" %
      (g.get("prompt_ids"), tok.encode(prompt).ids))
check(g.get("text") == tok.decode(g.get("ids", []), skip_special_tokens=True),
      "--prompt text is not the tokenizer's decoding of the ids")
check(0 < len(g.get("ids", [])) <= 12, "--max-new-tokens 12 gave %d ids" % len(g.get("ids", [])))
byids = one("--ids", ",".join(map(str, tok.encode(prompt).ids)), "--max-new-tokens", "12")
check(byids.get("ids") == g.get("ids"), "--ids and --prompt of the same ids differ")
check("text" not in byids, "--ids decoded text without being asked to need a tokenizer")
# a 1 MiB device arena: the layers stream from pinned RAM, the ids stay
gs = one("--prompt", prompt, "--max-new-tokens", "12", "--gpu-mem", "1MiB")
check(gs.get("ids") == g.get("ids"), "streamed weights give other ids than resident ones")
r = run("--prompt", prompt, "--gpu-mem", "1MiB", "--plan")
# nothing on stderr but the test guard's own notice (a machine without
# memory protection keys says it cannot guard the arena)
quiet = [x for x in r.stderr.splitlines() if "ZINC_DEVICE_GUARD" not in x]
check(r.returncode == 0 and "streamed from pinned RAM" in r.stdout and
      "kv cache" in r.stdout and not quiet, "--plan: %s %s" % (r.stdout, r.stderr))
# a cache the capped arena cannot hold (64 sequences of 64 tokens of the
# 3-layer fixture): homed in pinned RAM, the plan says so and bounds decode
# on the named target's link or says the figure is unknown, the ids are
# those of the cache on the device
idsf, ido = os.path.join(work, "ids.jsonl"), os.path.join(work, "ids-out.jsonl")
with open(idsf, "w") as f:
    for i in range(64):
        f.write(json.dumps({"ids": [(i * 13 + k * 5) % 160 for k in range(1 + (i * 7) % 20)]})
                + "\n")
ft = [zinc, "generate", "--model", os.path.join(fix, "ft-llama"), "--device", "host",
      "--prompts", idsf, "--batch-size", "64", "--context", "64", "--max-new-tokens", "8"]
empty = os.path.join(work, "no-cache")
os.makedirs(empty, exist_ok=True)
env_empty = dict(os.environ, ZINC_CACHE_DIR=empty)
r = subprocess.run(ft + ["--gpu-mem", "1800KiB", "--plan", "--target", "a10"], capture_output=True,
                   text=True, env=env_empty)
check(r.returncode == 0 and re.search(r"kv cache .* in pinned RAM", r.stdout) and
      re.search(r"per step .*kv cache .* in per 1k tokens", r.stdout) and
      re.search(r"bound +decode at most [0-9.]+ tokens/s with 64 sequences .*with it full",
                r.stdout) and "a10 target's figures" in r.stdout,
      "--plan, pinned cache, --target a10: %s %s" % (r.stdout, r.stderr))
r = subprocess.run(ft + ["--gpu-mem", "1800KiB", "--plan"], capture_output=True, text=True,
                   env=env_empty)
check(r.returncode == 0 and re.search(r"bound +unknown: .*--recalibrate", r.stdout) and
      not os.listdir(empty), "--plan with no measured link: %s %s" % (r.stdout, r.stderr))
outs = []
for cap in (["--gpu-mem", "1800KiB"], []):
    r = subprocess.run(ft + cap + ["--out", ido], capture_output=True, text=True)
    check(r.returncode == 0, "64 sequences %s: %s" % (cap, r.stderr))
    outs.append([json.loads(x)["ids"] for x in open(ido)] if r.returncode == 0 else None)
check(outs[0] is not None and outs[0] == outs[1],
      "the pinned cache's ids are not the device cache's")
# --kv-cache pinned forces the cache into pinned RAM even where the device
# holds it; the ids stay the device cache's
r = subprocess.run(ft + ["--kv-cache", "pinned", "--out", ido], capture_output=True, text=True)
check(r.returncode == 0 and outs[1] is not None and
      [json.loads(x)["ids"] for x in open(ido)] == outs[1],
      "--kv-cache pinned: other ids than the device cache's: %s" % r.stderr)
r = subprocess.run(ft + ["--kv-cache", "device", "--gpu-mem", "1800KiB", "--plan"],
                   capture_output=True, text=True)
check(r.returncode == 1 and "KV cache" in r.stderr,
      "--kv-cache device where it does not fit: %d %s" % (r.returncode, r.stderr))
r = subprocess.run(ft + ["--kv-cache", "gpu", "--plan"], capture_output=True, text=True)
check(r.returncode == 2 and "--kv-cache must be" in r.stderr, "--kv-cache gpu: %s" % r.stderr)

# zinc bench generate places the model and its cache as generate does for the
# same settings (64 sequences of 64 tokens: 40 prompt ids + 24 new), and the
# bytes its decoding steps move are the plan's. The byte counts are exact
# integers (no timing in them), so they are compared for equality.
cfg = json.load(open(os.path.join(fix, "ft-llama", "config.json")))
# one token's keys and values over every layer, f32 on the host backend
ktb = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4 * cfg["num_hidden_layers"]
P, N, B = 40, 24, 64
steps = N - 1
kv_in = B * ktb * sum(P + j for j in range(steps))  # step j: P + j rows cached per sequence
logits_out = steps * B * cfg["vocab_size"] * 4


def placement_plan(out):
    m1 = re.search(r"layers +(\d+) of (\d+) on the device, (\d+) streamed", out)
    m2 = re.search(r"kv cache +(\S+ \S+) per sequence of (\d+) tokens, (\d+) sequences: "
                   r"(\S+ \S+) (in pinned RAM|on the device)", out)
    return m1 and m2 and (m1.group(1), m1.group(3), m2.group(1), m2.group(2), m2.group(3),
                          m2.group(4), m2.group(5))


def placement_bench(out):
    m1 = re.search(r": (\d+) layers, (\d+) on the device, (\d+) streamed", out)
    m2 = re.search(r"kv cache (in pinned RAM|on the device) \(--kv-cache \w+\), (\S+ \S+) per "
                   r"sequence of (\d+) tokens, (\d+) sequences: (\S+ \S+);", out)
    return m1 and m2 and (m1.group(2), m1.group(3), m2.group(2), m2.group(3), m2.group(4),
                          m2.group(5), m2.group(1))


for name, extra in (("auto, 1800KiB", ["--gpu-mem", "1800KiB"]),
                    ("pinned", ["--kv-cache", "pinned"]),
                    ("device", ["--kv-cache", "device"]),
                    ("auto", [])):
    csvf = os.path.join(work, "bench-%s.csv" % name.replace(" ", "").replace(",", "-"))
    rp = subprocess.run(ft[:-6] + ["--batch-size", str(B), "--context", str(P + N), "--plan",
                                   "--target", "a10"] + extra, capture_output=True, text=True)
    rb = subprocess.run([zinc, "bench", "generate", "--model", os.path.join(fix, "ft-llama"),
                         "--device", "host", "--batches", "1,5,%d" % B, "--prompt-len", str(P),
                         "--new-tokens", str(N), "--target", "a10", "--csv", csvf] + extra,
                        capture_output=True, text=True)
    pp, pb = placement_plan(rp.stdout), placement_bench(rb.stdout)
    check(rp.returncode == 0 and rb.returncode == 0 and pp and pp == pb,
          "bench generate (%s) places the model as generate --plan does: %s vs %s\n%s%s%s%s" %
          (name, pb, pp, rp.stdout, rp.stderr, rb.stdout, rb.stderr))
    rows = list(csv_rows(csvf)) if rb.returncode == 0 else []
    check(len(rows) == 3 and all(x["wrong"] == "0" and x["h2d_run"] == x["h2d_plan"] and
                                 x["d2h_run"] == x["d2h_plan"] and
                                 x["nvme_run"] == x["nvme_plan"] for x in rows),
          "bench generate (%s): the bytes moved are not the plan's: %s" % (name, rows))
    pinned = pp and pp[6] == "in pinned RAM"
    check(pinned == (name in ("auto, 1800KiB", "pinned")),
          "bench generate (%s): the cache %s" % (name, pp and pp[6]))
    if name in ("pinned", "device", "auto") and rows:
        # every weight on the device: only the cache's rows cross, and the logits
        r64 = [x for x in rows if x["batch"] == str(B)][0]
        check(r64["streamed"] == "0" and int(r64["kv_token_bytes"]) == ktb and
              int(r64["h2d_run"]) == (kv_in if pinned else 0) and
              int(r64["d2h_run"]) == logits_out + (steps * B * ktb if pinned else 0),
              "bench generate (%s): batch %d moved %s in, %s out; %d and %d expected" %
              (name, B, r64["h2d_run"], r64["d2h_run"], kv_in if pinned else 0,
               logits_out + (steps * B * ktb if pinned else 0)))

r = run("--prompt", prompt, "--max-new-tokens", "12")
check(r.returncode == 0 and r.stdout == g.get("text", "") + "\n",
      "streamed text %r vs %r" % (r.stdout, g.get("text")))
check("tokens/s" in r.stderr, "no summary line: %s" % r.stderr)

# --chat: the template with the generation prompt
question = "what is two plus two"
c = one("--chat", question, "--max-new-tokens", "8")
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
rendered = env.from_string(TEMPLATE).render(
    messages=[{"role": "user", "content": question}], add_generation_prompt=True)
check(c.get("prompt_ids") == tok.encode(rendered).ids, "--chat ids are not the template's")
if c.get("finish") == "eos":
    check(c["ids"][-1] in (im_end, eot), "finish eos without an eos id")

# Qwen3's own chat template (tests/fixtures/templates/qwen3.jinja) as the
# folder's chat_template.jinja: enable_thinking false unless set (the
# generation prompt ends in an empty reasoning block), --template-arg sets
# it, a malformed one is a usage error
import shutil
q3 = os.path.join(work, "model-qwen3")
shutil.copytree(model, q3)
cfg = json.load(open(os.path.join(q3, "tokenizer_config.json")))
del cfg["chat_template"]
json.dump(cfg, open(os.path.join(q3, "tokenizer_config.json"), "w"))
q3t = open(os.path.join(fix, "templates", "qwen3.jinja")).read()
with open(os.path.join(q3, "chat_template.jinja"), "w") as f:
    f.write(q3t)
for targs, think in (([], False), (["--template-arg", "enable_thinking=true"], True)):
    r = subprocess.run([zinc, "generate", "--model", q3, "--device", "host", "--chat", question,
                        "--max-new-tokens", "2", "--json"] + targs, capture_output=True,
                       text=True)
    check(r.returncode == 0, "qwen3 template %s: %s" % (targs, r.stderr))
    want = env.from_string(q3t).render(messages=[{"role": "user", "content": question}],
                                       add_generation_prompt=True, enable_thinking=think)
    check(r.returncode == 0 and json.loads(r.stdout).get("prompt_ids") == tok.encode(want).ids
          and want.endswith("</think>\n\n") != think,
          "qwen3 --chat ids (thinking %s) are not the template's" % think)
r = subprocess.run([zinc, "generate", "--model", q3, "--chat", question, "--template-arg",
                    "enable_thinking"], capture_output=True, text=True)
check(r.returncode == 2 and "--template-arg 'enable_thinking': expected KEY=VALUE" in r.stderr,
      "a malformed --template-arg: %d %s" % (r.returncode, r.stderr))

# Gemma's own template (tests/fixtures/templates/gemma.jinja): --chat's ids
# are its render with the generation prompt; a conversation with a system
# turn, which it refuses, fails naming the template's words
gm = os.path.join(work, "model-gemma")
shutil.copytree(model, gm)
cfg = json.load(open(os.path.join(gm, "tokenizer_config.json")))
gmt = open(os.path.join(fix, "templates", "gemma.jinja")).read()
cfg["chat_template"] = gmt
json.dump(cfg, open(os.path.join(gm, "tokenizer_config.json"), "w"))
r = subprocess.run([zinc, "generate", "--model", gm, "--device", "host", "--chat", question,
                    "--max-new-tokens", "2", "--json"], capture_output=True, text=True)
bos = cfg.get("bos_token")
bos = bos.get("content") if isinstance(bos, dict) else bos
want = env.from_string(gmt).render(messages=[{"role": "user", "content": question}],
                                   add_generation_prompt=True, bos_token=bos or "")
check(r.returncode == 0 and json.loads(r.stdout).get("prompt_ids") == tok.encode(want).ids
      and want.endswith("<start_of_turn>model\n"),
      "gemma --chat ids are not the template's: %s" % r.stderr)
gp = os.path.join(work, "gemma-sys.jsonl")
with open(gp, "w") as f:
    f.write(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": question}]}) + "\n")
r = subprocess.run([zinc, "generate", "--model", gm, "--device", "host", "--prompts", gp,
                    "--max-new-tokens", "2"], capture_output=True, text=True)
check(r.returncode != 0 and "the chat template refuses this conversation: System role not "
      "supported" in r.stderr and "Traceback" not in r.stderr,
      "gemma, a system turn: %d %s" % (r.returncode, r.stderr))

# --prompts with --out: each as alone
recs = [{"prompt": prompt}, {"messages": [{"role": "user", "content": question}]},
        {"ids": tok.encode("hello there").ids}]
pf, of = os.path.join(work, "p.jsonl"), os.path.join(work, "o.jsonl")
with open(pf, "w") as f:
    for rec in recs:
        f.write(json.dumps(rec) + "\n")
r = run("--prompts", pf, "--out", of, "--max-new-tokens", "8", "--batch-size", "2")
check(r.returncode == 0, "--prompts: %s" % r.stderr)
lines = [json.loads(x) for x in open(of)] if r.returncode == 0 else []
check(len(lines) == 3, "--out has %d lines" % len(lines))
singles = [one("--prompt", prompt, "--max-new-tokens", "8"),
           one("--chat", question, "--max-new-tokens", "8"),
           one("--ids", ",".join(map(str, recs[2]["ids"])), "--max-new-tokens", "8")]
for k, (got, want) in enumerate(zip(lines, singles)):
    check(got.get("ids") == want.get("ids"), "--prompts line %d: %s vs alone %s" %
          (k + 1, got.get("ids"), want.get("ids")))
    check(got.get("index") == k, "--prompts line %d: index %s" % (k + 1, got.get("index")))

# generation_config.json: sampling on; --greedy turns it off; seeds repeat
json.dump({"eos_token_id": [im_end, eot], "do_sample": True, "temperature": 1.0, "top_k": 0},
          open(os.path.join(model, "generation_config.json"), "w"))
s1 = one("--prompt", prompt, "--max-new-tokens", "12", "--seed", "3")
s2 = one("--prompt", prompt, "--max-new-tokens", "12", "--seed", "3")
check(s1.get("ids") == s2.get("ids"), "sampling twice with seed 3 differs")
gr = one("--prompt", prompt, "--max-new-tokens", "12", "--greedy")
check(gr.get("ids") == g.get("ids"), "--greedy over a sampling generation_config differs from "
      "greedy")
os.remove(os.path.join(model, "generation_config.json"))

# zinc chat in a pseudo-terminal
q1, q2 = "what is two plus two", "and the cat?"
t1 = one("--chat", q1, "--max-new-tokens", "6", "--greedy").get("text", "")
with open(pf, "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": q1},
                                     {"role": "assistant", "content": t1},
                                     {"role": "user", "content": q2}]}) + "\n")
r = run("--prompts", pf, "--max-new-tokens", "6", "--greedy")
t2 = json.loads(r.stdout).get("text", "") if r.returncode == 0 else None
check(t2 is not None, "the two-turn reference: %s" % r.stderr)
pid, fd = pty.fork()
if pid == 0:
    os.execv(zinc, [zinc, "chat", "--model", model, "--device", "host", "--max-new-tokens", "6",
                    "--greedy"])
seen = b""


def expect(want, timeout=10.0):
    """Reads the terminal until `want` (bytes) has appeared."""
    global seen
    end = time.time() + timeout
    while want not in seen and time.time() < end:
        rd, _, _ = select.select([fd], [], [], 0.2)
        if rd:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return want in seen


def crlf(text):
    return text.replace("\n", "\r\n").encode()


check(expect(b"> "), "chat: no prompt: %r" % seen)
for q, t in ((q1, t1), (q2, t2), ("/reset", None), (q1, t1)):
    seen = b""
    os.write(fd, (q + "\n").encode())
    if t is None:
        check(expect(b"history cleared"), "chat: /reset said nothing: %r" % seen)
        continue
    # the reply, then the line of tokens/s (stderr), then the next prompt;
    # the terminal's echo of the line typed (and, at times, a prompt: the
    # pty's echo is queued apart from the program's output) come before it
    ok = expect(b"in all]") and expect(b"> ")
    reply = seen[:seen.find(b"\r\n[")] if ok else b""
    reply = reply.replace(crlf(q) + b"\r\n", b"", 1)
    while reply.startswith(b"> "):
        reply = reply[2:]
    check(ok and reply == crlf(t), "chat: after %r the reply is not %r: %r" % (q, t, seen))
    if q == q2:  # the second turn's prompt starts with the first's: its cache stays
        m = re.search(rb"; (\d+) prompt tokens from the cache", seen)
        check(m and int(m.group(1)) > 0, "chat: the second turn reused no cache: %r" % seen)
os.write(fd, b"/exit\n")
_, status = os.waitpid(pid, 0)
check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "chat exit status %d" % status)
os.close(fd)

# refusals
bare = os.path.join(work, "bare")
os.makedirs(bare)
for f in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(fix, "tiny-llama", f), bare)
r = subprocess.run([zinc, "generate", "--model", bare, "--prompt", "hi"], capture_output=True,
                   text=True)
check(r.returncode == 1 and "tokenizer.json" in r.stderr, "no tokenizer: %s" % r.stderr)
r = run("--ids", "5,6,7", "--adapter", os.path.join(fix, "lora-llama", "final-adapter"))
check(r.returncode == 1 and "lora_A" in r.stderr and "shape" in r.stderr,
      "adapter for another base: %s" % r.stderr)
r = run("--ids", ",".join(["5"] * 64))
check(r.returncode == 1 and "context" in r.stderr, "prompt filling the context: %s" % r.stderr)
r = run("--prompt", "x", "--top-p", "-1")
check(r.returncode == 2 and "--top-p" in r.stderr, "bad --top-p: %s" % r.stderr)
with open(pf, "w") as f:
    f.write('{"prompt": "a"}\n[1, 2]\n')
r = run("--prompts", pf)
check(r.returncode == 1 and "p.jsonl:2" in r.stderr, "bad --prompts line: %s" % r.stderr)

print("generate cli: %d failures" % fails)
sys.exit(1 if fails else 0)
