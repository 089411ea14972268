"""
The prepared datasets' readers, shared by train.py, sample.py, export_hf.py and prepare_data.py:
where a dataset lives, its meta.json, and the tokenizer that meta.json names.

A dataset named NAME lives in data/NAME under the working directory, for every tool: prepare_data.py
writes it there and train.py, sample.py, export_hf.py and bench.py read it there (as in nanoGPT).
"""
import base64
import functools
import hashlib
import json
from pathlib import Path

import tiktoken

ROOT = Path(__file__).parent
GPT2_RANKS = ROOT / "data/raw/gpt2.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256


def data_dir(name):
    """The folder of dataset `name`: data/<name> under the working directory (the one rule of every tool)."""
    return Path("data") / name


@functools.lru_cache
def gpt2_encoding(path=GPT2_RANKS, sha256=GPT2_RANKS_SHA256):
    """GPT-2's BPE built from the vendored ranks file: tiktoken.get_encoding("gpt2") would download it."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: GPT-2 vocabulary file {path} is missing: restore it from git.")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"error: GPT-2 vocabulary file {path} has the wrong sha256 (damaged or not GPT-2's ranks): restore it from git.")
    # parsed here, not by tiktoken.load.load_tiktoken_bpe: that one keeps a copy in /tmp keyed by
    # the path and serves it even after the file itself is gone or changed
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOT})


def load_meta(data_dir):
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        name = Path(data_dir).name
        cmd = name if name in ("shakespeare_char", "shakespeare", "fineweb_edu") else f"text --input FILE --name {name}"
        raise SystemExit(f"error: no prepared data in {data_dir} (meta.json missing): run `python prepare_data.py {cmd}` first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        raise SystemExit(f"error: {path} is not valid JSON ({e}): prepare the dataset again") from None
    missing = [k for k in ("tokenizer", "vocab_size") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise SystemExit(f"error: {path} lacks {', '.join(missing)}: prepare the dataset again")
    return meta


def get_tokenizer(meta):
    """(encode, decode) for the tokenizer a meta.json names."""
    if meta["tokenizer"] == "gpt2":
        enc = gpt2_encoding()
        return enc.encode_ordinary, enc.decode
    if meta["tokenizer"] == "char":
        chars = meta["chars"]
        stoi = {c: i for i, c in enumerate(chars)}
        def encode(s):
            try:
                return [stoi[c] for c in s]
            except KeyError as e:
                raise ValueError(f"character {e.args[0]!r} is not in this char-level vocabulary") from None
        return encode, lambda ids: "".join(chars[i] for i in ids)
    raise SystemExit(f"error: unknown tokenizer {meta['tokenizer']!r} in meta.json (expected 'char' or 'gpt2')")
