"""bench.py: figures from the times measured (a fake clock), side by side; refusals one sentence;
a sample instead of a step, spinning processes, the threads table (no time is asserted)."""
import contextlib
import json
import os
import time
import types

import pytest

from config.defaults import DEFAULTS
from configurator import ConfigError
from helpers import ROOT
from tools import bench as bench_py

pytestmark = pytest.mark.usefixtures("one_thread")   # build() sets this process's threads
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2",
        "--vocab_size=50", "--vocab_pad=1", "--device=cpu", "--steps=3", "--warmup=1",
        "--dataset=none"]


def test_the_figures_follow_from_the_measured_times(monkeypatch, capsys):
    ticks = [0, 0.5, 1, 1.03, 2, 2.01, 3, 3.02]   # perf_counter: the warmup, steps of 30, 10, 20 ms
    monkeypatch.setattr(bench_py, "time", types.SimpleNamespace(perf_counter=iter(ticks).__next__))
    bench_py.main([*TINY, "--json=True", "--mfu_peak_flops=1e9"])
    r, model = json.loads(capsys.readouterr().out), bench_py.build(bench_py.check(TINY))[0]
    # approx: the readings' float rounding only; 20 ms is the median step
    assert r["ms"] == pytest.approx(20.0) and r["warmup_s"] == pytest.approx(0.5)
    assert r["tokens_per_s"] == pytest.approx(2 * 16 / 0.020)   # B x T tokens a step
    assert r["mfu"] == pytest.approx(model.flops_per_token() * 2 * 16 / 0.020 / 1e9)
    assert r["params_m"] == sum(p.numel() for p in model.parameters()) / 1e6
    monkeypatch.setattr(bench_py, "time", types.SimpleNamespace(perf_counter=iter(ticks).__next__))
    bench_py.main(TINY)   # a CPU has no known peak: no MFU without --mfu_peak_flops
    assert ("ms/step (median of 3), 1,600 tokens/s, MFU — (no known peak: --mfu_peak_flops), "
            "peak memory ") in capsys.readouterr().out


def test_a_sample_is_sample_pys_generation_of_n_tokens(monkeypatch, capsys):
    ticks = [0, 0.5, 1, 1.03, 2, 2.01, 3, 3.02]   # the warmup, samples of 30, 10, 20 ms
    monkeypatch.setattr(bench_py, "time", types.SimpleNamespace(perf_counter=iter(ticks).__next__))
    bench_py.main([*TINY, "--sample=5", "--json=True", "--mfu_peak_flops=1e9"])
    r = json.loads(capsys.readouterr().out)
    assert r["ms"] == pytest.approx(20.0) and r["tokens_per_s"] == pytest.approx(5 / 0.020)
    assert r["mfu"] is None and r["threads"] == 1   # no training FLOPs; one_thread's
    model, sample, info = bench_py.build(bench_py.check([*TINY, "--sample=5"]))
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    sample()
    assert calls == [(1, t) for t in range(1, 6)] and not model.training   # a token at a time


def test_spinning_processes_use_the_cores_while_they_run_and_are_gone_after():
    with bench_py.spinning(2) as spinners:
        def cpu_ticks(p):   # utime + stime, /proc/PID/stat's fields 14 and 15
            with open(f"/proc/{p.pid}/stat") as f:
                return sum(map(int, f.read().rpartition(")")[2].split()[11:13]))
        t0 = time.time()
        while min(map(cpu_ticks, spinners)) < 20:   # 0.2 s of CPU each, however busy the machine
            assert time.time() - t0 < 120 and all(p.poll() is None for p in spinners)
            time.sleep(0.1)
    assert all(p.returncode is not None for p in spinners)


