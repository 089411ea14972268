"""
Where a script runs: the device it picks, and on a CPU its threads and memory allocator. train.py,
sample.py and the tools share these, so they behave alike on one machine.
"""
import ctypes

import torch
import torch.distributed as dist

from configurator import ConfigError


def pick_device(name):
    """The device to run on: `name` ('' picks cuda, then mps, then cpu), if this machine has it."""
    has = {"cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available()),
           "cpu": 1}
    kind, _, index = name.partition(":")
    if name and has[kind] <= int(index or 0):
        raise ConfigError(f"device={name!r}, but this machine has {has[kind]} {kind.upper()} "
                          "device(s) torch can use: use --device=cpu (or leave it empty)")
    return name or next(k for k in has if has[k])


def setup_cpu(threads=0):
    """Before a CPU run: torch's threads (0: torch's default), and glibc's allocator told to keep
    freed memory for the next step. Returns the threads torch uses."""
    keep_freed_memory()
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def keep_freed_memory():
    """Keep freed blocks of up to 32 MB for reuse, instead of handing them back to the OS, which
    would fault each step's activations in again (glibc only; other allocators are left alone)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # macOS, Windows, musl
        return
    mallopt(-3, 32 << 20), mallopt(-1, 1 << 30)   # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def any_process(flag, device):
    """Whether `flag` is True on any process (on every process alike under DDP), so that they all
    act at the same step."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor(float(flag), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() > 0
