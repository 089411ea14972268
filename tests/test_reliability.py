"""README's "Resuming and preemption", one test per promise: train.py in subprocesses as a cluster
runs it (signals, kills); checkpoint.py in-process."""
import errno
import io
import os
import re
import shutil
import signal
import time

import pytest
import torch

import checkpoint
from helpers import TORCHRUN, finish, last_line, make, metrics, records, start, train


def wait_for(predicate, timeout=120, poll=0.05):
    t0 = time.time()
    while not predicate():
        assert time.time() - t0 < timeout, "condition not met in time"
        time.sleep(poll)


def catches_sigterm(pid):
    """Whether process pid has its SIGTERM handler installed (Linux: the SigCgt mask in /proc):
    train.py installs it right before its loop, whose first work is the step-0 evaluation."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


# ---- train.py in subprocesses: signals, kills --------------------------------------------------

@pytest.mark.slow
def test_a_stop_signal_saves_and_exits_0_a_second_trainer_is_refused_a_nan_is_never_saved(workdir):
    """SIGTERM at step 0 (in its evaluation, which the resume does not repeat), SIGINT mid-run; at
    lr=1e30 the save itself checks the loss and weights (log_interval too large to see them)."""
    run = ["--out_dir=out_term", "--max_iters=100000", "--eval_interval=100000",
           "--eval_iters=400"]   # 0.2-2 s of evaluation at step 0
    p = start(workdir, *run)
    wait_for(lambda: catches_sigterm(p.pid), poll=0.005)   # not a delay: a fast CPU outran one
    p.send_signal(signal.SIGTERM)
    assert "stop signal at step 0" in finish(p).stdout
    p = start(workdir, *run, "--init_from=resume")
    wait_for(lambda: len(records(workdir, "out_term", "train")) >= 3)
    busy = f"error: out_dir out_term is in use by another process (pid {p.pid})"
    for more in ([], ["--overwrite=True"]):   # told a trainer runs there, before any advice
        assert busy in last_line(train(workdir, "--out_dir=out_term", *more, check=False))
    # under torchrun each rank says so, or torchrun stops it first (quietly); no rank's traceback
    ddp = train(workdir, "--out_dir=out_term", "--overwrite=True",
                "--gradient_accumulation_steps=2", check=False, launcher=TORCHRUN).stderr
    assert busy in ddp and "gloo" not in ddp and "train.py\", line" not in ddp, ddp
    p.send_signal(signal.SIGINT)
    out = finish(p).stdout
    steps = len(records(workdir, "out_term", "train"))
    path, state = checkpoint.load_latest(workdir / "out_term")
    assert state["iter_num"] == steps and path.endswith(f"ckpt_{steps:07d}.pt")
    assert f"stop signal at step {steps}" in out, out
    assert [r["iter"] for r in records(workdir, "out_term", "eval")] == [0]
    good = checkpoint.checkpoints(workdir / "out_term")
    for more, named in (("--out_dir=out_nan", "no checkpoint was saved"), (
            "--init_from=resume", f"the last good checkpoint is out_term/{os.path.basename(path)}: "
            "resume from it")):
        p = start(workdir, *run, more, "--eval_iters=2", "--log_interval=100000",
                  "--learning_rate=1e30", "--warmup_iters=0")
        wait_for(lambda: catches_sigterm(p.pid))
        time.sleep(1.0)   # some steps at lr=1e30
        p.send_signal(signal.SIGTERM)
        last = last_line(finish(p, check=False))
        assert re.search(r"(training loss is nan|\S+ is not finite) at step \d+", last), last
        assert named in last, last
    assert checkpoint.checkpoints(workdir / "out_term") == good
    assert checkpoint.checkpoints(workdir / "out_nan") == []


@pytest.mark.slow
def test_sigkill_during_a_save_resumes_from_the_previous_complete_checkpoint(workdir):
    """The kill lands as soon as a temporary checkpoint appears (a slow save, every step)."""
    out = workdir / "out_kill"
    big = ["--n_layer=4", "--n_embd=384", "--n_head=4", "--eval_interval=1", "--eval_iters=1",
           "--keep_checkpoints=2", "--out_dir=out_kill"]
    p = start(workdir, *big, "--max_iters=100000")
    tmp = re.compile(rf"ckpt_(\d+)\.pt\.tmp{p.pid}")
    wait_for(lambda: checkpoint.latest_name(out) and any(map(tmp.fullmatch, os.listdir(out))),
             poll=0.002)
    p.kill()
    p.wait()
    cut = next(m for m in map(tmp.fullmatch, os.listdir(out)) if m)   # it did interrupt a write
    path, state = checkpoint.load_latest(out)
    assert state["iter_num"] < int(cut.group(1))
    p = train(workdir, *big, f"--max_iters={state['iter_num'] + 2}", "--init_from=resume")
    assert f"resuming from {os.path.join('out_kill', os.path.basename(path))}" in p.stdout
    assert checkpoint.load_latest(out)[1]["iter_num"] == state["iter_num"] + 2
    assert not (out / cut.group(0)).exists()   # a dead writer's temporary file, cleaned up


@pytest.mark.slow
def test_a_requeue_runs_one_command_in_every_state_of_its_run(workdir):
    """--init_from=resume as a requeue script runs it: with nothing in out_dir, or a log of a run
    killed before its first checkpoint, it starts from scratch and says so (the log replaced, as
    out_ref's own); from a checkpoint it resumes; on a finished run it trains nothing and adds no
    record. Each ends as out_ref, every record (wall time aside), and no checkpoint is deleted."""
    requeue = ["--max_iters=4", "--eval_interval=2", "--init_from=resume"]
    train(workdir, "--out_dir=out_ref", *requeue[:2])
    ref = workdir / "out_ref"
    for state in ("nothing", "a log", "a checkpoint"):
        out = workdir / f"out_requeue_{state.split()[-1]}"
        if state != "nothing":
            out.mkdir()
            with open(ref / "metrics.jsonl") as f:   # killed after step 3
                (out / "metrics.jsonl").write_text("".join(f.readlines()[:6]))
        if state == "a checkpoint":
            shutil.copy(ref / "ckpt_0000002.pt", out)
        said = train(workdir, f"--out_dir={out.name}", *requeue).stdout
        assert (f"no checkpoint in {out}: starting from scratch" in said) == (
            state != "a checkpoint") and ("resuming from" in said) == (state == "a checkpoint")
        assert metrics(workdir, out.name) == metrics(workdir, "out_ref"), state
    finished = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "lock"}
    said = train(workdir, f"--out_dir={out.name}", *requeue).stdout
    assert "at iteration 4 = max_iters: nothing to train" in said, said
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "lock"} == finished
    assert [os.path.basename(p) for p in checkpoint.checkpoints(out)] == [
        "ckpt_0000002.pt", "ckpt_0000004.pt"]


# ---- checkpoint.py, in-process -------------------------------------------------------------------

def fake_state(step, **change):
    return {"model": {"w": torch.full((4,), float(step))}, "optimizers": [], "model_args": {},
            "config": {}, "iter_num": step, "best_val_loss": 1.0, "vocab": {}, **change}


def nonfinite_moments():
    """A real model's optimizer state after a step, one moment made infinite."""
    model = make()
    opt = model.configure_optimizers(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95))[0]
    model(*[torch.zeros(1, 4, dtype=torch.long)] * 2)[1].backward()
    opt.step()
    opt.state[model.blocks[1].mlp.down.weight]["exp_avg_sq"][0, 0] = float("inf")
    return opt.state_dict()


