"""
Checkpoints and the run folder (out_dir). A record is written to a temporary name, fsynced and
renamed, a checkpoint before the `latest` that names it, so a kill at any moment leaves the last
one whole; checkpoints load with weights_only=True; one trainer at a time holds out_dir/lock.
"""
import errno
import fcntl
import math
import os
import re

import torch

from model import GPT, GPTConfig

CKPT = re.compile(r"ckpt_(\d{7,})\.pt")   # the only checkpoint names train.py writes
TEMPORARY = re.compile(r"(ckpt_\d{7,}\.pt|latest|metrics\.jsonl)\.tmp\d+")   # atomic_write's
KEYS = {"model": dict, "optimizers": list, "model_args": dict, "config": dict, "iter_num": int,
        "best_val_loss": float, "vocab": dict}   # what train.py saves, of these types


class CheckpointError(SystemExit):
    """A bad checkpoint or run folder: a SystemExit, so uncaught it ends a script in a sentence."""

    def __init__(self, sentence):
        super().__init__(f"error: {sentence}")


def step_of(path):
    """The iteration in a checkpoint's name (ckpt_0000250.pt -> 250); None for another file."""
    m = CKPT.fullmatch(os.path.basename(path))
    return int(m.group(1)) if m else None


def checkpoints(out_dir):
    """out_dir's checkpoint files, oldest first."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    paths = [os.path.join(out_dir, n) for n in names if step_of(n) is not None]
    return sorted(filter(os.path.isfile, paths), key=step_of)


def latest_name(out_dir):
    """The checkpoint `latest` names (ckpt_NNNNNNN.pt), None without a `latest`."""
    path = os.path.join(out_dir, "latest")
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        name = f.read(64).decode(errors="replace").strip()
    if not CKPT.fullmatch(name):
        raise CheckpointError(f"{path} does not name a checkpoint (ckpt_NNNNNNN.pt): remove it "
                              "to use the newest checkpoint of its folder")
    return name


def last_good(out_dir, advice="resume from it with --init_from=resume"):
    """Where a run that failed now can go on from, for its one sentence."""
    name = latest_name(out_dir)
    return (f"the last good checkpoint is {os.path.join(out_dir, name)}: {advice}" if name
            else "no checkpoint was saved: start again")


def check_finite(what, value, step, out_dir):
    """A NaN or inf loss ends the run in one sentence, and nothing after it is saved."""
    if not math.isfinite(value):
        raise CheckpointError(f"{what} is {value} at step {step}; " + last_good(
            out_dir, "resume from it with --init_from=resume and a lower learning_rate"))


def atomic_write(path, write):
    """Write `path` by write(f) to a temporary name, fsync, rename: a crash leaves the old file or
    the new one, whole. Every record a later run trusts is written so."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)   # the rename, durable
        os.fsync(folder), os.close(folder)
    except (OSError, RuntimeError) as e:   # RuntimeError: torch.save's zip writer around it
        while not isinstance(e, OSError) and e.__context__ is not None:
            e = e.__context__
        why = ("the disk is full: free space" if getattr(e, "errno", 0) in (errno.ENOSPC,
               errno.EDQUOT) else e)
        raise CheckpointError(f"cannot write {path} ({why}); {last_good(os.path.dirname(path))}"
                              ) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def nonfinite(state):
    """The first non-finite tensor of a checkpoint's weights and moments (its name), or None. A
    moment is named by its parameter where the optimizer kept the names (model.param_groups)."""
    moments = [(f"{names.get(i, f'parameter {i}')}'s optimizer moments", v)
               for opt in state["optimizers"] for names in [param_names(opt)]
               for i, s in opt.get("state", {}).items() for v in s.values()]
    return next((name for name, t in [*state["model"].items(), *moments]
                 if isinstance(t, torch.Tensor) and not t.isfinite().all()), None)


def param_names(opt):
    """{index: parameter name} of an optimizer's state dict (torch keeps the names it was given)."""
    return {i: name for g in opt.get("param_groups", [])
            for i, name in zip(g["params"], g.get("param_names", ()))}


def save(out_dir, state, keep=3):
    """Write out_dir/ckpt_<iter>.pt, point `latest` at it, keep this run's newest `keep`. A
    non-finite weight or moment is never saved: a diverged model must not become `latest`."""
    it, bad = state["iter_num"], nonfinite(state)
    if bad:
        raise CheckpointError(f"{bad} is not finite at step {it}, so it is not saved; "
                              + last_good(out_dir, "resume from it with a lower learning_rate"))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name := f"ckpt_{it:07d}.pt")
    atomic_write(path, lambda f: torch.save(state, f))
    atomic_write(os.path.join(out_dir, "latest"), lambda f: f.write(name.encode()))
    for old in [p for p in checkpoints(out_dir) if step_of(p) <= it][:-max(keep, 1)]:
        os.remove(old)
    return path


def load(path):
    """A checkpoint of this project, by torch.load(weights_only=True), or one sentence."""
    before = [p for p in checkpoints(os.path.dirname(path)) if step_of(p) < (step_of(path) or 0)]
    instead = f"move it and `latest` away to use {before[-1]}" if before else "start again"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        wrong = [f"its {k!r} is {type(state[k]).__name__}, not {t.__name__}" if k in state
                 else f"no {k!r} key" for k, t in KEYS.items()
                 if not isinstance(state.get(k), t)] if isinstance(state, dict) else ["not a dict"]
        bad = None if wrong else nonfinite(state)   # (edited, or older code): never "good"
        why = wrong[0] if wrong else bad and f"a non-finite {bad}: it diverged"
    except Exception as e:   # torch.load raises a dozen types for a bad file
        why = "objects weights_only refuses" if "GLOBAL" in str(e) else "it does not load"
    if why:
        raise CheckpointError(f"checkpoint {path} is not one to go on from ({why}): {instead}")
    return state


