"""prepare_data.py, dataset.py: tokenizers, token files, each source, bad input (one sentence)."""
import errno
import io
import json
import os
import sys
from unittest import mock

import numpy as np
import pytest

import dataset
import prepare_data
import tokenizer as tok

TEXT = ("First Citizen:\nBefore we proceed, hear me speak.\n\nAll:\n"
        "Speak, speak. Ünïcödé — 你好 🙂\r\n\ttabs\n") * 20
TXT = ["text", "--input", "in.txt", "--name"]
FW = ["fineweb_edu", "--num_proc", "1", "--num_tokens", "1000", "--data_files"]
PQ = [*FW, "*.parquet"]


def error_of(excinfo):   # a SystemExit's message: Python prints it as it is, with no traceback
    msg = str(excinfo.value.code)
    assert msg.startswith("error:") and "\n" not in msg, msg
    return msg


def read_set(d):   # meta.json, as every tool's load_meta checks it, and the bins' token ids
    bins = (np.fromfile(d / f"{s}.bin", dtype=np.uint16).tolist() for s in ("train", "val"))
    return (dataset.load_meta(d), *bins)


def test_the_tokenizers(tmp_path):
    gpt2, char, byte = (tok.get_tokenizer({"tokenizer": t, "chars": "ab"})
                        for t in ("gpt2", "char", "byte"))
    assert gpt2[0]("Hello world") == [15496, 995] and tok.gpt2_encoding().n_vocab == 50257
    with pytest.raises(KeyError, match="'z'"):
        char[0]("abz")
    # byte: the end-of-text id decodes to nothing, a cut character to U+FFFD (a model may emit any)
    assert byte[1]([256, *"é".encode(), 256, *"é".encode()[:1]]) == "é\ufffd"
    (tmp_path / "ranks").write_bytes(b"#" + tok.GPT2_RANKS.read_bytes()[1:])   # damaged
    for path, words in ((tmp_path / "ranks", "wrong sha256"), (tmp_path / "gone", "is missing")):
        with pytest.raises(SystemExit) as e:
            tok.gpt2_encoding(path)
        assert str(path) in error_of(e) and words in error_of(e)


@pytest.mark.parametrize("command,tokenizer,sizes", [
    ("text", "char", None), ("text", "gpt2", None), ("text", "byte", None),
    ("shakespeare_char", "char", (1_003_854, 111_540)),   # nanoGPT's prepare.py printed these
    ("shakespeare", "gpt2", (301_966, 36_059))])
def test_the_bins_hold_the_tokens_of_the_text(tmp_path, monkeypatch, command, tokenizer, sizes):
    monkeypatch.chdir(tmp_path)   # data/<name> under the working directory, for every tool
    # 5,000-character chunks, which must give the tokens of the whole (nanoGPT encoded it whole)
    monkeypatch.setattr(prepare_data.text_chunks, "__defaults__", (5_000,))
    (tmp_path / "in.txt").write_text(TEXT, encoding="utf-8")
    src = tmp_path / "in.txt" if command == "text" else prepare_data.SHAKESPEARE
    mine = ["--input", "in.txt", "--name", "mine", "--tokenizer", tokenizer]
    prepare_data.main([command, *(mine if command == "text" else [])])
    meta, train, val = read_set(dataset.dataset_dir("mine" if command == "text" else command))
    text, (encode, decode) = src.read_bytes().decode(), tok.get_tokenizer(meta)
    n = int(len(text) * 0.9)   # the last --val_fraction (0.1) of the characters is val
    assert train == encode(text[:n]) and val == encode(text[n:]) and decode(train + val) == text
    # load_meta checked vocab_size against the tokenizer; char: the text's characters, sorted
    assert [meta.get(k, "") for k in ("tokenizer", "train_tokens", "val_tokens", "chars")] == [
        tokenizer, len(train), len(val), "".join(sorted(set(text))) * (tokenizer == "char")]
    assert sizes in (None, (len(train), len(val)))
    # a file of the repository by its relative path: the same record on every machine
    assert meta["source"] == (str(src) if command == "text" else "data/raw/tinyshakespeare.txt")


