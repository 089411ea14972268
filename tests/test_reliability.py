"""Faults a long pre-training run meets: kills, preemption, bad checkpoints, bad data, a diverging
loss. Each test runs train.py in subprocesses, as a cluster would."""
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
from conftest import ROOT
from helpers import ENV, TINY_MODEL, records, train


def start(wd, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, *args],
                            cwd=wd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(predicate, timeout=60, poll=0.05):
    t0 = time.time()
    while not predicate():
        if time.time() - t0 > timeout:
            raise TimeoutError("condition not met in time")
        time.sleep(poll)


def catches_sigterm(pid):
    """Whether process pid has a SIGTERM handler installed (Linux: the SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def read_until(p, prefix):
    """Read p's stdout up to a line that starts with prefix (the loop has started once 'step 0:' is
    out)."""
    for line in p.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting with {prefix!r}: {p.stderr.read()}")


@pytest.mark.slow
def test_sigterm_finishes_the_step_saves_and_exits_0_and_a_second_trainer_is_refused(workdir):
    p = start(workdir, "--out_dir=out_term", "--max_iters=100000", "--eval_interval=100000")
    wait_for(lambda: os.path.exists(workdir / "out_term" / "metrics.jsonl")
             and len(records(workdir, "out_term", "train")) >= 3)
    # a requeued job on the same out_dir while this one runs: one sentence naming the holder,
    # nothing touched
    second = train(workdir, "--out_dir=out_term", "--overwrite=True", check=False)
    assert (second.returncode != 0
            and f"in use by another trainer (pid {p.pid})" in second.stderr), second.stderr
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    steps = len(records(workdir, "out_term", "train"))
    path, state = checkpoint.load_latest(workdir / "out_term")
    # the step it was on
    assert state["iter_num"] == steps and path.endswith(f"ckpt_{steps:07d}.pt")
    assert "stop signal" in out


@pytest.mark.slow
def test_a_stop_signal_after_divergence_saves_no_nan_checkpoint(workdir):
    """log_interval too large to see the loss: the save itself checks the last step's loss and the
    weights."""
    p = start(workdir, "--out_dir=out_nan", "--overwrite=True", "--max_iters=100000",
              "--eval_interval=100000", "--log_interval=100000", "--learning_rate=1e30",
              "--warmup_iters=0")
    read_until(p, "step 0:")
    time.sleep(1.0)   # some steps at lr=1e30
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in err, err
    assert (("training loss is nan" in last or "a weight is nan" in last)
            and "no checkpoint was saved" in last), last
    assert (not os.path.exists(workdir / "out_nan" / "latest")
            and not checkpoint.checkpoints(workdir / "out_nan"))


@pytest.mark.slow
def test_ddp_stop_signal_with_a_large_log_interval_saves_before_torchrun_kills(workdir):
    """torchrun forwards SIGTERM to the workers and SIGKILLs them 30 s later: the flag is shared
    every step, so the save comes within a step, not within log_interval steps. torchrun itself
    then exits 1."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), *TINY_MODEL, "--out_dir=out_ddp_stop",
           "--overwrite=True", "--gradient_accumulation_steps=2", "--max_iters=100000",
           "--eval_interval=100000", "--log_interval=100000"]
    p = subprocess.Popen(cmd, cwd=workdir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    read_until(p, "step 0:")
    time.sleep(1.0)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=90)
    assert time.time() - t0 < 25, "the workers were not stopped before torchrun's SIGKILL"
    assert "stop signal at step" in out and "saved" in out, out + err
    assert "terminate called" not in err and "exitcode  : -" not in err, err   # no rank aborted
    assert p.returncode == 1   # torchrun's own SignalException, whatever its workers did
    path, state = checkpoint.load_latest(workdir / "out_ddp_stop")
    assert (state["iter_num"] > 0
            and f"saved {os.path.join('out_ddp_stop', os.path.basename(path))}" in out)


