import errno
import hashlib
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import prepare_data
import dataset

EOT = 50256
TEXT = ("First Citizen:\nBefore we proceed, hear me speak.\n\nAll:\n"
        "Speak, speak. Ünïcödé — 你好 🙂\r\n\ttabs\n") * 20


def error_of(excinfo):
    """The message a SystemExit prints: one line starting with 'error:'."""
    msg = str(excinfo.value.code)
    assert msg.startswith("error:") and "\n" not in msg, msg
    return msg


def read_set(d):
    meta = json.loads((d / "meta.json").read_text())
    train, val = (np.fromfile(d / f"{s}.bin", dtype=np.uint16) for s in ("train", "val"))
    return meta, train, val


def prepare(tmp_path, text, tokenizer="char", *extra):
    src = tmp_path / "input.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    prepare_data.main(["text", "--input", str(src), "--name", "tiny", "--tokenizer", tokenizer,
                       "--out_dir", str(out), *extra])
    return out


def snapshot(d):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.iterdir())}


# --- tokenizers ----------------------------------------------------------------

def test_gpt2_matches_gpt2():
    assert dataset.gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]
    encode, _ = dataset.get_tokenizer({"tokenizer": "gpt2"})
    assert encode("Hello world") == [15496, 995]
    assert dataset.gpt2_encoding().n_vocab == 50257


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_roundtrip(tokenizer):
    meta = {"tokenizer": tokenizer, "chars": "".join(sorted(set(TEXT)))}
    encode, decode = dataset.get_tokenizer(meta)
    ids = encode(TEXT)
    assert decode(ids) == TEXT
    assert len(ids) < len(TEXT) if tokenizer == "gpt2" else len(ids) == len(TEXT)


def test_byte_roundtrip_on_non_ascii_text():
    encode, decode = dataset.get_tokenizer({"tokenizer": "byte", "vocab_size": 257})
    ids = encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and len(ids) > len(TEXT)   # multi-byte characters
    assert max(ids) > 127 and decode(ids) == TEXT
    assert decode([256] + ids[:20] + [256]) == TEXT[:20]   # the end-of-text id decodes to nothing
    assert decode(list("é".encode())[:1]) == "\ufffd"   # a cut character: replaced, not an error


def test_char_encode_unknown_character():
    encode, _ = dataset.get_tokenizer({"tokenizer": "char", "chars": "ab"})
    with pytest.raises(ValueError, match="'z'"):
        encode("abz")