def test_a_set_is_prepared_again_only_when_needed_and_never_lost(tmp_path, monkeypatch, capsys):
    def prepare(text, *extra):
        (tmp_path / "in.txt").write_text(text, encoding="utf-8")
        prepare_data.main(["text", "--input", str(tmp_path / "in.txt"), "--name", "x",
                           "--tokenizer", "char", "--out_dir", str(out), *extra])
        return "already prepared" in capsys.readouterr().out
    out, more = tmp_path / "x", TEXT + "one more line\n"
    snapshot = lambda: {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.iterdir())}
    assert not prepare(TEXT)
    before = snapshot()
    assert prepare(TEXT) and snapshot() == before   # the same source and settings: nothing done
    assert not prepare(more) and not prepare(more, "--val_fraction", "0.2")   # source, split
    (out / "val.bin").write_bytes(b"")   # a damaged set is prepared again, not trusted
    assert not prepare(more, "--val_fraction", "0.2")
    meta, train, val = read_set(out)
    assert tok.get_tokenizer(meta)[1](val) == more[int(len(more) * 0.8):]
    class FullDisk(io.FileIO):
        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
    before = snapshot()
    with monkeypatch.context() as m, pytest.raises(SystemExit) as e:
        m.setattr(prepare_data, "open", lambda path, mode="r": FullDisk(path, mode), raising=False)
        prepare(TEXT)   # another recipe: prepared again
    assert ("train.bin.tmp" in error_of(e) and "(the disk is full)" in error_of(e)
            and "keeps its earlier set" in error_of(e))
    assert snapshot() == before   # the earlier set intact, no .tmp file left behind
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(prepare_data.json, "dump", mock.Mock(side_effect=KeyboardInterrupt))
        prepare(more.replace("speak", "SPEAK"), "--val_fraction", "0.2")   # the same .bin sizes
    assert not (out / "meta.json").exists()   # killed after the bins got their names: incomplete
    assert not prepare(more, "--val_fraction", "0.2")   # so prepared again, the sizes not trusted
    meta, train, val = read_set(out)
    assert tok.get_tokenizer(meta)[1](train + val) == more


