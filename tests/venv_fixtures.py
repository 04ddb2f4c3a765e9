"""What the Python tests of the command line share (tests/venv_test.sh runs
them with the project's .venv): a byte-level BPE tokenizer trained here (no
downloads) and a model folder made of it, a ChatML-style chat template and,
where the test generates or trains, a committed fixture's weights."""
import json
import os
import shutil

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def checker():
    """check(cond, what) counting failures in check.fails."""
    def check(cond, what):
        if not cond:
            check.fails += 1
            print("FAIL:", what)
    check.fails = 0
    return check


def model_folder(folder, corpus, vocab_size, weights_of=None, template=CHATML):
    """A model folder: tokenizer.json (a BPE of vocab_size trained on
    corpus), tokenizer_config.json (the template, <|endoftext|> as eos, no
    BOS) and, with weights_of (a fixture folder), its config.json and
    weights. Returns the tokenizer."""
    os.makedirs(folder, exist_ok=True)
    if weights_of:
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(weights_of, f), folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(folder, "tokenizer.json"))
    json.dump({"chat_template": template, "eos_token": "<|endoftext|>", "add_bos_token": False},
              open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return tok
