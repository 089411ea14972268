"""
Where a script runs: the device it picks, on a CPU its threads and memory allocator, and a model
that does not fit there. train.py, sample.py and the tools share these, so they behave alike on one
machine.
"""
import ctypes

import torch

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


def build(make, device, dtype):
    """make() (a model) on `device` in `dtype`; a model the memory cannot hold is one sentence that
    names its size, not the allocator's traceback."""
    try:
        return make().to(device, dtype)
    except RuntimeError as e:   # torch.OutOfMemoryError on a GPU, a RuntimeError on a CPU
        if not isinstance(e, torch.OutOfMemoryError) and "can't allocate memory" not in str(e):
            raise
    with torch.device("meta"):   # sizes only, no memory
        n = sum(p.numel() for p in make().parameters())
    raise ConfigError(f"a model of {n:,} parameters ({n * dtype.itemsize / 1e9:,.1f} GB of "
                      f"{str(dtype)[6:]} weights alone) does not fit in the memory of {device}: "
                      "make it smaller (n_layer, n_embd), or use a device with more memory")
