#!/usr/bin/env python3
"""The tokenizer side of `zinc generate`: a co-process speaking one JSON
object per line on stdin/stdout, with the model folder's own tokenizer and
chat template (the same Model class zinc prepare renders training data
with, so a prompt is tokenized as training saw it).

usage: zinc_tokenize.py MODEL_DIR
First line out: {"ready": true, "vocab": N, "eos": [ids], "bos": id|null}
or {"error": "..."} (then exit 1). Then per request line:
  {"text": "..."}                 -> {"ids": [...]}  raw text (BOS first when
                                     tokenizer_config.json's add_bos_token says so)
  {"messages": [{"role", "content"}, ...]}
                                  -> {"ids": [...]}  the chat template with the
                                     generation prompt, as transformers'
                                     apply_chat_template(add_generation_prompt=True)
  {"decode": [ids]}               -> {"text": "..."} special tokens skipped
A request that fails gets {"error": "..."} and the loop goes on.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def out(obj):
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def main():
    if len(sys.argv) not in (2, 3):
        out({"error": "usage: zinc_tokenize.py MODEL_DIR [TEMPLATE_ARGS_JSON]"})
        return 1
    import zinc_prepare

    # zinc_prepare reports a bad folder with fail() (SystemExit): turn it
    # into the protocol's error line
    def fail(msg):
        raise RuntimeError(msg)

    zinc_prepare.fail = fail
    try:
        targs = {}
        if len(sys.argv) == 3:
            targs = json.loads(sys.argv[2])
            if not isinstance(targs, dict):
                raise RuntimeError("the chat template's variables must be a JSON object")
        m = zinc_prepare.Model(sys.argv[1], targs)
    except (RuntimeError, ValueError) as e:
        out({"error": str(e)})
        return 1
    except Exception as e:  # anything else the folder's files make the libraries raise
        out({"error": "%s: %s: %s" % (sys.argv[1], type(e).__name__, e)})
        return 1
    eos = [m.eos[1]] if m.eos else []
    out({"ready": True, "vocab": m.vocab, "eos": eos, "bos": m.bos[1] if m.bos else None})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if "decode" in req:
                out({"text": m.tok.decode(req["decode"], skip_special_tokens=True)})
            elif "messages" in req:
                text = m.render(req["messages"], True)
                out({"ids": list(m.encode(text).ids)})
            elif "text" in req:
                ids = ([m.bos[1]] if m.add_bos else []) + list(m.encode(req["text"]).ids)
                out({"ids": ids})
            else:
                out({"error": "a request needs 'text', 'messages' or 'decode'"})
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            out({"error": str(e)})
        except Exception as e:  # jinja2's template errors have their own base
            out({"error": "%s: %s" % (type(e).__name__, e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
