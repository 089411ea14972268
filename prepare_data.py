"""
Turn text into token files for training: data/<name>/{train.bin, val.bin, meta.json}, under the
working directory (where train.py looks: dataset.dataset_dir).
train.bin and val.bin are raw numpy uint16 token ids (as in nanoGPT); meta.json is written
last and marks the set complete. A re-run with the same source and settings does nothing.

    python prepare_data.py shakespeare_char          # char-level Tiny Shakespeare (vocab 65)
    python prepare_data.py shakespeare               # same text, GPT-2 BPE
    python prepare_data.py text --input book.txt --name book [--tokenizer gpt2|char|byte]
    python prepare_data.py fineweb_edu --num_tokens 1e8   # needs `pip install datasets` and network
    # local shards, offline
    python prepare_data.py fineweb_edu --data_files 'shards/*.parquet' --num_proc 32
    python prepare_data.py fineweb_edu --tokenizer byte   # UTF-8 bytes, vocab 257

The text commands put the last --val_fraction (0.1) of the characters in val.bin.
fineweb_edu puts the first --val_tokens (default 0.5% of --num_tokens) of the stream in val.bin
and the rest, up to --num_tokens in all, in train.bin; <|endoftext|> precedes every document
(with --tokenizer byte: id 256).
With --data_files it reads local .parquet or .jsonl files (a glob; the dataset's own shards, as
compute nodes without internet hold them) through `datasets`, offline, in sorted file order.
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

from dataset import (BYTE_EOT, BYTE_VOCAB, DATASET, EOT, ROOT, dataset_dir, get_tokenizer,
                     gpt2_encoding)

SHAKESPEARE = ROOT / "data/raw/tinyshakespeare.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# the fewest tokens a split may hold: train.py draws a sequence of block_size inputs and their next
# tokens from more than block_size + 1 tokens, so even block_size=1 needs 3; fewer is a broken set,
# not a small one
MIN_SPLIT_TOKENS = 3
FINEWEB = "HuggingFaceFW/fineweb-edu (sample-10BT, streaming)"

# -----------------------------------------------------------------------------
# writing token files

class Progress:
    """One self-overwriting line on stderr: 'tokenizing:  45% 450.0M/1.0G tokens 12.3M tokens/s'."""
    def __init__(self, what, total, unit):
        self.what, self.total, self.unit, self.n, self.shown = what, total, unit, 0, False
        self.t0 = self.last = time.time()
    def update(self, k):
        self.n += k
        now = time.time()
        if now - self.last > 0.5 or self.n >= self.total:  # redraw at most twice a second
            self.last, self.shown = now, True
            rate = self.n / max(now - self.t0, 1e-9)
            print(f"\r{self.what}: {100 * self.n / max(self.total, 1):3.0f}% "
                  f"{self.n / 1e6:.1f}M/{self.total / 1e6:.1f}M "
                  f"{self.unit} {rate / 1e6:.1f}M {self.unit}/s", end="", file=sys.stderr,
                  flush=True)
    def close(self):
        if self.shown:
            print(file=sys.stderr)

def utf8_ids(text):
    """The byte tokenizer's ids of text, as uint16 without a Python list (~20x faster than one)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

def to_uint16(ids):
    a = np.asarray(ids, dtype=np.int64)
    if a.size and a.max() > 65535:
        raise SystemExit(f"error: token id {a.max()} does not fit in the uint16 .bin format")
    return a.astype(np.uint16)

@contextlib.contextmanager
def staged_bins(out_dir):
    """Yields open train/val files; they get their final names only if the block succeeds."""
    # the long work goes to .tmp<pid> files (this writer's own), so a crash or error leaves any
    # earlier complete set untouched
    out_dir.mkdir(parents=True, exist_ok=True)
    tmps = [out_dir / f"train.bin.tmp{os.getpid()}", out_dir / f"val.bin.tmp{os.getpid()}"]
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
        for tmp in tmps:
            os.replace(tmp, tmp.with_suffix(""))
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)