def test_gpt2_ranks_wrong_hash_or_missing(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    data = bytearray(dataset.GPT2_RANKS.read_bytes())
    data[100] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as e:
        dataset.gpt2_encoding(bad)
    assert str(bad) in error_of(e) and "sha256" in error_of(e)
    with pytest.raises(SystemExit) as e:
        dataset.gpt2_encoding(tmp_path / "gone.tiktoken")
    assert "gone.tiktoken" in error_of(e) and "missing" in error_of(e)


def test_load_meta_missing_names_the_command(tmp_path):
    with pytest.raises(SystemExit) as e:
        dataset.load_meta(tmp_path / "shakespeare_char")
    assert "python prepare_data.py shakespeare_char" in error_of(e)
    with pytest.raises(SystemExit) as e:
        dataset.load_meta(tmp_path / "mybook")
    assert "text --input FILE --name mybook" in error_of(e)


def test_chunked_gpt2_encoding_equals_whole():
    # Shakespeare plus random runs of newlines and spaces, where a careless cut would change the
    # tokens
    rng = random.Random(0)
    noise = "".join(rng.choice(["word", "x.", " ", "  ", "\n", "\n\n", "\t", "Ü"])
                    for _ in range(40_000))
    text = prepare_data.SHAKESPEARE.read_text()[:200_000] + noise
    chunks = list(prepare_data.text_chunks(text, size=5_000))
    assert len(chunks) > 50 and "".join(chunks) == text
    enc = dataset.gpt2_encoding()
    assert [t for c in chunks for t in enc.encode_ordinary(c)] == enc.encode_ordinary(text)


def test_uint16_overflow_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        prepare_data.to_uint16([1, 65536])
    assert "uint16" in error_of(e)
    huge = "".join(chr(c) for c in range(0x10000, 0x10000 + 70_000))  # 70k distinct characters
    with pytest.raises(SystemExit) as e:
        prepare(tmp_path, huge, "char")
    assert "uint16" in error_of(e)
    assert not (tmp_path / "out" / "train.bin").exists()


# --- text sub-command ----------------------------------------------------------

@pytest.mark.parametrize("tokenizer", ["char", "gpt2", "byte"])
def test_text_bins_decode_to_train_and_val_text(tmp_path, tokenizer):
    out = prepare(tmp_path, TEXT, tokenizer)
    meta, train, val = read_set(out)
    _, decode = dataset.get_tokenizer(meta)
    n = int(len(TEXT) * 0.9)
    assert decode(train.tolist()) == TEXT[:n] and decode(val.tolist()) == TEXT[n:]
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    assert meta["vocab_size"] == {"char": len(set(TEXT)), "gpt2": 50257, "byte": 257}[tokenizer]
    if tokenizer == "byte":   # one id per UTF-8 byte, no end-of-text in a single text
        assert train.tolist() + val.tolist() == list(TEXT[:n].encode()) + list(TEXT[n:].encode())
    assert meta["tokenizer"] == tokenizer and meta["dtype"] == "uint16" and meta["name"] == "tiny"
    assert len(meta["source_sha256"]) == 64
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_rerun_is_idempotent_and_source_change_rebuilds(tmp_path, capsys):
    out = prepare(tmp_path, TEXT)
    before = snapshot(out)
    capsys.readouterr()
    prepare(tmp_path, TEXT)
    assert "already prepared" in capsys.readouterr().out
    assert snapshot(out) == before
    prepare(tmp_path, TEXT + "one more line\n")
    assert "already prepared" not in capsys.readouterr().out
    meta, train, val = read_set(out)
    assert (meta["train_tokens"] + meta["val_tokens"] == len(TEXT) + len("one more line\n")
            == len(train) + len(val))
    # new split: rebuild too
    prepare(tmp_path, TEXT + "one more line\n", "char", "--val_fraction", "0.2")
    total = len(TEXT) + len("one more line\n")
    assert read_set(out)[0]["val_tokens"] == total - int(total * 0.8) == len(read_set(out)[2])
    (out / "val.bin").write_bytes(b"")  # a damaged set is rebuilt, not trusted
    prepare(tmp_path, TEXT + "one more line\n", "char", "--val_fraction", "0.2")
    assert ("already prepared" not in capsys.readouterr().out
            and (out / "val.bin").stat().st_size > 0)


def test_failure_midway_leaves_no_partial_files(tmp_path, monkeypatch):
    out = prepare(tmp_path, TEXT)
    before = snapshot(out)
    real = prepare_data.get_tokenizer

    def failing_tokenizer(meta):
        encode, decode = real(meta)
        calls = []

        def encode_then_fail(s):
            calls.append(s)
            if len(calls) == 2:  # train.bin.tmp is complete, val fails
                raise RuntimeError("boom")
            return encode(s)
        return encode_then_fail, decode

    monkeypatch.setattr(prepare_data, "get_tokenizer", failing_tokenizer)
    with pytest.raises(RuntimeError, match="boom"):
        prepare(tmp_path, TEXT + "changed\n")
    assert snapshot(out) == before  # the earlier complete set is intact, no .tmp left behind
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError, match="boom"):
        prepare_data.prepare_text(tmp_path / "input.txt", fresh, "fresh", "char")
    assert list(fresh.iterdir()) == []


def test_crash_before_meta_never_pairs_old_meta_with_new_bins(tmp_path, monkeypatch):
    out = prepare(tmp_path, TEXT)
    other = TEXT.replace("speak", "SPEAK")  # same length, so same .bin sizes

    def crash(*args):
        raise KeyboardInterrupt
    # dies after the new bins got their names
    monkeypatch.setattr(prepare_data, "write_meta", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path, other)
    monkeypatch.undo()
    assert not (out / "meta.json").exists()  # the set is marked incomplete
    prepare(tmp_path, TEXT)  # so this rebuilds instead of trusting sizes
    meta, train, val = read_set(out)
    assert dataset.get_tokenizer(meta)[1](train.tolist() + val.tolist()) == TEXT


def test_shakespeare_char(tmp_path):
    prepare_data.main(["shakespeare_char", "--out_dir", str(tmp_path / "sc")])
    meta, train, val = read_set(tmp_path / "sc")
    assert meta["vocab_size"] == 65 and len(meta["chars"]) == 65
    assert (len(train), len(val)) == (1_003_854, 111_540)  # nanoGPT's numbers
    assert meta["source_sha256"] == prepare_data.SHAKESPEARE_SHA256


