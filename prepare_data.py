"""
Turn text into token files for training: data/<name>/{train.bin, val.bin, meta.json}, under the
working directory (where train.py looks: dataset.dataset_dir), with tokenizer.py's tokenizers.
train.bin and val.bin are raw numpy uint16 token ids (as in nanoGPT); meta.json is written
last and marks the set complete. A re-run with the same source and settings does nothing.

    python prepare_data.py shakespeare_char          # char-level Tiny Shakespeare (vocab 65)
    python prepare_data.py shakespeare               # same text, GPT-2 BPE
    python prepare_data.py text --input book.txt --name book [--tokenizer gpt2|char|byte]
    python prepare_data.py fineweb_edu --num_tokens 1e8   # needs `pip install datasets` and network
    python prepare_data.py fineweb_edu --data_files 'shards/*.parquet' --num_proc 32   # offline
    python prepare_data.py fineweb_edu --tokenizer byte   # UTF-8 bytes, vocab 257

The text commands put the last --val_fraction (0.1) of the characters in val.bin.
fineweb_edu puts the first --val_tokens (default 0.5% of --num_tokens) of the stream in val.bin
and the rest, up to --num_tokens in all, in train.bin; <|endoftext|> precedes every document
(with --tokenizer byte: id 256).
With --data_files it reads local .parquet files (a glob; the dataset's own shards, as compute
nodes without internet hold them) through `datasets`, offline, in sorted file order.
"""
import argparse
import contextlib
import errno
import functools
import glob
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from dataset import dataset_dir
from tokenizer import BYTE_EOT, BYTE_VOCAB, EOT, ROOT, get_tokenizer, gpt2_encoding

SHAKESPEARE = ROOT / "data/raw/tinyshakespeare.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# the fewest tokens a split may hold: train.py needs more than block_size + 1, so even block_size=1
# needs 3; fewer is a broken set, not a small one
MIN_SPLIT_TOKENS = 3
FINEWEB = "HuggingFaceFW/fineweb-edu (sample-10BT, streaming)"

# ---- writing token files ------------------------------------------------------------------------

class Progress:
    """One self-overwriting line on stderr: 'tokenizing:  45% 450.0M/1.0G tokens 12.3M tokens/s'."""
    def __init__(self, total, unit):
        self.total, self.unit, self.n, self.shown = total, unit, 0, False
        self.t0 = self.last = time.time()
    def update(self, k):
        self.n, now = self.n + k, time.time()
        if now - self.last > 0.5 or self.n >= self.total:  # redraw at most twice a second
            self.last, self.shown, rate = now, True, self.n / max(now - self.t0, 1e-9)
            print(f"\rtokenizing: {100 * self.n / max(self.total, 1):3.0f}% {self.n / 1e6:.1f}M/"
                  f"{self.total / 1e6:.1f}M {self.unit} {rate / 1e6:.1f}M {self.unit}/s", end="",
                  file=sys.stderr, flush=True)
    def close(self):
        if self.shown:
            print(file=sys.stderr)