@pytest.mark.slow
def test_sigkill_during_a_save_resumes_from_the_previous_complete_checkpoint(workdir):
    """Saves every step with a model large enough that a save takes a while (~50 MB with AdamW's
    state). The first kill lands at a random moment; the second as soon as a temporary checkpoint
    file appears, so it interrupts a save: `latest` still names the previous complete checkpoint
    and the run resumes from it."""
    out = workdir / "out_kill"
    big = ["--n_layer=4", "--n_embd=384", "--n_head=4", "--eval_interval=1", "--eval_iters=1",
           "--keep_checkpoints=2", "--out_dir=out_kill", "--overwrite=True", "--max_iters=100000"]
    p = start(workdir, *big)
    wait_for(lambda: (checkpoint.candidates(out)
                      and checkpoint.load_latest(out)[1]["iter_num"] >= 1), timeout=120)
    time.sleep(random.Random(0).uniform(0.0, 1.0))
    p.kill()
    p.wait()
    last = checkpoint.load_latest(out)[1]["iter_num"]   # never corrupt

    p = start(workdir, *big, "--init_from=resume")
    def temporary_checkpoint():
        return next((n for n in os.listdir(out)
                     if re.fullmatch(rf"ckpt_\d+\.pt\.tmp{p.pid}", n)), None)
    t0 = time.time()
    while (tmp := temporary_checkpoint()) is None:
        assert time.time() - t0 < 120 and p.poll() is None, "no save began"
        time.sleep(0.002)
    p.kill()
    p.wait()
    # it did interrupt a write
    assert os.path.exists(out / tmp), "the kill landed after the save completed"
    path, state = checkpoint.load_latest(out)
    # the previous complete one
    assert last <= state["iter_num"] < checkpoint.step_of(tmp.split(".tmp")[0])

    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, *big[:-2],
                        f"--max_iters={state['iter_num'] + 2}", "--init_from=resume"],
                       cwd=workdir, env=ENV, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"resuming from {os.path.join('out_kill', os.path.basename(path))}" in p.stdout
    assert checkpoint.load_latest(out)[1]["iter_num"] == state["iter_num"] + 2
    assert not os.path.exists(out / tmp)   # its writer is gone: cleaned up by the next save