def test_shakespeare_wrong_hash(tmp_path, monkeypatch):
    bad = tmp_path / "tinyshakespeare.txt"
    bad.write_text(prepare_data.SHAKESPEARE.read_text().replace("Citizen", "Citizan", 1))
    monkeypatch.setattr(prepare_data, "SHAKESPEARE", bad)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["shakespeare_char", "--out_dir", str(tmp_path / "sc")])
    assert "sha256" in error_of(e) and str(bad) in error_of(e)
    assert not (tmp_path / "sc").exists()


# --- FineWeb-Edu -----------------------------------------------------------------

DOCS = ["doc one", "the second document, a bit longer", "doc three\nwith a newline", "four"] * 5


def stream_of(docs):
    enc = dataset.gpt2_encoding()
    return [t for d in docs for t in [EOT] + enc.encode_ordinary(d)]


def test_write_documents_eot_budget_and_split(tmp_path):
    stream = stream_of(DOCS)
    prepare_data.write_documents(iter(DOCS), tmp_path / "all", num_tokens=10**6, val_tokens=9,
                                 processes=2)
    meta, train, val = read_set(tmp_path / "all")
    assert val.tolist() + train.tolist() == stream  # EOT before each document
    assert len(val) == meta["val_tokens"] == 9 and meta["train_tokens"] == len(stream) - 9
    fingerprint = hashlib.sha256(b"".join(hashlib.sha256(d.encode()).digest() for d in DOCS))
    assert meta["source_sha256"] == fingerprint.hexdigest()  # which documents were used, in order
    budget = len(stream) // 2 + 1
    prepare_data.write_documents(DOCS, tmp_path / "half", num_tokens=budget, val_tokens=5,
                                 processes=2)
    meta, train, val = read_set(tmp_path / "half")
    assert val.tolist() + train.tolist() == stream[:budget]
    assert (len(val), len(train)) == (5, budget - 5) == (meta["val_tokens"], meta["train_tokens"])
    starts = np.cumsum([0] + [len(stream_of([d])) for d in DOCS])[:-1]
    # a cut document counts, later ones do not
    used = [d for d, start in zip(DOCS, starts) if start < budget]
    assert 0 < len(used) < len(DOCS)
    assert meta["source_sha256"] == hashlib.sha256(
        b"".join(hashlib.sha256(d.encode()).digest() for d in used)).hexdigest()
    assert meta["vocab_size"] == 50257 and meta["tokenizer"] == "gpt2"


def test_write_documents_byte_puts_256_before_each_document(tmp_path):
    docs = DOCS + ["Ünïcödé — 你好 🙂"]
    stream = [t for d in docs for t in [256] + list(d.encode("utf-8"))]
    prepare_data.write_documents(iter(docs), tmp_path / "b", num_tokens=10**6, val_tokens=9,
                                 processes=2, tokenizer="byte")
    meta, train, val = read_set(tmp_path / "b")
    assert val.tolist() + train.tolist() == stream
    assert (meta["tokenizer"], meta["vocab_size"]) == ("byte", 257)
    fingerprint = hashlib.sha256(b"".join(hashlib.sha256(d.encode()).digest() for d in docs))
    # the same fingerprint as the gpt2 path's
    assert meta["source_sha256"] == fingerprint.hexdigest()


def test_write_documents_too_few_tokens(tmp_path):
    with pytest.raises(SystemExit) as e:
        prepare_data.write_documents(["tiny"], tmp_path / "o", num_tokens=100, val_tokens=50,
                                     processes=1)
    assert "val_tokens" in error_of(e)
    assert list((tmp_path / "o").iterdir()) == []


def test_fineweb_without_datasets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--num_tokens", "1000", "--out_dir",
                           str(tmp_path / "fw")])
    assert "pip install datasets" in error_of(e)
    assert not (tmp_path / "fw").exists()


def test_fineweb_error_is_one_line_without_traceback(tmp_path):
    code = ("import sys; sys.modules['datasets'] = None; import prepare_data; "
            "prepare_data.main(['fineweb_edu', '--num_tokens', '1000', '--out_dir', "
            f"{str(tmp_path / 'fw')!r}])")
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(prepare_data.__file__).parent,
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    assert (r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
            and "pip install datasets" in r.stderr)