def utf8_ids(text):
    """The byte tokenizer's ids of text, as uint16 without a Python list (~20x faster than one)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

@contextlib.contextmanager
def staged_set(out_dir, meta):
    """Yields open train/val files, and the block completes meta. Each file is written to .tmp<pid>
    (this writer's own), fsynced, then renamed, meta.json last (it marks the set complete), only if
    the block succeeds: a crash or error leaves any earlier complete set untouched."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmps = [out_dir / f"{f}.tmp{os.getpid()}" for f in ("train.bin", "val.bin", "meta.json")]
    try:
        with open(tmps[0], "wb") as train_f, open(tmps[1], "wb") as val_f:
            yield train_f, val_f
            for f, split in ((train_f, "train"), (val_f, "val")):
                f.flush()
                if f.tell() < 2 * MIN_SPLIT_TOKENS:   # checked before the old set is touched
                    raise SystemExit(f"error: the {split} split would hold {f.tell() // 2} "
                                     f"token(s), fewer than the {MIN_SPLIT_TOKENS} a training "
                                     "sequence needs: give more text (nothing was written)")
                os.fsync(f.fileno())
        # from here the old set is no longer complete
        (out_dir / "meta.json").unlink(missing_ok=True)
        for tmp in tmps[:2]:
            os.replace(tmp, tmp.with_suffix(""))
        with open(tmps[2], "w") as f:
            json.dump(meta, f, indent=2, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmps[2], out_dir / "meta.json")
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
    print(f"{meta['name']}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"vocab {meta['vocab_size']} ({meta['tokenizer']}) -> {out_dir}")

def is_prepared(out_dir, recipe):
    """True if out_dir holds a complete set made with the same recipe (source hash, tokenizer,
    split): then the command prints 'already prepared' and does nothing."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
        sizes = [os.path.getsize(out_dir / f"{split}.bin") for split in ("train", "val")]
    except (OSError, ValueError):
        return False
    if any(meta.get(k) != v for k, v in recipe.items()) or sizes != [
            2 * meta.get("train_tokens", -1), 2 * meta.get("val_tokens", -1)]:
        return False
    print(f"already prepared: {out_dir}")
    return True

# GPT-2's regex never joins "x\ny" across that newline, so cutting right after it tokenizes exactly
# like the whole text would; a cut anywhere else could change the tokens at the seam
SAFE_CUT = re.compile(r"\S\n(?=\S)")

def text_chunks(text, size=1 << 20):
    start = 0
    while start < len(text):
        m = SAFE_CUT.search(text, start + size)
        end = m.end() if m else len(text)
        yield text[start:end]
        start = end

def prepare_text(path, out_dir, name, tokenizer, val_fraction=0.1, expected_sha256=None):
    path, out_dir = Path(path), Path(out_dir)
    if not path.is_file():
        raise SystemExit(f"error: input file {path} not found")
    if not 0 < val_fraction < 1:
        raise SystemExit(f"error: --val_fraction must be between 0 and 1, got {val_fraction}")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if expected_sha256 and sha != expected_sha256:
        raise SystemExit(f"error: {path} has sha256 {sha}, not the expected {expected_sha256}: "
                         "restore it from git.")
    recipe = {"source_sha256": sha, "tokenizer": tokenizer, "val_fraction": val_fraction}
    if is_prepared(out_dir, recipe):
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"error: {path} is not UTF-8 text ({e})") from None
    # record repo files by their portable, repo-relative path
    full, root = path.resolve(), ROOT.resolve()
    source = full.relative_to(root) if full.is_relative_to(root) else full
    meta = {"name": name, **recipe, "source": str(source), "dtype": "uint16",
            "vocab_size": BYTE_VOCAB if tokenizer == "byte" else EOT + 1}
    if tokenizer == "char":
        meta.update(chars="".join(sorted(set(text))), vocab_size=len(set(text)))
        if meta["vocab_size"] > 65536:   # ids beyond uint16
            raise SystemExit(f"error: {path} has {meta['vocab_size']:,} distinct characters, more "
                             "than uint16 ids can hold: use --tokenizer gpt2")
    # byte: the same ids as get_tokenizer's encode, without a list of Python ints
    encode = utf8_ids if tokenizer == "byte" else get_tokenizer(meta)[0]
    # last val_fraction of the characters is val, as in nanoGPT
    n, progress = int(len(text) * (1 - val_fraction)), Progress(len(text), "chars")
    with staged_set(out_dir, meta) as files:
        for f, split, part in zip(files, ("train", "val"), (text[:n], text[n:])):
            meta[f"{split}_tokens"] = 0
            for chunk in text_chunks(part):
                ids = np.asarray(encode(chunk), dtype=np.uint16)
                f.write(ids.tobytes())
                meta[f"{split}_tokens"] += len(ids)
                progress.update(len(chunk))
        progress.close()

# ---- FineWeb-Edu --------------------------------------------------------------------------------

class DownloadError(Exception):
    pass

def encode_batch(docs, tokenizer):
    """The ids of a list of documents, <|endoftext|> before each (byte: id 256), as one array."""
    if tokenizer == "byte":
        ids = [np.insert(utf8_ids(d), 0, BYTE_EOT) for d in docs]
    else:
        ids = [np.array([EOT] + gpt2_encoding().encode_ordinary(d), np.uint16) for d in docs]
    return np.concatenate(ids)

def documents(files):
    """Lists of documents, read lazily (in the pool's feeder thread) from local files, offline, or
    (files None) streamed from FineWeb-Edu's sample-10BT on the Hub."""
    load = ({"path": "parquet", "data_files": files} if files else
            {"path": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT"})
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")   # its retry warnings, before our sentence
    if files:   # offline: fail fast, not after timeouts (works only before `datasets` is imported)
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise SystemExit("error: FineWeb-Edu needs the optional `datasets` package: "
                         "pip install datasets") from None
    def batches():
        # runs after the workers forked: errors come back through the pool, so they travel as a
        # plain, picklable DownloadError
        n = 0
        try:
            stream = datasets.load_dataset(**load, split="train", streaming=True)
            # streaming: shard by shard, no Arrow copy of the whole set; in batches of rows (~25x
            # faster than row by row), one message each to and from a worker: the parent keeps up
            for rows in stream.iter(batch_size=1024):
                docs = rows["text"]
                # checked here, in the parent, so that the message has its index
                bad = next((i for i, doc in enumerate(docs) if not isinstance(doc, str)), None)
                if bad is not None:
                    raise DownloadError(
                        f"error: document {n + bad:,} of the source is {type(docs[bad]).__name__} "
                        f"{str(docs[bad])[:40]!r}, not text (a null, missing or numeric field in a "
                        "row?): fix or drop that row (nothing was written)")
                n += len(docs)
                yield docs
        except DownloadError:
            raise
        except Exception as e:
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            raise DownloadError(
                f"error: could not read the local files ({files[0]}...): {why}" if files else
                f"error: could not download FineWeb-Edu (no network?): {why}; offline, prepare "
                "local shards with `--data_files 'DIR/*.parquet'` (or a text file with `python "
                "prepare_data.py text --input FILE --name NAME`)") from None
    return batches()

def prepare_fineweb(out_dir, name, num_tokens, val_tokens=None, processes=None, data_files=None,
                    tokenizer="gpt2"):
    """Tokenize the documents in parallel: the first val_tokens go to val.bin, the next ones to
    train.bin, until num_tokens in all (or the documents run out)."""
    out_dir, val_tokens = Path(out_dir), val_tokens or max(1, num_tokens // 200)
    if not 0 < val_tokens < num_tokens:
        raise SystemExit(f"error: need 0 < val_tokens < num_tokens, got {val_tokens} and "
                         f"{num_tokens}")
    files = sorted(p for p in glob.glob(os.path.expanduser(data_files or ""), recursive=True)
                   if os.path.isfile(p))
    if data_files and not files:
        raise SystemExit(f"error: --data_files {data_files!r} matches no file: give a glob of "
                         "local .parquet files, quoted so that the shell does not expand it")
    recipe = {"source": f"local parquet files: {data_files}" if files else FINEWEB}
    if files:   # every file with its size, so a changed shard set is prepared again
        recipe["files"] = [[os.path.abspath(f), os.path.getsize(f)] for f in files]
    # the tokenizer is in the recipe: a gpt2 set is never taken for a byte one (nor the reverse)
    recipe.update(tokenizer=tokenizer, num_tokens=num_tokens, val_tokens=val_tokens)
    if is_prepared(out_dir, recipe):
        return
    batches, written = documents(files), 0
    progress = Progress(num_tokens, "tokens")
    encode = functools.partial(encode_batch, tokenizer=tokenizer)   # picklable for the workers
    meta = {"name": name, **recipe, "dtype": "uint16",
            "vocab_size": BYTE_VOCAB if tokenizer == "byte" else EOT + 1}
    with staged_set(out_dir, meta) as (train_f, val_f), mp.Pool(processes) as pool:
        for ids in pool.imap(encode, batches):
            ids = ids[:num_tokens - written]
            n_val = min(len(ids), max(val_tokens - written, 0))
            val_f.write(ids[:n_val].tobytes())
            train_f.write(ids[n_val:].tobytes())
            written += len(ids)
            progress.update(len(ids))
            if written >= num_tokens:
                break  # leaving the Pool block terminates the workers
        progress.close()   # too few for val and train: staged_set says so
        if written < num_tokens:
            print(f"note: the documents ran out at {written:,} of the {num_tokens:,} tokens")
        meta.update(train_tokens=written - val_tokens)

# ---- the command line ---------------------------------------------------------------------------

def count(text):
    """A whole number >= 1, also written as 1e9: --num_tokens, --val_tokens, --num_proc."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(value)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for cmd, what, tokenizer in [
            ("shakespeare_char", "Tiny Shakespeare, one token per character", "char"),
            ("shakespeare", "Tiny Shakespeare, GPT-2 BPE", "gpt2"),
            ("text", "a local UTF-8 text file", "gpt2")]:
        text = sub.add_parser(cmd, help=what)   # the last one: text
        text.set_defaults(input=SHAKESPEARE, tokenizer=tokenizer, sha256=SHAKESPEARE_SHA256)
        text.add_argument("--out_dir", help="default: data/<name>")
        text.add_argument("--val_fraction", type=float, default=0.1,
                          help="last part of the text kept for val")
    text.set_defaults(sha256=None)
    text.add_argument("--input", required=True)
    text.add_argument("--name", required=True)
    text.add_argument("--tokenizer", choices=["gpt2", "char", "byte"], default="gpt2",
                      help="byte: UTF-8 bytes, vocab 257")
    f = sub.add_parser("fineweb_edu",
                       help="a FineWeb-Edu sample (needs `datasets`; network unless --data_files)")
    f.add_argument("--data_files", help="a glob of local .parquet files (quoted), not the hub")
    f.add_argument("--num_tokens", type=count, default=10**9, help="train + val tokens")
    f.add_argument("--val_tokens", type=count, help="first tokens kept for val (default 0.5%%)")
    f.add_argument("--name", default="fineweb_edu")
    f.add_argument("--tokenizer", choices=["gpt2", "byte"], default="gpt2",
                   help="byte: UTF-8 bytes, vocab 257, id 256 before each document")
    f.add_argument("--out_dir", help="default: data/<name>")
    f.add_argument("--num_proc", "--processes", dest="processes", type=count,
                   help="tokenizer processes (default: all cores)")
    args = p.parse_args(argv)

    name = getattr(args, "name", args.command)
    out_dir = dataset_dir(name)   # where train.py looks; a name not one folder's is one sentence
    out_dir = Path(args.out_dir) if args.out_dir else out_dir
    try:
        if args.command == "fineweb_edu":
            prepare_fineweb(out_dir, name, args.num_tokens, args.val_tokens, args.processes,
                            args.data_files, args.tokenizer)
        else:
            prepare_text(args.input, out_dir, name, args.tokenizer, args.val_fraction, args.sha256)
    except DownloadError as e:   # raised where the pool reads the documents
        raise SystemExit(str(e)) from None
    # a full disk, a read-only folder, an --out_dir that is a file: the .tmp files are gone, an
    # earlier complete set stays
    except OSError as e:
        why = ("the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT)
               else (e.strerror or str(e)))
        raise SystemExit(f"error: cannot write {e.filename or out_dir} ({why}): fix that and run "
                         f"again ({out_dir} keeps its earlier set, if it had one)") from None

if __name__ == "__main__":
    main()
