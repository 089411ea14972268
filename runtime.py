"""
Where a script runs: the device it picks, on a CPU its threads and memory allocator, and a model
that does not fit there. train.py, sample.py and the tools share these, so they behave alike on one
machine.
"""
import ctypes
import os
import re
import time

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
    """Before a CPU run: torch's threads, and glibc's allocator told to keep freed memory for the
    next step. threads=0: OMP_NUM_THREADS where it is set, else the cores idle now (at least 1,
    at most torch's default), since OpenMP's waiting workers on cores another job holds made a
    step several times slower. Returns the threads torch uses, in words for a first line."""
    keep_freed_memory()
    said = ""
    if not threads and "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > 1:
        idle, cores = idle_cores()
        if idle is not None:   # Linux
            threads = max(1, min(idle, torch.get_num_threads()))
            said = f": {idle} of {cores} cores were idle at start, --cpu_threads=N sets them"
    if threads and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    n = torch.get_num_threads()
    return f"{n} thread{'s' * (n > 1)}{said}"


def idle_cores(wait=0.15):
    """(idle cores, cores) of the CPUs this process may run on, over `wait` seconds, from two
    readings of /proc/stat; (None, None) without one (not Linux)."""
    readings = []
    try:
        for pause in (wait, 0):
            with open("/proc/stat") as f:
                readings.append(f.read())
            time.sleep(pause)
    except OSError:
        return None, None
    cpus = os.sched_getaffinity(0)
    return count_idle(*readings, cpus), len(cpus)


def count_idle(before, after, cpus):
    """The idle cores among `cpus` (numbers) between two readings of /proc/stat: the sum of each
    one's idle share (idle and iowait over user to steal; guest time is in user's), rounded."""
    def ticks(text):
        rows = [line.split() for line in text.splitlines() if re.match(r"cpu\d+ ", line)]
        return {int(r[0][3:]): [int(v) for v in r[1:9]] for r in rows}
    a, b = ticks(before), ticks(after)
    idle = 0.0
    for cpu in set(cpus) & a.keys() & b.keys():
        d = [y - x for x, y in zip(a[cpu], b[cpu])]
        idle += (d[3] + d[4]) / sum(d) if sum(d) > 0 else 1.0   # no tick counted: nothing ran
    return int(idle + 0.5)


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