def fake_datasets(load_dataset):
    return types.SimpleNamespace(load_dataset=load_dataset)


@pytest.mark.parametrize("tokenizer", ["gpt2", "byte"])
def test_fineweb_download_failure(tmp_path, monkeypatch, tokenizer):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach huggingface.co\nmore detail")
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(offline))
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--num_tokens", "1000", "--processes", "1",
                           "--tokenizer", tokenizer, "--out_dir", str(tmp_path / "fw")])
    assert "could not download FineWeb-Edu" in error_of(e) and "prepare_data.py text" in error_of(e)
    assert list((tmp_path / "fw").iterdir()) == []


def test_fineweb_with_a_local_stand_in(tmp_path, monkeypatch, capsys):
    def load_dataset(path, name, split, streaming):
        assert (path, name, streaming) == ("HuggingFaceFW/fineweb-edu", "sample-10BT", True)
        return iter({"text": d} for d in DOCS)
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(load_dataset))
    args = ["fineweb_edu", "--num_tokens", "60", "--val_tokens", "10", "--processes", "2",
            "--out_dir", str(tmp_path / "fw")]
    prepare_data.main(args)
    meta, train, val = read_set(tmp_path / "fw")
    assert val.tolist() + train.tolist() == stream_of(DOCS)[:60] and len(val) == 10
    monkeypatch.setitem(sys.modules, "datasets", None)  # a complete set needs no download
    capsys.readouterr()
    prepare_data.main(args)
    assert "already prepared" in capsys.readouterr().out


# --- FineWeb-Edu from local shards (offline, through `datasets`) ---------------------------------

def write_shards(tmp_path, fmt, docs, n_shards=2):
    """docs split over n_shards files shard_0.fmt, shard_1.fmt... with an extra column, as
    FineWeb-Edu's."""
    d = tmp_path / "shards"
    d.mkdir(exist_ok=True)
    per = -(-len(docs) // n_shards)
    for k in range(n_shards):
        part = docs[k * per:(k + 1) * per]
        path = d / f"shard_{k}.{fmt}"
        if fmt == "parquet":
            pa = pytest.importorskip("pyarrow")
            import pyarrow.parquet as pq
            pq.write_table(pa.table({"id": [f"{k}-{i}" for i in range(len(part))], "text": part}),
                           path)
        else:
            path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                    for i, t in enumerate(part)))
    return d


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_fineweb_from_local_shards_offline_decodes_to_the_documents(
        tmp_path, monkeypatch, capsys, fmt):
    pytest.importorskip("datasets")
    docs = [f"Document {i}: " + TEXT[i * 7:i * 7 + 50 + i] for i in range(40)]
    shards = write_shards(tmp_path, fmt, docs)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "fw"
    args = ["fineweb_edu", "--data_files", str(shards / f"*.{fmt}"), "--num_tokens", "1e6",
            "--val_tokens", "100", "--num_proc", "2", "--out_dir", str(out)]
    prepare_data.main(args)
    meta, train, val = read_set(out)
    _, decode = dataset.get_tokenizer(meta)
    # shards in order
    assert decode(val.tolist() + train.tolist()) == "".join("<|endoftext|>" + d for d in docs)
    assert len(val) == meta["val_tokens"] == 100 and meta["train_tokens"] == len(train)
    assert meta["source"] == (
        f"local {'parquet' if fmt == 'parquet' else 'json'} files: {shards}/*.{fmt}")
    capsys.readouterr()
    prepare_data.main(args)
    assert "already prepared" in capsys.readouterr().out
    # shard_0 changed: prepared again, with the budget
    write_shards(tmp_path, fmt, docs[:10], n_shards=1)
    prepare_data.main([*args[:4], "300", *args[5:]])
    meta, train, val = read_set(out)
    assert val.tolist() + train.tolist() == stream_of(docs[:10])[:300]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_fineweb_local_shards_byte_tokenizer(tmp_path, monkeypatch, capsys, fmt):
    pytest.importorskip("datasets")
    docs = [f"Document {i}: " + TEXT[i * 7:i * 7 + 50 + i] for i in range(40)]   # non-ASCII too
    shards = write_shards(tmp_path, fmt, docs)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "fw"
    args = ["fineweb_edu", "--data_files", str(shards / f"*.{fmt}"), "--num_tokens", "1e6",
            "--val_tokens", "100", "--num_proc", "2", "--out_dir", str(out)]
    prepare_data.main(args)   # gpt2 first: its folder must not be reused for the byte request
    capsys.readouterr()
    prepare_data.main([*args, "--tokenizer", "byte"])
    assert "already prepared" not in capsys.readouterr().out
    meta, train, val = read_set(out)
    assert (meta["tokenizer"], meta["vocab_size"]) == ("byte", 257)
    ids = val.tolist() + train.tolist()
    assert ids == [t for d in docs for t in [256] + list(d.encode("utf-8"))]   # shards in order
    assert dataset.get_tokenizer(dataset.load_meta(out))[1](ids) == "".join(docs)
    assert len(val) == meta["val_tokens"] == 100 and meta["train_tokens"] == len(train)
    prepare_data.main([*args, "--tokenizer", "byte"])
    assert "already prepared" in capsys.readouterr().out
    prepare_data.main(args)   # and back: the byte set is not taken for a gpt2 one
    assert ("already prepared" not in capsys.readouterr().out
            and read_set(out)[0]["tokenizer"] == "gpt2")


