#!/usr/bin/env python3
"""zinc prepare: text to a zinc token file (version 2: ids, loss mask,
document ends; docs/tokens.md), tokenized with the model folder's own
tokenizer (tokenizer.json, through the HF `tokenizers` library) and, for
chat data, rendered with the folder's chat template (tokenizer_config.json's
chat_template, Jinja, as transformers renders it).

Input records (jsonl lines, a .json file holding one JSON array of them,
or whole plain-text files as documents):
  text                  {"text": "..."}: every token a target
  prompt / completion   {"prompt": "...", "completion": "..."}: the
                        completion (and EOS) are targets
  chat                  {"messages": [{"role": ..., "content": ...}, ...]}:
                        the assistant turns (as the template renders them,
                        with their end-of-turn tokens) are targets
  alpaca                {"instruction", "input", "output", "system",
                        "history": [[query, response], ...]} (LLaMA-Factory's
                        alpaca format): the chat of system, history, then
                        instruction + "\n" + input as the user's turn and
                        output as the assistant's
  sharegpt              {"conversations": [{"from": "human"|"gpt"|"system"|
                        "observation"|"function_call", "value": ...}],
                        "system"}: the chat, roles mapped as LLaMA-Factory
                        maps them (human: user, gpt: assistant)
Field names are settable. A text or completion document ends with EOS (the
model learns to stop) and starts with BOS when tokenizer_config.json's
add_bos_token says so; chat documents are exactly what the template renders.

LLaMA-Factory's registered datasets: --dataset-info DIR (its
dataset_info.json) with --datasets NAME,NAME (and --eval-datasets): each
entry's local file_name (.json arrays or .jsonl), its formatting (alpaca,
or sharegpt with its tags), its columns; --max-samples keeps the first N
records of each, as LLaMA-Factory's max_samples does.

usage: zinc prepare INPUT... --model DIR --out FILE [--eval-out FILE
       (--eval-fraction F | --eval INPUT...)] [--max-len N] [--on-error skip|fail]
       zinc prepare --dataset-info DIR --datasets NAMES --model DIR --out FILE ...
"""
import argparse
import json
import os
import random
import struct
import sys
import time


def fail(msg):
    sys.stderr.write("zinc prepare: error: %s\n" % msg)
    sys.exit(1)


def parse_template_args(pairs):
    """KEY=VALUE strings (--template-arg) as the chat template's extra
    variables: VALUE as JSON when it parses (true, 3, "x", [..]), else the
    string itself."""
    args = {}
    for p in pairs or []:
        key, eq, val = p.partition("=")
        if not eq or not key.isidentifier():
            fail("--template-arg %r: expected KEY=VALUE (for example enable_thinking=true)" % p)
        if key in ("messages", "add_generation_prompt", "bos_token", "eos_token"):
            fail("--template-arg %s: zinc sets that variable itself" % key)
        try:
            args[key] = json.loads(val)
        except ValueError:
            args[key] = val
    return args


