"""The prepared datasets, as every tool reads them (prepare_data.py writes them): data/NAME under
the working directory, as in nanoGPT, holds meta.json (the tokenizer) and train.bin and val.bin,
uint16 token ids. Bad input is one sentence (SystemExit) naming the file and what to do."""
import base64
import functools
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import tiktoken

ROOT = Path(__file__).parent
GPT2_RANKS = ROOT / "data/raw/gpt2.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256
# the byte-level tokenizer: ids 0..255 are the UTF-8 bytes, 256 the end-of-text token before each
# document (as EOT for GPT-2): a 257-row embedding, small enough for 0.1M-parameter models
BYTE_EOT = 256
BYTE_VOCAB = BYTE_EOT + 1
TOKENIZERS = ("char", "gpt2", "byte")
DATASET = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")   # one folder under data/: no "..", no "/"


def dataset_dir(name):
    """data/<name> under the working directory (the one rule of every tool); a name that is not one
    folder's is one sentence, not a path elsewhere or an OSError."""
    if DATASET.fullmatch(name) is None:   # ../../tmp/x would read /tmp/x/meta.json
        raise SystemExit(f"error: the dataset name {name[:40]!r} is not one folder name under "
                         "data/ (letters, digits, _ . -, not first a dot)")
    return Path("data") / name


@functools.lru_cache
def gpt2_encoding(path=GPT2_RANKS, sha256=GPT2_RANKS_SHA256):
    """GPT-2's BPE from the vendored ranks file (tiktoken.get_encoding would download it)."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: GPT-2 vocabulary file {path} is missing: restore it from git.")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"error: GPT-2 vocabulary file {path} has the wrong sha256 (damaged or "
                         "not GPT-2's ranks): restore it from git.")
    # parsed here, not by tiktoken.load.load_tiktoken_bpe: that one keeps a copy in /tmp keyed by
    # the path and serves it even after the file itself is gone or changed
    ranks = {base64.b64decode(tok): int(rank)
             for tok, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


def load_meta(data_dir):
    """data_dir/meta.json, its values checked (meta_problem)."""
    path = Path(data_dir) / "meta.json"
    if not os.path.isfile(path):   # any OSError too (a name too long): not prepared
        name = Path(data_dir).name
        cmd = (name if name in ("shakespeare_char", "shakespeare", "fineweb_edu")
               else f"text --input FILE --name {name}")
        raise SystemExit(f"error: no prepared data in {data_dir} (meta.json missing; data/ is "
                         f"looked up in the working directory, {Path.cwd()}): run "
                         f"`python prepare_data.py {cmd}` there first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:   # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise SystemExit(f"error: {path} is not valid JSON ({e}): "
                         "prepare the dataset again") from None
    if wrong := meta_problem(meta):
        raise SystemExit(f"error: {path} {wrong}: prepare the dataset again")
    return meta


def meta_problem(meta):
    """What is wrong with a meta.json or a run's vocabulary (words after its path), or None."""
    missing = [k for k in ("tokenizer", "vocab_size")
               if not isinstance(meta, dict) or k not in meta]
    if missing:
        return f"lacks {', '.join(missing)}"
    tokenizer, vocab_size = meta["tokenizer"], meta["vocab_size"]
    if tokenizer not in TOKENIZERS:
        return f"names tokenizer {tokenizer!r}, not 'char', 'gpt2' or 'byte'"
    if type(vocab_size) is not int or not 1 <= vocab_size <= 65536:   # uint16 ids
        return f"has vocab_size={vocab_size!r}, not a whole number from 1 to 65536"
    if tokenizer == "gpt2" and vocab_size != EOT + 1:
        return f"has vocab_size={vocab_size} for GPT-2's BPE, which has {EOT + 1}"
    if tokenizer == "byte" and vocab_size != BYTE_VOCAB:
        return f"has vocab_size={vocab_size} for the byte tokenizer, which has {BYTE_VOCAB}"
    chars = meta.get("chars")
    if tokenizer == "char" and not (isinstance(chars, str)
                                    and len(chars) == vocab_size == len(set(chars))):
        return (f"has no 'chars' string of vocab_size={vocab_size} distinct characters (chars: "
                f"{type(chars).__name__}{f' of {len(chars)}' if isinstance(chars, str) else ''})")
    # JSON's "\ud800" escape: half of a UTF-16 pair, no character; decoding that id would crash
    lone = next((i for i, c in enumerate(chars or "") if 0xD800 <= ord(c) <= 0xDFFF), None)
    if lone is not None:
        return (f"has a lone surrogate (U+{ord(chars[lone]):04X}, half of a UTF-16 pair, not a "
                f"character) at index {lone} of 'chars'")
    return None


def vocabulary(meta):
    """What a run's token ids mean, recorded in its checkpoints: a resume on other data is refused,
    sample.py and export_hf.py decode with the run's own vocabulary, not a later meta.json's."""
    return {"tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"],
            **({"chars": meta["chars"]} if meta["tokenizer"] == "char" else {})}


