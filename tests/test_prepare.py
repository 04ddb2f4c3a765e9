#!/usr/bin/env python3
"""zinc prepare against the HF tokenizers library itself (run by
tests/venv_test.sh with the project's .venv python).

A byte-level BPE tokenizer is trained here (no downloads) and saved with a
ChatML-style chat template in tokenizer_config.json. A jsonl of chats,
prompt/completion pairs and texts is prepared; the token file (read by hand,
docs/tokens.md version 2) must hold exactly the tokenizer's own encoding of
each rendered document, a mask covering exactly the assistant turns (the
completion, the text), and the document ends. Then the failures: a malformed
line (named with its line number; fatal by default, skipped with
--on-error skip), a missing tokenizer, an empty file, a document longer than
--max-len (truncated and counted), and the eval split.
usage: test_prepare.py ZINC SOURCE_ROOT WORKDIR"""
import json
import os
import struct
import subprocess
import sys

import jinja2
import jinja2.ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from venv_fixtures import CHATML, model_folder  # noqa: E402

zinc, work = sys.argv[1], sys.argv[3]
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what)


TEMPLATE = CHATML

model = os.path.join(work, "model")
corpus = ["the cat sat on the mat", "what is two plus two", "four, of course",
          "hello there, how are you", "system prompt: be brief"] * 40
tok = model_folder(model, corpus, 400)

records = [
    {"messages": [{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "what is two plus two"},
                  {"role": "assistant", "content": "four, of course"},
                  {"role": "user", "content": "and the cat?"},
                  {"role": "assistant", "content": "sat on the mat"}]},
    {"prompt": "hello there, ", "completion": "how are you"},
    {"text": "the cat sat on the mat"},
]
data = os.path.join(work, "data.jsonl")
with open(data, "w") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")


def run(*args):
    return subprocess.run([zinc, "prepare"] + list(args), capture_output=True, text=True)


