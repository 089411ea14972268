"""The promises of README's "Resuming and preemption", one test each: a kill leaves the previous
checkpoint; a NaN is never saved; SIGTERM saves and exits 0 (under DDP before torchrun kills); bad
input (data, checkpoints, a full disk, a second trainer) is one sentence; nothing outside the run
folder is touched. train.py in subprocesses, as a cluster runs it; checkpoint.py in-process."""
import errno
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import checkpoint
import dataset
import telemetry
from helpers import finish, make, records, start, train

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")


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


# ---- signals and kills --------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stop_signal_saves_the_step_exits_0_and_a_second_trainer_is_refused(workdir):
    """SIGTERM during the step-0 evaluation saves step 0, and the resume does not log that
    evaluation again; SIGTERM mid-run finishes the step, saves it and exits 0; meanwhile a second
    trainer on the folder is refused, naming the first."""
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
    p.send_signal(signal.SIGTERM)
    out = finish(p).stdout
    steps = len(records(workdir, "out_term", "train"))
    path, state = checkpoint.load_latest(workdir / "out_term")
    assert state["iter_num"] == steps and path.endswith(f"ckpt_{steps:07d}.pt")
    assert f"stop signal at step {steps}" in out, out
    assert [r["iter"] for r in records(workdir, "out_term", "eval")] == [0]


@pytest.mark.slow
def test_a_stop_signal_after_divergence_saves_no_nan_checkpoint(workdir):
    """log_interval too large to see the loss: the save itself checks the last loss and weights."""
    p = start(workdir, "--out_dir=out_nan", "--max_iters=100000", "--eval_interval=100000",
              "--log_interval=100000", "--learning_rate=1e30", "--warmup_iters=0")
    wait_for(lambda: catches_sigterm(p.pid))
    time.sleep(1.0)   # some steps at lr=1e30
    p.send_signal(signal.SIGTERM)
    last = last_line(finish(p, check=False))
    assert re.search(r"(training loss|a weight) is nan .* no checkpoint was saved", last), last
    assert not checkpoint.candidates(workdir / "out_nan")


@pytest.mark.slow
def test_ddp_stops_before_torchrun_kills_and_a_killed_rank_is_one_sentence(workdir):
    """torchrun forwards SIGTERM and SIGKILLs 30 s later: the processes agree every step, so the
    save comes within a step. A rank killed outright: the survivor says so in one sentence."""
    args = ["--gradient_accumulation_steps=2", "--max_iters=100000", "--eval_interval=100000",
            "--log_interval=100000"]
    p = start(workdir, "--out_dir=out_ddp_stop", *args, launcher=TORCHRUN)
    wait_for(lambda: os.path.exists(workdir / "out_ddp_stop" / "metrics.jsonl"))
    time.sleep(1.0)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=90)
    assert time.time() - t0 < 25 and "stop signal at step" in out, out + err
    assert "terminate called" not in err and p.returncode == 1   # torchrun's own exit code
    assert checkpoint.load_latest(workdir / "out_ddp_stop")[1]["iter_num"] > 0
    p = start(workdir, "--out_dir=out_ddp_kill", *args, launcher=TORCHRUN)
    wait_for(lambda: os.path.exists(workdir / "out_ddp_kill" / "metrics.jsonl"))
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout
    rank1 = next(int(k) for k in kids.split()
                 if b"RANK=1\0" in open(f"/proc/{k}/environ", "rb").read())
    os.kill(rank1, signal.SIGKILL)
    err = p.communicate(timeout=90)[1]
    assert ("error: another process of this job died" in err and "--init_from=resume" in err
            and "[rank0]: Traceback" not in err), err


@pytest.mark.slow
def test_sigkill_during_a_save_resumes_from_the_previous_complete_checkpoint(workdir):
    """A save every step of a model whose save takes a while: the kill lands as soon as a
    temporary checkpoint appears; `latest` still names the previous one, which resumes."""
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


# ---- train.py checks what it reads ---------------------------------------------------------------

@pytest.fixture(scope="module")
def two_made_once(workdir):
    train(workdir, "--out_dir=out_two_master", "--max_iters=4", "--eval_interval=2")
    return workdir / "out_two_master"


