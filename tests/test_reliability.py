"""Faults a long pre-training run meets: kills, preemption, bad checkpoints, bad data, a diverging loss.
Each test runs train.py in subprocesses, as a cluster would."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
from conftest import ROOT
from test_train import ENV, TINY_MODEL, records, train


def start(wd, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, *args], cwd=wd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout=60):
    t0 = time.time()
    while not predicate():
        if time.time() - t0 > timeout:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


def test_sigterm_finishes_the_step_saves_and_exits_0(workdir):
    p = start(workdir, "--out_dir=out_term", "--max_iters=100000", "--eval_interval=100000")
    wait_for(lambda: os.path.exists(workdir / "out_term" / "metrics.jsonl") and len(records(workdir, "out_term", "train")) >= 3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    steps = len(records(workdir, "out_term", "train"))
    path, state = checkpoint.load_latest(workdir / "out_term")
    assert state["iter_num"] == steps and path.endswith(f"ckpt_{steps:07d}.pt")   # the step it was on
    assert "stop signal" in out


def test_sigkill_at_random_moments_never_loses_the_last_checkpoint(workdir):
    """Saves every step with a model large enough that a save takes a while (~50 MB with AdamW's
    state), killed at random moments; the newest complete checkpoint always loads and resumes."""
    big = ["--n_layer=4", "--n_embd=384", "--n_head=4", "--eval_interval=1", "--eval_iters=1", "--keep_checkpoints=2",
           "--out_dir=out_kill", "--max_iters=100000"]
    rng, killed_mid_save, last = random.Random(0), 0, -1
    for trial in range(3):
        p = start(workdir, *big, *(["--init_from=resume"] if trial else []))
        wait_for(lambda: checkpoint.candidates(workdir / "out_kill") and
                 checkpoint.load_latest(workdir / "out_kill")[1]["iter_num"] > last + 1, timeout=120)
        time.sleep(rng.uniform(0.0, 1.0))
        p.kill()
        p.wait()
        killed_mid_save += any(".tmp" in n for n in os.listdir(workdir / "out_kill"))   # a save it interrupted
        path, state = checkpoint.load_latest(workdir / "out_kill")   # never corrupt
        assert state["iter_num"] > last
        last = state["iter_num"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, *big[:-1],
                        f"--max_iters={last + 2}", "--init_from=resume"], cwd=workdir, env=ENV, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert checkpoint.load_latest(workdir / "out_kill")[1]["iter_num"] == last + 2
    print(f"{killed_mid_save} of 3 kills landed during a save")


@pytest.fixture
def two_checkpoints(workdir):
    out = workdir / "out_two"
    shutil.rmtree(out, ignore_errors=True)
    train(workdir, "--out_dir=out_two", "--max_iters=4", "--eval_interval=2")
    return out


def test_a_truncated_checkpoint_is_named_and_fallback_is_opt_in(workdir, two_checkpoints):
    newest = checkpoint.candidates(two_checkpoints)[0]
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2", "--init_from=resume", check=False)
    assert p.returncode != 0 and os.path.basename(newest) in p.stderr and "resume_fallback" in p.stderr
    train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2", "--init_from=resume", "--resume_fallback=True")
    assert checkpoint.load_latest(two_checkpoints)[1]["iter_num"] == 6


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_checkpoint_with_a_disallowed_object_is_refused(two_checkpoints):
    path = checkpoint.candidates(two_checkpoints)[0]
    state = torch.load(path, weights_only=True)
    torch.save({**state, "extra": Evil()}, path)
    with pytest.raises(checkpoint.CheckpointError, match="refuses"):
        checkpoint.load(path)


def test_resume_with_another_model_lists_the_mismatched_keys(workdir, two_checkpoints):
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--init_from=resume", "--n_embd=64", "--sv_hetero=True",
              "--optimizer=muon", check=False)
    assert p.returncode != 0 and all(k in p.stderr for k in ("n_embd", "sv_hetero", "optimizer")), p.stderr


def test_a_checkpoint_of_another_model_version_is_one_clear_error(workdir, two_checkpoints):
    """Weights renamed (as a later model.py might) or model_args with a key this model.py lacks: train.py and
    sample.py stop with one sentence naming the file, and the checkpoint stays as it was."""
    path = checkpoint.candidates(two_checkpoints)[0]
    state = torch.load(path, weights_only=True)
    state["model"]["blocks.0.attn.qkv.v.gain"] = state["model"].pop("blocks.0.attn.qkv.v.g")
    torch.save(state, path)
    size = os.path.getsize(path)
    sample = lambda: subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir=out_two", "--max_new_tokens=2"],
                                    cwd=workdir, env=ENV, capture_output=True, text=True, timeout=120)
    for p in (train(workdir, "--out_dir=out_two", "--max_iters=6", "--init_from=resume", check=False), sample()):
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert os.path.basename(path) in last and "does not fit this model" in last and "blocks.0.attn.qkv.v.g" in last, last
    assert os.path.getsize(path) == size
    state["model_args"]["a_flag_of_another_version"] = True
    torch.save(state, path)
    p = sample()
    assert p.returncode != 0 and "another version of model.py" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_diverging_loss_stops_and_keeps_the_last_good_checkpoint(workdir, two_checkpoints):
    before = checkpoint.load_latest(two_checkpoints)
    p = train(workdir, "--out_dir=out_two", "--max_iters=40", "--eval_interval=2", "--init_from=resume",
              "--learning_rate=1e30", "--warmup_iters=0", "--grad_clip=0", check=False)
    assert p.returncode != 0
    assert "loss is" in p.stderr and os.path.basename(before[0]) in p.stderr, p.stderr
    after = checkpoint.load_latest(two_checkpoints)
    assert after[0] == before[0] and all(torch.equal(after[1]["model"][k], v) for k, v in before[1]["model"].items())


@pytest.mark.parametrize("fault,message", [("vocab", "beyond vocab_size"), ("no_meta", "meta.json missing"),
                                           ("no_bin", "val.bin is missing")])
def test_bad_data_says_what_to_run(workdir, fault, message):
    bad = workdir / "data" / f"bad_{fault}"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(workdir / "data" / "tiny", bad)
    if fault == "vocab":
        meta = json.loads((bad / "meta.json").read_text())
        (bad / "meta.json").write_text(json.dumps({**meta, "vocab_size": 10}))
    else:
        os.remove(bad / ("meta.json" if fault == "no_meta" else "val.bin"))
    p = train(workdir, f"--dataset=bad_{fault}", "--out_dir=out_bad", "--max_iters=2", check=False)
    assert p.returncode != 0 and message in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr, p.stderr
