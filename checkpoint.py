"""
Crash-safe checkpoints, shared by train.py and sample.py.

A checkpoint is written to a temporary file in the same folder, flushed and
fsynced, then renamed over its final name (a rename is atomic on POSIX), and only
then does the `latest` pointer name it. A crash at any moment leaves the previous
complete checkpoint and a pointer to it. The last `keep` checkpoints are kept.
Loading uses torch.load(weights_only=True): tensors and plain Python values only.
"""
import glob
import os
import pickle
import zipfile

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated, corrupt or holds objects that are not allowed."""


def _atomic_write(path, write):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)   # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save(out_dir, state, iter_num, keep=3):
    """Write state as out_dir/ckpt_<iter>.pt, point `latest` at it, keep the newest `keep`. Returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(out_dir, "*.tmp*")):   # left by a process killed while saving
        os.remove(stale)
    path = os.path.join(out_dir, f"ckpt_{iter_num:07d}.pt")
    _atomic_write(path, lambda f: torch.save(state, f))
    _atomic_write(os.path.join(out_dir, "latest"), lambda f: f.write(os.path.basename(path).encode()))
    for old in sorted(glob.glob(os.path.join(out_dir, "ckpt_*.pt")))[:-max(keep, 1)]:
        if old != path:
            os.remove(old)
    return path


def candidates(out_dir):
    """Complete checkpoints in out_dir, newest first: the one `latest` names, then older ones."""
    try:
        with open(os.path.join(out_dir, "latest")) as f:
            latest = os.path.join(out_dir, f.read().strip())
    except FileNotFoundError:
        return []
    older = [p for p in sorted(glob.glob(os.path.join(out_dir, "ckpt_*.pt")), reverse=True) if p < latest]
    return [latest] + older


def load(path):
    """torch.load with weights_only=True, and one clear error for every way a file can be bad."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower():
            raise CheckpointError(f"checkpoint {path} holds Python objects that weights_only loading refuses; "
                                  "it was not written by train.py, or was tampered with") from None
        raise CheckpointError(f"checkpoint {path} is corrupt (unpickling failed); "
                              "resume from an older one with --resume_fallback=True") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}); "
                              "resume from an older one with --resume_fallback=True") from None


def load_latest(out_dir, fallback=False):
    """The newest complete checkpoint of out_dir as (path, state); with fallback, skip bad ones."""
    paths = candidates(out_dir)
    if not paths:
        raise CheckpointError(f"no checkpoint in {out_dir} (no `latest` file): train with --init_from=scratch first")
    for path in paths:
        try:
            return path, load(path)
        except CheckpointError as e:
            if not fallback or path == paths[-1]:
                raise
            print(f"warning: {e}; trying the previous checkpoint")


def restore_model(model, state, path):
    """Load a checkpoint's weights into `model`; weights of another shape (another config, or a version
    of model.py that named or sized a parameter differently) are one CheckpointError, not a traceback."""
    own = model.state_dict()
    wrong = [f"missing {k}" for k in own if k not in state] + [f"unexpected {k}" for k in state if k not in own] + \
            [f"{k} is {tuple(state[k].shape)}, not {tuple(own[k].shape)}" for k in own if k in state and state[k].shape != own[k].shape]
    if wrong:
        shown = "; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        raise CheckpointError(f"checkpoint {path} does not fit this model ({shown}): it was written by another "
                              "config or another version of model.py; use that code, or train into a new out_dir")
    model.load_state_dict(state)