@pytest.mark.parametrize("source", ["hub", "parquet"])
def test_fineweb_edu_gives_the_tokens_of_its_documents(tmp_path, monkeypatch, capsys, source):
    docs = [f"Document {i}: " + TEXT[i * 7:i * 7 + 50 + i] for i in range(40)]   # non-ASCII too
    encode = {t: tok.get_tokenizer({"tokenizer": t})[0] for t in ("gpt2", "byte")}
    stream_of = lambda docs, t="gpt2": [x for d in docs for x in [   # EOT, a document, EOT...
        tok.BYTE_EOT if t == "byte" else tok.EOT, *encode[t](d)]]
    args = ["fineweb_edu", "--num_tokens=600", "--processes=2", f"--out_dir={tmp_path / 'fw'}"]
    if source == "hub":
        offline = mock.Mock(**{"load_dataset.side_effect": ConnectionError("no huggingface.co\n.")})
        for module, words in ((None, "needs the optional `datasets` package: pip install datasets"),
                              (offline, "no huggingface.co; offline, prepare local shards with")):
            monkeypatch.setitem(sys.modules, "datasets", module)   # None: `import datasets` fails
            with pytest.raises(SystemExit) as e:
                prepare_data.main(args)
            assert words in error_of(e) and not any(p.is_file() for p in tmp_path.rglob("*"))
        hub = mock.Mock(**{"load_dataset.return_value.iter.return_value": [{"text": docs}]})
        monkeypatch.setitem(sys.modules, "datasets", hub)
    else:
        datasets = pytest.importorskip("datasets")
        def write_shards(*parts):   # one shard a part, with an id column too, as FineWeb-Edu's
            for k, part in enumerate(parts):
                datasets.Dataset.from_list([{"id": i, "text": t} for i, t in enumerate(part)]
                                           ).to_parquet(tmp_path / f"shard_{k}.parquet")
        write_shards(docs[:20], docs[20:])
        args += ["--data_files", str(tmp_path / "*.parquet")]
    for tokenizer in ("gpt2", "byte", "gpt2"):   # a set of one tokenizer is not taken for another
        prepare_data.main([*args, "--tokenizer", tokenizer])
        assert "already prepared" not in capsys.readouterr().out
        meta, train, val = read_set(tmp_path / "fw")
        # in sorted file order; the first 0.5% is val
        assert val + train == stream_of(docs, tokenizer)[:600] and len(val) == 600 // 200
        with monkeypatch.context() as m:   # a complete set needs no `datasets`, no download
            m.setitem(sys.modules, "datasets", None)
            prepare_data.main([*args, "--tokenizer", tokenizer])
        assert "already prepared" in capsys.readouterr().out
    if source == "hub":
        hub.load_dataset.assert_called_with(path="HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                            split="train", streaming=True)
        return
    assert meta["source"] == f"local parquet files: {tmp_path}/*.parquet"
    write_shards(docs[:10])   # shard_0 changed: prepared again
    prepare_data.main(args)
    _, train, val = read_set(tmp_path / "fw")
    assert val + train == stream_of(docs[:10] + docs[20:])[:600]


@pytest.mark.parametrize("files,args,words", [
    ({}, [*TXT, "a" * 256], "(File name too long): fix that and run again"),   # the OS's
    ({}, [*TXT[:2], "gone.txt", "--name", "x"], "input file gone.txt not found"),
    ({"in.txt": b"\xff"}, [*TXT, "x"], "in.txt is not UTF-8 text"),
    ({}, [*TXT, "x", "--val_fraction", "1"], "--val_fraction must be between 0 and 1, got 1.0"),
    ({"in.txt": "".join(map(chr, range(0x10000, 0x10000 + 70_000))).encode()},   # > uint16
     [*TXT, "x", "--tokenizer", "char"], "70,000 distinct characters, more than uint16 ids"),
    *[({}, ["fineweb_edu", f, v], f"{f}: {v!r} is not a") for f, v in (
        ("--num_tokens", "inf"), ("--val_tokens", "1.5"), ("--processes", "x"))],
    ({}, [*FW, "none/*.parquet"], "'none/*.parquet' matches no file: give a glob"),
    ({"a.parquet": b"x"}, PQ, "could not read the local files (a.parquet...)"),   # not parquet
    ({"a.parquet": [{"body": "a"}]}, PQ, "(a.parquet...): KeyError: 'text'"),
    ({"a.parquet": [{"text": "a"}, {"text": None}]}, PQ, "1 of the source is NoneType 'None', not"),
    ({"a.parquet": [{"text": "tiny"}]}, [*PQ, "--val_tokens", "50"],
     "the train split would hold 0 token(s), fewer than the 3 a training sequence needs"),
    ({"tinyshakespeare.txt": b"#" + prepare_data.SHAKESPEARE.read_bytes()[1:]},
     ["shakespeare_char"], "tinyshakespeare.txt has sha256 ")])
def test_bad_input_is_one_sentence(tmp_path, monkeypatch, capsys, files, args, words):
    monkeypatch.chdir(tmp_path)   # where data/<name> would be written
    # a damaged copy of the vendored Tiny Shakespeare, where a case writes one
    monkeypatch.setattr(prepare_data, "SHAKESPEARE", tmp_path / "tinyshakespeare.txt")
    if files and PQ[-1] in args:   # read by `datasets`
        datasets = pytest.importorskip("datasets")
    for name, content in {"in.txt": b"some text to prepare " * 20, **files}.items():
        if isinstance(content, list):   # the rows of a parquet shard
            datasets.Dataset.from_list(content).to_parquet(tmp_path / name)
        else:
            (tmp_path / name).write_bytes(content)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(args)
    # one sentence (argparse's: the usage, then an error line, exit status 2), nothing written
    assert words in (capsys.readouterr().err if e.value.code == 2 else error_of(e))
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted({"in.txt", *files})


@pytest.mark.parametrize("name,change,words", [
    # no meta.json: the command that prepares it, and the folder where it was looked for
    ("shakespeare_char", None, "directory, CWD): run `python prepare_data.py shakespeare_char`"),
    ("mybook", None, "CWD): run `python prepare_data.py text --input FILE --name mybook`"),
    ("a" * 256, None, "(meta.json missing;"),   # too long a name: not prepared, no OSError
    ("x", {"vocab_size": True}, "has vocab_size=True, not a whole number from 1 to 65536"),
    ("x", {"vocab_size": 70000}, "=70000"), ("x", {"tokenizer": "gpt2"}, "=3, not 50257"),
    ("x", {"chars": None}, "has no 'chars' string of vocab_size=3 distinct characters"),
    ("x", {"chars": "abcd"}, "no 'chars'"), ("x", {"chars": "aab"}, "distinct characters"),
    ("x", {"tokenizer": "bpe"}, "names no tokenizer of char, gpt2, byte")])
def test_a_missing_or_bad_set_is_one_sentence(tmp_path, monkeypatch, name, change, words):
    monkeypatch.chdir(tmp_path)
    if change is not None:
        meta = {"tokenizer": "char", "vocab_size": 3, "chars": "abc", **change}
        (tmp_path / "data" / "x").mkdir(parents=True)
        (tmp_path / "data/x/meta.json").write_text(json.dumps(
            {k: v for k, v in meta.items() if v is not None}))   # None: the key left out
    with pytest.raises(SystemExit) as e:
        dataset.load_meta(dataset.dataset_dir(name))
    msg = error_of(e).replace(str(tmp_path), "CWD")
    assert words in msg and (not change or msg.startswith("error: data/x/meta.json ")
                             and msg.endswith(": prepare the dataset again"))
