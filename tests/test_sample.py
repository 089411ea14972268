"""sample.py: generate's text streamed after its evaluation; faults one sentence; Ctrl-C quiet."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import checkpoint
import telemetry
from tokenizer import decode_stream, get_tokenizer
from helpers import ENV, ROOT, last_line, records, train

BYTE = {"tokenizer": "byte", "vocab_size": 257}
GPT2 = {"tokenizer": "gpt2", "vocab_size": 50257}
SAMPLE = [sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir=out_sample", "--device=cpu"]
pytestmark = pytest.mark.usefixtures("one_thread")   # conftest: one thread, as sample.py's ENV


@pytest.mark.parametrize("meta, texts", [
    (BYTE, ["h\u00e9 \u20ac\U0001f600!", b"\xffA\xe2\x82"]),   # an invalid byte; a cut end
    (GPT2, ["\u2019 caf\u00e9 \u6f22\u5b57 \U0001f600"])], ids=["byte", "gpt2"])
def test_the_streamed_text_is_the_whole_text_with_cut_characters_held_back(meta, texts):
    """A model emits any ids, so pieces that end inside a UTF-8 character: none is printed cut."""
    encode, decode = get_tokenizer(meta)
    g = torch.Generator().manual_seed(0)   # and any ids, as a random model's
    for ids in [list(t) if isinstance(t, bytes) else encode(t) for t in texts] + [
            torch.randint(meta["vocab_size"], (60,), generator=g).tolist()]:
        pieces, held = list(decode_stream(decode, iter(ids))), 0
        assert "".join(pieces) == decode(ids) and len(pieces) == len(ids) + 1
        for k in range(1, len(ids) + 1):   # the first k pieces: the text of k ids but a cut end
            text = decode(ids[:k])
            assert "".join(pieces[:k]) == text.rstrip("\ufffd"), (k, pieces[:k], text)
            held += text.endswith("\ufffd")
        assert held >= 3 or len(ids) == 60, ids   # the texts cut characters; random ids may not


def test_the_header_gives_the_val_loss_of_the_checkpoints_own_evaluation(tmp_path):
    """Not best_val_loss, which may be an earlier evaluation's; a lone checkpoint: what it knows."""
    log = [("eval", 250, 1.9), ("eval", 500, 1.95), ("train", 504, 3.0), ("eval", 750, 1.5),
           ("eval", 0, 4.17)]   # read by iteration, not by place: one out of train.py's order
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": kind, "iter": i, "val_loss": v}) + "\n" for kind, i, v in log))
    path, state = str(tmp_path / "ckpt_0000500.pt"), {"iter_num": 500, "best_val_loss": 1.9}
    line = telemetry.describe(path, state)
    assert line.endswith("ckpt_0000500.pt (iteration 500, val loss 1.9500, best 1.9000)"), line
    line = telemetry.describe(path, {**state, "iter_num": 504})
    assert line.endswith("(iteration 504, saved between evaluations: none since step 500's, val "
                         "loss 1.9500)"), line
    os.remove(tmp_path / "metrics.jsonl")
    line = telemetry.describe(path, state)
    assert line.endswith("(iteration 500, best val loss 1.9000 of the evaluations up to it)"), line


