"""
Crash-safe checkpoints and the run folder (out_dir), for train.py, sample.py and export_hf.py: a
record is written to a temporary name, fsynced and renamed (atomic on POSIX), a checkpoint before
the `latest` that names it; loading uses torch.load(weights_only=True); one trainer at a time holds
out_dir/lock. Each fault is one CheckpointError that names the file and what to do.
"""
import errno
import fcntl
import math
import os
import re
from dataclasses import fields

import torch

from dataset import dataset_dir
from model import GPT, GPTConfig

# the keys train.py writes and their types: a file without them is not a checkpoint of this project
REQUIRED_KEYS = {"model": dict, "optimizers": list, "model_args": dict, "config": dict,
                 "iter_num": int, "best_val_loss": (int, float), "vocab": dict}
CKPT = re.compile(r"ckpt_(\d{7,})\.pt")   # the only checkpoint names train.py writes
TEMPORARY = re.compile(r"(ckpt_\d{7,}\.pt|latest|metrics\.jsonl)\.tmp\d+")   # atomic_write's
ADVICE = {errno.ENOSPC: "the disk is full: free space", errno.EDQUOT: "the quota is full",
          errno.EROFS: "the file system is read-only: use another out_dir",
          errno.EACCES: "permission denied: fix the folder's permissions or use another out_dir",
          errno.ENOTDIR: "a file stands where a folder must be", errno.EISDIR: "it is a folder"}


class CheckpointError(RuntimeError):
    """A checkpoint or run folder that is missing, corrupt, in use, or cannot be written."""


def step_of(path):
    """The iteration in a checkpoint's name (ckpt_0000250.pt -> 250), or None for any other file."""
    m = CKPT.fullmatch(os.path.basename(path))
    return int(m.group(1)) if m else None


def checkpoints(out_dir):
    """out_dir's checkpoints, oldest first: listed, never globbed (`out/g[1]` is only itself)."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    return sorted((os.path.join(out_dir, n) for n in names if step_of(n) is not None), key=step_of)


def latest_name(out_dir):
    """The checkpoint `latest` names (a bare ckpt_NNNNNNN.pt of out_dir), None without one."""
    path = os.path.join(out_dir, "latest")
    try:
        with open(path) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):   # a folder, unreadable, binary
        name = "nothing readable"
    if not CKPT.fullmatch(name):   # ../victim/ckpt_0000020.pt would read another run
        raise CheckpointError(f"{path} holds {name[:60]!r}, not the name of a checkpoint in its "
                              "folder (ckpt_NNNNNNN.pt): restore or remove it")
    return name


def write_error(path, e, out_dir):
    """A failed write in one sentence: the file, advice for its errno, what `latest` names."""
    while not isinstance(e, OSError) and e.__context__ is not None:   # torch.save wraps it
        e = e.__context__
    code = getattr(e, "errno", None)
    advice = ADVICE.get(code, f"{getattr(e, 'strerror', None) or e}: fix it")
    try:
        still = latest_name(out_dir)
    except CheckpointError:
        still = None
    return (f"cannot write {getattr(e, 'filename', None) or path} (errno {code}, {advice}); "
            f"`latest` still names {still or 'no checkpoint'}, which is complete: then resume "
            "with --init_from=resume")


def atomic_write(path, write, tmp=None):
    """Write `path` through write(f) to a temporary name (<path>.tmp<pid>), fsync, rename, fsync
    the folder: a crash leaves the old file or the new one, whole. The one way every record a
    later run trusts is written (here and in reproduce.py). A failed write is a CheckpointError."""
    tmp = tmp or f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)   # the rename, durable
        os.fsync(folder), os.close(folder)
    except (OSError, RuntimeError) as e:   # RuntimeError: torch.save's zip writer around it
        raise CheckpointError(write_error(path, e, os.path.dirname(path))) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save(out_dir, state, iter_num, keep=3):
    """Write out_dir/ckpt_<iter>.pt, point `latest` at it, keep this run's newest `keep` (a later
    one, skipped by --resume_fallback, neither counts nor is deleted)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name := f"ckpt_{iter_num:07d}.pt")
    atomic_write(path, lambda f: torch.save(state, f))
    atomic_write(os.path.join(out_dir, "latest"), lambda f: f.write(name.encode()))
    for old in [p for p in checkpoints(out_dir) if step_of(p) <= iter_num][:-max(keep, 1)]:
        os.remove(old)
    return path


def candidates(out_dir):
    """Complete checkpoints, newest first: `latest`'s, then older ones; without a `latest` every
    checkpoint (each got its name only once complete)."""
    name, found = latest_name(out_dir), checkpoints(out_dir)[::-1]
    if name is None:
        return found
    return [os.path.join(out_dir, name)] + [p for p in found if step_of(p) < step_of(name)]