class Model:
    def __init__(self, folder, template_args=None):
        try:
            import tokenizers
        except ImportError:
            fail("the HF tokenizers library is not installed (scripts/setup.sh venv installs it "
                 "into .venv)")
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isdir(folder):
            fail("--model %s: no such folder (the HF model folder whose tokenizer and chat "
                 "template prepare uses)" % folder)
        if not os.path.isfile(path):
            fail("%s: no tokenizer.json (zinc prepare tokenizes with the model folder's own "
                 "tokenizer)" % folder)
        try:
            self.tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library's own message names the problem
            fail("%s: %s" % (path, e))
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        self.cfg = {}
        if os.path.isfile(cfg_path):
            try:
                with open(cfg_path, encoding="utf-8") as f:
                    self.cfg = json.load(f)
            except (ValueError, UnicodeDecodeError, RecursionError) as e:
                fail("%s: invalid JSON: %s" % (cfg_path, e))
            if not isinstance(self.cfg, dict):
                fail("%s: expected a JSON object, found %s" % (cfg_path, type(self.cfg).__name__))
        self.cfg_path = cfg_path
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.bos = self._special("bos_token")
        self.eos = self._special("eos_token")
        add_bos = self.cfg.get("add_bos_token", False)
        if add_bos is not None and not isinstance(add_bos, bool):
            fail("%s: add_bos_token: expected true or false, found %s" % (cfg_path,
                                                                          json.dumps(add_bos)))
        self.add_bos = bool(add_bos) and self.bos is not None
        self.template = self.cfg.get("chat_template")
        self.template_src = cfg_path + ": chat_template"
        if isinstance(self.template, list):  # [{"name": "default", "template": ...}]
            if not all(isinstance(t, dict) and isinstance(t.get("name"), str) and
                       isinstance(t.get("template"), str) for t in self.template):
                fail("%s: chat_template: a list of templates must hold {\"name\": ..., "
                     "\"template\": ...} objects of strings" % cfg_path)
            named = {t["name"]: t["template"] for t in self.template}
            pick = "default" if "default" in named else next(iter(named), None)
            self.template = named.get(pick)
            self.template_src = "%s: chat_template '%s'" % (cfg_path, pick)
        elif self.template is not None and not isinstance(self.template, str):
            fail("%s: chat_template: expected a string or a list of {\"name\", \"template\"} "
                 "objects, found %s" % (cfg_path, type(self.template).__name__))
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if not self.template and os.path.isfile(jinja_path):
            # transformers >= 4.43 saves the template beside the config
            try:
                with open(jinja_path, encoding="utf-8") as f:
                    self.template = f.read()
            except (OSError, UnicodeDecodeError) as e:
                fail("%s: %s" % (jinja_path, e))
            self.template_src = jinja_path
        # the template's extra variables (transformers passes apply_chat_template's
        # keyword arguments through); a thinking switch the template reads
        # (Qwen3's enable_thinking) is off unless set: the assistant turns
        # train and chat without a reasoning block
        self.template_args = dict(template_args or {})
        self.defaulted = []
        if self.template and "enable_thinking" in self.template and \
                "enable_thinking" not in self.template_args:
            self.template_args["enable_thinking"] = False
            self.defaulted.append("enable_thinking=false")
        self._jinja = None

    def _special(self, key):
        v = self.cfg.get(key)
        if isinstance(v, dict):  # an AddedToken: {"content": ..., ...}
            v = v.get("content")
        if not v:
            return None
        if not isinstance(v, str):
            fail("%s: %s: expected a token string or {\"content\": ...}, found %s"
                 % (self.cfg_path, key, json.dumps(v)[:80]))
        i = self.tok.token_to_id(v)
        return (v, i) if i is not None else None

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def _compile(self):
        if not self.template:
            fail("the model folder's tokenizer_config.json has no chat_template: chat data "
                 "needs one")
        try:
            import jinja2
            import jinja2.ext
            import jinja2.sandbox
        except ImportError:
            fail("jinja2 is not installed (scripts/setup.sh venv installs it into .venv)")

        class Generation(jinja2.ext.Extension):
            """transformers' {% generation %} ... {% endgeneration %}: the
            assistant text a template marks; rendered as it stands (the
            mask comes from the turns, as for every template)."""
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.Scope(body, lineno=lineno)

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[Generation])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        try:
            self._jinja = env.from_string(self.template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            fail("%s: line %s: %s" % (self.template_src, e.lineno, e.message))
        except Exception as e:  # jinja2's parser on what it cannot read at all
            fail("%s: %s: %s" % (self.template_src, type(e).__name__, e))
        self._template_error = jinja2.exceptions.TemplateError

    def render(self, messages, add_generation_prompt):
        """The conversation through the chat template. ValueError when the
        template refuses it (its raise_exception) or fails on it, naming
        the template."""
        if self._jinja is None:
            self._compile()
        try:
            out = self._jinja.render(messages=messages,
                                     add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos[0] if self.bos else "",
                                     eos_token=self.eos[0] if self.eos else "",
                                     **self.template_args)
        except self._template_error as e:
            if type(e) is self._template_error:  # raise_exception: the template's own words
                raise ValueError("the chat template refuses this conversation: %s" % e)
            raise ValueError("the chat template (%s) failed on this conversation: %s: %s"
                             % (self.template_src, type(e).__name__, e))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError,
                RecursionError, OverflowError, MemoryError) as e:
            raise ValueError("the chat template (%s) failed on this conversation: %s: %s"
                             % (self.template_src, type(e).__name__, e))
        if not isinstance(out, str):
            raise ValueError("the chat template (%s) did not render text" % self.template_src)
        return out