@pytest.fixture(scope="module")
def sample_run(workdir):
    """out_sample (its data then re-prepared: Greek letters), out_cut (cut short), out_edited."""
    shutil.copytree(workdir / "data" / "tiny", workdir / "data" / "tiny_s", dirs_exist_ok=True)
    train(workdir, "--dataset=tiny_s", "--out_dir=out_sample", "--max_iters=3")
    (workdir / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (workdir / "big.txt").write_text("A" * 3000)
    shutil.copytree(workdir / "out_sample", workdir / "out_cut")
    with open(workdir / "out_cut" / "ckpt_0000003.pt", "r+b") as f:
        f.truncate(1000)
    meta = json.loads((workdir / "data" / "tiny_s" / "meta.json").read_text())
    greek = "".join(chr(0x391 + i) for i in range(meta["vocab_size"]))
    (workdir / "data" / "tiny_s" / "meta.json").write_text(json.dumps({**meta, "chars": greek}))
    _, state = checkpoint.load_latest(str(workdir / "out_sample"))   # its vocabulary edited
    checkpoint.save(workdir / "out_edited", {**state, "vocab": {**state["vocab"], "chars": "ab"}})
    return workdir


@pytest.mark.slow
def test_sample_py_prints_the_text_of_generate_after_a_header_of_the_evaluation(sample_run):
    n = 1000
    p = subprocess.run([*SAMPLE, "--start=A", f"--max_new_tokens={n}", "--num_samples=2"],
                       cwd=sample_run, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    header, text = p.stdout.split("\n", 1)
    step0, step3 = records(sample_run, "out_sample", "eval")
    assert header.endswith(f"(iteration 3, val loss {step3['val_loss']:.4f}, best "
                           f"{min(step0['val_loss'], step3['val_loss']):.4f})"), header
    # the very text generate gives for sample.py's seed (one thread: one_thread, and ENV), in the
    # run's own vocabulary (its meta.json now holds Greek letters)
    path, state, model = checkpoint.load_model(str(sample_run / "out_sample"))
    encode, decode = get_tokenizer(state["vocab"])
    torch.manual_seed(1337)
    prompt = torch.tensor([encode("A")])
    want = "".join(decode(model.eval().generate(prompt, n, 0.8, 200)[0].tolist())
                   + "\n---------------\n" for _ in range(2))
    assert text == want


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--start=FILE:/dev/zero"], "'/dev/zero' is not a regular file of at most"),   # endless
    (["--start=FILE:binary.bin"], "cannot read the prompt file 'binary.bin' (not UTF-8 text)"),
    (["--start=FILE:big.txt"], "'big.txt' is not a regular file of at most 2,048 bytes (the"),
    (["--start=" + "A" * 20], "the prompt encodes to 20 tokens, and the model takes 1 to 16"),
    (["--start=\u00e9"], "the prompt's character '\u00e9' is not in the char-level vocabulary"),
    (["--device=cuda:99"], "CUDA device"),   # none, or fewer than 100
    (["--out_dir=out_cut"], "out_cut/ckpt_0000003.pt is not one to go on from (it does not "
                             "load): start again"),
    (["--out_dir=out_edited"], "out_edited/ckpt_0000003.pt records a vocabulary that is not its"),
    (["--temperature=-1"], "temperature=-1.0 is out of range: it must be >= 0")])
def test_sample_faults_are_one_sentence(sample_run, args, message):
    p = subprocess.run([*SAMPLE, "--max_new_tokens=2", *args], cwd=sample_run, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert message in last_line(p), p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("code", [130, 141], ids=["ctrl-c", "closed-pipe"])
def test_ctrl_c_ends_the_line_and_a_closed_pipe_ends_quietly(sample_run, code):
    """No KeyboardInterrupt traceback mid-stream, no BrokenPipeError after `| head -c 200`."""
    # SIGINT at its default in the child: a shell's background job (`pytest ... &`) starts with it
    # ignored, and Python then raises no KeyboardInterrupt
    s = subprocess.Popen([*SAMPLE, "--max_new_tokens=100000", "--num_samples=1"], cwd=sample_run,
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = b""
    while len(out) < 200:   # streamed: the header and a sample's start, printed as sampled
        chunk = s.stdout.read1(1 << 16)
        assert chunk, s.stderr.read().decode()
        out += chunk
    if code == 130:
        s.send_signal(signal.SIGINT)
        assert (out + s.stdout.read()).endswith(b"\n")   # the line ends
    else:
        s.stdout.close()   # as `head -c 200` does
    err = s.stderr.read()
    assert s.wait(timeout=60) == code and err == b"", err   # 130, 141: as SIGINT, SIGPIPE