LEGACY = io.BytesIO()   # torch.save's pre-zip format, cut short in BAD_FILES
torch.save(fake_state(1), LEGACY, _use_new_zipfile_serialization=False)
NAN = torch.tensor([1.0, float("nan")])
BAD_FILES = {   # name: (the bytes of the file, or what torch.save writes; what the sentence says)
    "legacy_truncated": (LEGACY.getvalue()[:200], "it does not load"),
    "binary": (bytes(range(256)) * 20, "it does not load"), "empty": (b"", "it does not load"),
    "a_tensor": (torch.ones(3), "not a dict"), "no_keys": ({"model": {}}, "no 'optimizers' key"),
    "pickle": (fake_state(2, extra=os.system),   # a global: what a pickle that runs code needs
               "objects weights_only refuses"),
    "nan_weights": (fake_state(2, model={"w": NAN}), "a non-finite w: it diverged"),
    "nan_moments": (fake_state(2, optimizers=[nonfinite_moments()]),   # named by its parameter
                    "a non-finite blocks.1.mlp.down.weight's optimizer moments: it diverged"),
    # fields of the wrong type (edited, or another program's): train.py and sample.py read them
    "model_args": (fake_state(2, model_args=[32]), "its 'model_args' is list, not dict"),
    "config": (fake_state(2, config="baseline"), "its 'config' is str, not dict"),
    "iter_num": (fake_state(2, iter_num="2"), "its 'iter_num' is str, not int")}