@pytest.fixture
def two_checkpoints(workdir, two_made_once):
    """A fresh copy of a 4-step run with checkpoints at steps 2 and 4, in out_two."""
    shutil.rmtree(workdir / "out_two", ignore_errors=True)
    shutil.copytree(two_made_once, workdir / "out_two", ignore=shutil.ignore_patterns("lock"))
    return workdir / "out_two"


def truncate(workdir, state, path):
    path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])


def swap_moments(workdir, state, path):   # was: munmap_chunk(), rc -6
    entries = state["optimizers"][0]["state"]
    a, b = "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight"
    entries[a], entries[b] = entries[b], entries[a]
    torch.save(state, path)


def rename_a_weight(workdir, state, path):   # as a later model.py might
    state["model"]["blocks.0.attn.qkv.g_in.gain"] = state["model"].pop("blocks.0.attn.qkv.g_in.g")
    torch.save(state, path)


def permute_the_vocabulary(workdir, state, path):   # a copy of data/tiny, its ids other characters
    perm = workdir / "data" / "tiny_perm"
    shutil.copytree(workdir / "data" / "tiny", perm, dirs_exist_ok=True)
    meta = json.loads((perm / "meta.json").read_text())
    (perm / "meta.json").write_text(json.dumps({**meta, "chars": meta["chars"][::-1]}))


RESUME_FAULTS = [   # (what is done to the newest checkpoint or the data, args, the sentence)
    (truncate, [], "is corrupt or not a checkpoint of this project (it does not load); resume "
                   "from an older one with --resume_fallback=True"),
    (swap_moments, [], "holds optimizer state that does not fit this model (blocks.0.attn.qkv."
                       "weight's exp_avg is (32, 32), not (96, 32))"),
    (rename_a_weight, [], "does not fit this model (missing blocks.0.attn.qkv.g_in.g"),
    (lambda w, s, p: None, ["--n_embd=64", "--sv_hetero=True", "--optimizer=muon"],
     "mismatched keys (checkpoint, requested): n_embd=(32, 64), sv_hetero=(False, True)"),
    (permute_the_vocabulary, ["--dataset=tiny_perm"],
     "was trained on another vocabulary than data/tiny_perm/meta.json now holds"),
    # a diverging loss: nothing saved after it, the last good checkpoint named
    (lambda w, s, p: None, ["--learning_rate=1e30", "--warmup_iters=0", "--grad_clip=0"],
     "; the last good checkpoint is out_two/ckpt_0000004.pt: resume from it")]


@pytest.mark.slow
@pytest.mark.parametrize("fault, args, message", RESUME_FAULTS, ids=lambda x: getattr(
    x, "__name__", None) if callable(x) else None)
def test_a_resume_refuses_what_it_cannot_continue_in_one_sentence(workdir, two_checkpoints,
                                                                    fault, args, message):
    """The newest checkpoint stays as it was, and `latest` names it."""
    path = Path(checkpoint.candidates(two_checkpoints)[0])
    fault(workdir, torch.load(path, weights_only=True) if fault is not truncate else None, path)
    kept = path.read_bytes()
    p = train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2",
              "--init_from=resume", *args, check=False)
    assert message in last_line(p) and os.path.basename(path) in last_line(p), last_line(p)
    assert path.read_bytes() == kept and checkpoint.candidates(two_checkpoints)[0] == str(path)
    if fault is truncate:   # the fallback is opt-in, and gets past it
        train(workdir, "--out_dir=out_two", "--max_iters=6", "--eval_interval=2",
              "--init_from=resume", "--resume_fallback=True")
        assert checkpoint.load_latest(two_checkpoints)[1]["iter_num"] == 6


@pytest.mark.slow
def test_overwrite_replaces_a_run_and_a_new_global_batch_is_one_warning(workdir, two_checkpoints):
    p = train(workdir, "--out_dir=out_two", "--init_from=resume", "--max_iters=5",
              "--eval_interval=5", "--batch_size=8")
    assert "trained with 64 tokens per iteration, this run uses 128" in p.stdout, p.stdout
    train(workdir, "--out_dir=out_two", "--overwrite=True", "--max_iters=2", "--eval_interval=2")
    assert checkpoint.checkpoints(two_checkpoints) == [str(two_checkpoints / "ckpt_0000002.pt")]
    assert [r["iter"] for r in records(workdir, "out_two", "train")] == [1, 2]


