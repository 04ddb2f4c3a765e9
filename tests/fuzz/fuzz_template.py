#!/usr/bin/env python3
"""libFuzzer (through atheris) over what zinc prepare and zinc generate read
from a model folder besides tokenizer.json: tokenizer_config.json (its
special tokens, add_bos_token, chat_template as a string or a list of named
templates) and the chat-template renderer with the turn masks zinc prepare
derives from it (scripts/zinc_prepare.py: Model, doc_chat).

The input is tokenizer_config.json's bytes; its first byte also picks one of
the conversation shapes records bring and whether a template variable is
set. A finding is any exception other than zinc's own refusal of the folder
(zinc_prepare.fail) or the ValueError a conversation the template refuses or
fails on gets; a mask that is not one 0/1 per token is one too. A render
still running after 2 s is cut: a slow template is the folder's code being
slow, not a parser's fault.

usage: fuzz_template.py CORPUS [libFuzzer flags]  (run_fuzz.sh runs it with
the .venv-fuzz python; TMPDIR holds the tokenizer it trains at start)"""
import json
import os
import signal
import sys
import tempfile

import atheris

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
sys.path.insert(0, os.path.join(here, ".."))

with atheris.instrument_imports():
    import jinja2  # noqa: F401  (instrumented: its parser is what templates reach)
    import zinc_prepare

from venv_fixtures import model_folder  # noqa: E402


class Refused(Exception):
    pass


class Slow(Exception):
    pass


def refuse(msg):
    if not isinstance(msg, str) or not msg:
        raise AssertionError("a refusal without a message: %r" % (msg,))
    raise Refused(msg)


zinc_prepare.fail = refuse

CONVS = [
    [{"role": "user", "content": "what is two plus two"},
     {"role": "assistant", "content": "four"}],
    [{"role": "system", "content": "be brief"},
     {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "  hello "},
     {"role": "user", "content": "and?"},
     {"role": "assistant", "content": "bye"}],
    [{"role": "assistant", "content": "first"}, {"role": "user", "content": "x"},
     {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "\u00e9t\u00e9 \u4e2d\u6587 <|im_end|> {{ x }}"},
     {"role": "tool", "content": "{}"},
     {"role": "assistant", "content": "\u00e9t\u00e9"}],
]

folder = os.path.join(tempfile.mkdtemp(prefix="zn_fuzz_template."), "model")
model_folder(folder, ["the cat sat on the mat", "what is two plus two", "hello there"] * 20, 300)
cfg_path = os.path.join(folder, "tokenizer_config.json")


def on_alarm(signum, frame):
    raise Slow()


signal.signal(signal.SIGALRM, on_alarm)


def one(data):
    if not data:
        return
    conv = CONVS[data[0] % len(CONVS)]
    targs = {"enable_thinking": True} if data[0] & 0x80 else {}
    with open(cfg_path, "wb") as f:
        f.write(data)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        m = zinc_prepare.Model(folder, targs)
        ids, mask = zinc_prepare.doc_chat(m, conv)
        if len(ids) != len(mask) or any(x not in (0, 1) for x in mask):
            raise AssertionError("%d ids, %d mask entries" % (len(ids), len(mask)))
        prompt = m.render(conv[:1], True)
        if not isinstance(prompt, str):
            raise AssertionError("a prompt of type %s" % type(prompt).__name__)
    except (Refused, Slow):
        pass
    except ValueError as e:
        if not str(e):
            raise AssertionError("a conversation refused without a message")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


atheris.Setup(sys.argv, one)
atheris.Fuzz()