def test_fineweb_local_shards_errors_are_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--data_files", str(tmp_path / "none" / "*.parquet"),
                           "--out_dir", str(tmp_path / "fw")])
    assert "matches no file" in error_of(e) and "--data_files" in error_of(e)
    (tmp_path / "a.parquet").write_bytes(b"x")
    (tmp_path / "b.txt").write_text("x")
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--data_files", str(tmp_path / "*"), "--out_dir",
                           str(tmp_path / "fw")])
    assert "not all .parquet or all .jsonl" in error_of(e)
    pytest.importorskip("datasets")
    (tmp_path / "b.txt").unlink()
    with pytest.raises(SystemExit) as e:   # not a parquet file: the reader's error, in one line
        prepare_data.main(["fineweb_edu", "--data_files", str(tmp_path / "*.parquet"),
                           "--num_proc", "1", "--out_dir", str(tmp_path / "fw")])
    assert "could not read the local files" in error_of(e)
    assert not (tmp_path / "fw" / "meta.json").exists()
    write_shards(tmp_path, "jsonl", ["a doc"], n_shards=1)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--data_files", str(tmp_path / "shards" / "*.jsonl"),
                           "--text_field", "body", "--num_proc", "1", "--out_dir",
                           str(tmp_path / "fw")])
    assert "no 'body' field" in error_of(e) and "--text_field" in error_of(e)


@pytest.mark.parametrize("name", ["..", "a/b", "", ".hidden"])
def test_a_name_that_is_not_one_folder_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("some text to prepare, long enough for both splits " * 4)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["text", "--input", "in.txt", "--name", name])
    assert e.value.code == 2 and "is not one folder name" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


# --- the data folder and meta.json's values (issue 20, items 18 and 20) --------------------------