def load(path):
    """torch.load(weights_only=True), one clear error for every way a file can be bad."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist or is not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        wrong = state_problem(state)
    except Exception as e:   # torch.load raises a dozen types for a bad file
        if "weights only" in str(e).lower() and "global" in str(e).lower():
            raise CheckpointError(f"checkpoint {path} holds Python objects that weights_only "
                                  "loading refuses; it was not written by train.py, or was "
                                  "tampered with") from None
        wrong = "it does not load"
    if wrong:
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint of this project "
                              f"({wrong}); resume from an older one with --resume_fallback=True")
    bad = next((k for k, v in state["model"].items() if not v.isfinite().all()), None)
    if bad:   # a NaN checkpoint is never "the last good one", nor sampled from or exported
        raise CheckpointError(f"checkpoint {path} holds non-finite weights ({bad}): the run had "
                              "diverged; resume from an older one with --resume_fallback=True and "
                              "a lower learning_rate")
    return state


def state_problem(state):
    """Why a loaded object is not a checkpoint of this project (its keys and types, weights of one
    floating dtype), or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    wrong = next((k for k, kind in REQUIRED_KEYS.items()   # bool is an int too: not an iter_num
                  if not isinstance(state.get(k), kind) or isinstance(state[k], bool)), None)
    if wrong:
        return f"{wrong} is {type(state.get(wrong)).__name__} {str(state.get(wrong))[:40]!r}"
    odd = next((k for k, v in state["model"].items()
                if not isinstance(v, torch.Tensor) or not v.is_floating_point()), None)
    dtypes = {v.dtype for v in state["model"].values()} if odd is None else ()
    return ("iter_num below 0" if state["iter_num"] < 0 else
            f"model's {odd} is not a floating-point tensor" if odd is not None else
            f"its weights mix {sorted(map(str, dtypes))}" if len(dtypes) > 1 else None)


def load_latest(out_dir, fallback=False):
    """(path, state) of out_dir's newest complete checkpoint; with fallback, skip bad ones."""
    paths = candidates(out_dir)
    if not paths:
        raise CheckpointError(f"no checkpoint in {out_dir}: train with --init_from=scratch first")
    for path in paths:
        try:
            return path, load(path)
        except CheckpointError as e:
            if not fallback or path == paths[-1]:
                raise
            print(f"warning: {e}; trying the previous checkpoint")


def restore_model(model, state, path):
    """Load a checkpoint's weights into `model`; another name, shape or dtype is one sentence."""
    own = model.state_dict()
    wrong = [f"missing {k}" for k in own if k not in state] + \
            [f"unexpected {k}" for k in state if k not in own] + \
            [f"{k} is {tuple(state[k].shape)} {state[k].dtype}, not {tuple(v.shape)} {v.dtype}"
             for k, v in own.items() if k in state and (state[k].shape, state[k].dtype)
             != (v.shape, v.dtype)]
    if wrong:
        raise CheckpointError(f"checkpoint {path} does not fit this model ({'; '.join(wrong[:3])}"
                              f"{f'; and {len(wrong) - 3} more' if len(wrong) > 3 else ''}): use "
                              "its config, --dtype and model.py, or train into a new out_dir")
    model.load_state_dict(state)


def optimizer_state(opt, names):
    """opt.state_dict() with each parameter's state under its name (names: parameter -> name)."""
    state, params = opt.state_dict(), [p for g in opt.param_groups for p in g["params"]]
    return {**state, "state": {names[params[i]]: e for i, e in state["state"].items()}}


def restore_optimizers(optimizers, saved, names, path, iter_num):
    """The saved moments onto `optimizers`, each by its parameter's name, once it fits (its shape:
    another would crash the fused AdamW; all there past step 0); this run's hyperparameters."""
    problems = [f"{len(saved)} optimizers"] if len(saved) != len(optimizers) else []
    for opt, state in zip(optimizers, saved):
        params = [p for g in opt.param_groups for p in g["params"]]
        entries = state.get("state") if isinstance(state, dict) else None
        entries = entries if isinstance(entries, dict) else {"(no moments)": {}}
        problems += [f"a state for {k}, which the model has not" for k in set(entries) - set(
            map(names.get, params))]
        problems += [f"no moments of {names[p]} at iteration {iter_num}" for p in params
                     if iter_num and names[p] not in entries]
        problems += [f"{names[p]}'s {k} is {tuple(v.shape)}, not {tuple(p.shape)}" for p in params
                     for k, v in entries.get(names[p], {}).items()
                     if isinstance(v, torch.Tensor) and k != "step" and v.shape != p.shape]
        ids = iter(range(len(params)))   # this run's groups, so its hyperparameters, by index
        groups = [{**g, "params": [next(ids) for _ in g["params"]]} for g in opt.param_groups]
        moments = {i: entries[names[p]] for i, p in enumerate(params) if names[p] in entries}
        try:
            if not problems:
                opt.load_state_dict({"state": moments, "param_groups": groups})
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
            problems.append(f"{type(e).__name__}: {e}")   # a value of another type
    if problems:
        raise CheckpointError(f"checkpoint {path} holds optimizer state that does not fit this "
                              f"model ({problems[0]}): it was edited or written by another "
                              "version of the code; resume from an older checkpoint or train "
                              "into a new out_dir")


