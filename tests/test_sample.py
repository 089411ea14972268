"""sample.py: each sample streamed token by token (model.GPT.generate_tokens, dataset.decode_stream)
is the text generate gives for the same seed, and the header says which evaluation the weights had
(checkpoint.describe), true after an interrupted run too."""
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
from dataset import decode_stream, get_tokenizer
from helpers import ENV, ROOT, make, records, start

BYTE = {"tokenizer": "byte", "vocab_size": 257}
GPT2 = {"tokenizer": "gpt2", "vocab_size": 50257}


@pytest.fixture(autouse=True)
def one_thread():
    """Models this small sample 5-10x faster on one thread than on two of a busy 2-core machine
    (as in tests/tools/test_export_hf.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def streamed(model, ids, decode, n, seed, **kw):
    """The ids sample.py samples and the pieces it prints, one per id: the prompt's, then each
    sampled token's."""
    torch.manual_seed(seed)
    new = [int(t) for t in model.generate_tokens(torch.tensor([ids]), n, **kw)]
    return ids + new, list(decode_stream(decode, itertools.chain(ids, iter(new))))


def cuts(pieces, ids, decode):
    """Check the pieces: the first k are the text of the first k ids but a character still cut at
    its end (a trailing U+FFFD); all are the text. Returns how often a cut was held back."""
    assert "".join(pieces) == decode(ids) and len(pieces) == len(ids) + 1
    held = 0
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        assert "".join(pieces[:k]) == text.rstrip("\ufffd"), (k, pieces[:k], text)
        held += text.endswith("\ufffd")
    return held


@pytest.mark.parametrize("meta, n", [(BYTE, 60), (GPT2, 20)], ids=["byte", "gpt2"])
def test_the_streamed_text_is_the_sample_of_the_same_seed(meta, n):
    """A random model emits any ids, so bytes and BPE pieces that end inside a UTF-8 character: no
    printed piece may end in one (it would show as U+FFFD), and together they are the text."""
    encode, decode = get_tokenizer(meta)
    model, prompt = make(vocab_size=meta["vocab_size"]).eval(), encode("Caf\u00e9 \U0001f600:")
    held = 0
    for seed in range(2):
        torch.manual_seed(seed)
        whole = model.generate(torch.tensor([prompt]), n, top_k=None)[0].tolist()
        ids, pieces = streamed(model, prompt, decode, n, seed)
        assert ids == whole
        held += cuts(pieces, ids, decode)
    assert held >= 2   # some ids did cut a character (the prompt's emoji for GPT-2's BPE)


@pytest.mark.parametrize("meta, text", [(BYTE, "h\u00e9 \u20ac\U0001f600!"),
                                        (GPT2, "\u2019 caf\u00e9 \u6f22\u5b57 \U0001f600")])
def test_a_character_cut_by_a_token_is_printed_whole_once_complete(meta, text):
    encode, decode = get_tokenizer(meta)
    ids = encode(text)
    pieces = list(decode_stream(decode, ids))
    assert "".join(pieces) == text and cuts(pieces, ids, decode) >= 3


def test_an_invalid_byte_is_printed_once_the_text_moves_on():
    _, decode = get_tokenizer(BYTE)
    assert list(decode_stream(decode, [0xFF, 0x41, 0xE2, 0x82])) == ["", "\ufffdA", "", "",
                                                                     "\ufffd"]


# ---- the header: which evaluation the weights had ------------------------------------------------

def run_folder(tmp_path, evals, iter_num, best):
    """A run folder as train.py leaves it: metrics.jsonl with train and eval records, a checkpoint
    at iter_num."""
    lines = [{"kind": "eval", "iter": i, "val_loss": v, "train_loss": v} for i, v in evals]
    lines += [{"kind": "train", "iter": i, "loss": 3.0} for i in range(1, iter_num + 5)]
    lines.sort(key=lambda r: r["iter"])
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    state = {"model": {}, "optimizers": [], "model_args": {}, "config": {}, "iter_num": iter_num,
             "best_val_loss": best}
    return checkpoint.describe(str(checkpoint.save(tmp_path, state, iter_num)), state)


def test_the_header_gives_the_val_loss_of_the_checkpoints_own_evaluation(tmp_path):
    line = run_folder(tmp_path, [(0, 4.17), (250, 1.9), (500, 1.95), (750, 1.5)], 500, 1.9)
    assert line.endswith("ckpt_0000500.pt (iteration 500, val loss 1.9500, best 1.9000)"), line


def test_the_header_after_a_stop_signal_says_no_evaluation_came_since(tmp_path):
    """Stopped at step 37 of a run that evaluates every 250: best_val_loss is step 0's, which is not
    the loss of these weights."""
    line = run_folder(tmp_path, [(0, 4.1743)], 37, 4.1743)
    assert line.endswith("ckpt_0000037.pt (iteration 37, saved between evaluations: none since "
                         "step 0's, val loss 4.1743)"), line
    assert "best" not in line
    os.remove(tmp_path / "metrics.jsonl")   # a checkpoint copied alone: only what it knows
    line = checkpoint.describe(str(tmp_path / "ckpt_0000037.pt"), {"iter_num": 37,
                                                                  "best_val_loss": 4.1743})
    assert line.endswith("(iteration 37, best val loss 4.1743 of the evaluations up to it)"), line


# ---- sample.py in a subprocess, after an interrupted train.py -----------------------------------

@pytest.mark.slow
def test_sample_py_streams_after_an_interrupted_run_and_says_which_evaluation_came_last(workdir):
    p = start(workdir, "--out_dir=out_stream", "--overwrite=True", "--max_iters=100000",
              "--eval_interval=100000")
    t0 = time.time()
    while not (os.path.exists(workdir / "out_stream" / "metrics.jsonl")
               and len(records(workdir, "out_stream", "train")) >= 3):
        assert time.time() - t0 < 60 and p.poll() is None, p.stderr.read()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    (step0,) = records(workdir, "out_stream", "eval")
    n, args = 1000, ["--start=A", "--num_samples=2", "--device=cpu"]
    s = subprocess.Popen([sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir=out_stream",
                          f"--max_new_tokens={n}", *args], cwd=workdir, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    while b"\nA" not in out or len(out.split(b"\nA", 1)[1]) < 20:
        chunk = os.read(s.stdout.fileno(), 1 << 16)
        assert chunk, s.stderr.read().decode()
        out += chunk
    # the first sample's start came while it was being sampled: not all of its n tokens yet
    assert len(out.split(b"\nA", 1)[1]) < n and s.poll() is None
    rest, err = s.communicate(timeout=120)
    assert s.returncode == 0, err.decode()
    header, text = (out + rest).decode().split("\n", 1)
    assert header.endswith(f"saved between evaluations: none since step 0's, val loss "
                           f"{step0['val_loss']:.4f})"), header
    # the very text generate gives for sample.py's seed (one thread: one_thread, and ENV)
    path, state, model = checkpoint.load_model(str(workdir / "out_stream"))
    encode, decode = get_tokenizer(state["vocab"])
    torch.manual_seed(1337)
    prompt = torch.tensor([encode("A")])
    want = "".join(decode(model.eval().generate(prompt, n, 0.8, 200)[0].tolist())
                   + "\n---------------\n" for _ in range(2))
    assert text == want
