"""README's "Resuming and preemption", one test per promise: train.py in subprocesses as a cluster
runs it (signals, kills); checkpoint.py, dataset.py, telemetry.py in-process."""
import errno
import io
import os
import re
import signal
import time

import numpy as np
import pytest
import torch

import checkpoint
import dataset
import telemetry
from helpers import finish, make, records, start, train


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


def last_line(p):
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    return p.stderr.strip().splitlines()[-1]


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
    second = train(workdir, "--out_dir=out_term", "--overwrite=True", check=False)
    assert f"out_dir out_term is in use by another process (pid {p.pid})" in last_line(second)
    p.send_signal(signal.SIGINT)
    out = finish(p).stdout
    steps = len(records(workdir, "out_term", "train"))
    path, state = checkpoint.load_latest(workdir / "out_term")
    assert state["iter_num"] == steps and path.endswith(f"ckpt_{steps:07d}.pt")
    assert f"stop signal at step {steps}" in out, out
    assert [r["iter"] for r in records(workdir, "out_term", "eval")] == [0]
    good = checkpoint.checkpoints(workdir / "out_term")
    for more, named in (("--out_dir=out_nan", "no checkpoint was saved"), (
            "--init_from=resume", f"the last good checkpoint is {os.path.relpath(path, workdir)}: "
            "resume from it")):
        p = start(workdir, *run, more, "--eval_iters=2", "--log_interval=100000",
                  "--learning_rate=1e30", "--warmup_iters=0")
        wait_for(lambda: catches_sigterm(p.pid))
        time.sleep(1.0)   # some steps at lr=1e30
        p.send_signal(signal.SIGTERM)
        last = last_line(finish(p, check=False))
        assert re.search(r"(training loss|a weight) is nan at step \d+; ", last), last
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
    wait_for(lambda: checkpoint.candidates(out) and any(map(tmp.fullmatch, os.listdir(out))),
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


# ---- checkpoint.py, dataset.py and telemetry.py, in-process ------------------------------------

def test_a_token_file_cut_short_at_start_up_or_under_a_running_trainer_is_one_sentence(
        tmp_path, monkeypatch):
    """Issue 31.3: a memmap died of SIGBUS. Reads are preads: a file cut between two reads of the
    start-up check is a short read; one cut later fails len(), which train.py asks every batch."""
    path = tmp_path / "train.bin"
    np.zeros((1 << 22) + 1000, dtype=np.uint16).tofile(path)   # two of the check's 4M-token reads
    running = dataset.TokenFile(path, 16, 65)
    os.truncate(path, 3001)   # mid-token, as a copy in progress would be
    with pytest.raises(SystemExit, match="changed under the running trainer"):
        len(running)
    np.zeros((1 << 22) + 1000, dtype=np.uint16).tofile(path)
    check, cuts = dataset.TokenFile.check_ids, []

    def check_then_cut(self, ids):   # a copy still in progress, or a second prepare_data.py
        check(self, ids)
        cuts.append(cuts or os.truncate(path, 2000))
    monkeypatch.setattr(dataset.TokenFile, "check_ids", check_then_cut)
    with pytest.raises(SystemExit, match="changed under the running trainer") as e:
        dataset.TokenFile(path, 16, 65)
    assert cuts and "--init_from=resume" in str(e.value.code)


def fake_state(step, **change):
    return {"model": {"w": torch.full((4,), float(step))}, "optimizers": [], "model_args": {},
            "config": {}, "iter_num": step, "best_val_loss": 1.0, "vocab": {}, **change}


LEGACY = io.BytesIO()   # torch.save's pre-zip format, cut short in BAD_FILES
torch.save(fake_state(1), LEGACY, _use_new_zipfile_serialization=False)
BAD_FILES = {   # name: (the bytes of the file, or what torch.save writes; what the sentence says)
    "legacy_truncated": (LEGACY.getvalue()[:200], "it does not load"),
    "binary": (bytes(range(256)) * 20, "it does not load"), "empty": (b"", "it does not load"),
    "a_tensor": (torch.ones(3), "a Tensor, not a dict"),
    "no_keys": ({"model": {}}, "optimizers is NoneType"),
    "config_list": (fake_state(2, config=[]), "config is list"),
    "iter_str": (fake_state(2, iter_num="20"), "iter_num is str '20'"),
    "iter_bool": (fake_state(2, iter_num=True), "iter_num is bool"),
    "iter_negative": (fake_state(2, iter_num=-1), "iter_num below 0"),
    "float_weight": (fake_state(2, model={"w": 1.0}), "model's w is not a floating-point"),
    "int_weights": (fake_state(2, model={"w": (torch.ones(4) * 1000).long()}),
                    "model's w is not a floating-point tensor"),
    "mixed": (fake_state(2, model={"w": torch.ones(4), "v": torch.ones(2, dtype=torch.float64)}),
              "its weights mix"),
    "pickle": (fake_state(2, extra=os.system),   # a global: what a pickle that runs code needs
               "holds Python objects that weights_only loading refuses"),
    "nan_weights": (fake_state(2, model={"w": torch.tensor([1.0, float("nan")])}),
                    "holds non-finite weights (w)")}   # never the last good checkpoint


@pytest.mark.parametrize("held, sentence", BAD_FILES.values(), ids=BAD_FILES)
def test_a_file_that_is_not_a_checkpoint_is_one_sentence_and_fallback_gets_past_it(tmp_path, held,
                                                                                    sentence):
    checkpoint.save(tmp_path, fake_state(1), 1)
    if isinstance(held, bytes):
        (tmp_path / "ckpt_0000002.pt").write_bytes(held)
    else:
        torch.save(held, tmp_path / "ckpt_0000002.pt")
    (tmp_path / "latest").write_text("ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_latest(tmp_path)
    assert sentence in str(e.value) and "ckpt_0000002.pt" in str(e.value), str(e.value)
    assert "--resume_fallback" in str(e.value) or "weights_only" in sentence   # a pickle: tampered
    assert checkpoint.load_latest(tmp_path, fallback=True)[1]["iter_num"] == 1


@pytest.mark.parametrize("held", ["../victim/ckpt_0000020.pt", "/tmp/ckpt_0000020.pt",
                                  "notes.txt", "a folder", b"\xff\xfe"])
def test_latest_must_name_a_checkpoint_of_its_own_folder(tmp_path, held):
    """Issue 39.10: `latest` naming ../victim/ckpt_0000020.pt was followed into another run."""
    checkpoint.save(tmp_path / "victim", fake_state(20), 20)
    run, latest = tmp_path / "run", tmp_path / "run" / "latest"
    checkpoint.save(run, fake_state(1), 1)
    os.remove(latest)
    latest.mkdir() if held == "a folder" else latest.write_bytes(
        held if isinstance(held, bytes) else held.encode())
    with pytest.raises(checkpoint.CheckpointError, match="not the name of a checkpoint in its"):
        checkpoint.load_latest(run)


def test_a_run_folder_loses_only_its_own_files_and_a_run_only_when_told(tmp_path):
    """keep_checkpoints counts this run's by iteration (an older run's take no slot; a folder named
    g[1] is only itself). Issue 39.1: a folder with only a run's metrics.jsonl holds a run too."""
    for step in (100, 200):
        torch.save(fake_state(step), tmp_path / f"ckpt_{step:07d}.pt")
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, fake_state(step), step, keep=2)
    assert ([os.path.basename(p) for p in checkpoint.checkpoints(tmp_path)]
            == ["ckpt_0000002.pt", "ckpt_0000003.pt", "ckpt_0000100.pt", "ckpt_0000200.pt"])
    assert checkpoint.candidates(tmp_path)[:2] == [str(tmp_path / f"ckpt_000000{i}.pt")
                                                   for i in (3, 2)]
    for step in (9_999_999, 10_000_000, 10_000_001):   # past 7 digits: by number
        checkpoint.save(tmp_path / "g1", fake_state(step), step, keep=5)
        checkpoint.save(tmp_path / "g[1]", fake_state(step), step, keep=2)   # as a glob: g1 too
    assert len(checkpoint.checkpoints(tmp_path / "g1")) == 3
    assert [checkpoint.step_of(p) for p in checkpoint.checkpoints(tmp_path / "g[1]")] == [
        10_000_000, 10_000_001]
    (tmp_path / "logged").mkdir()
    (tmp_path / "logged" / "metrics.jsonl").write_text('{"kind": "eval", "iter": 0}\n')
    checkpoint.save(tmp_path / "saved", fake_state(1), 1)
    os.remove(tmp_path / "saved" / "latest")   # removed by hand: the checkpoints still count
    for run, held in (("logged", "metrics.jsonl"), ("saved", "ckpt_0000001.pt")):
        with pytest.raises(checkpoint.CheckpointError,
                           match=rf"holds a run \({held}\).*--overwrite=True"):
            checkpoint.check_out_dir(tmp_path / run, "scratch", False)
        checkpoint.check_out_dir(tmp_path / run, "scratch", True)
        checkpoint.check_out_dir(tmp_path / run, "resume", False)
    checkpoint.save(tmp_path / "saved", fake_state(2), 2)   # `latest` again
    for name in ("ckpt_0000003.pt.tmp99999", "notes.txt.tmp99999", "notes.txt", "metrics.jsonl"):
        (tmp_path / "saved" / name).write_text("x")
    checkpoint.open_run(tmp_path / "saved", "scratch").close()
    assert sorted(os.listdir(tmp_path / "saved")) == ["lock", "notes.txt", "notes.txt.tmp99999"]


def test_the_lock_and_metrics_are_never_written_through_a_link(tmp_path):
    """A symbolic link points anywhere; a hard link (a run copied with `cp -al`) is another's."""
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    for name, link, why in (("lock", os.symlink, "is a symbolic link"),
                            ("metrics.jsonl", os.link, "is hard-linked with another file")):
        run = tmp_path / name
        run.mkdir()
        link(precious, run / name)
        with pytest.raises(checkpoint.CheckpointError, match=why):
            checkpoint.open_run(run, "resume") if name == "lock" else telemetry.RunLog(run)
    assert precious.read_text() == "keep me"


@pytest.mark.parametrize("room, code, advice", [
    (100, errno.ENOSPC, "the disk is full"),   # mid-way through torch.save's zip writer
    (0, errno.EROFS, "read-only: use another out_dir"),   # at once
    (0, errno.ENOTDIR, "a file stands where a folder must")])
def test_a_failed_write_names_its_file_and_errno_and_latest_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, room, code, advice):
    """Issue 39.6: every failure blamed metrics.jsonl (not the file that failed, here the temporary
    one) and advised freeing space."""
    checkpoint.save(tmp_path, fake_state(1), 1)
    before, written = sorted(os.listdir(tmp_path)), []

    class FullDisk(io.FileIO):   # its writes fail with errno `code` after `room` bytes
        def write(self, b):
            written.append(len(b))
            if sum(written) > room:
                raise OSError(code, os.strerror(code), self.name)
            return super().write(b)
    monkeypatch.setattr(checkpoint, "open", lambda path, mode="r": FullDisk(path, mode)
                        if "w" in mode else open(path, mode), raising=False)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(tmp_path, fake_state(2), 2)
    failed = tmp_path / f"ckpt_0000002.pt.tmp{os.getpid()}"
    assert (str(e.value).startswith(f"cannot write {failed} (errno {code}, ") and advice in
            str(e.value) and "still names ckpt_0000001.pt" in str(e.value)), str(e.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before   # no temporary file left, nothing else touched


def test_optimizer_state_is_restored_by_name_and_checked_against_its_parameters():
    """A state of another shape would crash the fused AdamW; a swapped one of the same shape would
    resume silently with the wrong moments; none past step 0, with fresh ones."""
    model = make()
    names = {p: n for n, p in model.named_parameters()}
    fresh = lambda: torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)   # noqa: E731
    opt = fresh()
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    opt.step()
    saved = checkpoint.optimizer_state(opt, names)
    restored = fresh()
    restored.param_groups[0]["lr"] = 5e-4   # this run's config, not the checkpoint's
    checkpoint.restore_optimizers([restored], [saved], names, "ckpt.pt", iter_num=1)
    w = model.wte.weight
    assert torch.equal(restored.state[w]["exp_avg"], opt.state[w]["exp_avg"])
    assert restored.param_groups[0]["lr"] == 5e-4
    moments = saved["state"]
    a, b = "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight"
    for state, why in (({**moments, a: moments[b], b: moments[a]}, f"{a}'s exp_avg is"),
                       ({**moments, "blocks.9.x": moments[a]}, "a state for blocks.9.x"),
                       ({}, "no moments of wte.weight at iteration 20")):
        with pytest.raises(checkpoint.CheckpointError,
                           match=f"ckpt.pt holds optimizer state that does not fit .*{why}"):
            checkpoint.restore_optimizers([fresh()], [{**saved, "state": state}], names,
                                          "ckpt.pt", iter_num=20)
    checkpoint.restore_optimizers([fresh()], [{**saved, "state": {}}], names, "ckpt.pt", 0)
    with pytest.raises(checkpoint.CheckpointError, match="2 optimizers"):
        checkpoint.restore_optimizers([fresh()], [saved, saved], names, "ckpt.pt", iter_num=1)