def test_the_threads_table_pairs_the_default_with_one_thread_idle_and_busy(monkeypatch, capsys):
    """Each child answers from its arguments (a fresh process is the side-by-side test's), so the
    table's pairing, medians and ratios are checked exactly, with the spinners really running."""
    live, busy_during, spinning = [], [], bench_py.spinning

    @contextlib.contextmanager
    def recorded(n):
        with spinning(n) as spinners:
            live[:] = spinners
            yield spinners
            live[:] = []

    def child(what, args):   # the k-th call: k ms more than 20 (busy: 40) or, one thread, 30
        busy_during.append(sum(p.poll() is None for p in live))
        one, k = "--cpu_threads=1" in args, len(busy_during)
        sample = [a for a in args if a.startswith("--sample=")][-1] != "--sample=0"   # last wins
        ms = (30 if one else 20 + 20 * bool(live)) * (10 if sample else 1) + k
        return {"ms": ms, "threads": 1 if one or live else 2}
    monkeypatch.setattr(bench_py, "spinning", recorded)
    monkeypatch.setattr(bench_py, "child", child)
    bench_py.main([*TINY, "--threads_table=True", "--rounds=2", "--sample=3", "--busy=1"])
    out = capsys.readouterr().out
    assert out.startswith("`python -m tools.bench --n_layer=2 ") and "--threads_table=True" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    # 2 alternating pairs (default, one thread) a row, their medians and the default over the best
    assert rows[1:] == [
        "| as it is | training step | 2/2 | 22.0 | 33.0 | 1.00 | 21/32, 23/34 |",
        "| as it is | sample of 3 tokens | 2/2 | 206.0 | 307.0 | 1.00 | 205/306, 207/308 |",
        "| 1 spinning | training step | 1/1 | 50.0 | 41.0 | 1.22 | 49/40, 51/42 |",
        "| 1 spinning | sample of 3 tokens | 1/1 | 414.0 | 315.0 | 1.31 | 413/314, 415/316 |"]
    assert busy_during == [0] * 8 + [1] * 8 and not live


@pytest.mark.slow   # 3 child processes; --interleave=True is gpu_check's: its CPU rehearsal
def test_configurations_side_by_side_in_fresh_processes(capsys):
    bench_py.main([*TINY, "--rounds=1", "--compare=gpt2,sv_hetero=True+sv_placement=dnp"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[1].strip() for r in rows] == ["base", "gpt2", "sv_hetero=True+sv_placement=dnp"]
    assert rows[0][4].strip() == rows[0][7].strip() == "1.000"   # time and memory ratios
    assert all(float(r[6].replace(",", "")) > 0 for r in rows)   # each child's peak memory
    base, other = [1.0, 1.0, 3.0, 2.0, 2.0, 9.0], [1.5, 1.5, 1.0, 2.0, 2.2, 2.2]   # 2 rounds of 3
    assert bench_py.round_spread(other, base, steps=3) == "1.100-1.500"   # 1.5/1 and 2.2/2


@pytest.mark.parametrize("args, words", [   # a torn meta.json: load_meta's sentence (test_train)
    (["--optimizer=muon"], "bench.py does not use --optimizer (it times one micro-step"),
    (["--dataset=shakespeare_chr"], "--dataset=shakespeare_chr has no data/shakespeare_chr/meta"),
    (["--compare=n_head=3", "--interleave=True"], "--compare item 'n_head=3': GPTConfig"),
    (["--threads_table=True", "--compare=gpt2"], "--threads_table=True makes its own comparison")])
def test_what_bench_would_ignore_or_cannot_use_is_one_sentence(args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        bench_py.check([a for a in TINY if not a.startswith(("--vocab", "--dataset"))] + args)
    assert words in str(e.value) and "\n" not in str(e.value), e.value
    assert {k: bench_py.defaults[k] for k in DEFAULTS} == DEFAULTS   # train.py's keys, values
    assert bench_py.check([os.path.join(ROOT, "config", "baseline_124m.py"), *TINY,
                           "--optimizer=adamw"])   # a value it would not change anyway


def test_help_teaches_the_keys_a_step_uses_and_names_those_it_refuses(capsys):   # README
    with pytest.raises(SystemExit) as e:
        bench_py.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--steps=20 measured steps: their median is reported" in text
    assert "--optimizer=" not in text and "are refused): out_dir," in text
