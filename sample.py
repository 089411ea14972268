r"""
Sample from a trained model: the newest complete checkpoint of out_dir. Each sample is printed
token by token as it is sampled.

    python sample.py --out_dir=out/shakespeare_char --start="ROMEO:" --num_samples=2 \
        --max_new_tokens=300
    python sample.py --out_dir=out/shakespeare_char --start=FILE:prompt.txt

Config files given as arguments are Python and are executed, as in train.py: run only those you
trust.
"""
import contextlib
import itertools
import os
import sys

import torch

import checkpoint
import telemetry
from config.defaults import at_least, device_name, folder
from configurator import configure, key_comments
from dataset import meta_problem
from runtime import pick_device, setup_cpu
from tokenizer import decode_stream, get_tokenizer

out_dir = "out"         # the run to sample from: its newest complete checkpoint
start = "\n"            # the prompt, or FILE:path to read it from a file
num_samples = 3         # samples, one after another
max_new_tokens = 500    # tokens per sample, after the prompt
temperature = 0.8       # < 1 sharpens the distribution, > 1 flattens it; 0: greedy
top_k = 200             # keep only the k most likely tokens (0: all)
seed = 1337             # fixes the samples
device = ""             # "" picks cuda, then mps, then cpu
cpu_threads = 0         # torch's threads on a CPU; 0: the cores idle at start, as train.py's
# temperature 0 is greedy decoding, top_k 0 keeps every token
RULES = {"out_dir": folder, "num_samples": at_least(1), "max_new_tokens": at_least(1),
         "temperature": at_least(0), "top_k": at_least(0), "device": device_name,
         "cpu_threads": at_least(0)}

globals().update(configure({k: v for k, v in globals().items()
                            if not k.startswith("_") and isinstance(v, (int, float, str))},
                           sys.argv[1:], RULES, usage=__doc__,
                           comments=lambda: key_comments(__file__)))
device = pick_device(device)
if device == "cpu":
    setup_cpu(cpu_threads)
path, ckpt, model = checkpoint.load_model(out_dir)   # a bad one: its one sentence
model.eval().to(device)
meta = ckpt["vocab"]   # the run's own (dataset.vocabulary), not today's meta.json
if meta_problem(meta) or meta["vocab_size"] != ckpt["model_args"].get("vocab_size"):
    sys.exit(f"error: {path} records a vocabulary that is not its model's (corrupt or edited): "
             "sample from another checkpoint")
encode, decode = get_tokenizer(meta)


if start.startswith("FILE:"):   # at most what the model can see: a prompt of block_size tokens
    prompt, limit = start[5:], 128 * model.config.block_size   # bytes; no token is over 128
    try:
        if not os.path.isfile(prompt) or os.path.getsize(prompt) > limit:
            sys.exit(f"error: the prompt file {prompt!r} is not a regular file of at most "
                     f"{limit:,} bytes (the model sees {model.config.block_size} tokens): give one")
        with open(prompt, encoding="utf-8") as f:
            start = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        sys.exit(f"error: cannot read the prompt file {prompt!r} ({why}): give a UTF-8 text file")
try:
    ids = encode(start)
except KeyError as e:   # a character outside a char-level vocabulary
    sys.exit(f"error: the prompt's character {e.args[0]!r} is not in the char-level vocabulary")
if not ids or len(ids) > model.config.block_size:
    sys.exit(f"error: the prompt encodes to {len(ids)} tokens, and the model takes 1 to "
             f"{model.config.block_size} (its block_size): give a shorter, non-empty --start")
x = torch.tensor(ids, dtype=torch.long, device=device)[None, :]

print(telemetry.describe(path, ckpt), flush=True)
torch.manual_seed(seed)   # here: building the model drew from the generator too
try:
    for _ in range(num_samples):
        # each token is printed as it is sampled (a long sample on a busy CPU takes minutes)
        tokens = model.generate_tokens(x, max_new_tokens, temperature=temperature,
                                       top_k=top_k or None)
        with contextlib.closing(tokens):   # closed here, not by the interpreter's exit
            for piece in decode_stream(decode, itertools.chain(ids, map(int, tokens))):
                print(piece, end="", flush=True)
        print("\n---------------", flush=True)
except KeyboardInterrupt:   # Ctrl-C: the line ends, no traceback
    print(flush=True)
    sys.exit(130)
except BrokenPipeError:   # `| head`: the reader is gone; Python's flush at exit must not raise
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(141)   # as a process killed by SIGPIPE