def load_model(out_dir):
    """(path, state, model): out_dir's newest checkpoint in a GPT of its model_args and dtype."""
    path, state = load_latest(out_dir)
    try:
        model = GPT(GPTConfig(**state["model_args"]))
    except Exception as e:   # model_args of another version of model.py, or of the wrong types
        raise CheckpointError(f"checkpoint {path} was written by another version of model.py "
                              f"({e})") from None
    restore_model(model.to(next(iter(state["model"].values())).dtype), state["model"], path)
    return path, state, model


def check_resume(path, ckpt, config, model_args, vocab, tokens_per_iter):
    """A resume continues the checkpoint's run: its model, optimizer and vocabulary (the same ids
    would mean other text), else CheckpointError; returns the lines to print."""
    # a model key added since the checkpoint was written counts as its default
    saved = {**{f.name: f.default for f in fields(GPTConfig)}, **ckpt["model_args"],
             "optimizer": ckpt["config"].get("optimizer", "adamw")}
    mismatched = [f"{k}=({saved.get(k)!r}, {v!r})" for k, v in
                  {**model_args, "optimizer": config["optimizer"]}.items() if saved.get(k) != v]
    if mismatched:
        raise CheckpointError(f"{path} was trained with a different model or optimizer; "
                              f"mismatched keys (checkpoint, requested): {', '.join(mismatched)}")
    if ckpt["vocab"] != vocab:
        raise CheckpointError(
            f"{path} was trained on another vocabulary than {dataset_dir(config['dataset'])}/"
            "meta.json now holds (the same token ids would mean other text): prepare "
            f"--dataset={config['dataset']} as it was, or train into a new out_dir")
    notes = [f"resuming from {path} at iteration {ckpt['iter_num']}"]
    if ckpt["iter_num"] >= config["max_iters"]:   # e.g. a requeued job whose run had finished
        notes.append(f"{path} is at iteration {ckpt['iter_num']} and max_iters="
                     f"{config['max_iters']}: nothing to train (raise --max_iters to go on)")
    batch = ("gradient_accumulation_steps", "batch_size", "block_size")
    old_tokens = math.prod(ckpt["config"].get(k, 0) for k in batch)
    if old_tokens != tokens_per_iter:   # legal (the command line wins), worth a line
        notes.append(f"warning: the checkpoint was trained with {old_tokens:,} tokens per "
                     f"iteration, this run uses {tokens_per_iter:,} ({' x '.join(batch)})")
    return notes


# ---- the run folder ------------------------------------------------------------------------------

def check_out_dir(out_dir, init_from, overwrite):
    """Before anything is written: out_dir is a folder, and a scratch run replaces another run
    (its checkpoints, or a metrics.jsonl of one that saved none) only with --overwrite=True."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CheckpointError(f"out_dir {out_dir} is a file, not a folder: pick another --out_dir")
    held = [os.path.basename(p) for p in candidates(out_dir)]
    held = held or ["metrics.jsonl"] * os.path.exists(os.path.join(out_dir, "metrics.jsonl"))
    if init_from == "scratch" and not overwrite and held:
        raise CheckpointError(f"out_dir {out_dir} holds a run ({held[0]}): continue it with "
                              "--init_from=resume, pick another --out_dir, or replace it with "
                              "--overwrite=True")


def own_file(path, mode):
    """`path` opened to write in place (the lock, metrics.jsonl) if it is out_dir's own: a
    symbolic link, or a file hard-linked elsewhere (`cp -al`), is refused in one sentence."""
    try:
        f = open(path, mode, opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW, 0o644))
    except OSError as e:
        raise CheckpointError(f"{path} is a symbolic link, and train.py writes that file: replace "
                              "it by a copy of its target" if e.errno == errno.ELOOP
                              else write_error(path, e, os.path.dirname(path))) from None
    if os.fstat(f.fileno()).st_nlink > 1:
        raise CheckpointError(f"{path} is hard-linked with another file (a run copied with "
                              "`cp -al`?), and train.py writes into it: copy the run with `cp -a`")
    return f


def hold_lock(path, what):
    """Hold the lock file `path` while the returned file is open (the kernel releases it when the
    process dies); a second holder gets one sentence naming `what` and the first one's pid."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    f = own_file(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise CheckpointError(f"{what} is in use by another process (pid {f.read().strip()}): "
                              "wait for it to end or stop it, or use another folder") from None
    f.truncate(0), f.write(str(os.getpid())), f.flush()
    return f


def open_run(out_dir, init_from):
    """Take out_dir for this trainer: its lock (the returned file: keep it open until the end); a
    scratch run removes an earlier run (check_out_dir allowed it), and a dead writer's temporary
    files go (the lock says none is alive)."""
    lock = hold_lock(os.path.join(out_dir, "lock"), f"out_dir {out_dir}")
    for name in os.listdir(out_dir):
        if TEMPORARY.fullmatch(name) or init_from == "scratch" and (
                step_of(name) is not None or name in ("latest", "metrics.jsonl")):
            os.remove(os.path.join(out_dir, name))
    return lock