def doc_text(m, text):
    ids = ([m.bos[1]] if m.add_bos else []) + m.encode(text).ids
    mask = [0] * (1 if m.add_bos else 0) + [1] * (len(ids) - (1 if m.add_bos else 0))
    if m.eos:
        ids.append(m.eos[1])
        mask.append(1)
    return ids, mask


def doc_prompt(m, prompt, completion):
    p = ([m.bos[1]] if m.add_bos else []) + m.encode(prompt).ids
    c = m.encode(completion).ids + ([m.eos[1]] if m.eos else [])
    return p + c, [0] * len(p) + [1] * len(c)


def turn_by_content(full, through, content, cursor, k):
    """An assistant turn of a template that renders a turn one way when it
    ends the conversation and another way inside it (Qwen3's drops the
    reasoning block of earlier turns): its content, found in the full
    render after `cursor`, through the closing text the template puts after
    it (what follows the content in the render that ends with this turn,
    when the full render has it there too)."""
    body = content.strip() if isinstance(content, str) else ""
    a = full.find(body, cursor) if body else -1
    if a < 0:
        raise ValueError("the chat template does not render assistant turn %d's content as "
                         "given, nor the conversation as a growing prefix" % k)
    b = a + len(body)
    at = through.rfind(body)
    closing = through[at + len(body):] if at >= 0 else ""
    if closing and full.startswith(closing, b):
        b += len(closing)
    return a, b


def doc_chat(m, messages):
    """The conversation as the template renders it; the mask covers each
    assistant turn: the characters between the render of the messages
    before it with the generation prompt and the render through it, or,
    where the template renders a turn inside the conversation otherwise
    than at its end, the turn's content and its closing text."""
    full = m.render(messages, False)
    spans = []
    cursor = 0
    for k, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        head, through = m.render(messages[:k], True), m.render(messages[:k + 1], False)
        a, b = len(head), len(through)
        if not full.startswith(through) or not through.startswith(head):
            a, b = turn_by_content(full, through, msg.get("content"), cursor, k)
        spans.append((a, b))
        cursor = b
    enc = m.encode(full)
    mask = []
    for (s, e) in enc.offsets:
        mask.append(1 if any(a <= s < b for (a, b) in spans) else 0)
    return list(enc.ids), mask


class Records:
    """jsonl lines or plain-text files, as documents, with where they came
    from for messages."""

    def __init__(self, args):
        self.a = args

    def __iter__(self):
        for path in self.paths:
            if not os.path.isfile(path):
                fail("%s: no such file" % path)
            if path.endswith(".jsonl") or path.endswith(".json"):
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                if text.lstrip().startswith("["):
                    # a JSON array of records (LLaMA-Factory ships its data so;
                    # HF datasets' json loader reads both forms)
                    try:
                        recs = json.loads(text)
                    except ValueError as e:
                        fail("%s: invalid JSON array (%s)" % (path, e))
                    for i, rec in enumerate(recs):
                        yield "%s[%d]" % (path, i), rec
                    continue
                for n, line in enumerate(text.splitlines(), 1):
                    if line.strip():
                        yield "%s:%d" % (path, n), line
            elif path.endswith(".parquet"):
                try:
                    import pyarrow.parquet as pq
                except ImportError:
                    fail("%s: reading parquet needs pyarrow (pip install pyarrow in .venv)" % path)
                try:
                    rows = pq.read_table(path).to_pylist()
                except Exception as e:  # pyarrow's errors have no common base
                    fail("%s: not a readable parquet file (%s)" % (path, e))
                for n, row in enumerate(rows, 1):
                    # a column another record type uses is null in this row
                    yield ("%s:row %d" % (path, n),
                           {k: v for k, v in row.items() if v is not None})
            else:
                with open(path, encoding="utf-8") as f:
                    yield path, {self.a.text_field: f.read()}


