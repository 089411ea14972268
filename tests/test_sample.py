"""sample.py: each sample streamed token by token (model.GPT.generate_tokens, dataset.decode_stream)
is the text generate gives for the same seed; the header says which evaluation the weights had
(telemetry.describe), true after an interrupted run too; bad input is one sentence, and Ctrl-C or
a closed pipe ends it quietly."""
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
import telemetry
from dataset import decode_stream, get_tokenizer
from helpers import ENV, ROOT, make, records, start, train

BYTE = {"tokenizer": "byte", "vocab_size": 257}
GPT2 = {"tokenizer": "gpt2", "vocab_size": 50257}


@pytest.fixture(autouse=True)
def one_thread():
    """Models this small sample 5-10x faster on one thread than on two of a busy 2-core machine."""
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
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    state = {"model": {}, "optimizers": [], "model_args": {}, "config": {}, "iter_num": iter_num,
             "best_val_loss": best}
    return telemetry.describe(str(checkpoint.save(tmp_path, state, iter_num)), state)


def test_the_header_gives_the_val_loss_of_the_checkpoints_own_evaluation(tmp_path):
    """And after a stop signal at step 37 of a run that evaluates every 250, best_val_loss is step
    0's, not these weights' loss: the header says no evaluation came since; a checkpoint copied
    alone says only what it knows."""
    line = run_folder(tmp_path / "a", [(0, 4.17), (250, 1.9), (500, 1.95), (750, 1.5)], 500, 1.9)
    assert line.endswith("ckpt_0000500.pt (iteration 500, val loss 1.9500, best 1.9000)"), line
    line = run_folder(tmp_path / "b", [(0, 4.1743)], 37, 4.1743)
    assert line.endswith("ckpt_0000037.pt (iteration 37, saved between evaluations: none since "
                         "step 0's, val loss 4.1743)"), line
    os.remove(tmp_path / "b" / "metrics.jsonl")
    line = telemetry.describe(str(tmp_path / "b" / "ckpt_0000037.pt"), {"iter_num": 37,
                                                                       "best_val_loss": 4.1743})
    assert line.endswith("(iteration 37, best val loss 4.1743 of the evaluations up to it)"), line


# ---- sample.py in a subprocess, after an interrupted train.py -----------------------------------

@pytest.mark.slow
def test_sample_py_streams_after_an_interrupted_run_and_says_which_evaluation_came_last(workdir):
    p = start(workdir, "--out_dir=out_stream", "--max_iters=100000", "--eval_interval=100000")
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


# ---- sample.py's faults, one sentence each ------------------------------------------------------

def sample(wd, *args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), "--max_new_tokens=2",
                           *args], cwd=wd, env=ENV, capture_output=True, text=True, timeout=120,
                          **kw)


@pytest.fixture(scope="module")
def sample_run(workdir):
    """A run on its own copy of the data (re-prepared below with another vocabulary); a folder
    whose `latest` is a folder; a checkpoint of integer weights; one from before the vocabulary
    record whose dataset name leaves data/."""
    import shutil
    shutil.copytree(workdir / "data" / "tiny", workdir / "data" / "tiny_s", dirs_exist_ok=True)
    train(workdir, "--dataset=tiny_s", "--out_dir=out_sample", "--max_iters=2",
          "--eval_interval=2")
    (workdir / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (workdir / "big.txt").write_text("A" * 3000)
    os.makedirs(workdir / "out_folder_latest" / "latest", exist_ok=True)
    state = torch.load(workdir / "out_sample" / "ckpt_0000002.pt", weights_only=True)
    for name, change in (("out_int", {"model": {k: (v * 1000).long()
                                                 for k, v in state["model"].items()}}),
                         ("out_old", {"config": {**state["config"], "dataset": "../../tmp/x"}})):
        checkpoint.save(workdir / name, {k: v for k, v in {**state, **change}.items()
                                         if name != "out_old" or k != "vocab"}, 2)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--start=FILE:missing.txt"], "is not a regular file of at most 2,048 bytes (the model"),
    (["--start=FILE:/dev/zero"], "'/dev/zero' is not a regular file of at most"),   # issue 39.13
    (["--start=FILE:binary.bin"], "cannot read the prompt file 'binary.bin' (not UTF-8 text)"),
    (["--start=FILE:big.txt"], "'big.txt' is not a regular file of at most 2,048 bytes"),
    (["--start=" + "A" * 20], "the prompt encodes to 20 tokens, and the model takes 1 to 16"),
    (["--device=cuda"], "no CUDA device"),
    (["--out_dir=out_folder_latest"], "not the name of a checkpoint in its folder"),
    (["--out_dir=out_int"], "model's wte.weight is not a floating-point tensor"),   # issue 39.2
    (["--out_dir=out_old"], "the dataset name '../../tmp/x' is not one folder name"),   # 39.9
    (["--num_samples=0"], "num_samples=0 is out of range: it must be >= 1"),
    (["--temperature=-1"], "temperature=-1.0 is out of range: it must be >= 0")])
def test_sample_faults_are_one_sentence(sample_run, args, message):
    if args == ["--device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = sample(sample_run, "--out_dir=out_sample", *args)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert message in p.stderr.strip().splitlines()[-1], p.stderr


@pytest.mark.slow
def test_sample_decodes_with_the_runs_own_vocabulary(sample_run):
    """The dataset prepared again from another text of as many characters: the run's ids still mean
    its own."""
    meta_path = sample_run / "data" / "tiny_s" / "meta.json"
    meta = meta_path.read_text()
    greek = "".join(chr(0x391 + i) for i in range(json.loads(meta)["vocab_size"]))
    meta_path.write_text(json.dumps({**json.loads(meta), "chars": greek}))
    try:
        p = sample(sample_run, "--out_dir=out_sample", "--max_new_tokens=50", "--start=A",
                   "--num_samples=1")
    finally:
        meta_path.write_text(meta)
    text = p.stdout.split("\n", 1)[1].rsplit("---", 1)[0]
    assert p.returncode == 0 and len(text) > 40 and not set(text) & set(greek), p.stderr


@pytest.mark.slow
def test_ctrl_c_ends_the_line_and_a_closed_pipe_ends_quietly(sample_run):
    """Issue 39.4: a KeyboardInterrupt traceback mid-stream; `| head -c 50`, a BrokenPipeError."""
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir=out_sample",
           "--max_new_tokens=100000", "--num_samples=1"]
    s = subprocess.Popen(cmd, cwd=sample_run, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    out = b""
    while len(out) < 200:   # the header and some of the sample
        out += s.stdout.read1(1 << 16)
    s.send_signal(signal.SIGINT)
    rest, err = s.communicate(timeout=60)
    assert s.returncode == 130 and (out + rest).endswith(b"\n") and b"Traceback" not in err, err
    s = subprocess.Popen(cmd, cwd=sample_run, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    s.stdout.read(50)
    s.stdout.close()   # as `head -c 50` does
    err = s.stderr.read()
    assert s.wait(timeout=60) == 141 and err == b"", err
