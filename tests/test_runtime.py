"""runtime.py: the threads a CPU run takes by default, from two readings of /proc/stat (faked)."""
import os

import pytest
import torch

import runtime

# /proc/stat's columns: user nice system idle iowait irq softirq steal guest guest_nice
START = [500, 10, 200, 9000, 30, 0, 5, 0, 100, 0]


def stat(spent):
    """A /proc/stat text: the machine's line, then per CPU START plus the ticks `spent` adds."""
    cpus = {n: [a + b for a, b in zip(START, d + [0] * 10)] for n, d in spent.items()}
    total = [sum(col) for col in zip(*cpus.values())]
    return "\n".join([" ".join(map(str, ["cpu ", *total]))] + [
        " ".join(map(str, [f"cpu{n}", *t])) for n, t in cpus.items()] + ["intr 12 3", "ctxt 99"])


IDLE, BUSY = [0, 0, 0, 100], [100]   # 100 ticks idle, 100 ticks of user time


@pytest.mark.parametrize("spent, cpus, idle", [
    ({0: IDLE, 1: BUSY}, {0, 1}, 1),
    ({0: BUSY, 1: BUSY}, {0, 1}, 0),
    ({0: [50, 0, 0, 0, 50], 1: IDLE}, {0, 1}, 2),   # iowait is idle: 1.5, rounded half up
    ({0: [50, 0, 0, 50, 0, 0, 0, 0, 50], 1: IDLE}, {0, 1}, 2),   # guest is in user: 1.5, not 1.33
    ({0: IDLE, 1: IDLE, 2: [50, 0, 0, 50]}, {0, 1, 2}, 3),   # 2.5: half up, not to even
    ({0: [30, 10, 10, 40, 0, 5, 5], 1: BUSY}, {0, 1}, 0),   # 0.4: system, irq, steal are busy
    ({0: IDLE, 1: BUSY, 2: IDLE}, {1}, 0),   # only the CPUs this process may run on
    ({0: IDLE, 1: [0] * 10}, {0, 1}, 2)])   # no tick counted: nothing ran there
def test_idle_cores_are_the_idle_shares_of_this_process_cpus(spent, cpus, idle):
    assert runtime.count_idle(stat({n: [] for n in spent}), stat(spent), cpus) == idle


@pytest.fixture
def torch_threads(monkeypatch):
    """torch's thread count as a plain number, 2 by default; nothing is changed in torch."""
    threads = [2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return threads


@pytest.mark.parametrize("threads, omp, idle, used, said", [
    (0, None, (1, 2), 1, "1 thread: 1 of 2 cores were idle at start, --cpu_threads=N sets them"),
    (0, None, (0, 2), 1, "1 thread: 0 of 2 cores were idle at start"),   # at least one
    (0, None, (8, 8), 2, "2 threads: 8 of 8 cores"),   # at most torch's default
    (0, None, (None, None), 2, "2 threads"),   # no /proc/stat: torch's default
    (0, "2", None, 2, "2 threads"), (3, None, None, 3, "3 threads")])   # as told: nothing read
def test_the_default_threads_are_the_idle_cores_unless_told(
        threads, omp, idle, used, said, torch_threads, monkeypatch):
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(runtime, "idle_cores", lambda: idle if idle else pytest.fail("read"))
    assert runtime.setup_cpu(threads).startswith(said) and torch_threads == [used]


def test_idle_cores_reads_this_machine():
    """Linux: between 0 and the CPUs this process may run on (the figure itself depends on load)."""
    idle, cores = runtime.idle_cores(wait=0.05)
    assert idle is None or 0 <= idle <= cores == len(os.sched_getaffinity(0))