# sharegpt's role tags, as LLaMA-Factory's dataset_info.json defaults name them
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool",
                  "function_call": "assistant"}


def alpaca_messages(rec):
    """LLaMA-Factory's alpaca record as a chat."""
    msgs = []
    if rec.get("system"):
        msgs.append({"role": "system", "content": rec["system"]})
    for turn in rec.get("history") or []:
        if not (isinstance(turn, list) and len(turn) == 2 and all(isinstance(x, str) for x in turn)):
            raise ValueError("'history' must be a list of [query, response] pairs")
        msgs += [{"role": "user", "content": turn[0]}, {"role": "assistant", "content": turn[1]}]
    ins, inp, out = rec.get("instruction"), rec.get("input") or "", rec.get("output")
    if not isinstance(ins, str) or not isinstance(inp, str) or not isinstance(out, str):
        raise ValueError("'instruction', 'input' and 'output' must be strings")
    msgs += [{"role": "user", "content": ins + ("\n" + inp if inp else "")},
             {"role": "assistant", "content": out}]
    return msgs


def sharegpt_messages(rec):
    """A sharegpt record (conversations of from/value) as a chat."""
    conv = rec.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise ValueError("'conversations' must be a non-empty list")
    msgs = [{"role": "system", "content": rec["system"]}] if rec.get("system") else []
    for k, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ValueError("conversations[%d] must be an object with a string 'value'" % k)
        role = SHAREGPT_ROLES.get(turn.get("from"))
        if role is None:
            raise ValueError("conversations[%d]: 'from' %r is not one of %s" %
                             (k, turn.get("from"), ", ".join(sorted(SHAREGPT_ROLES))))
        msgs.append({"role": role, "content": turn["value"]})
    return msgs