@pytest.mark.slow
def test_a_token_file_cut_short_under_a_running_trainer_is_one_sentence(workdir):
    data = workdir / "data" / "tiny_cut"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(workdir / "data" / "tiny", data)
    p = start(workdir, "--dataset=tiny_cut", "--out_dir=out_cut", "--max_iters=100000",
              "--eval_interval=3")
    wait_for(lambda: checkpoint.candidates(workdir / "out_cut"))
    with open(data / "train.bin", "r+b") as f:   # cut mid-token, as a copy in progress would be
        f.truncate(os.path.getsize(data / "train.bin") // 2 + 1)
    assert last_line(finish(p, check=False)).startswith(
        f"error: {os.path.join('data', 'tiny_cut', 'train.bin')} changed under the running trainer")
    assert checkpoint.load_latest(workdir / "out_cut")[1]["iter_num"] % 3 == 0   # `latest` intact


def test_a_token_file_cut_short_during_the_start_up_check_is_one_sentence(tmp_path, monkeypatch):
    """Issue 31.3: a memmap died of SIGBUS; the check reads with pread, so a file cut between two
    of its reads is a short read and one sentence."""
    path = tmp_path / "train.bin"
    np.zeros((1 << 22) + 1000, dtype=np.uint16).tofile(path)   # two of the check's 4M-token reads
    check, cuts = dataset.TokenFile.check_ids, []

    def check_then_cut(self, ids):   # a copy still in progress, or a second prepare_data.py
        check(self, ids)
        cuts.append(cuts or os.truncate(path, 2000))
    monkeypatch.setattr(dataset.TokenFile, "check_ids", check_then_cut)
    with pytest.raises(SystemExit, match="changed under the running trainer") as e:
        dataset.TokenFile(path, 16, 65)
    assert cuts and "--init_from=resume" in str(e.value.code)


# ---- checkpoint.py and the run folder, in-process -----------------------------------------------

def fake_state(step, **change):
    return {"model": {"w": torch.full((4,), float(step))}, "optimizers": [], "model_args": {},
            "config": {}, "iter_num": step, "best_val_loss": 1.0, **change}


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


BAD_FILES = {   # what a file holds -> what the sentence says of it
    "legacy_truncated": "it does not load", "random_bytes": "it does not load",
    "text": "it does not load", "empty": "it does not load", "a_tensor": "a Tensor, not a dict",
    "no_keys": "optimizers is NoneType", "config_list": "config is list",
    "iter_str": "iter_num is str '20'", "iter_bool": "iter_num is bool",
    "iter_negative": "iter_num below 0", "float_weight": "model's w is not a floating-point",
    "int_weights": "model's w is not a floating-point tensor", "mixed": "its weights mix",
    "pickle": "holds Python objects that weights_only loading refuses",
    "nan_weights": "holds non-finite weights (w)"}   # never the last good checkpoint


def write_bad(kind, path):
    raw = {"random_bytes": random.Random(0).randbytes(5000), "text": b"hello world\n" * 100,
           "empty": b""}
    if kind in raw:
        return path.write_bytes(raw[kind])
    if kind == "legacy_truncated":   # torch.save's pre-zip format, cut short
        torch.save(fake_state(1), path, _use_new_zipfile_serialization=False)
        return path.write_bytes(path.read_bytes()[:200])
    weights = {"float_weight": {"w": 1.0}, "int_weights": {"w": (torch.ones(4) * 1000).long()},
               "mixed": {"w": torch.ones(4), "v": torch.ones(2, dtype=torch.float64)},
               "nan_weights": {"w": torch.tensor([1.0, float("nan")])}}
    states = {"a_tensor": torch.ones(3), "no_keys": {"model": {}},
              "config_list": fake_state(2, config=[]), "iter_str": fake_state(2, iter_num="20"),
              "iter_bool": fake_state(2, iter_num=True),
              "iter_negative": fake_state(2, iter_num=-1), "pickle": fake_state(2, extra=Evil())}
    torch.save(states[kind] if kind in states else fake_state(2, model=weights[kind]), path)


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_file_that_is_not_a_checkpoint_is_one_sentence_and_fallback_gets_past_it(tmp_path,
                                                                                    kind):
    checkpoint.save(tmp_path, fake_state(1), 1)
    write_bad(kind, tmp_path / "ckpt_0000002.pt")
    (tmp_path / "latest").write_text("ckpt_0000002.pt")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_latest(tmp_path)
    assert BAD_FILES[kind] in str(e.value) and "ckpt_0000002.pt" in str(e.value), str(e.value)
    assert "--resume_fallback" in str(e.value) or kind == "pickle"
    assert checkpoint.load_latest(tmp_path, fallback=True)[1]["iter_num"] == 1


@pytest.mark.parametrize("held", ["../victim/ckpt_0000020.pt", "/tmp/ckpt_0000020.pt",
                                  "notes.txt", "a folder", b"\xff\xfe"])
def test_latest_must_name_a_checkpoint_of_its_own_folder(tmp_path, held):
    """Issue 39.10: `latest` naming ../victim/ckpt_0000020.pt was followed into another run."""
    (tmp_path / "victim").mkdir()
    checkpoint.save(tmp_path / "victim", fake_state(20), 20)
    run, latest = tmp_path / "run", tmp_path / "run" / "latest"
    checkpoint.save(run, fake_state(1), 1)
    os.remove(latest)
    latest.mkdir() if held == "a folder" else latest.write_bytes(
        held if isinstance(held, bytes) else held.encode())
    with pytest.raises(checkpoint.CheckpointError, match="not the name of a checkpoint in its"):
        checkpoint.load_latest(run)


def test_keep_last_k_counts_by_iteration_this_run_only_and_touches_only_its_folder(tmp_path):
    """An older run's higher-numbered checkpoints take no slot; past 9,999,999 iterations the
    order is by number; a folder named with glob characters (g[1]) is only itself."""
    for step in (100, 200):
        torch.save(fake_state(step), tmp_path / f"ckpt_{step:07d}.pt")
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, fake_state(step), step, keep=2)
    assert ([os.path.basename(p) for p in checkpoint.checkpoints(tmp_path)]
            == ["ckpt_0000002.pt", "ckpt_0000003.pt", "ckpt_0000100.pt", "ckpt_0000200.pt"])
    assert checkpoint.candidates(tmp_path)[:2] == [str(tmp_path / f"ckpt_000000{i}.pt")
                                                   for i in (3, 2)]
    for odd, other in (("g[1]", "g1"), ("x*", "xy")):
        for step in (9_999_999, 10_000_000, 10_000_001):
            checkpoint.save(tmp_path / other, fake_state(step), step, keep=5)
            checkpoint.save(tmp_path / odd, fake_state(step), step, keep=2)
        assert len(checkpoint.checkpoints(tmp_path / other)) == 3
        assert [checkpoint.step_of(p) for p in checkpoint.checkpoints(tmp_path / odd)] == [
            10_000_000, 10_000_001]