def read_tok(path):
    b = open(path, "rb").read()
    assert b[:8] == b"ZNTOKENS"
    version, width, count, vocab, flags = struct.unpack("<IIQII", b[8:32])
    o = 32
    ids = list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), b[o:o + count * width]))
    o += count * width
    mb = b[o:o + (count + 7) // 8]
    mask = [(mb[i >> 3] >> (i & 7)) & 1 for i in range(count)]
    o += (count + 7) // 8
    nd = struct.unpack("<Q", b[o:o + 8])[0]
    ends = list(struct.unpack("<%dQ" % nd, b[o + 8:o + 8 + 8 * nd]))
    assert o + 8 + 8 * nd == len(b)
    return version, flags, vocab, ids, mask, ends


out = os.path.join(work, "train.tok")
r = run(data, "--model", model, "--out", out)
check(r.returncode == 0, "prepare failed: %s%s" % (r.stdout, r.stderr))
version, flags, vocab, ids, mask, ends = read_tok(out)
check(version == 2 and flags == 3, "version %d flags %d" % (version, flags))
check(vocab == tok.get_vocab_size(with_added_tokens=True), "vocab %d" % vocab)

# the expected documents, built independently of zinc_prepare.py
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
t = env.from_string(TEMPLATE)
eos = tok.token_to_id("<|endoftext|>")
chat = records[0]["messages"]
full = t.render(messages=chat, add_generation_prompt=False)
enc = tok.encode(full, add_special_tokens=False)
spans = []
for k, m in enumerate(chat):
    if m["role"] == "assistant":
        spans.append((len(t.render(messages=chat[:k], add_generation_prompt=True)),
                      len(t.render(messages=chat[:k + 1], add_generation_prompt=False))))
want_ids = list(enc.ids)
want_mask = [1 if any(a <= s < b for a, b in spans) else 0 for s, _ in enc.offsets]
p = tok.encode("hello there, ", add_special_tokens=False).ids
c = tok.encode("how are you", add_special_tokens=False).ids + [eos]
want_ids += p + c
want_mask += [0] * len(p) + [1] * len(c)
x = tok.encode("the cat sat on the mat", add_special_tokens=False).ids + [eos]
want_ids += x
want_mask += [1] * len(x)
want_ends = [len(enc.ids), len(enc.ids) + len(p) + len(c), len(want_ids)]
check(ids == want_ids, "ids differ from the tokenizer's own encoding")
check(mask == want_mask, "mask differs: %s vs %s" % (mask, want_mask))
check(ends == want_ends, "document ends %s, want %s" % (ends, want_ends))
# the mask covers the assistant turns: their text decodes from the masked ids
asst = tok.decode([i for i, m in zip(ids[:len(enc.ids)], mask) if m])
check("four, of course" in asst and "sat on the mat" in asst and "what is" not in asst
      and "be brief" not in asst, "assistant mask decodes to %r" % asst)

# the same records as one JSON array in a .json file (LLaMA-Factory's and HF
# datasets' other form): the same tokens
arr = os.path.join(work, "data.json")
with open(arr, "w") as f:
    json.dump(records, f, indent=1)
out2 = os.path.join(work, "train-array.tok")
r = run(arr, "--model", model, "--out", out2)
check(r.returncode == 0, "prepare of a JSON array failed: %s%s" % (r.stdout, r.stderr))
check(r.returncode == 0 and read_tok(out2)[3:] == (ids, mask, ends),
      "a JSON array file gives other tokens than the same records as JSON lines")
badarr = os.path.join(work, "bad.json")
with open(badarr, "w") as f:
    f.write('[{"text": "a"},\n {"text": }]\n')
r = run(badarr, "--model", model, "--out", os.path.join(work, "bad-array.tok"))
check(r.returncode == 1 and "bad.json: invalid JSON array" in r.stderr,
      "a malformed array: %s" % r.stderr)

# a malformed line: fatal by default, named with its line number
bad = os.path.join(work, "bad.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps(records[2]) + "\n{not json\n" + json.dumps({"x": 1}) + "\n")
r = run(bad, "--model", model, "--out", os.path.join(work, "b.tok"))
check(r.returncode == 1 and "bad.jsonl:2" in r.stderr, "malformed line: %s" % r.stderr)
check(not os.path.exists(os.path.join(work, "b.tok")), "a failed prepare wrote its output")
r = run(bad, "--model", model, "--out", os.path.join(work, "b.tok"), "--on-error", "skip")
check(r.returncode == 0 and "bad.jsonl:2" in r.stderr and "bad.jsonl:3" in r.stderr
      and "2 invalid records skipped" in r.stdout, "skip mode: %s %s" % (r.stdout, r.stderr))
# a missing tokenizer, an empty file
r = run(data, "--model", work, "--out", os.path.join(work, "c.tok"))
check(r.returncode == 1 and "no tokenizer.json" in r.stderr, "missing tokenizer: %s" % r.stderr)
empty = os.path.join(work, "empty.jsonl")
open(empty, "w").close()
r = run(empty, "--model", model, "--out", os.path.join(work, "d.tok"))
check(r.returncode == 1 and "no documents" in r.stderr, "empty file: %s" % r.stderr)
# a document longer than --max-len: truncated and counted
r = run(data, "--model", model, "--out", os.path.join(work, "e.tok"), "--max-len", "8")
check(r.returncode == 0 and "truncated" in r.stdout, "max-len: %s %s" % (r.stdout, r.stderr))
_, _, _, ids8, _, ends8 = read_tok(os.path.join(work, "e.tok"))
check(all(b - a <= 8 for a, b in zip([0] + ends8, ends8)), "documents beyond --max-len")
n_long = sum(1 for a, b in zip([0] + want_ends, want_ends) if b - a > 8)
check("longest 8 tokens, %d truncated" % n_long in r.stdout, "truncated count (want %d): %s"
      % (n_long, r.stdout))
# the eval split: a separate input
r = run(data, "--model", model, "--out", os.path.join(work, "f.tok"), "--eval-out",
        os.path.join(work, "g.tok"), "--eval", data)
check(r.returncode == 0 and os.path.exists(os.path.join(work, "g.tok")), "eval split: %s" % r.stderr)

# parquet (pyarrow, pinned in requirements-prepare.txt): the same records as
# a table, each record type's columns null in the others' rows, give the same
# file; a file that is not parquet is named
import pyarrow as pa
import pyarrow.parquet as pq
pqf = os.path.join(work, "data.parquet")
cols = sorted({k for rec in records for k in rec})
pq.write_table(pa.Table.from_pydict({k: [rec.get(k) for rec in records] for k in cols}), pqf)
r = run(pqf, "--model", model, "--out", os.path.join(work, "p.tok"))
check(r.returncode == 0, "parquet: %s%s" % (r.stdout, r.stderr))
if r.returncode == 0:
    check(read_tok(os.path.join(work, "p.tok")) == read_tok(out), "parquet differs from jsonl")
notpq = os.path.join(work, "not.parquet")
with open(notpq, "w") as f:
    f.write("hello")
r = run(notpq, "--model", model, "--out", os.path.join(work, "q.tok"))
check(r.returncode == 1 and "not.parquet: not a readable parquet file" in r.stderr,
      "not parquet: %s" % r.stderr)

# Qwen3's own chat template (tests/fixtures/templates/qwen3.jinja, as its
# tokenizer_config.json ships it), here as chat_template.jinja beside a
# tokenizer_config.json without one (transformers >= 4.43 saves it so). It
# renders an assistant turn inside the conversation without the reasoning
# block it gives the last one, so the turns are found by their content;
# enable_thinking is false unless set: the last turn's empty block is
# prompt, not target, and --template-arg enable_thinking=true trains it.
import shutil
q3 = os.path.join(work, "model-qwen3")
os.makedirs(q3, exist_ok=True)
shutil.copy(os.path.join(model, "tokenizer.json"), q3)
json.dump({"eos_token": "<|endoftext|>", "add_bos_token": False},
          open(os.path.join(q3, "tokenizer_config.json"), "w"))
q3t = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "templates",
                        "qwen3.jinja")).read()
with open(os.path.join(q3, "chat_template.jinja"), "w") as f:
    f.write(q3t)
q3data = os.path.join(work, "qwen3.jsonl")
with open(q3data, "w") as f:
    f.write(json.dumps({"messages": chat}) + "\n")
t3 = env.from_string(q3t)
for targs, think in (([], False), (["--template-arg", "enable_thinking=true"], True)):
    o3 = os.path.join(work, "qwen3-%d.tok" % think)
    r = run(q3data, "--model", q3, "--out", o3, *targs)
    check(r.returncode == 0, "qwen3 template: %s%s" % (r.stdout, r.stderr))
    if r.returncode:
        continue
    check(("enable_thinking" in r.stderr) != think, "qwen3 note: %r" % r.stderr)
    _, _, _, ids3, mask3, _ = read_tok(o3)
    full3 = t3.render(messages=chat, add_generation_prompt=False, enable_thinking=think)
    enc3 = tok.encode(full3, add_special_tokens=False)
    first = full3.index("four, of course")
    last_hdr = full3.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    last = last_hdr if think else full3.index("sat on the mat")
    spans3 = [(first, first + len("four, of course<|im_end|>\n")), (last, len(full3))]
    check("<think>\n\n</think>\n\nsat on the mat" in full3 and
          "<think>" not in full3[:last_hdr], "qwen3 render: %r" % full3)
    check(ids3 == list(enc3.ids), "qwen3 ids differ from the tokenizer's encoding")
    want3 = [1 if any(a <= st < b for a, b in spans3) else 0 for st, _ in enc3.offsets]
    check(mask3 == want3, "qwen3 mask (thinking %s): %s vs %s" % (think, mask3, want3))
r = run(q3data, "--model", q3, "--out", os.path.join(work, "q3bad.tok"), "--template-arg",
        "messages=1")
check(r.returncode == 1 and "--template-arg messages: zinc sets that variable itself"
      in r.stderr, "template-arg messages: %s" % r.stderr)

# Gemma's and phi-4's own templates (tests/fixtures/templates/README.md),
# and one marking its assistant text with transformers' {% generation %}:
# each chat prepares to the tokenizer's encoding of jinja2's own render,
# the mask covering each assistant turn's text and its end marker; Gemma's
# refusal of a system turn is reported with the record's line and the
# template's words.
tdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "templates")
GENERATION = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
              "{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}"
              "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class _Gen(jinja2.ext.Extension):  # the reference render: the block's body as it is
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