def dataset_records(info_dir, names, max_samples):
    """LLaMA-Factory's datasets by name: (where, record) in zinc prepare's
    own record shapes (alpaca fields, or a chat of messages)."""
    path = os.path.join(info_dir, "dataset_info.json")
    try:
        info = json.load(open(path, encoding="utf-8"))
    except OSError as e:
        fail("%s: %s (dataset_dir must hold LLaMA-Factory's dataset_info.json)" % (path, e))
    except ValueError as e:
        fail("%s: invalid JSON: %s" % (path, e))
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        e = info.get(name)
        if not isinstance(e, dict):
            fail("%s: no dataset '%s' (it has: %s)" % (path, name, ", ".join(sorted(info))))
        if "file_name" not in e:
            fail("%s: dataset '%s' is not a local file (%s): download it and register its "
                 "file_name" % (path, name, ", ".join(k for k in e if k.endswith("url")) or
                                "no file_name"))
        if e.get("ranking"):
            fail("%s: dataset '%s' is a preference (ranking) dataset: zinc trains sft" %
                 (path, name))
        fmt = e.get("formatting", "alpaca")
        if fmt not in ("alpaca", "sharegpt"):
            fail("%s: dataset '%s': formatting '%s' (zinc reads alpaca and sharegpt)" %
                 (path, name, fmt))
        cols, tags = e.get("columns") or {}, e.get("tags") or {}
        fpath = os.path.join(info_dir, e["file_name"])
        if not os.path.isfile(fpath):
            fail("%s: dataset '%s': %s: no such file" % (path, name, fpath))
        with open(fpath, encoding="utf-8") as f:
            text = f.read()
        try:
            recs = json.loads(text)
            if not isinstance(recs, list):
                recs = [recs]
            where = ["%s[%d]" % (fpath, i) for i in range(len(recs))]
        except ValueError:  # json lines
            recs, where = [], []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        recs.append(json.loads(line))
                    except ValueError as err:
                        fail("%s:%d: invalid JSON (%s)" % (fpath, n, err))
                    where.append("%s:%d" % (fpath, n))
        if max_samples:
            recs, where = recs[:max_samples], where[:max_samples]
        for w, r in zip(where, recs):
            if not isinstance(r, dict):
                yield w, r
            elif fmt == "alpaca":
                yield w, {"instruction": r.get(cols.get("prompt", "instruction")),
                          "input": r.get(cols.get("query", "input")) or "",
                          "output": r.get(cols.get("response", "output")),
                          "system": r.get(cols["system"]) if "system" in cols else None,
                          "history": r.get(cols["history"]) if "history" in cols else None}
            else:
                roles = {tags.get("user_tag", "human"): "user",
                         tags.get("assistant_tag", "gpt"): "assistant",
                         tags.get("system_tag", "system"): "system",
                         tags.get("observation_tag", "observation"): "tool",
                         tags.get("function_tag", "function_call"): "assistant"}
                rt, ct = tags.get("role_tag", "from"), tags.get("content_tag", "value")
                conv = r.get(cols.get("messages", "conversations"))
                msgs = []
                if "system" in cols and r.get(cols["system"]):
                    msgs.append({"role": "system", "content": r[cols["system"]]})
                for k, turn in enumerate(conv if isinstance(conv, list) else []):
                    role = roles.get(turn.get(rt)) if isinstance(turn, dict) else None
                    if role is None:
                        msgs = None
                        yield w, {"__error__": "turn %d: role %r is none of the dataset's "
                                               "tags (%s)" % (k, turn.get(rt) if isinstance(
                                                   turn, dict) else turn,
                                                   ", ".join(sorted(roles)))}
                        break
                    msgs.append({"role": role, "content": turn.get(ct)})
                if msgs is not None:
                    yield w, {"messages": msgs}


def make_doc(m, a, rec):
    if isinstance(rec, str):
        try:
            rec = json.loads(rec)
        except ValueError as e:
            raise ValueError("invalid JSON (%s)" % e)
    if not isinstance(rec, dict):
        raise ValueError("a record must be a JSON object")
    if "__error__" in rec:
        raise ValueError(rec["__error__"])
    if a.messages_field not in rec and "conversations" in rec:
        rec = {a.messages_field: sharegpt_messages(rec)}
    elif a.messages_field not in rec and "instruction" in rec and "output" in rec:
        rec = {a.messages_field: alpaca_messages(rec)}
    if a.messages_field in rec:
        msgs = rec[a.messages_field]
        if not isinstance(msgs, list) or not all(
                isinstance(x, dict) and isinstance(x.get("role"), str) and
                isinstance(x.get("content"), str) for x in msgs):
            raise ValueError("'%s' must be a list of {\"role\", \"content\"} objects"
                             % a.messages_field)
        if not any(x["role"] == "assistant" for x in msgs):
            raise ValueError("a conversation without an assistant turn has nothing to learn")
        return doc_chat(m, msgs)
    if a.prompt_field in rec and a.completion_field in rec:
        p, c = rec[a.prompt_field], rec[a.completion_field]
        if not isinstance(p, str) or not isinstance(c, str):
            raise ValueError("'%s' and '%s' must be strings" % (a.prompt_field, a.completion_field))
        return doc_prompt(m, p, c)
    if a.text_field in rec:
        if not isinstance(rec[a.text_field], str):
            raise ValueError("'%s' must be a string" % a.text_field)
        return doc_text(m, rec[a.text_field])
    raise ValueError("no '%s', '%s'/'%s' or '%s' field" % (a.messages_field, a.prompt_field,
                                                          a.completion_field, a.text_field))