def test_a_dataset_is_prepared_where_train_py_looks_for_it(tmp_path, monkeypatch):
    """One rule for every tool: data/<name> under the working directory, wherever the scripts
    live."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("some text to prepare, long enough for both splits " * 4)
    prepare_data.main(["text", "--input", "in.txt", "--name", "here", "--tokenizer", "char"])
    assert (tmp_path / "data" / "here" / "meta.json").is_file()
    assert dataset.load_meta(dataset.dataset_dir("here"))["tokenizer"] == "char"
    with pytest.raises(SystemExit) as e:   # and the error for a missing one names that folder
        dataset.load_meta(dataset.dataset_dir("elsewhere"))
    assert f"working directory, {tmp_path}" in error_of(e)


@pytest.mark.parametrize("change,words", [
    ({"vocab_size": "65"}, "has vocab_size='65', not a whole number from 1 to 65536"),
    ({"vocab_size": True}, "has vocab_size=True"),
    ({"vocab_size": 70000}, "not a whole number from 1 to 65536"),
    ({"chars": None},
     "has no 'chars' string of vocab_size=3 distinct characters (chars: NoneType)"),
    ({"chars": "abcd"}, "(chars: str of 4)"),
    ({"chars": "aab"}, "distinct characters"),
    ({"tokenizer": "bpe"}, "names tokenizer 'bpe', not 'char', 'gpt2' or 'byte'"),
    ({"tokenizer": "gpt2"}, "has vocab_size=3 for GPT-2's BPE, which has 50257"),
    ({"tokenizer": "byte", "vocab_size": 50257},
     "has vocab_size=50257 for the byte tokenizer, which has 257"),
    # issue 31.7: passed the check, then crashed sample.py once that token was sampled
    ({"chars": "a\ud800b"},
     "has a lone surrogate (U+D800, half of a UTF-16 pair, not a character) at index 1 of 'chars'"),
])
def test_meta_json_values_are_checked_in_one_sentence(tmp_path, change, words):
    meta = {"tokenizer": "char", "vocab_size": 3, "chars": "abc", **change}
    (tmp_path / "meta.json").write_text(json.dumps({k: v for k, v in meta.items()
                                                    if v is not None}))
    with pytest.raises(SystemExit) as e:
        dataset.load_meta(tmp_path)
    msg = error_of(e)
    assert (msg.startswith(f"error: {tmp_path / 'meta.json'} ") and words in msg
            and msg.endswith(": prepare the dataset again"))


def test_a_dataset_name_longer_than_a_folder_name_is_one_sentence(tmp_path, monkeypatch):
    """Issue 31.8: a 300-character --dataset was an OSError traceback (File name too long), in
    every tool that looks for data/<name>; the limit is the filesystem's NAME_MAX, in bytes."""
    monkeypatch.chdir(tmp_path)
    assert dataset.dataset_dir("a" * 255) == Path("data") / ("a" * 255)
    for name, size in (("a" * 256, 256), ("é" * 128, 256)):   # é: 2 bytes in UTF-8
        with pytest.raises(SystemExit) as e:
            dataset.load_meta(dataset.dataset_dir(name))
        assert f"is {size} bytes long, and a folder's name is at most 255" in error_of(e)
    (tmp_path / "in.txt").write_text("some text to prepare, long enough for both splits " * 4)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["text", "--input", "in.txt", "--name", "a" * 300])
    assert "is 300 bytes long" in error_of(e) and sorted(os.listdir(tmp_path)) == ["in.txt"]


# --- bad sources and a full disk: one sentence, nothing replaced (issue 20, item 17) -------------

@pytest.mark.parametrize("arg", [["--num_tokens", "inf"], ["--num_tokens", "nan"],
                                 ["--num_tokens", "0"], ["--val_tokens", "1.5"],
                                 ["--num_proc", "0"], ["--num_proc", "x"]])
def test_bad_counts_are_one_argparse_line(tmp_path, capsys, arg):
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", *arg, "--out_dir", str(tmp_path / "fw")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "fineweb_edu: error: argument" in err and f"{arg[1]!r}" in err, err
    assert not (tmp_path / "fw").exists()


@pytest.mark.parametrize("rows,what", [([{"text": "a doc"}, {"text": None}], "NoneType"),
                                       # a row without the field
                                       ([{"text": "a doc"}, {"id": 2}], "NoneType"),
                                       ([{"text": 7}], "int")])
def test_a_row_without_text_is_one_sentence(tmp_path, rows, what):
    pytest.importorskip("datasets")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["fineweb_edu", "--data_files", str(tmp_path / "shards" / "*.jsonl"),
                           "--num_proc", "1", "--num_tokens", "1000", "--out_dir",
                           str(tmp_path / "fw")])
    assert (f"is {what}" in error_of(e) and "not text" in error_of(e)
            and "fix or drop that row" in error_of(e))
    assert not (tmp_path / "fw" / "meta.json").exists()


def test_a_full_disk_is_one_sentence_and_keeps_the_earlier_set(tmp_path, monkeypatch):
    out = prepare(tmp_path, TEXT, "char")
    before = snapshot(out)

    class FullDisk:
        def __init__(self, path, mode="r", *args, **kw):
            self.f = open(path, mode, *args, **kw)
        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.f.name))
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.f.close()
    (tmp_path / "input.txt").write_text(TEXT + "more text ")   # another source: prepared again
    monkeypatch.setattr(prepare_data, "open", FullDisk, raising=False)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["text", "--input", str(tmp_path / "input.txt"), "--name", "tiny",
                           "--tokenizer", "char", "--out_dir", str(out)])
    assert ("train.bin.tmp" in error_of(e) and "(the disk is full)" in error_of(e)
            and "keeps its earlier set" in error_of(e))
    assert snapshot(out) == before