def get_tokenizer(meta):
    """(encode, decode) for the tokenizer of a checked meta.json (meta_problem). char: encode
    raises KeyError on a character outside the vocabulary. byte: decode drops the end-of-text id
    256 (a sample reads as the text itself) and turns a cut or invalid UTF-8 sequence into U+FFFD
    (a model may emit any byte sequence)."""
    if meta["tokenizer"] == "byte":
        return (lambda s: list(s.encode("utf-8")),
                lambda ids: bytes(i for i in ids if i < BYTE_EOT).decode("utf-8", errors="replace"))
    if meta["tokenizer"] == "gpt2":
        return gpt2_encoding().encode_ordinary, gpt2_encoding().decode
    chars = meta["chars"]
    stoi = {c: i for i, c in enumerate(chars)}
    return (lambda s: [stoi[c] for c in s]), (lambda ids: "".join(chars[i] for i in ids))


def decode_stream(decode, ids):
    """The text of token ids (a model's samples as they come) in pieces, one per id and a last one,
    whose concatenation is decode(all ids): what sample.py prints. A character cut by a token
    (a trailing U+FFFD) is held back until the next ids complete it; UTF-8 resyncs, so the text
    before it never changes, and after a whole character decoding starts afresh."""
    pending, shown = [], ""   # the ids since the text last ended on a whole character
    for i in ids:
        pending.append(i)
        text = decode(pending)
        whole = text.rstrip("\ufffd")
        yield whole[len(shown):]
        pending, shown = ([], "") if whole == text else (pending, whole)
    yield decode(pending)[len(shown):]


# ---- token files --------------------------------------------------------------------------------

def file_id(path):
    """(inode, size, mtime) of a file, or None: what tells that it is still the file checked."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class TokenFile:
    """One split, data/<name>/<split>.bin, checked when opened: it exists, holds more than
    block_size + 1 tokens (a val split too short would fail only at the first evaluation) and no
    id beyond the vocabulary. Read with pread, not a memmap: a file cut short under a running
    trainer is then a short read and one sentence, not SIGBUS. limit > 0: only its first `limit`
    tokens are read (train.py's train_tokens)."""

    def __init__(self, path, block_size, vocab_size, limit=0):
        self.path, self.block_size, self.vocab_size = str(path), block_size, vocab_size
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise SystemExit(f"error: {path} is {'empty' if os.path.isfile(path) else 'missing'}: "
                             "prepare the dataset again (python prepare_data.py ...)")
        self.id = file_id(path)
        if self.id[1] % 2:   # uint16 tokens: two bytes each
            raise SystemExit(f"error: {path} has an odd number of bytes ({self.id[1]:,}): it is "
                             "cut short or not uint16 tokens; prepare the dataset again")
        if limit > self.id[1] // 2:
            raise SystemExit(f"error: train_tokens={limit:,} but {path} has {self.id[1] // 2:,} "
                             "tokens: lower --train_tokens (0: all of them)")
        n = self.n = limit or self.id[1] // 2
        if n <= block_size + 1:
            raise SystemExit(f"error: {path} has {n} tokens, not more than block_size={block_size} "
                             "+ 1: lower --block_size or prepare more text")
        # every token of a split of up to 256M tokens (~0.5 s); of a larger one (FineWeb: 20 GB)
        # 16 spread-out slices of 4M, and rows() checks each batch as it is read
        chunk = 1 << 22
        starts = (range(0, n, chunk) if n <= 1 << 28
                  else np.linspace(0, n - chunk, 16).astype(np.int64))
        for i in starts:
            self.read([i], min(chunk, n - int(i)))

    def __len__(self):
        """The number of tokens; a file changed since it was checked is one sentence."""
        if file_id(self.path) != self.id:
            self.changed()
        return self.n

    def read(self, starts, n):
        """(len(starts), n) tokens as int64, a row of n from each start, their ids checked."""
        with open(self.path, "rb") as f:
            raw = [os.pread(f.fileno(), 2 * n, 2 * int(i)) for i in starts]
        if any(len(r) < 2 * n for r in raw):
            self.changed()
        ids = np.frombuffer(b"".join(raw), dtype=np.uint16).reshape(len(starts), n)
        self.check_ids(ids)
        return ids.astype(np.int64)

    def rows(self, starts):
        """A row of block_size + 1 tokens from each start: inputs and, shifted by one, targets."""
        return self.read(starts, self.block_size + 1)

    def check_ids(self, ids):
        if ids.size and ids.max() >= self.vocab_size:
            raise SystemExit(f"error: {self.path} holds token id {ids.max()}, beyond "
                             f"vocab_size={self.vocab_size} in meta.json: the data and its "
                             "meta.json disagree; prepare the dataset again")

    def changed(self):
        raise SystemExit(f"error: {self.path} changed under the running trainer (cut short, "
                         "replaced or removed): restore it as it was, then continue from the last "
                         "checkpoint with --init_from=resume")