genv = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[_Gen])
two_turns = [{"role": "user", "content": "what is two plus two"},
             {"role": "assistant", "content": "  four, of course "},
             {"role": "user", "content": "and the cat?"},
             {"role": "assistant", "content": "sat on the mat"}]
for name, src, hdr, end in (
        ("gemma", open(os.path.join(tdir, "gemma.jinja")).read(), "<start_of_turn>model\n",
         "<end_of_turn>\n"),
        ("phi4", open(os.path.join(tdir, "phi4.jinja")).read(),
         "<|im_start|>assistant<|im_sep|>", "<|im_end|>"),
        ("generation", GENERATION, "<|im_start|>assistant\n", "<|im_end|>\n")):
    d = os.path.join(work, "model-" + name)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(model, "tokenizer.json"), d)
    json.dump({"chat_template": src, "bos_token": "<|im_start|>", "eos_token": "<|endoftext|>",
               "add_bos_token": False}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    dj = os.path.join(work, name + ".jsonl")
    with open(dj, "w") as f:
        f.write(json.dumps({"messages": two_turns}) + "\n")
    o = os.path.join(work, name + ".tok")
    r = run(dj, "--model", d, "--out", o)
    check(r.returncode == 0, "%s template: %s%s" % (name, r.stdout, r.stderr))
    if r.returncode:
        continue
    _, _, _, ids_t, mask_t, _ = read_tok(o)
    full_t = genv.from_string(src).render(messages=two_turns, add_generation_prompt=False,
                                          bos_token="<|im_start|>", eos_token="<|endoftext|>")
    enc_t = tok.encode(full_t, add_special_tokens=False)
    spans_t, at = [], 0
    for m_ in two_turns:
        if m_["role"] == "assistant":
            body = m_["content"] if name != "gemma" else m_["content"].strip()
            a_ = full_t.index(hdr + body, at) + len(hdr)
            b_ = a_ + len(body) + len(end)
            check(full_t[a_ + len(body):b_] == end, "%s: %r ends %r" % (name, body, full_t))
            spans_t.append((a_, b_))
            at = b_
    check(ids_t == list(enc_t.ids), "%s: ids differ from the tokenizer's encoding" % name)
    want_t = [1 if any(a_ <= st < b_ for a_, b_ in spans_t) else 0 for st, _ in enc_t.offsets]
    check(mask_t == want_t, "%s mask: %s vs %s" % (name, mask_t, want_t))
gj = os.path.join(work, "gemma-sys.jsonl")
with open(gj, "w") as f:
    f.write(json.dumps({"messages": two_turns}) + "\n")
    f.write(json.dumps({"messages": [{"role": "system", "content": "be brief"}] + two_turns}) + "\n")
r = run(gj, "--model", os.path.join(work, "model-gemma"), "--out", os.path.join(work, "gs.tok"))
check(r.returncode == 1 and "gemma-sys.jsonl:2: the chat template refuses this conversation: "
      "System role not supported" in r.stderr, "gemma system turn: %s" % r.stderr)

# tokenizer_config.json fields of the wrong shape, and templates that do not
# compile or fail on a conversation: one line naming the file, the field (or
# the template's line) and what is wrong; never a traceback
bad_cfgs = [
    ([], "tokenizer_config.json: expected a JSON object, found list"),
    # found by tests/fuzz/fuzz_template.py: nesting past Python's recursion limit
    ("[" * 100000 + "]" * 100000, "tokenizer_config.json: invalid JSON: maximum recursion depth"),
    ({"chat_template": 5}, "chat_template: expected a string or a list"),
    ({"chat_template": [{"name": "default"}]}, "chat_template: a list of templates must hold"),
    ({"chat_template": "{% for m in messages %}{{ m['content'] }}"},
     "chat_template: line 1: Unexpected end of template"),
    ({"chat_template": CHATML, "bos_token": 7}, "bos_token: expected a token string"),
    ({"chat_template": CHATML, "add_bos_token": "yes"}, 'add_bos_token: expected true or false'),
    ({"chat_template": "{{ messages[0]['content'] + 1 }}"},
     "data.jsonl:1: the chat template (%s: chat_template) failed on this conversation: TypeError"),
]
for k_, (cfg_, want_) in enumerate(bad_cfgs):
    d = os.path.join(work, "model-bad%d" % k_)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(model, "tokenizer.json"), d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        f.write(cfg_ if isinstance(cfg_, str) else json.dumps(cfg_))
    if "%s" in want_:
        want_ = want_ % os.path.join(d, "tokenizer_config.json")
    r = run(data, "--model", d, "--out", os.path.join(work, "bad%d.tok" % k_))
    check(r.returncode == 1 and want_ in r.stderr and "Traceback" not in r.stderr,
          "bad tokenizer_config %d (%s): %s" % (k_, json.dumps(cfg_)[:60], r.stderr))
    check(not os.path.exists(os.path.join(work, "bad%d.tok" % k_)),
          "bad tokenizer_config %d left its output" % k_)

print("%d failure(s)" % fails)

# alpaca and sharegpt records (LLaMA-Factory's formats) prepare to the very
# tokens and mask of the same conversation written as messages
conv = [{"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is two and two?"},
        {"role": "assistant", "content": "four, of course"},
        {"role": "user", "content": "and the cat?\nsay where"},
        {"role": "assistant", "content": "sat on the mat"}]
alpaca = {"system": "be brief", "history": [["what is two and two?", "four, of course"]],
          "instruction": "and the cat?", "input": "say where", "output": "sat on the mat"}
sharegpt = {"system": "be brief", "conversations": [
    {"from": "human", "value": "what is two and two?"}, {"from": "gpt", "value": "four, of course"},
    {"from": "human", "value": "and the cat?\nsay where"}, {"from": "gpt", "value": "sat on the mat"}]}
got = {}
for name, rec in (("messages", {"messages": conv}), ("alpaca", alpaca), ("sharegpt", sharegpt)):
    src = os.path.join(work, name + ".jsonl")
    with open(src, "w") as f:
        f.write(json.dumps(rec) + "\n")
    dst = os.path.join(work, name + ".tok")
    r = run(src, "--model", model, "--out", dst)
    check(r.returncode == 0, "%s: prepare failed: %s%s" % (name, r.stdout, r.stderr))
    if r.returncode == 0:
        got[name] = read_tok(dst)[3:5]
check(len(got) == 3 and got["alpaca"] == got["messages"] and got["sharegpt"] == got["messages"],
      "alpaca / sharegpt differ from the same chat as messages")
check(sum(got.get("messages", ([], [0]))[1]) > 0, "the chat has no targets")
bad = os.path.join(work, "badshare.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps({"conversations": [{"from": "robot", "value": "x"}]}) + "\n")
r = run(bad, "--model", model, "--out", os.path.join(work, "bad.tok"))
check(r.returncode != 0 and "robot" in r.stderr, "unknown sharegpt role: %s" % r.stderr)
print("alpaca and sharegpt: the messages record's tokens")

sys.exit(1 if fails else 0)