@pytest.mark.parametrize("held, sentence", BAD_FILES.values(), ids=BAD_FILES)
def test_a_file_that_is_not_a_checkpoint_to_go_on_from_is_one_sentence(tmp_path, held, sentence):
    checkpoint.save(tmp_path, fake_state(1), 1)
    if isinstance(held, bytes):
        (tmp_path / "ckpt_0000002.pt").write_bytes(held)
    else:
        torch.save(held, tmp_path / "ckpt_0000002.pt")
    (tmp_path / "latest").write_text("ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_latest(tmp_path)
    assert e.value.code == (f"error: checkpoint {tmp_path}/ckpt_0000002.pt is not one to go on "
                            f"from ({sentence}): move it and `latest` away to use "
                            f"{tmp_path}/ckpt_0000001.pt"), e.value.code
    if "non-finite" in sentence:   # nor written
        what = re.escape(sentence[len("a non-finite "):sentence.index(":")])
        with pytest.raises(checkpoint.CheckpointError, match=f"^error: {what} is not finite at "
                           f"step 2, so it is not saved; the last good checkpoint is {tmp_path}/"):
            checkpoint.save(tmp_path, held)
    os.remove(tmp_path / "ckpt_0000002.pt")
    os.remove(tmp_path / "latest")   # as the sentence says: the one before
    assert checkpoint.load_latest(tmp_path)[1]["iter_num"] == 1


def test_a_folder_a_trainer_holds_is_refused_before_any_advice(tmp_path):
    """Whatever the command (the advice "holds a run" would send it to the lock's refusal too)."""
    (tmp_path / "metrics.jsonl").write_text('{"kind": "eval", "iter": 0}\n')
    with checkpoint.hold_lock(str(tmp_path / "lock"), "out_dir"):
        for init_from, overwrite in (("scratch", False), ("scratch", True), ("resume", False)):
            with pytest.raises(checkpoint.CheckpointError) as e:
                checkpoint.check_out_dir(str(tmp_path), init_from, overwrite)
            assert e.value.code == (f"error: out_dir {tmp_path} is in use by another process (pid "
                                    f"{os.getpid()}): wait for it to end or stop it, or use "
                                    "another folder"), e.value.code
    assert checkpoint.check_out_dir(str(tmp_path), "resume", False) == "scratch"   # no checkpoint


@pytest.mark.parametrize("held, sentence", [
    ("notes.txt", "latest does not name a checkpoint (ckpt_NNNNNNN.pt): remove it to use the "
     "newest checkpoint of its folder"),
    ("ckpt_0000009.pt", "latest names ckpt_0000009.pt, which is gone: remove it to use the newest "
     "checkpoint there (RUN/ckpt_0000001.pt)")])
def test_latest_names_a_checkpoint_that_is_there(tmp_path, held, sentence):
    checkpoint.save(tmp_path, fake_state(1))
    (tmp_path / "latest").write_text(held)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_latest(tmp_path)
    assert e.value.code == f"error: {tmp_path}/" + sentence.replace("RUN", str(tmp_path))


@pytest.mark.parametrize("made", [False, True], ids=["no folder", "an empty folder"])
def test_no_checkpoint_names_the_absolute_folder_and_retrains_only_an_empty_one(
        tmp_path, monkeypatch, made):
    """sample.py --out_dir=out/run from the repository's parent: where it looked, and why there."""
    monkeypatch.chdir(tmp_path)
    if made:
        os.makedirs("out/run")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_latest("out/run")
    said = f"{tmp_path}/out/run{' does not exist' * (not made)} (a relative out_dir is read from "
    assert e.value.code.startswith(f"error: {'no checkpoint in' if made else 'out_dir'} {said}"
                                   "the working directory"), e.value.code
    assert ("train one there first" in e.value.code) == made and "\n" not in e.value.code


def test_a_run_folder_loses_only_its_own_files_and_a_run_only_when_told(tmp_path):
    """keep_checkpoints counts this run's by iteration (an older run's take no slot); a folder with
    only a run's metrics.jsonl holds a run too; a folder named like a checkpoint is none."""
    for step in (100, 200):
        torch.save(fake_state(step), tmp_path / f"ckpt_{step:07d}.pt")
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, fake_state(step), keep=2)
    assert ([os.path.basename(p) for p in checkpoint.checkpoints(tmp_path)]
            == ["ckpt_0000002.pt", "ckpt_0000003.pt", "ckpt_0000100.pt", "ckpt_0000200.pt"])
    for run in ("g", "logged", "saved"):
        (tmp_path / run).mkdir()
    for step in (9_999_999, 10_000_000, 10_000_001):   # past 7 digits: by number
        checkpoint.save(tmp_path / "g", fake_state(step), keep=2)
    assert [checkpoint.step_of(p) for p in checkpoint.checkpoints(tmp_path / "g")] == [
        10_000_000, 10_000_001]
    (tmp_path / "logged" / "metrics.jsonl").write_text('{"kind": "eval", "iter": 0}\n')
    checkpoint.save(tmp_path / "saved", fake_state(1))
    os.remove(tmp_path / "saved" / "latest")   # removed by hand: the checkpoints still count
    for run, held in (("logged", "metrics.jsonl"), ("saved", "ckpt_0000001.pt")):
        with pytest.raises(checkpoint.CheckpointError,
                           match=rf"holds a run \({held}\).*--overwrite=True"):
            checkpoint.check_out_dir(tmp_path / run, "scratch", False)
        checkpoint.check_out_dir(tmp_path / run, "scratch", True)
        checkpoint.check_out_dir(tmp_path / run, "resume", False)
    checkpoint.save(tmp_path / "saved", fake_state(2))   # `latest` again
    for name in ("ckpt_0000003.pt.tmp99999", "notes.txt.tmp99999", "notes.txt", "metrics.jsonl"):
        (tmp_path / "saved" / name).write_text("x")
    (tmp_path / "saved" / "ckpt_0000009.pt").mkdir()   # a folder: not a checkpoint, not removed
    checkpoint.open_run(tmp_path / "saved", "scratch").close()
    assert sorted(os.listdir(tmp_path / "saved")) == ["ckpt_0000009.pt", "lock", "notes.txt",
                                                      "notes.txt.tmp99999"]
    with pytest.raises(checkpoint.CheckpointError, match=r"cannot create .*notes.txt/run/lock "
                       r"\(Not a directory\): use another folder"):   # an out_dir under a file
        checkpoint.open_run(tmp_path / "saved" / "notes.txt" / "run", "scratch")


@pytest.mark.parametrize("first", [False, True])
def test_a_full_disk_names_the_file_and_what_latest_still_names(tmp_path, monkeypatch, first):
    """Mid-way through torch.save's zip writer; the first checkpoint has nothing to resume."""
    if not first:
        checkpoint.save(tmp_path, fake_state(1))
    before, written = sorted(os.listdir(tmp_path)), []

    class FullDisk(io.FileIO):   # its writes fail with ENOSPC after 100 bytes
        def write(self, b):
            written.append(len(b))
            if sum(written) > 100:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
            return super().write(b)
    monkeypatch.setattr(checkpoint, "open", lambda path, mode="r": FullDisk(path, mode)
                        if "w" in mode else open(path, mode), raising=False)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(tmp_path, fake_state(2))
    left = ("no checkpoint was saved: start again" if first else "the last good checkpoint is "
            f"{tmp_path}/ckpt_0000001.pt: resume from it with --init_from=resume")
    assert e.value.code == (f"error: cannot write {tmp_path}/ckpt_0000002.pt (the disk is full: "
                            f"free space); {left}"), e.value.code
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before   # no temporary file left, nothing else touched