@pytest.mark.slow
def test_a_full_disk_is_one_sentence_and_the_run_resumes_once_there_is_room(workdir):
    """A real full disk: a 1 MB tmpfs as out_dir (only as root, where mounting is allowed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = workdir / "out_full"
    mnt.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        args = ["--out_dir=out_full", "--eval_interval=1", "--keep_checkpoints=1000"]
        # the full disk met mid-run, then again on resume
        for resume in ([], ["--init_from=resume"]):
            p = train(workdir, *args, *resume, "--max_iters=1000", check=False)
            last = p.stderr.strip().splitlines()[-1]
            assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
            assert (last.startswith("error: cannot write")
                    and "disk is full (errno 28, ENOSPC)" in last
                    and "still names ckpt_" in last), last
            path, state = checkpoint.load_latest(mnt)   # what `latest` names is complete
            assert os.path.basename(path) in last
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        for old in checkpoint.checkpoints(mnt)[:-1]:
            os.remove(old)
        train(workdir, *args, "--init_from=resume", f"--max_iters={state['iter_num'] + 2}")
        assert ([r["iter"] for r in records(workdir, "out_full", "train")]
                == list(range(1, state["iter_num"] + 3)))
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.fixture(scope="module")
def two_checkpoints_made_once(workdir):
    train(workdir, "--out_dir=out_two_master", "--overwrite=True", "--max_iters=4",
          "--eval_interval=2")
    return workdir / "out_two_master"


@pytest.fixture
def two_checkpoints(workdir, two_checkpoints_made_once):
    """A fresh copy of a 4-step run with checkpoints at steps 2 and 4, in out_two."""
    out = workdir / "out_two"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(two_checkpoints_made_once, out, ignore=shutil.ignore_patterns("lock"))
    return out


@pytest.mark.slow
def test_a_truncated_checkpoint_is_named_and_fallback_is_opt_in(workdir, two_checkpoints):
    newest = checkpoint.candidates(two_checkpoints)[0]
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2",
              "--init_from=resume", check=False)
    assert (p.returncode != 0 and os.path.basename(newest) in p.stderr
            and "resume_fallback" in p.stderr)
    train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2", "--init_from=resume",
          "--resume_fallback=True")
    assert checkpoint.load_latest(two_checkpoints)[1]["iter_num"] == 6


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.slow
def test_a_checkpoint_with_a_disallowed_object_is_refused(two_checkpoints):
    path = checkpoint.candidates(two_checkpoints)[0]
    state = torch.load(path, weights_only=True)
    torch.save({**state, "extra": Evil()}, path)
    with pytest.raises(checkpoint.CheckpointError, match="refuses"):
        checkpoint.load(path)


@pytest.mark.slow
def test_resume_with_another_model_lists_the_mismatched_keys(workdir, two_checkpoints):
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--init_from=resume", "--n_embd=64",
              "--sv_hetero=True", "--optimizer=muon", check=False)
    assert (p.returncode != 0
            and all(k in p.stderr for k in ("n_embd", "sv_hetero", "optimizer"))), p.stderr


@pytest.mark.slow
def test_a_checkpoint_of_another_model_version_is_one_clear_error(workdir, two_checkpoints):
    """Weights renamed (as a later model.py might) or model_args with a key this model.py lacks:
    train.py and sample.py stop with one sentence naming the file, and the checkpoint stays as it
    was."""
    path = checkpoint.candidates(two_checkpoints)[0]
    state = torch.load(path, weights_only=True)
    state["model"]["blocks.0.attn.qkv.g_in.gain"] = state["model"].pop("blocks.0.attn.qkv.g_in.g")
    torch.save(state, path)
    size = os.path.getsize(path)
    sample = lambda: subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"),
                                     "--out_dir=out_two", "--max_new_tokens=2"], cwd=workdir,
                                    env=ENV, capture_output=True, text=True, timeout=120)
    for p in (train(workdir, "--out_dir=out_two", "--max_iters=6", "--init_from=resume",
                    check=False), sample()):
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert (os.path.basename(path) in last and "does not fit this model" in last
                and "blocks.0.attn.qkv.g_in.g" in last), last
    assert os.path.getsize(path) == size
    state["model_args"]["a_flag_of_another_version"] = True
    torch.save(state, path)
    p = sample()
    assert (p.returncode != 0 and "another version of model.py" in p.stderr
            and "Traceback" not in p.stderr), p.stderr


@pytest.mark.slow
def test_a_diverging_loss_stops_and_keeps_the_last_good_checkpoint(workdir, two_checkpoints):
    before = checkpoint.load_latest(two_checkpoints)
    p = train(workdir, "--out_dir=out_two", "--max_iters=40", "--eval_interval=2",
              "--init_from=resume", "--learning_rate=1e30", "--warmup_iters=0", "--grad_clip=0",
              check=False)
    assert p.returncode != 0
    assert "loss is" in p.stderr and os.path.basename(before[0]) in p.stderr, p.stderr
    after = checkpoint.load_latest(two_checkpoints)
    assert after[0] == before[0] and all(torch.equal(after[1]["model"][k], v)
                                         for k, v in before[1]["model"].items())


@pytest.mark.slow
@pytest.mark.parametrize("fault,message", [
    ("vocab", "beyond vocab_size"),
    ("no_meta", "meta.json missing"),
    ("no_bin", "val.bin is missing"),
    ("torn_bin", "train.bin has an odd number of bytes"),
    ("bad_json", "meta.json is not valid JSON"),
    ("no_vocab", "meta.json lacks vocab_size"),
])
def test_bad_data_says_what_to_run(workdir, fault, message):
    bad = workdir / "data" / f"bad_{fault}"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(workdir / "data" / "tiny", bad)
    meta = json.loads((bad / "meta.json").read_text())
    if fault in ("vocab", "no_vocab"):
        (bad / "meta.json").write_text(json.dumps(
            {**meta, "vocab_size": 10, "chars": meta["chars"][:10]} if fault == "vocab" else
            {k: v for k, v in meta.items() if k != "vocab_size"}))
    elif fault == "torn_bin":   # a copy cut short mid-token
        (bad / "train.bin").write_bytes((bad / "train.bin").read_bytes()[:-1])
    elif fault == "bad_json":
        (bad / "meta.json").write_text('{"tokenizer": "char", ')
    else:
        os.remove(bad / ("meta.json" if fault == "no_meta" else "val.bin"))
    p = train(workdir, f"--dataset=bad_{fault}", "--out_dir=out_bad", "--max_iters=2", check=False)
    assert (p.returncode != 0 and message in p.stderr.strip().splitlines()[-1]
            and "Traceback" not in p.stderr), p.stderr


# ---- checkpoint.py and the run folder, in-process -----------------------------------------------

def fake_state(step):
    return {"model": {"w": torch.full((4,), float(step))}, "optimizers": [], "model_args": {},
            "config": {}, "iter_num": step, "best_val_loss": 1.0}


def bad_file(kind, path):
    if kind == "legacy_truncated":
        # torch.save's pre-zip format, cut short: IndexError or KeyError inside torch
        torch.save(fake_state(1), path, _use_new_zipfile_serialization=False)
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "random_bytes":
        path.write_bytes(random.Random(0).randbytes(5000))
    elif kind == "text":
        path.write_text("hello world\n" * 100)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "a_tensor":   # loads fine, but is not a checkpoint of this project
        torch.save(torch.ones(3), path)
    elif kind == "dict_without_keys":
        torch.save({"model": {}}, path)


BAD_FILES = ["legacy_truncated", "random_bytes", "text", "empty", "a_tensor", "dict_without_keys"]


@pytest.mark.parametrize("kind", BAD_FILES)
def test_any_file_that_does_not_load_is_corrupt_with_the_fallback_hint(tmp_path, kind):
    bad_file(kind, tmp_path / "ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(tmp_path / "ckpt_0000002.pt")
    assert ("corrupt or not a checkpoint of this project" in str(e.value)
            and "--resume_fallback" in str(e.value))
    # ... and --resume_fallback gets past it to the previous checkpoint
    checkpoint.save(tmp_path, fake_state(1), 1)
    (tmp_path / "latest").write_text("ckpt_0000002.pt")
    path, state = checkpoint.load_latest(tmp_path, fallback=True)
    assert state["iter_num"] == 1 and path.endswith("ckpt_0000001.pt")


def test_a_latest_that_is_a_folder_is_one_sentence(tmp_path):
    (tmp_path / "latest").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="latest cannot be read"):
        checkpoint.load_latest(tmp_path)


def test_keep_last_k_counts_by_iteration_and_this_run_only(tmp_path):
    """An older run's higher-numbered checkpoints (or a later one skipped by --resume_fallback)
    take no slot: the newest `keep` of this run survive. Iterations past 9,999,999 sort by number,
    not by name."""
    for step in (100, 200):
        torch.save(fake_state(step), tmp_path / f"ckpt_{step:07d}.pt")
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, fake_state(step), step, keep=2)
    names = sorted(os.listdir(tmp_path))
    assert ("ckpt_0000002.pt" in names and "ckpt_0000003.pt" in names
            and "ckpt_0000001.pt" not in names)
    assert ([os.path.basename(p) for p in checkpoint.candidates(tmp_path)]
            == ["ckpt_0000003.pt", "ckpt_0000002.pt"])
    big = tmp_path / "big"
    for step in (9_999_999, 10_000_000, 10_000_001):
        checkpoint.save(big, fake_state(step), step, keep=2)
    assert (sorted(checkpoint.step_of(p) for p in checkpoint.checkpoints(big))
            == [10_000_000, 10_000_001])
    assert checkpoint.load_latest(big)[1]["iter_num"] == 10_000_001


def test_save_deletes_only_temporary_files_whose_writer_is_gone(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / f"ckpt_0000005.pt.tmp{alive.pid}").write_bytes(b"another trainer, mid-write")
        (tmp_path / f"ckpt_0000005.pt.tmp{dead.pid}").write_bytes(b"left by a kill -9")
        checkpoint.save(tmp_path, fake_state(1), 1)
        left = os.listdir(tmp_path)
        assert (f"ckpt_0000005.pt.tmp{alive.pid}" in left
                and f"ckpt_0000005.pt.tmp{dead.pid}" not in left)
    finally:
        alive.kill()
        alive.wait()


def test_a_second_trainer_on_one_out_dir_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time, checkpoint; checkpoint.lock(sys.argv[1]); "
                               "print('locked', flush=True); time.sleep(30)", str(tmp_path)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(checkpoint.CheckpointError,
                           match=f"in use by another trainer \\(pid {holder.pid}\\)"):
            checkpoint.lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    checkpoint.lock(tmp_path)   # the kernel released the dead holder's lock
    assert (tmp_path / "lock").read_text() == str(os.getpid())
    checkpoint._lock_file.close()


class FullDisk:
    """A file whose writes fail with ENOSPC after `room` bytes, as on a full disk."""
    def __init__(self, path, mode, room):
        self.f, self.room = open(path, mode), room
    def write(self, b):
        self.room -= len(b)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(b)
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()


# mid-way through torch.save's zip writer / at the first byte
@pytest.mark.parametrize("room", [100, 0])
def test_a_full_disk_is_one_sentence_and_latest_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, room):
    checkpoint.save(tmp_path, fake_state(1), 1)
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setattr(checkpoint, "open", lambda path, mode="r": FullDisk(path, mode, room),
                        raising=False)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(tmp_path, fake_state(2), 2)
    msg = str(e.value)
    assert ("ckpt_0000002.pt" in msg and "disk is full (errno 28, ENOSPC)" in msg
            and "still names ckpt_0000001.pt" in msg), msg
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before   # no temporary file left, nothing else touched
    assert checkpoint.load_latest(tmp_path)[1]["iter_num"] == 1


def test_resume_drops_a_torn_metrics_line_and_what_came_after_the_checkpoint(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "train", "iter": i}) + "\n" for i in (1, 2, 3))
                    + '{"kind": "tr')
    checkpoint.trim_metrics(path, 2)
    assert [json.loads(line)["iter"] for line in path.read_text().splitlines()] == [1, 2]
    assert "dropped 1 line(s)" in capsys.readouterr().out
    mtime = path.stat().st_mtime_ns
    checkpoint.trim_metrics(path, 2)   # nothing to drop: nothing written (a resume on a full disk)
    assert path.stat().st_mtime_ns == mtime


def test_check_out_dir_refuses_a_file_and_a_scratch_run_over_another_run(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="is a file"):
        checkpoint.check_out_dir(tmp_path / "a_file", "resume", False)
    checkpoint.save(tmp_path / "run", fake_state(1), 1)
    with pytest.raises(checkpoint.CheckpointError, match="--overwrite=True"):
        checkpoint.check_out_dir(tmp_path / "run", "scratch", False)
    checkpoint.check_out_dir(tmp_path / "run", "scratch", True)
    checkpoint.check_out_dir(tmp_path / "run", "resume", False)
    checkpoint.check_out_dir(tmp_path / "new", "scratch", False)


# ---- prepare_data.py: never replace a good set with a broken one --------------------------------

@pytest.mark.parametrize("text", ["", "a", "ab"])
def test_prepare_data_refuses_a_split_too_short_to_train_and_keeps_the_old_set(tmp_path, text):
    import prepare_data
    good, out = tmp_path / "good.txt", tmp_path / "data"
    good.write_text("First Citizen: before we proceed any further, hear me speak.\n" * 10)
    prepare_data.main(["text", "--input", str(good), "--name", "x", "--tokenizer", "char",
                       "--out_dir", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["text", "--input", str(tmp_path / "bad.txt"), "--name", "x",
                           "--tokenizer", "char", "--out_dir", str(out)])
    assert (str(e.value.code).startswith("error:")
            and "fewer than the 3 a training sequence needs" in str(e.value.code))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_prepare_data_out_dir_that_is_a_file(tmp_path):
    import prepare_data
    (tmp_path / "f").write_text("x")
    (tmp_path / "in.txt").write_text("some text " * 20)
    with pytest.raises(SystemExit, match="is a file"):
        prepare_data.main(["text", "--input", str(tmp_path / "in.txt"), "--name", "x",
                           "--out_dir", str(tmp_path / "f")])


# ---- a new run over an old one; a resumed run with another batch --------------------------------

@pytest.mark.slow
def test_overwrite_replaces_a_run_and_a_new_global_batch_is_one_warning(workdir, two_checkpoints):
    p = train(workdir, "--out_dir=out_two", "--init_from=resume", "--max_iters=5",
              "--eval_interval=5", "--batch_size=8")
    assert ("warning: the checkpoint was trained with 64 tokens per iteration, this run uses 128"
            in p.stdout), p.stdout
    train(workdir, "--out_dir=out_two", "--overwrite=True", "--max_iters=2", "--eval_interval=2")
    assert ([os.path.basename(c) for c in checkpoint.checkpoints(two_checkpoints)]
            == ["ckpt_0000002.pt"])
    # the old run's metrics are gone
    assert [r["iter"] for r in records(workdir, "out_two", "train")] == [1, 2]


# ---- sample.py ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_run(workdir):
    """A run on its own copy of the data (re-prepared below with another vocabulary)."""
    shutil.copytree(workdir / "data" / "tiny", workdir / "data" / "tiny_s", dirs_exist_ok=True)
    train(workdir, "--dataset=tiny_s", "--out_dir=out_sample", "--overwrite=True", "--max_iters=2",
          "--eval_interval=2")
    (workdir / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (workdir / "out_folder_latest").mkdir(exist_ok=True)
    (workdir / "out_folder_latest" / "latest").mkdir(exist_ok=True)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--start=FILE:missing.txt"],
     "cannot read the prompt file 'missing.txt' (No such file or directory)"),
    (["--start=FILE:binary.bin"], "cannot read the prompt file 'binary.bin' (not UTF-8 text)"),
    (["--device=cuda"], "no CUDA device"),
    (["--out_dir=out_folder_latest"], "latest cannot be read"),
    (["--num_samples=0"], "num_samples=0 is out of range: it must be >= 1"),
    (["--temperature=-1"], "temperature=-1.0 is out of range: it must be >= 0"),
])
def test_sample_faults_are_one_sentence(sample_run, args, message):
    if args == ["--device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir=out_sample",
                        "--max_new_tokens=2", *args],
                       cwd=sample_run, env=ENV, capture_output=True, text=True, timeout=120)
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
        p = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"),
                            "--out_dir=out_sample", "--max_new_tokens=50", "--start=A",
                            "--num_samples=1"],
                           cwd=sample_run, env=ENV, capture_output=True, text=True, timeout=120)
    finally:
        meta_path.write_text(meta)
    assert p.returncode == 0, p.stderr
    text = p.stdout.split("\n", 1)[1].rsplit("---", 1)[0]
    assert len(text) > 40 and not set(text) & set(greek), text


# ---- issue 20: nothing outside out_dir is touched, every file read is checked (in-process) ------

@pytest.mark.parametrize("odd,other", [("g[1]", "g1"), ("x*", "xy"), ("q?", "qq")])
def test_an_out_dir_named_with_glob_characters_touches_only_itself(tmp_path, odd, other):
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path / other, fake_state(step), step, keep=10)
    assert (checkpoint.checkpoints(tmp_path / odd) == []
            and checkpoint.candidates(tmp_path / odd) == [])
    for step in (1, 2):
        checkpoint.save(tmp_path / odd, fake_state(step), step, keep=1)
    assert len(checkpoint.checkpoints(tmp_path / other)) == 4
    assert ([os.path.basename(p) for p in checkpoint.checkpoints(tmp_path / odd)]
            == ["ckpt_0000002.pt"])


def test_save_removes_only_its_own_temporary_names(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine, theirs = f"ckpt_0000003.pt.tmp{dead.pid}", f"notes.txt.tmp{dead.pid}"
    for name in (mine, theirs):
        (tmp_path / name).write_text("left by a kill -9")
    checkpoint.save(tmp_path, fake_state(1), 1)
    assert not (tmp_path / mine).exists() and (tmp_path / theirs).exists()


def test_checkpoints_without_latest_are_resumed_and_a_scratch_run_is_refused(tmp_path):
    for step in (1, 2):
        checkpoint.save(tmp_path, fake_state(step), step)
    os.remove(tmp_path / "latest")
    path, state = checkpoint.load_latest(tmp_path)
    assert state["iter_num"] == 2 and path.endswith("ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"holds a run \(ckpt_0000002.pt\).*--overwrite=True"):
        checkpoint.check_out_dir(tmp_path, "scratch", False)


def test_the_lock_and_metrics_are_never_written_through_a_link(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "lock").symlink_to(precious)
    with pytest.raises(checkpoint.CheckpointError,
                       match="lock is a symbolic link .* remove the link"):
        checkpoint.lock(a)
    (a / "metrics.jsonl").symlink_to(precious)
    with pytest.raises(checkpoint.CheckpointError, match="metrics.jsonl is a symbolic link"):
        checkpoint.open_append(a / "metrics.jsonl")
    assert precious.read_text() == "keep me"
    # a run copied with `cp -al`: its files are hard links to the original's
    (b / "lock").write_text("12345")
    (b / "metrics.jsonl").write_text('{"kind": "train", "iter": 1}\n')
    for name in ("lock", "metrics.jsonl"):
        os.link(b / name, c / name)
    checkpoint.lock(c)
    checkpoint._lock_file.close()
    with checkpoint.open_append(c / "metrics.jsonl") as f:
        f.write('{"kind": "train", "iter": 2}\n')
    assert (b / "lock").read_text() == "12345" and (c / "lock").read_text() == str(os.getpid())
    assert ((b / "metrics.jsonl").read_text().count("\n") == 1
            and (c / "metrics.jsonl").read_text().count("\n") == 2)


@pytest.mark.parametrize("change,why", [
    ({"model_args": None}, "model_args is NoneType"), ({"config": []}, "config is list"),
    ({"iter_num": "20"}, "iter_num is str '20'"), ({"iter_num": True}, "iter_num is bool"),
    ({"iter_num": -1}, "iter_num below 0"), ({"model": {"w": 1.0}}, "not a tensor"),
])
def test_a_checkpoint_with_the_right_keys_and_wrong_types_is_corrupt(tmp_path, change, why):
    torch.save({**fake_state(2), **change}, tmp_path / "ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError,
                       match="corrupt or not a checkpoint of this project") as e:
        checkpoint.load(tmp_path / "ckpt_0000002.pt")
    assert why in str(e.value)


def test_a_checkpoint_with_non_finite_weights_is_never_the_last_good_one(tmp_path):
    checkpoint.save(tmp_path, fake_state(1), 1)
    state = fake_state(2)
    state["model"]["w"][1] = float("nan")
    checkpoint.save(tmp_path, state, 2)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"ckpt_0000002.pt holds non-finite weights \(w\).*--resume_fallback"):
        checkpoint.load_latest(tmp_path)
    assert checkpoint.load_latest(tmp_path, fallback=True)[1]["iter_num"] == 1


def test_optimizer_state_is_checked_against_the_parameters_it_is_restored_onto():
    from helpers import make
    model = make()
    names = {p: n for n, p in model.named_parameters()}
    params = list(model.parameters())
    fresh = lambda: torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    opt = fresh()
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    opt.step()
    saved = checkpoint.optimizer_state(opt, names)
    restored = fresh()
    restored.param_groups[0]["lr"] = 5e-4   # this run's config, not the checkpoint's
    checkpoint.restore_optimizers([restored], [saved], names, "ckpt.pt", iter_num=1)
    assert torch.equal(restored.state[params[0]]["exp_avg"], opt.state[params[0]]["exp_avg"])
    assert restored.param_groups[0]["lr"] == 5e-4
    square = [i for i, p in enumerate(params)
              if p.shape == params[-1].shape and i != len(params) - 1][0]
    other = [i for i, p in enumerate(params) if p.shape != params[0].shape][0]
    unnamed = {**saved, "state": {i: {k: v for k, v in e.items() if k != "param_name"}
                                  for i, e in saved["state"].items()}}
    # another shape (caught even in a checkpoint written before the names), and the same shape
    # (by its name)
    for state, i, j, why in ((unnamed, 0, other, r"'s exp_avg is \("),
                             (saved, square, len(params) - 1, "the state of .* is .*'s")):
        swapped = {**state, "state": {**state["state"], i: state["state"][j], j: state["state"][i]}}
        with pytest.raises(checkpoint.CheckpointError,
                           match="ckpt.pt holds optimizer state that does not fit this model .*"
                                 + why):
            checkpoint.restore_optimizers([fresh()], [swapped], names, "ckpt.pt", iter_num=1)
    with pytest.raises(checkpoint.CheckpointError, match="2 optimizer"):
        checkpoint.restore_optimizers([fresh()], [saved, saved], names, "ckpt.pt", iter_num=1)
    # issue 31, item 9: no moments past step 0 would resume silently with fresh ones
    empty = {**saved, "state": {}}
    checkpoint.restore_optimizers([fresh()], [empty], names, "ckpt.pt", iter_num=0)
    with pytest.raises(checkpoint.CheckpointError, match="no moments at iteration 20"):
        checkpoint.restore_optimizers([fresh()], [empty], names, "ckpt.pt", iter_num=20)


# ---- issue 20: train.py and sample.py check what they read, in subprocesses ---------------------

def permuted_dataset(workdir, name, chars=None):
    """A copy of data/tiny whose ids mean other characters (the same count): reversed, or
    `chars`."""
    bad = workdir / "data" / name
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(workdir / "data" / "tiny", bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "chars": chars or meta["chars"][::-1]}))


@pytest.mark.slow
@pytest.mark.parametrize("fault,message", [
    # was: munmap_chunk(), rc -6
    ("swap", "holds optimizer state that does not fit this model (the state of"),
    ("types", "is corrupt or not a checkpoint of this project (iter_num is str '4')"),
    ("vocab", "was trained on another vocabulary than data/tiny_perm/meta.json now holds"),
])
def test_resume_checks_what_it_reads_in_one_sentence(workdir, two_checkpoints, fault, message):
    path = checkpoint.candidates(two_checkpoints)[0]
    state = torch.load(path, weights_only=True)
    args = []
    if fault == "swap":   # two entries of different shapes
        entries = state["optimizers"][0]["state"]
        j = next(j for j in entries if entries[j]["exp_avg"].shape != entries[0]["exp_avg"].shape)
        entries[0], entries[j] = entries[j], entries[0]
    elif fault == "types":
        state["iter_num"] = str(state["iter_num"])
    else:
        permuted_dataset(workdir, "tiny_perm")
        args = ["--dataset=tiny_perm"]
    torch.save(state, path)
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2",
              "--init_from=resume", *args, check=False)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert last.startswith(
        f"error: checkpoint {os.path.join('out_two', os.path.basename(path))}" if fault != "vocab"
        else f"error: {os.path.join('out_two', os.path.basename(path))}") and message in last, last
    assert (checkpoint.candidates(two_checkpoints)[0] == path
            and len(records(workdir, "out_two", "train")) == 4)


@pytest.mark.slow
def test_a_run_copied_with_hard_links_resumes_without_writing_into_the_original(
        workdir, two_checkpoints):
    copy = workdir / "out_linked"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(two_checkpoints, copy, copy_function=os.link)   # cp -al
    before = {p.name: p.read_bytes() for p in two_checkpoints.iterdir()}
    train(workdir, "--out_dir=out_linked", "--max_iters=6", "--eval_interval=2",
          "--init_from=resume")
    assert {p.name: p.read_bytes() for p in two_checkpoints.iterdir()} == before
    assert [r["iter"] for r in records(workdir, "out_linked", "train")] == list(range(1, 7))


@pytest.mark.slow
def test_ddp_processes_with_different_configurations_are_refused_before_anything_is_written(
        workdir):
    """A config that reads RANK: max_iters differs by process (it hung for gloo's 30 minutes)."""
    (workdir / "by_rank.py").write_text(
        "import os\nmax_iters = 2 + int(os.environ.get('RANK', 0))\n")
    p = train(workdir, "by_rank.py", "--out_dir=out_by_rank", "--gradient_accumulation_steps=2",
              check=False,
              launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2"))
    assert p.returncode != 0, p.stdout
    assert ("error: the 2 processes run different configurations "
            "(max_iters; max_iters=2, 3 by rank)" in p.stderr), p.stderr
    assert not (workdir / "out_by_rank").exists()


@pytest.mark.slow
def test_a_token_file_cut_short_under_a_running_trainer_is_one_sentence(workdir):
    data = workdir / "data" / "tiny_cut"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(workdir / "data" / "tiny", data)
    p = start(workdir, "--dataset=tiny_cut", "--out_dir=out_cut", "--overwrite=True",
              "--max_iters=100000", "--eval_interval=3")
    wait_for(lambda: checkpoint.candidates(workdir / "out_cut"))
    # cut mid-token, as a copy still in progress would be
    with open(data / "train.bin", "r+b") as f:
        f.truncate(os.path.getsize(data / "train.bin") // 2 + 1)
    out, err = p.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in err, err
    assert last.startswith(f"error: {os.path.join('data', 'tiny_cut', 'train.bin')} "
                           "changed under the running trainer"), last
    assert checkpoint.load_latest(workdir / "out_cut")[1]["iter_num"] % 3 == 0   # `latest` intact


@pytest.mark.slow
def test_a_stop_during_the_step_0_evaluation_then_a_resume_logs_that_evaluation_once(workdir):
    p = start(workdir, "--out_dir=out_eval0", "--overwrite=True", "--max_iters=100000",
              "--eval_interval=100000", "--eval_iters=400")   # 0.2-2 s of evaluation
    # train.py catches SIGTERM just before its loop, whose first work is that evaluation: signalled
    # as soon as the kernel shows the handler (not after a delay, which a fast CPU outran in CI)
    wait_for(lambda: catches_sigterm(p.pid), poll=0.005)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "stop signal at step 0" in out, out + err
    train(workdir, "--out_dir=out_eval0", "--init_from=resume", "--max_iters=2",
          "--eval_interval=2")
    assert [r["iter"] for r in records(workdir, "out_eval0", "eval")] == [0, 2]


def test_a_token_file_cut_short_during_the_start_up_check_is_one_sentence(tmp_path, monkeypatch):
    """Issue 31.3: cutting train.bin short while the start-up check read it killed train.py with
    SIGBUS (a memmap). The check reads with pread: the file, cut between two of its reads, is a
    short read and one sentence."""
    import numpy as np
    import dataset
    path = tmp_path / "train.bin"
    np.zeros((1 << 22) + 1000, dtype=np.uint16).tofile(path)   # two of the check's 4M-token reads
    check, cuts = dataset.TokenFile.check_ids, []

    def check_then_cut(self, ids):   # a copy still in progress, or a second prepare_data.py
        check(self, ids)
        if not cuts:
            cuts.append(os.truncate(path, 2000))
    monkeypatch.setattr(dataset.TokenFile, "check_ids", check_then_cut)
    with pytest.raises(SystemExit) as e:
        dataset.TokenFile(path, 16, 65)
    assert cuts and str(e.value.code) == (
        f"error: {path} changed under the running trainer (cut short, replaced or removed): "
        "restore it as it was, then continue from the last checkpoint with --init_from=resume")


def test_a_checkpoint_without_a_vocabulary_record_resumes_only_on_its_own_dataset():
    """Issue 31.11: a checkpoint from before the "vocab" record, resumed on another dataset of the
    same vocabulary size, was then stamped with that dataset's vocabulary. Without the record, the
    dataset its config names is the only one it resumes on."""
    ckpt = {"model_args": {}, "iter_num": 4,
            "config": {"optimizer": "adamw", "dataset": "tiny", "gradient_accumulation_steps": 1,
                       "batch_size": 4, "block_size": 16}}
    vocab = {"tokenizer": "char", "vocab_size": 3, "chars": "abc"}
    config = {"optimizer": "adamw", "max_iters": 8}
    notes = checkpoint.check_resume("ckpt.pt", ckpt, {**config, "dataset": "tiny"}, {}, vocab, 64)
    assert notes == ["resuming from ckpt.pt at iteration 4"]
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_resume("ckpt.pt", ckpt, {**config, "dataset": "tiny2"}, {}, vocab, 64)
    assert str(e.value).startswith(f"ckpt.pt was trained on another vocabulary than "
                                   f"{os.path.join('data', 'tiny2')}/meta.json now holds")
    # with the record, the record decides (a dataset renamed is the same vocabulary)
    assert checkpoint.check_resume("ckpt.pt", {**ckpt, "vocab": vocab},
                                   {**config, "dataset": "tiny2"}, {}, vocab, 64) == notes
