"""
Crash-safe checkpoints and the run folder (out_dir), shared by train.py, sample.py and export_hf.py.

A checkpoint is written to a temporary file in the same folder, flushed and
fsynced, then renamed over its final name (a rename is atomic on POSIX), and only
then does the `latest` pointer name it. A crash at any moment leaves the previous
complete checkpoint and a pointer to it. The last `keep` checkpoints are kept.
Loading uses torch.load(weights_only=True): tensors and plain Python values only.
One trainer at a time holds out_dir/lock; a failed write (a full disk) is one
CheckpointError that names the file and what `latest` still names.
"""
import errno
import fcntl
import json
import os
import re
from dataclasses import fields

import torch

from dataset import dataset_dir
from model import GPT, GPTConfig

# the keys train.py writes and the type of each: a file without them is not a checkpoint of this
# project
REQUIRED_KEYS = {"model": dict, "optimizers": list, "model_args": dict, "config": dict,
                 "iter_num": int, "best_val_loss": (int, float)}
# the files train.py writes in out_dir; only these, and its own temporary files, are ever deleted or
# replaced
TEMPORARY = re.compile(r"(ckpt_\d+\.pt|latest|metrics\.jsonl|lock)\.tmp(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint or run folder that is missing, corrupt, in use, or cannot be written."""


def step_of(path):
    """The iteration in a checkpoint's name (ckpt_0000250.pt -> 250), or None for any other file."""
    m = re.fullmatch(r"ckpt_(\d+)\.pt", os.path.basename(path))
    return int(m.group(1)) if m else None


def names_in(out_dir):
    """The names in out_dir (none if it is not a folder): listed, never globbed, so that an out_dir
    named `out/g[1]` or `out/x*` matches itself only, not out/g1 or out/xy."""
    try:
        return os.listdir(out_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def checkpoints(out_dir):
    """The ckpt_<iter>.pt files of out_dir, oldest first by iteration (not by name)."""
    return sorted((os.path.join(out_dir, n) for n in names_in(out_dir) if step_of(n) is not None),
                  key=step_of)


def latest_name(out_dir):
    """The file name `latest` holds, or None when out_dir has no `latest`."""
    try:
        with open(os.path.join(out_dir, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:   # a folder, unreadable, binary
        raise CheckpointError(f"{os.path.join(out_dir, 'latest')} cannot be read "
                              f"({e.strerror if isinstance(e, OSError) else e}): "
                              "it should be a one-line file naming a checkpoint; "
                              "restore or remove it") from None


def write_error(path, e, out_dir):
    """One sentence for a failed write: the file, the errno (ENOSPC: the disk is full), what
    `latest` still names."""
    # torch.save wraps the OSError of a write
    while not isinstance(e, OSError) and e.__context__ is not None:
        e = e.__context__
    if isinstance(e, OSError) and e.errno:
        why = ("the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror) + \
              f" (errno {e.errno}, {errno.errorcode.get(e.errno, '?')})"
    else:
        why = f"{type(e).__name__}: {e}"
    try:
        still = latest_name(out_dir)
    except CheckpointError:
        still = None
    return (f"cannot write {path}: {why}; `latest` still names {still or 'no checkpoint'}, "
            "which is complete: free space and resume with --init_from=resume")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, another user's
        return True
    return True


def _remove_stale_tmps(out_dir):
    """This module's temporary files left by a writer that died mid-save; a live writer's file
    (another trainer) and any name this module does not write are left alone."""
    for name in names_in(out_dir):
        m = TEMPORARY.fullmatch(name)
        if m and (int(m.group(2)) == os.getpid() or not _pid_alive(int(m.group(2)))):
            os.remove(os.path.join(out_dir, name))


def atomic_write(path, write, tmp=None):
    """Write `path` through write(f) (a binary file): to a temporary name (`tmp`, default
    <path>.tmp<pid>), flushed and fsynced, then renamed over `path`, and the rename fsynced: a
    crash at any moment leaves the old file or the new one, whole. The one way every record a later
    run trusts is written (checkpoints, `latest`, metrics here; reproduce.py's run.json, result.json
    and summaries). A failed write is one CheckpointError."""
    tmp = tmp or f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # make the rename itself durable
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    # RuntimeError: torch.save's zip writer around the OSError
    except (OSError, RuntimeError) as e:
        raise CheckpointError(write_error(path, e, os.path.dirname(path))) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save(out_dir, state, iter_num, keep=3):
    """Write state as out_dir/ckpt_<iter>.pt, point `latest` at it, keep the newest `keep`. Returns
    the path."""
    os.makedirs(out_dir, exist_ok=True)
    _remove_stale_tmps(out_dir)
    path = os.path.join(out_dir, f"ckpt_{iter_num:07d}.pt")
    atomic_write(path, lambda f: torch.save(state, f))
    atomic_write(os.path.join(out_dir, "latest"),
                 lambda f: f.write(os.path.basename(path).encode()))
    # keep-last-K by iteration among this run's checkpoints (those up to iter_num); a later-numbered
    # one (skipped by --resume_fallback) neither counts nor is deleted
    ours = [p for p in checkpoints(out_dir) if step_of(p) <= iter_num]
    for old in ours[:-max(keep, 1)]:
        os.remove(old)
    return path


def candidates(out_dir):
    """Complete checkpoints in out_dir, newest first: the one `latest` names, then older ones.
    Without a `latest` (removed by hand) every checkpoint is a candidate, newest first: each
    ckpt_<iter>.pt got its name only once complete, so the run is still there and is resumed, never
    taken for an empty folder."""
    name = latest_name(out_dir)
    if name is None:
        return checkpoints(out_dir)[::-1]
    latest, step = os.path.join(out_dir, name), step_of(name)
    older = [p for p in reversed(checkpoints(out_dir)) if step is not None and step_of(p) < step]
    return [latest] + older


def load(path):
    """torch.load with weights_only=True, and one clear error for every way a file can be bad."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist"
                              + (" (it is a folder)" if os.path.isdir(path) else ""))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    # torch.load raises a dozen types for a bad file (EOFError, IndexError, KeyError, ...)
    except Exception as e:
        # a pickle that would run code
        if "global" in str(e).lower() and "weights only" in str(e).lower():
            raise CheckpointError(f"checkpoint {path} holds Python objects that weights_only "
                                  "loading refuses; it was not written by train.py, or was "
                                  "tampered with") from None
        state = None
    wrong = state_problem(state)
    if wrong:
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint of this project "
                              f"({wrong}); resume from an older one with "
                              "--resume_fallback=True") from None
    bad = next((k for k, v in state["model"].items()
                if v.is_floating_point() and not v.isfinite().all()), None)
    if bad:   # a NaN checkpoint is never "the last good one", nor sampled from or exported
        raise CheckpointError(f"checkpoint {path} holds non-finite weights ({bad}): the run had "
                              "diverged; resume from an older one with --resume_fallback=True and "
                              "a lower learning_rate")
    return state


def state_problem(state):
    """What makes a loaded object not a checkpoint of this project (words), or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    for key, kind in REQUIRED_KEYS.items():
        if key not in state:
            return f"no {key!r}"
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            return f"{key} is {type(state[key]).__name__} {str(state[key])[:40]!r}"
    if (state["iter_num"] < 0
            or not all(isinstance(v, torch.Tensor) for v in state["model"].values())):
        return ("iter_num below 0" if state["iter_num"] < 0
                else "model holds a value that is not a tensor")
    return None


def load_latest(out_dir, fallback=False):
    """The newest complete checkpoint of out_dir as (path, state); with fallback, skip bad ones."""
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
    """Load a checkpoint's weights into `model`; weights of another shape (another config, or a
    version of model.py that named or sized a parameter differently) are one CheckpointError, not a
    traceback."""
    own = model.state_dict()
    wrong = [f"missing {k}" for k in own if k not in state] + \
            [f"unexpected {k}" for k in state if k not in own] + \
            [f"{k} is {tuple(state[k].shape)}, not {tuple(own[k].shape)}"
             for k in own if k in state and state[k].shape != own[k].shape]
    if wrong:
        shown = "; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        raise CheckpointError(f"checkpoint {path} does not fit this model ({shown}): it was "
                              "written by another config or another version of model.py; use that "
                              "code, or train into a new out_dir")
    model.load_state_dict(state)


def optimizer_state(opt, names):
    """opt.state_dict() with each parameter's state naming its parameter (`names`: parameter ->
    name), so that a resume can tell that the state it restores belongs to the parameter it is
    restored onto."""
    state = opt.state_dict()
    params = [p for group in opt.param_groups for p in group["params"]]
    state["state"] = {i: {**entry, "param_name": names[params[i]]}
                      for i, entry in state["state"].items()}
    return state


def restore_optimizers(optimizers, saved, names, path, iter_num):
    """Load the saved optimizer states into `optimizers` after checking that each fits its
    parameters: same groups and sizes, every state tensor of its parameter's shape, and (when
    recorded) its parameter's name. A state of the wrong shape would otherwise crash the fused AdamW
    (invalid pointer), and a swapped one of the same shape would resume silently with the wrong
    moments; a checkpoint past step 0 without moments would resume with fresh ones. The moments
    come back; the hyperparameters (lr, weight decay, betas...) stay those of this run's config."""
    config = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
              for opt in optimizers]
    wrong = (f"{len(saved)} optimizer(s), not {len(optimizers)}" if len(saved) != len(optimizers)
             else None)
    for opt, state in zip(optimizers, saved):
        if wrong:
            break
        try:
            wrong = _optimizer_problem(opt, state, names, iter_num)
            if not wrong:
                entries = {i: {k: v for k, v in e.items() if k != "param_name"}
                           for i, e in state["state"].items()}
                opt.load_state_dict({**state, "state": entries})
        # a value of another type
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
            wrong = f"{type(e).__name__}: {e}"
    if wrong:
        raise CheckpointError(f"checkpoint {path} holds optimizer state that does not fit this "
                              f"model ({wrong}): it was edited or written by another version of "
                              "the code; resume from an older checkpoint or train into a new "
                              "out_dir")
    for opt, hparams in zip(optimizers, config):
        for group, h in zip(opt.param_groups, hparams):
            group.update(h)


def _optimizer_problem(opt, state, names, iter_num):
    """What does not fit between a saved optimizer state and `opt`'s parameters (words), or None."""
    groups, entries = state["param_groups"], state["state"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in opt.param_groups]:
        return "other parameter groups"
    if iter_num > 0 and not entries:
        return f"no moments at iteration {iter_num}, where every parameter has them"
    owner = {i: p for saved_g, g in zip(groups, opt.param_groups)
             for i, p in zip(saved_g["params"], g["params"])}
    for i, entry in entries.items():
        p = owner.get(i)
        if p is None:
            return f"a state for parameter {i!r}, which the optimizer does not have"
        if entry.get("param_name", names[p]) != names[p]:
            return f"the state of {names[p]} is {entry['param_name']}'s"
        for key, v in entry.items():
            if key != "step" and isinstance(v, torch.Tensor) and v.shape != p.shape:
                return f"{names[p]}'s {key} is {tuple(v.shape)}, not {tuple(p.shape)}"
    return None


def load_model(out_dir):
    """(path, state, model) for sample.py and export_hf.py: out_dir's newest checkpoint, its weights
    in a GPT built from its own model_args; one CheckpointError for whatever does not fit."""
    path, state = load_latest(out_dir)
    try:
        model = GPT(GPTConfig(**state["model_args"]))
    except Exception as e:   # model_args of another version of model.py, or of the wrong types
        raise CheckpointError(f"checkpoint {path} was written by another version of model.py "
                              f"({e})") from None
    restore_model(model, state["model"], path)
    return path, state, model


def describe(path, state):
    """One line on a checkpoint for sample.py: its step and the validation loss its weights had.
    best_val_loss is the best of the evaluations up to the checkpoint, so one saved on a stop signal
    between evaluations carries an earlier step's (step 0's, at worst): the run's metrics.jsonl
    beside it says which evaluation came last."""
    it, best = state["iter_num"], state["best_val_loss"]
    metrics = os.path.join(os.path.dirname(path), "metrics.jsonl")
    evals = [r for r in (read_metrics(metrics)[0] if os.path.isfile(metrics) else [])
             if isinstance(r, dict) and r.get("kind") == "eval" and isinstance(r.get("iter"), int)
             and isinstance(r.get("val_loss"), (int, float)) and r["iter"] <= it]
    if not evals:   # a checkpoint copied without its metrics.jsonl
        return f"{path} (iteration {it}, best val loss {best:.4f} of the evaluations up to it)"
    last = evals[-1]
    if last["iter"] == it:
        return f"{path} (iteration {it}, val loss {last['val_loss']:.4f}, best {best:.4f})"
    return (f"{path} (iteration {it}, saved between evaluations: none since step {last['iter']}'s, "
            f"val loss {last['val_loss']:.4f})")


def check_resume(path, ckpt, config, model_args, vocab, tokens_per_iter):
    """A resume continues the checkpoint's run: the same model and optimizer, and the vocabulary it
    was trained on (the same token ids would otherwise mean other text); CheckpointError if not.
    Returns the lines to print: where it resumes, and what this command line changes."""
    # a model key added since the checkpoint was written counts as its default (what it trained
    # with); a key removed since (GPTConfig.kernels: the same values) is not compared
    saved = {**{f.name: f.default for f in fields(GPTConfig)}, **ckpt["model_args"],
             "optimizer": ckpt["config"].get("optimizer", "adamw")}
    mismatched = {k: (saved.get(k), v)
                  for k, v in {**model_args, "optimizer": config["optimizer"]}.items()
                  if saved.get(k) != v}
    if mismatched:
        listed = ", ".join(f"{k}=({a!r}, {b!r})" for k, (a, b) in mismatched.items())
        raise CheckpointError(f"{path} was trained with a different model or optimizer; "
                              f"mismatched keys (checkpoint, requested): {listed}")
    old = ckpt["config"]
    # a checkpoint written before the vocabulary record: its dataset's name must be this one
    if ckpt.get("vocab", vocab) != vocab or ("vocab" not in ckpt
                                             and old.get("dataset") != config["dataset"]):
        raise CheckpointError(
            f"{path} was trained on another vocabulary than {dataset_dir(config['dataset'])}/"
            "meta.json now holds (the same token ids would mean other text): prepare "
            f"--dataset={config['dataset']} as it was, or train into a new out_dir")
    notes = [f"resuming from {path} at iteration {ckpt['iter_num']}"]
    if ckpt["iter_num"] >= config["max_iters"]:   # e.g. a requeued job whose run had finished
        notes.append(f"{path} is at iteration {ckpt['iter_num']} and "
                     f"max_iters={config['max_iters']}: nothing to train (raise --max_iters to go "
                     "on)")
    # the command line wins on resume (learning rate, max_iters, batch); a new global batch is
    # legal but worth a line
    old_tokens = (old.get("gradient_accumulation_steps", 0) * old.get("batch_size", 0)
                  * old.get("block_size", 0))
    if old_tokens != tokens_per_iter:
        notes.append(f"warning: the checkpoint was trained with {old_tokens:,} tokens per "
                     f"iteration, this run uses {tokens_per_iter:,} (gradient_accumulation_steps "
                     "x batch_size x block_size)")
    return notes


# ---- the run folder ------------------------------------------------------------------------------

def check_out_dir(out_dir, init_from, overwrite):
    """Read-only checks before a run writes anything: out_dir is a folder, and a scratch run does
    not silently replace another run (its metrics and checkpoints) unless told to."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CheckpointError(f"out_dir {out_dir} is a file, not a folder: pick another --out_dir")
    held = latest_name(out_dir) or next((os.path.basename(p) for p in candidates(out_dir)), None)
    if init_from == "scratch" and not overwrite and held is not None:
        raise CheckpointError(f"out_dir {out_dir} holds a run ({held}): continue it with "
                              "--init_from=resume, pick another --out_dir, or replace it with "
                              "--overwrite=True")


# held open for the life of the process: the kernel releases the lock when it dies
_lock_file = None


def private_file(path):
    """Make sure writing `path` writes into out_dir only: a symbolic link is refused (it points
    anywhere); a file hard-linked with another (a run copied with `cp -al`) is first replaced by its
    own copy."""
    if os.path.islink(path):
        raise CheckpointError(f"{path} is a symbolic link (to {os.readlink(path)}), and train.py "
                              "writes that file: remove the link (or replace it by a copy of its "
                              "target) and run again")
    try:
        if os.path.isfile(path) and os.stat(path).st_nlink > 1:
            with open(path, "rb") as f:
                content = f.read()
            atomic_write(path, lambda f: f.write(content))
    except OSError as e:
        raise CheckpointError(write_error(path, e, os.path.dirname(path))) from None


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def open_append(path):
    """`path` opened for appending, never through a link (metrics.jsonl)."""
    private_file(path)
    return open(path, "a", opener=_no_follow)


def lock(out_dir):
    """Take out_dir/lock; a second trainer on the same out_dir gets one sentence naming the holder's
    pid."""
    global _lock_file
    os.makedirs(out_dir, exist_ok=True)
    private_file(os.path.join(out_dir, "lock"))
    f = open(os.path.join(out_dir, "lock"), "a+", opener=_no_follow)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise CheckpointError(f"out_dir {out_dir} is in use by another trainer (pid {holder}): "
                              "wait for it to end or stop it, or pick another --out_dir") from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    _lock_file = f


def clear_run(out_dir):
    """Remove a previous run's checkpoints, `latest` and metrics (a scratch run with
    --overwrite=True)."""
    for path in [*checkpoints(out_dir), os.path.join(out_dir, "latest"),
                 os.path.join(out_dir, "metrics.jsonl")]:
        if os.path.exists(path):
            os.remove(path)


def open_run(out_dir, init_from, iter_num, wandb=None):
    """Take the run folder for this trainer: its lock (one trainer per out_dir), then its RunLog.
    A scratch run removes an earlier run's checkpoints and metrics (it is there only with
    --overwrite=True: check_out_dir); a resumed one drops what was logged after its checkpoint.
    wandb: wandb.init's arguments, to log there too."""
    metrics = os.path.join(out_dir, "metrics.jsonl")
    try:
        lock(out_dir)
        if init_from == "scratch":
            clear_run(out_dir)
        else:
            private_file(metrics)   # a link would log into another run's (or any) file
            trim_metrics(metrics, iter_num)
        return RunLog(open_append(metrics), out_dir, wandb)
    except OSError as e:
        raise CheckpointError(write_error(metrics, e, out_dir)) from None


class RunLog:
    """out_dir/metrics.jsonl, one JSON record per line, and the same records to Weights & Biases
    when asked (as in nanoGPT: optional, its files in out_dir, a resumed run continues its
    run)."""

    def __init__(self, file, out_dir, wandb=None):
        self.file, self.out_dir, self.wandb = file, out_dir, None
        if wandb:
            try:
                import wandb as wb
            except ImportError:
                raise SystemExit("error: --wandb_log=True needs wandb, which is not installed: "
                                 "pip install wandb") from None
            self.wandb = wb.init(resume="allow", dir=out_dir, **wandb)

    def log(self, record=None, durable=False):
        """Append a record; durable=True: fsync, as before a checkpoint (a resume trims to it)."""
        try:
            self.file.write(json.dumps(record) + "\n" if record else "")
            self.file.flush()
            if durable:
                os.fsync(self.file.fileno())
        except OSError as e:
            raise SystemExit(f"error: {write_error(self.file.name, e, self.out_dir)}") from None
        if self.wandb and record:
            self.wandb.log({f"{record['kind']}/{k}": v for k, v in scalars(record).items()},
                           step=record["iter"])


def scalars(record, prefix=""):
    """A record's numbers, nested keys joined by '/' (what wandb plots)."""
    out = {}
    for k, v in record.items() if isinstance(record, dict) else enumerate(record):
        if isinstance(v, (dict, list)):
            out.update(scalars(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def read_metrics(path):
    """The records of a metrics.jsonl, and how many lines did not parse (a line torn by a full disk
    or a kill)."""
    records, torn = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                torn += 1
    return records, torn


def trim_metrics(path, iter_num):
    """On resume, drop what the interrupted run logged after its checkpoint, and any torn line, so
    that the file reads as one run; rewrites the file (atomically) only when something is
    dropped."""
    if not os.path.exists(path):
        return
    records, torn = read_metrics(path)
    kept = [r for r in records if isinstance(r, dict) and r.get("iter", 0) <= iter_num]
    if torn:
        print(f"note: dropped {torn} line(s) of {path} that did not parse (a write cut short)")
    if len(kept) < len(records) + torn:
        atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))