def load_latest(out_dir):
    """(path, state) of the checkpoint `latest` names, else of the newest (named once complete)."""
    name, found = latest_name(out_dir), checkpoints(out_dir)
    relative = "a relative out_dir is read from the working directory, not the repository's"
    if not os.path.exists(out_dir):   # a folder missing is no reason to train again
        raise CheckpointError(f"out_dir {os.path.abspath(out_dir)} does not exist ({relative}): "
                              "run where train.py ran, or give --out_dir the run's path")
    if not name and not found:
        raise CheckpointError(f"no checkpoint in {os.path.abspath(out_dir)} ({relative}): give "
                              "--out_dir a run's folder, or train one there first")
    path = os.path.join(out_dir, name) if name else found[-1]
    if not os.path.isfile(path):
        raise CheckpointError(f"{out_dir}/latest names {name}, which is gone: remove it to use the"
                              f" newest checkpoint there ({found[-1] if found else 'none'})")
    return path, load(path)


def restore(model, optimizers, state, path):
    """Weights and moments into this run's model and optimizers, which keep its hyperparameters."""
    try:
        model.load_state_dict(state["model"])
        for opt, saved in zip(optimizers, state["optimizers"], strict=True):
            own = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            opt.load_state_dict(saved)
            for group, mine in zip(opt.param_groups, own):
                group.update(mine)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model ("
                              f"{' '.join(str(e).split())[:160]}): use its config and model.py, "
                              "or train into a new out_dir") from None


def load_model(out_dir):
    """(path, state, model): out_dir's newest checkpoint in a GPT of its model_args and dtype."""
    path, state = load_latest(out_dir)
    try:
        model = GPT(GPTConfig(**state["model_args"]))
        model.to(next(iter(state["model"].values())).dtype).load_state_dict(state["model"])
    except (TypeError, ValueError, RuntimeError) as e:   # another version of model.py
        raise CheckpointError(f"checkpoint {path} does not fit this model.py ("
                              f"{' '.join(str(e).split())[:160]})") from None
    return path, state, model


def check_resume(path, ckpt, config, model_args, vocab):
    """A resume goes on with the checkpoint's model, optimizer and vocabulary: the line to say."""
    saved = {**ckpt["model_args"], "optimizer": ckpt["config"].get("optimizer")}
    differ = [f"{k}=({saved.get(k)!r}, {v!r})" for k, v in
              {**model_args, "optimizer": config["optimizer"]}.items() if saved.get(k) != v]
    if differ:
        raise CheckpointError(f"{path} was trained with a different model or optimizer; "
                              f"mismatched keys (checkpoint, requested): {', '.join(differ)}")
    if ckpt["vocab"] != vocab:
        raise CheckpointError(f"{path} was trained on another vocabulary than data/"
                              f"{config['dataset']}/meta.json holds: prepare it as it was")
    done = ckpt["iter_num"] >= config["max_iters"]   # e.g. a requeued job whose run had finished
    return f"resuming from {path} at iteration {ckpt['iter_num']}" + (
        " = max_iters: nothing to train (raise --max_iters to go on)" if done else "")


# ---- the run folder -----------------------------------------------------------------------------

def check_out_dir(out_dir, init_from, overwrite):
    """Before anything is written, the way this trainer starts: a resume with no checkpoint to go
    on from starts from scratch (so a requeue runs one command in every state of its run); a
    scratch run replaces a run only with --overwrite=True; a folder a trainer holds is refused."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CheckpointError(f"out_dir {out_dir} is a file, not a folder: pick another --out_dir")
    check_free(os.path.join(out_dir, "lock"), f"out_dir {out_dir}")   # before any advice
    held = [os.path.basename(p) for p in checkpoints(out_dir)]
    if init_from == "resume" and not held:
        if os.environ.get("RANK", "0") == "0":   # torchrun's: one line, not one per process
            print(f"no checkpoint in {os.path.abspath(out_dir)}: starting from scratch")
        return "scratch"
    held += ["metrics.jsonl"] * os.path.isfile(os.path.join(out_dir, "metrics.jsonl"))
    if init_from == "scratch" and not overwrite and held:
        raise CheckpointError(f"out_dir {out_dir} holds a run ({held[0]}): go on with "
                              "--init_from=resume, or replace it with --overwrite=True")
    return init_from


IN_USE = ("{what} is in use by another process (pid {pid}): wait for it to end or stop it, or use "
          "another folder")


def check_free(path, what):
    """While a process holds `path` locked (hold_lock), one sentence naming `what` and its pid;
    else nothing (it only reads)."""
    try:
        f = open(path)
    except OSError:
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(IN_USE.format(what=what, pid=f.read().strip())) from None


def hold_lock(path, what):
    """Hold `path` locked while the returned file is open (or the process lives); a second holder
    gets one sentence naming `what` and the first one's pid."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        f = open(path, "a+")
    except OSError as e:
        raise CheckpointError(f"cannot create {path} ({e.strerror}): use another folder") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise CheckpointError(IN_USE.format(what=what, pid=f.read().strip())) from None
    f.truncate(0), f.write(str(os.getpid())), f.flush()
    return f


def open_run(out_dir, init_from):
    """Take out_dir for this trainer: its lock (keep the file open until the end); a scratch run
    removes an earlier run (check_out_dir allowed it); a dead writer's temporary files go."""
    lock = hold_lock(os.path.join(out_dir, "lock"), f"out_dir {out_dir}")
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path) and (TEMPORARY.fullmatch(name) or init_from == "scratch" and (
                step_of(name) is not None or name in ("latest", "metrics.jsonl"))):
            os.remove(path)
    return lock
