"""
The tokenizers of the prepared datasets (dataset.py's meta.json names one): GPT-2's BPE, from the
ranks vendored in data/raw (tiktoken, offline), characters (the set's own) and UTF-8 bytes.
prepare_data.py encodes with them; sample.py and tools/export_hf.py decode.
"""
import base64
import functools
import hashlib
from pathlib import Path

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