def write_tokens(path, vocab, docs):
    ids, mask, ends = [], [], []
    for d_ids, d_mask in docs:
        ids.extend(d_ids)
        mask.extend(d_mask)
        ends.append(len(ids))
    width = 2 if vocab <= 65536 else 4
    if any(i >= vocab for i in ids):
        fail("%s: a token id is beyond the tokenizer's vocabulary" % path)
    mbytes = bytearray((len(mask) + 7) // 8)
    for i, b in enumerate(mask):
        if b:
            mbytes[i >> 3] |= 1 << (i & 7)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"ZNTOKENS" + struct.pack("<IIQII", 2, width, len(ids), vocab, 3))
        f.write(struct.pack("<%d%s" % (len(ids), "H" if width == 2 else "I"), *ids))
        f.write(bytes(mbytes))
        f.write(struct.pack("<Q", len(ends)))
        f.write(struct.pack("<%dQ" % len(ends), *ends))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(ids), sum(mask)


def main():
    ap = argparse.ArgumentParser(prog="zinc prepare",
                                 description=" ".join(__doc__.split("\n\n")[0].split()),
                                 epilog="Records: text, prompt/completion, chat (messages), "
                                        "alpaca and sharegpt (docs/tokens.md).")
    ap.add_argument("inputs", nargs="*", metavar="INPUT")
    ap.add_argument("--dataset-info", metavar="DIR",
                    help="LLaMA-Factory's dataset_dir (its dataset_info.json)")
    ap.add_argument("--datasets", help="names registered there, comma-separated")
    ap.add_argument("--eval-datasets", help="names for the held-out file")
    ap.add_argument("--eval-count", type=int, default=0,
                    help="hold out this many documents, drawn at random (LLaMA-Factory's "
                         "integer val_size)")
    ap.add_argument("--max-samples", type=int, default=0,
                    help="the first N records of each dataset")
    ap.add_argument("--model", required=True, help="the HF model folder (tokenizer.json)")
    ap.add_argument("--out", required=True, help="the training token file to write")
    ap.add_argument("--eval-out", help="the held-out evaluation token file")
    ap.add_argument("--eval-fraction", type=float, default=0.0,
                    help="documents drawn (seeded) into --eval-out")
    ap.add_argument("--eval", nargs="+", default=[], metavar="INPUT",
                    help="separate evaluation inputs for --eval-out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-len", type=int, default=0,
                    help="truncate documents to this many tokens (0: no limit); counted")
    ap.add_argument("--on-error", choices=["skip", "fail"], default="fail",
                    help="an invalid record: report it and skip it, or stop (default)")
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--messages-field", default="messages")
    ap.add_argument("--prompt-field", default="prompt")
    ap.add_argument("--completion-field", default="completion")
    ap.add_argument("--template-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="a variable of the chat template (VALUE as JSON, else a string), as "
                         "apply_chat_template's keyword arguments; Qwen3's enable_thinking is "
                         "false unless set")
    ap.add_argument("--quiet", action="store_true", help="no progress line")
    a = ap.parse_args()
    if bool(a.inputs) == bool(a.datasets):
        fail("give INPUT files or --dataset-info DIR --datasets NAMES (one of them)")
    if a.datasets and not a.dataset_info:
        fail("--datasets needs --dataset-info DIR")
    if not 0.0 <= a.eval_fraction < 1.0:
        fail("--eval-fraction %g: must be in [0, 1)" % a.eval_fraction)
    if a.eval_count and (a.eval_fraction or a.eval or a.eval_datasets):
        fail("--eval-count goes alone: not with --eval-fraction, --eval or --eval-datasets")
    if (a.eval_fraction or a.eval or a.eval_datasets or a.eval_count) and not a.eval_out:
        fail("--eval-fraction / --eval need --eval-out")
    if a.eval_fraction and a.eval:
        fail("give --eval-fraction or --eval, not both")
    m = Model(a.model, parse_template_args(a.template_arg))
    if m.defaulted:
        print("zinc prepare: the chat template reads %s: set to false (a chat's last "
              "assistant turn gets an empty reasoning block, outside the loss; "
              "--template-arg enable_thinking=true trains the reasoning blocks)"
              % ", ".join(d.split("=")[0] for d in m.defaulted), file=sys.stderr)
    rng = random.Random(a.seed)
    stats = {"docs": 0, "skipped": 0, "truncated": 0, "longest": 0}
    t0 = last = time.time()
    ntok = 0

    def collect(paths, split, names=None):
        nonlocal ntok, last
        train, held = [], []
        if names:
            recs = dataset_records(a.dataset_info, names, a.max_samples)
        else:
            recs = Records(a)
            recs.paths = paths
        for where, rec in recs:
            try:
                ids, mask = make_doc(m, a, rec)
            except Exception as e:  # a bad record: named with its line
                stats["skipped"] += 1
                sys.stderr.write("zinc prepare: %s: %s%s\n" % (
                    where, e, "" if a.on_error == "fail" else " (skipped)"))
                if a.on_error == "fail":
                    fail("%s: invalid record (--on-error skip goes on without it)" % where)
                continue
            if a.max_len and len(ids) > a.max_len:
                stats["truncated"] += 1
                ids, mask = ids[:a.max_len], mask[:a.max_len]
            stats["docs"] += 1
            stats["longest"] = max(stats["longest"], len(ids))
            ntok += len(ids)
            (held if split and rng.random() < a.eval_fraction else train).append((ids, mask))
            now = time.time()
            if not a.quiet and now - last >= 1.0:
                last = now
                sys.stderr.write("\rzinc prepare: %d documents, %d tokens, %.0f tokens/s"
                                 % (stats["docs"], ntok, ntok / max(now - t0, 1e-9)))
        return train, held

    train, held = collect(a.inputs, a.eval_fraction > 0, a.datasets)
    if a.eval:
        held = collect(a.eval, False)[0]
    if a.eval_count:
        if a.eval_count >= len(train):
            fail("--eval-count %d: only %d documents" % (a.eval_count, len(train)))
        pick = set(rng.sample(range(len(train)), a.eval_count))
        held = [d for i, d in enumerate(train) if i in pick]
        train = [d for i, d in enumerate(train) if i not in pick]
    if a.eval_datasets:
        if a.eval_fraction:
            fail("give --eval-fraction or --eval-datasets, not both")
        held = collect([], False, a.eval_datasets)[0]
    if not a.quiet and time.time() - t0 >= 1.0:
        sys.stderr.write("\n")
    if not train:
        fail("no documents in %s%s" % (", ".join(a.inputs) or a.datasets,
                                        " (%d invalid records skipped)" % stats["skipped"]
                                        if stats["skipped"] else ""))
    n, t = write_tokens(a.out, m.vocab, train)
    print("%s: %d documents, %d tokens, %.1f%% of them targets" % (a.out, len(train), n,
                                                                  100.0 * t / max(n, 1)))
    if a.eval_out:
        if not held:
            fail("no documents for %s (raise --eval-fraction or give --eval)" % a.eval_out)
        n2, t2 = write_tokens(a.eval_out, m.vocab, held)
        print("%s: %d documents, %d tokens, %.1f%% of them targets" % (a.eval_out, len(held), n2,
                                                                      100.0 * t2 / max(n2, 1)))
    dt = max(time.time() - t0, 1e-9)
    print("%d documents, longest %d tokens, %d truncated to --max-len, %d invalid records "
          "skipped; %.0f tokens/s" % (stats["docs"], stats["longest"], stats["truncated"],
                                      stats["skipped"], ntok / dt))


if __name__ == "__main__":
    main()
