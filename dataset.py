"""
The prepared datasets, as train.py reads them (prepare_data.py writes them, with its tokenizers):
data/NAME in the working directory, as in nanoGPT, holds meta.json (the tokenizer), train.bin and
val.bin (uint16 ids). Bad input is one sentence (a SystemExit): the file and what to do.
"""
import json
from pathlib import Path

import numpy as np

VOCAB_SIZES = {"char": None, "gpt2": 50257, "byte": 257}   # each tokenizer's (char: its text's)


def dataset_dir(name):   # the one rule of every tool
    return Path("data") / name


def load_meta(data_dir):   # data_dir/meta.json, its values checked (meta_problem)
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        name = Path(data_dir).name
        cmd = (name if name in ("shakespeare_char", "shakespeare", "fineweb_edu")
               else f"text --input FILE --name {name}")
        raise SystemExit(f"error: no prepared data in {data_dir} (meta.json missing; data/ is "
                         f"looked up in the working directory, {Path.cwd()}): run `python "
                         f"prepare_data.py {cmd}` there first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:   # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise SystemExit(f"error: {path} is not valid JSON ({e}): prepare the dataset again")
    if wrong := meta_problem(meta):
        raise SystemExit(f"error: {path} {wrong}: prepare the dataset again")
    return meta


def meta_problem(meta):
    """What is wrong with a meta.json or a run's recorded vocabulary (words after its path)."""
    if not isinstance(meta, dict) or meta.get("tokenizer") not in VOCAB_SIZES:
        return f"names no tokenizer of {', '.join(VOCAB_SIZES)}"
    n, chars, size = meta.get("vocab_size"), meta.get("chars"), VOCAB_SIZES[meta["tokenizer"]]
    if type(n) is not int or not 1 <= n <= 65536 or size and n != size:   # uint16 ids
        return f"has vocab_size={n!r}, not {size or 'a whole number from 1 to 65536'}"
    if meta["tokenizer"] == "char" and not (isinstance(chars, str)
                                            and len(chars) == n == len(set(chars))):
        return f"has no 'chars' string of vocab_size={n} distinct characters"


def vocabulary(meta):
    """What a run's ids mean, kept in its checkpoints: a resume on other data is refused."""
    return {"tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"],
            **({"chars": meta["chars"]} if meta["tokenizer"] == "char" else {})}


def token_file(data_dir, split, block_size, vocab_size, limit=0):
    """data_dir/<split>.bin, a read-only np.memmap of uint16 ids (its first `limit`; 0: all), over
    block_size + 1 of them, its first 4M checked before anything is written (then every batch)."""
    path = Path(data_dir) / f"{split}.bin"
    size = path.stat().st_size if path.is_file() else 0
    if size == 0 or size % 2:   # uint16 ids: two bytes each
        why = "cut short (an odd number of bytes)" if size else "missing or empty"
        raise SystemExit(f"error: {path} is {why}: prepare the dataset again")
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if limit > len(data):
        raise SystemExit(f"error: train_tokens={limit:,} but {path} has {len(data):,} tokens: "
                         "lower --train_tokens (0: all of them)")
    data = data[:limit or len(data)]
    if len(data) <= block_size + 1:
        raise SystemExit(f"error: {path} has {len(data)} tokens, not more than block_size="
                         f"{block_size} + 1: lower --block_size or prepare more text")
    read_rows(data, [0], min(len(data), 1 << 22), vocab_size)
    return data


def read_rows(data, starts, n, vocab_size):
    """(len(starts), n) ids of a token_file as int64, a row of n from each start."""
    rows = np.stack([data[i : i + n] for i in starts]).astype(np.int64)
    if rows.size and rows.max() >= vocab_size:
        raise SystemExit(f"error: {data.filename} holds token id {rows.max()}, beyond vocab_size="
                         f"{vocab_size} in its meta.json: prepare the dataset again")
    return rows


def eval_windows(n, block_size, rows, iters=None, rank=0, world_size=1):
    """This process's share of an evaluation over the first n tokens of a split, as batches of
    (starts, length) windows of up to `rows` rows. With `iters`, that many batches at fixed, evenly
    spaced offsets, the same in every run. Without, windows that tile every target, the last one
    shorter."""
    if iters:
        starts = np.linspace(0, n - block_size - 1, iters * rows).astype(np.int64)
    else:
        starts = np.arange((n - 1) // block_size) * block_size
    for k in range(rank * rows, len(starts), world_size * rows):
        yield starts[k : k + rows], block_size + 1
    if not iters and (n - 1) % block_size and rank == 0:   # the rest, a shorter window
        yield [len(starts) * block_size], (n - 1) % block_size + 1