def test_a_scratch_run_replaces_a_run_only_when_told_and_removes_only_its_own_names(tmp_path):
    """Issue 39.1: a folder holding only a run's metrics.jsonl (it stopped before its first
    checkpoint) holds a run as one with checkpoints does. Told, open_run removes exactly the
    run's checkpoints, `latest`, metrics and a dead writer's temporary checkpoint."""
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="is a file"):
        checkpoint.check_out_dir(tmp_path / "a_file", "resume", False)
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
    lock = checkpoint.open_run(tmp_path / "saved", "scratch")
    assert sorted(os.listdir(tmp_path / "saved")) == ["lock", "notes.txt", "notes.txt.tmp99999"]
    assert (tmp_path / "saved" / "lock").read_text() == str(os.getpid())
    lock.close()


def test_the_lock_and_metrics_are_never_written_through_a_link(tmp_path):
    """A symbolic link points anywhere, a hard link (a run copied with `cp -al`) is another run's
    file: both refused in one sentence, the other file untouched."""
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


class FullDisk(io.FileIO):
    """A file whose writes fail with ENOSPC after `room` bytes, as on a full disk."""
    room = 0

    def write(self, b):
        FullDisk.room -= len(b)
        if FullDisk.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


@pytest.mark.parametrize("room", [100, 0])   # mid-way through torch.save's zip writer / at once
def test_a_full_disk_is_one_sentence_and_latest_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, room):
    checkpoint.save(tmp_path, fake_state(1), 1)
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setattr(FullDisk, "room", room)
    monkeypatch.setattr(checkpoint, "open", lambda path, mode="r": FullDisk(path, mode)
                        if "w" in mode else open(path, mode), raising=False)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(tmp_path, fake_state(2), 2)
    assert ("ckpt_0000002.pt" in str(e.value) and "errno 28, the disk is full" in str(e.value)
            and "still names ckpt_0000001.pt" in str(e.value)), str(e.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before   # no temporary file left, nothing else touched


@pytest.mark.parametrize("code, advice", [(errno.EROFS, "read-only: use another out_dir"),
                                          (errno.ENOTDIR, "a file stands where a folder must"),
                                          (errno.ENOSPC, "the disk is full")])
def test_a_failed_write_names_the_path_that_failed_and_advice_for_its_errno(tmp_path, code,
                                                                             advice):
    """Issue 39.6: every failure blamed metrics.jsonl and advised freeing space."""
    e = OSError(code, os.strerror(code), str(tmp_path / "wandb"))
    msg = checkpoint.write_error(tmp_path / "metrics.jsonl", e, tmp_path)
    assert msg.startswith(f"cannot write {tmp_path / 'wandb'} (errno {code}, ") and advice in msg


def test_wandb_that_cannot_start_is_one_sentence(tmp_path, monkeypatch):
    """Issue 39.5: online without an API key, wandb.init raised UsageError after 22 s."""
    class UsageError(Exception):
        pass
    fake = type(sys)("wandb")
    fake.init = lambda **kw: (_ for _ in ()).throw(UsageError("api_key not configured (no-tty)"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(SystemExit, match=r"wandb could not start \(api_key not configured.*"
                                         r"`wandb login`.*WANDB_MODE=offline"):
        telemetry.RunLog(tmp_path, wandb={"project": "p"})


def test_resume_drops_a_torn_metrics_line_and_what_came_after_the_checkpoint(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "train", "iter": i}) + "\n" for i in (1, 2, 3))
                    + '{"kind": "tr')
    telemetry.trim_metrics(path, 2)
    assert [r["iter"] for r in telemetry.read_metrics(path)[0]] == [1, 2]
    assert "dropped 1 line(s)" in capsys.readouterr().out
    mtime = path.stat().st_mtime_ns
    telemetry.trim_metrics(path, 2)   # nothing to drop: nothing written (a resume on a full disk)
    assert path.stat().st_mtime_ns == mtime


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


def test_a_checkpoint_without_a_vocabulary_record_resumes_only_on_its_own_dataset():
    """Issue 31.11: without the record, the dataset its config names is the only one it resumes
    on; with it, the record decides (a dataset renamed is the same vocabulary)."""
    ckpt = {"model_args": {}, "iter_num": 4,
            "config": {"optimizer": "adamw", "dataset": "tiny", "gradient_accumulation_steps": 1,
                       "batch_size": 4, "block_size": 16}}
    vocab = {"tokenizer": "char", "vocab_size": 3, "chars": "abc"}
    config = {"optimizer": "adamw", "max_iters": 8}
    notes = checkpoint.check_resume("ckpt.pt", ckpt, {**config, "dataset": "tiny"}, {}, vocab, 64)
    assert notes == ["resuming from ckpt.pt at iteration 4"]
    with pytest.raises(checkpoint.CheckpointError, match="trained on another vocabulary"):
        checkpoint.check_resume("ckpt.pt", ckpt, {**config, "dataset": "tiny2"}, {}, vocab, 64)
    assert checkpoint.check_resume("ckpt.pt", {**ckpt, "vocab": vocab},
                                   {**config, "dataset": "tiny2"}, {}, vocab, 64) == notes