def write_meta(out_dir, meta):
    tmp = out_dir / f"meta.json.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_dir / "meta.json")
    print(f"{meta['name']}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"vocab {meta['vocab_size']} ({meta['tokenizer']}) -> {out_dir}")

def is_prepared(out_dir, recipe):
    """True if out_dir holds a complete set made with the same recipe (source hash, tokenizer,
    split)."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    if any(meta.get(k) != v for k, v in recipe.items()):
        return False
    bins = [(out_dir / f"{split}.bin", meta.get(f"{split}_tokens", -1))
            for split in ("train", "val")]
    return all(p.is_file() and p.stat().st_size == 2 * n for p, n in bins)

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
        print(f"already prepared: {out_dir}")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"error: {path} is not UTF-8 text ({e})") from None
    vocab_size = BYTE_VOCAB if tokenizer == "byte" else EOT + 1   # char: set below
    meta = {"name": name, "tokenizer": tokenizer, "vocab_size": vocab_size}
    if tokenizer == "char":
        meta["chars"] = "".join(sorted(set(text)))
        meta["vocab_size"] = len(meta["chars"])
        if meta["vocab_size"] > 65536:
            raise SystemExit(f"error: {path} has {meta['vocab_size']:,} distinct characters, more "
                             "than uint16 ids can hold: use --tokenizer gpt2")
    encode, _ = get_tokenizer(meta)
    if tokenizer == "byte":   # the same ids as encode, without a list of Python ints
        encode = utf8_ids
    # last val_fraction of the characters is val, as in nanoGPT
    n = int(len(text) * (1 - val_fraction))
    progress, counts = Progress("tokenizing", len(text), "chars"), []
    with staged_bins(out_dir) as files:
        for f, part in zip(files, (text[:n], text[n:])):
            counts.append(0)
            for chunk in text_chunks(part):
                ids = to_uint16(encode(chunk))
                f.write(ids.tobytes())
                counts[-1] += len(ids)
                progress.update(len(chunk))
    progress.close()
    # record repo files by their portable, repo-relative path
    full, root = path.resolve(), ROOT.resolve()
    source = full.relative_to(root) if full.is_relative_to(root) else full
    meta.update(train_tokens=counts[0], val_tokens=counts[1], source=str(source), source_sha256=sha,
                val_fraction=val_fraction, dtype="uint16")
    write_meta(out_dir, meta)

# -----------------------------------------------------------------------------
# FineWeb-Edu

class DownloadError(Exception):
    pass

def encode_document(doc):
    # runs in the worker processes; the doc's hash lets the parent fingerprint the source it used
    return (to_uint16([EOT] + gpt2_encoding().encode_ordinary(doc)),
            hashlib.sha256(doc.encode()).digest())

def encode_batch(docs, tokenizer="gpt2"):
    """encode_document over a batch of documents, as one array: one message per batch to and from a
    worker process, so that the parent, which feeds them all, is not the bottleneck of many
    cores."""
    if tokenizer == "byte":
        return encode_bytes_batch(docs)
    encoded = [encode_document(d) for d in docs]
    return (np.concatenate([ids for ids, _ in encoded]), np.array([len(ids) for ids, _ in encoded]),
            b"".join(sha for _, sha in encoded))

def encode_bytes_batch(docs):
    """encode_batch for the byte tokenizer: BYTE_EOT, then the UTF-8 bytes, for each document;
    the whole batch through numpy at once: a Python int per byte would be the bottleneck."""
    raw = [d.encode("utf-8") for d in docs]
    lengths = np.array([len(b) for b in raw], dtype=np.int64)
    ids = np.frombuffer(b"".join(raw), dtype=np.uint8).astype(np.uint16)
    starts = np.cumsum(lengths) - lengths
    ids = np.insert(ids, starts, BYTE_EOT)   # before each document's first byte
    return ids, lengths + 1, b"".join(hashlib.sha256(b).digest() for b in raw)

def batches(docs, chars=1 << 20):
    """Lists of consecutive documents of about `chars` characters in all; a document that is not
    text (a null, missing or numeric field of a row) stops the run here, in the parent, as one
    sentence."""
    batch, n = [], 0
    for i, doc in enumerate(docs):
        # raised in the pool's feeder thread: it comes back as a DownloadError
        if not isinstance(doc, str):
            raise DownloadError(f"error: document {i:,} of the source is {type(doc).__name__} "
                                f"{str(doc)[:40]!r}, not text (a null, missing or numeric field in "
                                "a row?): fix or drop that row (nothing was written)")
        batch.append(doc)
        n += len(doc)
        if n >= chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch

def write_documents(docs, out_dir, num_tokens, val_tokens, name="fineweb_edu", source="documents",
                    processes=None, extra_meta=None, tokenizer="gpt2"):
    """Tokenize docs in parallel, <|endoftext|> before each (tokenizer 'gpt2'; 'byte': id 256):
    the first val_tokens go to val.bin, the next ones to train.bin, until num_tokens in all
    (or the docs run out)."""
    if tokenizer not in ("gpt2", "byte"):
        raise ValueError(f"write_documents tokenizes with 'gpt2' or 'byte', not {tokenizer!r}")
    out_dir = Path(out_dir)
    if not 0 < val_tokens < num_tokens:
        raise SystemExit(f"error: need 0 < val_tokens < num_tokens, got {val_tokens} and "
                         f"{num_tokens}")
    fingerprint, written = hashlib.sha256(), 0
    progress = Progress("tokenizing", num_tokens, "tokens")
    with staged_bins(out_dir) as (train_f, val_f), mp.Pool(processes) as pool:
        encode = functools.partial(encode_batch, tokenizer=tokenizer)   # picklable for the workers
        for ids, lengths, doc_shas in pool.imap(encode, batches(docs)):
            ids = ids[:num_tokens - written]
            # documents that start within the budget
            used = int(np.sum(np.cumsum(lengths) - lengths < len(ids)))
            # the same digest as one update per document used
            fingerprint.update(doc_shas[:32 * used])
            n_val = min(len(ids), max(val_tokens - written, 0))
            val_f.write(ids[:n_val].tobytes())
            train_f.write(ids[n_val:].tobytes())
            written += len(ids)
            progress.update(len(ids))
            if written >= num_tokens:
                break  # leaving the Pool block terminates the workers
        progress.close()
        if written <= val_tokens:
            raise SystemExit(f"error: the documents hold only {written:,} tokens, not more than "
                             f"val_tokens={val_tokens:,}")
    if written < num_tokens:
        print(f"note: the documents ran out at {written:,} of the {num_tokens:,} tokens asked for")
    vocab_size = BYTE_VOCAB if tokenizer == "byte" else EOT + 1
    write_meta(out_dir, {"name": name, "tokenizer": tokenizer, "vocab_size": vocab_size,
                         "train_tokens": written - val_tokens,
                         "val_tokens": val_tokens, "num_tokens": num_tokens, "source": source,
                         "source_sha256": fingerprint.hexdigest(), "dtype": "uint16",
                         **(extra_meta or {})})

def download_error(e):
    msg = (str(e).splitlines() or [""])[0]
    return (f"error: could not download FineWeb-Edu (no network?): {type(e).__name__}: {msg}; "
            "offline, prepare local shards with `--data_files 'DIR/*.parquet'` (or a text file "
            "with `python prepare_data.py text --input FILE --name NAME`)")

def import_datasets():
    # the Hub's retry warnings would come before our one sentence
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    try:
        import datasets
    except ImportError:
        raise SystemExit("error: FineWeb-Edu needs the optional `datasets` package: "
                         "pip install datasets") from None
    return datasets

def fineweb_docs():
    datasets = import_datasets()
    def texts():
        # runs lazily in the pool's feeder thread (after the workers forked): errors come back
        # through the pool, so they travel as a plain, picklable DownloadError
        try:
            for row in datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                             split="train", streaming=True):
                yield row["text"]
        except Exception as e:
            raise DownloadError(download_error(e)) from None
    return texts()

LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".jsonl.gz": "json",
                 ".json.gz": "json"}

def local_files(pattern):
    """The sorted files a --data_files glob names, and the `datasets` builder that reads them."""
    files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(p))
    if not files:
        raise SystemExit(f"error: --data_files {pattern!r} matches no file: give a glob of local "
                         ".parquet or .jsonl files, quoted so that the shell does not expand it")
    kinds = {next((k for e, k in LOCAL_FORMATS.items() if f.endswith(e)), None) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise SystemExit(f"error: --data_files {pattern!r} matches {len(files)} files that are not "
                         f"all .parquet or all .jsonl (e.g. {files[0]}): give a glob of one format")
    return files, kinds.pop()

def local_docs(files, builder, text_field="text"):
    # local files never need the network: offline mode, so that a compute node without internet
    # fails fast instead of waiting on timeouts (only effective if `datasets` is not imported yet)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    datasets = import_datasets()
    def texts():
        # streaming: read shard by shard, no Arrow copy of the whole set in the cache; in batches of
        # rows, which reads ~25x faster than row by row (the parent must feed all the tokenizer
        # processes)
        try:
            stream = datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
            for batch in stream.iter(batch_size=1024):
                yield from batch[text_field]
        except KeyError:
            raise DownloadError(f"error: the rows of {files[0]} have no {text_field!r} field: name "
                                "the text column with --text_field") from None
        except Exception as e:
            msg = (str(e).splitlines() or [""])[0]
            raise DownloadError(f"error: could not read the local files ({files[0]}...): "
                                f"{type(e).__name__}: {msg}") from None
    return texts()

def prepare_fineweb(out_dir, name, num_tokens, val_tokens=None, processes=None, data_files=None,
                    text_field="text", tokenizer="gpt2"):
    out_dir, val_tokens = Path(out_dir), val_tokens or max(1, num_tokens // 200)
    # the recipe names every file with its size, so a changed shard set is prepared again
    if data_files:
        files, builder = local_files(data_files)
        source = f"local {builder} files: {data_files}"
        recipe = {"source": source,
                  "files": [[os.path.abspath(f), os.path.getsize(f)] for f in files]}
        docs = lambda: local_docs(files, builder, text_field)
    else:
        source, recipe, docs = FINEWEB, {"source": FINEWEB}, fineweb_docs
    # the tokenizer is in the recipe: a gpt2 set is never taken for a byte one (nor the reverse)
    if is_prepared(out_dir, {**recipe, "tokenizer": tokenizer, "num_tokens": num_tokens,
                             "val_tokens": val_tokens}):
        print(f"already prepared: {out_dir}")
        return
    try:
        write_documents(docs(), out_dir, num_tokens, val_tokens, name, source, processes,
                        extra_meta=recipe, tokenizer=tokenizer)
    except DownloadError as e:
        raise SystemExit(str(e)) from None

# -----------------------------------------------------------------------------

def dataset_name(name):
    """--name: the folder under data/ that train.py's --dataset names (dataset.DATASET)."""
    if DATASET.fullmatch(name) is None:
        raise argparse.ArgumentTypeError(f"{name!r} is not one folder name "
                                         "(letters, digits, _ . -; no '/' or '..')")
    return name

def count(text):
    """A whole number >= 1, also written as 1e9: --num_tokens, --val_tokens, --num_proc."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(value)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for cmd, what in [("shakespeare_char", "Tiny Shakespeare, one token per character"),
                      ("shakespeare", "Tiny Shakespeare, GPT-2 BPE"),
                      ("text", "a local UTF-8 text file")]:
        s = sub.add_parser(cmd, help=what)
        s.add_argument("--out_dir", help="default: data/<name>")
        s.add_argument("--val_fraction", type=float, default=0.1,
                       help="last part of the text kept for val")
    sub.choices["text"].add_argument("--input", required=True)
    sub.choices["text"].add_argument("--name", required=True, type=dataset_name)
    text = sub.choices["text"]
    text.add_argument("--tokenizer", choices=["gpt2", "char", "byte"], default="gpt2",
                      help="byte: UTF-8 bytes, vocab 257")
    f = sub.add_parser("fineweb_edu",
                       help="a FineWeb-Edu sample (needs `datasets`; network unless --data_files)")
    f.add_argument("--data_files",
                   help="a glob of local .parquet or .jsonl files (quoted) instead of the hub")
    f.add_argument("--text_field", default="text",
                   help="the column of the documents' text (with --data_files)")
    f.add_argument("--num_tokens", type=count, default=10**9, help="train + val tokens")
    f.add_argument("--val_tokens", type=count, help="first tokens kept for val (default 0.5%%)")
    f.add_argument("--name", default="fineweb_edu", type=dataset_name)
    f.add_argument("--tokenizer", choices=["gpt2", "byte"], default="gpt2",
                   help="byte: UTF-8 bytes, vocab 257, id 256 before each document")
    f.add_argument("--out_dir", help="default: data/<name>")
    f.add_argument("--num_proc", "--processes", dest="processes", type=count,
                   help="tokenizer processes (default: all cores)")
    args = p.parse_args(argv)

    name = getattr(args, "name", None) or args.command
    out_dir = Path(args.out_dir) if args.out_dir else dataset_dir(name)   # where train.py looks
    if out_dir.exists() and not out_dir.is_dir():
        raise SystemExit(f"error: --out_dir {out_dir} is a file, not a folder: "
                         "pick another --out_dir")
    try:
        if args.command == "fineweb_edu":
            prepare_fineweb(out_dir, name, args.num_tokens, args.val_tokens, args.processes,
                            args.data_files, args.text_field, args.tokenizer)
        elif args.command == "text":
            prepare_text(args.input, out_dir, name, args.tokenizer, args.val_fraction)
        else:
            tokenizer = "char" if args.command == "shakespeare_char" else "gpt2"
            prepare_text(SHAKESPEARE, out_dir, name, tokenizer, args.val_fraction,
                         SHAKESPEARE_SHA256)
    # a full disk, a read-only folder: the .tmp files are gone, an earlier complete set stays
    except OSError as e:
        why = ("the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT)
               else (e.strerror or str(e)))
        raise SystemExit(f"error: cannot write {e.filename or out_dir} ({why}): fix that and run "
                         f"again ({out_dir} keeps its earlier set, if it had one)") from None

if __name__ == "__main__":
    main()
