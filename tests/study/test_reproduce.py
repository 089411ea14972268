"""reproduce.py on a tiny grid (2 variants x 2 seeds, a few steps): its summary holds the numbers
of the runs' metrics files, a failed run is reported and run again next time, and a finished grid
trains nothing."""
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pytest

import model as model_py
from checkpoint import read_metrics as read_lines
from conftest import ROOT
from study import grids, report, reproduce
from study.grids import Variant


def read_metrics(run_dir, kind="eval"):
    path = os.path.join(run_dir, "metrics.jsonl")
    return [r for r in read_lines(path)[0] if r.get("kind") == kind] if os.path.exists(path) else []

TINY = ("--dataset=tiny --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 "
        "--vocab_pad=1 --eval_iters=2 --device=cpu --log_interval=1 --learning_rate=3e-3 "
        "--min_lr=3e-4 --eval_interval=4")


def final_val(path):
    """The loss a summary reports: the final record's whole-val-split loss (issue 33)."""
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "final"][-1]["val_loss"]


@pytest.mark.slow   # trains a grid of runs in subprocesses
def test_tiny_grid_summary_matches_metrics_failures_rerun_and_restart_trains_nothing(
        workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    cfg = workdir / "hetero_tiny.py"
    cfg.write_text("sv_hetero = True\nsv_placement = 'bogus'\n")   # invalid: train.py exits 1
    grids = {"tiny": [Variant("base", "config/baseline_char.py", [], None, "", 0),
                      Variant("hg", str(cfg), [], "base", "HG lowers the loss", -1)]}
    argv = ["--grid=tiny", "--seeds=2", "--max_iters=8", "--jobs=2", f"--extra={TINY}",
            "--results_dir=res"]
    runs = {(v, s): workdir / "res" / "runs" / v / f"seed{s}"
            for v in ("base", "hg") for s in (1, 2)}

    assert reproduce.main(argv, grids) == 1
    out = capsys.readouterr().out
    assert "0 done, 4 to do" in out and out.count("FAILED") == 2 and "sv_placement" in out, out
    assert (not (runs["hg", 1] / "result.json").exists()
            and (runs["base", 1] / "result.json").exists())
    base_mtime = os.path.getmtime(runs["base", 1] / "metrics.jsonl")

    # fixed: the same command runs only the two failed runs again
    cfg.write_text("sv_hetero = True\n")
    assert reproduce.main(argv, grids) == 0
    out = capsys.readouterr().out
    assert "2 done, 2 to do" in out and "FAILED" not in out, out
    assert os.path.getmtime(runs["base", 1] / "metrics.jsonl") == base_mtime

    val = {k: final_val(d / "metrics.jsonl") for k, d in runs.items()}
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    # what code made the result: this checkout's commit
    with open(runs["base", 1] / "result.json") as f:
        code = json.load(f)["code"]
    assert (code["commit"].startswith(head) and code == reproduce.code_version() if head
            else code is None), code
    with open(workdir / "res" / "summary.json") as f:
        rows = {r["variant"]: r for r in json.load(f)["rows"]}
    for v in ("base", "hg"):
        assert rows[v]["n"] == 2
        assert abs(rows[v]["val_loss_mean"] - statistics.mean([val[v, 1], val[v, 2]])) < 1e-12
        assert abs(rows[v]["val_loss_std"] - statistics.stdev([val[v, 1], val[v, 2]])) < 1e-12
    diffs = [val["hg", s] - val["base", s] for s in (1, 2)]
    assert abs(rows["hg"]["diff_mean"] - statistics.mean(diffs)) < 1e-12
    assert abs(rows["hg"]["diff_std"] - statistics.stdev(diffs)) < 1e-12
    half = 12.706 * statistics.stdev(diffs) / 2 ** 0.5   # t(0.975, 1 degree of freedom)
    lo, hi = statistics.mean(diffs) - half, statistics.mean(diffs) + half
    assert report.verdict([lo, hi]) == ("lower" if hi < 0 else "higher" if lo > 0
                                        else "not resolved")
    assert rows["hg"]["ci95"] == pytest.approx([lo, hi], abs=1e-12)
    assert rows["hg"]["verdict"] == "not resolved (n too small for p < 0.05)"   # 2 seeds
    assert rows["hg"]["direction_matches"] == (statistics.mean(diffs) < 0)
    md = (workdir / "res" / "summary.md").read_text()
    assert (f"{statistics.mean(diffs):+.4f} ± {statistics.stdev(diffs):.4f}" in md
            and "HG lowers the loss" in md)
    for png in ("val_loss.png", "diff_vs_baseline.png", "scale_vectors.png"):
        assert (workdir / "res" / png).stat().st_size > 1000

    mtimes = {k: os.path.getmtime(d / "metrics.jsonl") for k, d in runs.items()}
    assert reproduce.main(argv, grids) == 0
    assert "4 done, 0 to do" in capsys.readouterr().out
    assert {k: os.path.getmtime(d / "metrics.jsonl") for k, d in runs.items()} == mtimes


# --- the committed results, folders that hold one configuration, whole-grid summaries ------------

def test_committed_default_grid_counts_as_done(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert reproduce.main(["--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "66 runs, 66 done, 0 to do" in out and "to do  python" not in out, out


def test_other_settings_are_refused_more_seeds_are_not_and_a_subset_summarizes_the_whole_grid(
        tmp_path, monkeypatch, capsys):
    # a copy of the committed results at the same relative path (runs' --out_dir)
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "study" / "results" / "default"
    shutil.copytree(os.path.join(ROOT, "study", "results", "default"), res,
                    ignore=shutil.ignore_patterns("*.png", "summary.*"))
    with pytest.raises(SystemExit) as e:   # a different size would overwrite all 66 results
        reproduce.main(["--max_iters=500", "--dry_run"])
    msg = str(e.value.code)
    assert (msg.startswith("error:") and "\n" not in msg and "--results_dir" in msg
            and "--replace" in msg), msg
    assert "66 of these runs" in msg and "--max_iters=1000" in msg and "--max_iters=500" in msg
    capsys.readouterr()
    assert reproduce.main(["--max_iters=500", "--dry_run", "--replace"]) == 0
    assert "0 done, 66 to do" in capsys.readouterr().out
    assert reproduce.main(["--max_iters=500", "--dry_run", "--results_dir=elsewhere"]) == 0
    assert "0 done, 66 to do" in capsys.readouterr().out
    assert reproduce.main(["--variants=moe_unified", "--seeds=7", "--dry_run", "--mixed_code"]) == 0
    # seeds added in place
    assert "2 variants x 7 seeds = 14 runs, 6 done, 8 to do" in capsys.readouterr().out

    assert reproduce.main(["--variants=noscale"]) == 0   # nothing to run: summarize
    with open(res / "summary.json") as f:
        rows = {r["variant"]: r for r in json.load(f)["rows"]}
    with open(os.path.join(ROOT, "study", "results", "default", "summary.json")) as f:
        committed = {r["variant"]: r for r in json.load(f)["rows"]}
    # the whole grid, not the subset
    assert rows.keys() == committed.keys() and len(rows) == len(grids.default_grid())
    for name, row in committed.items():
        assert rows[name]["n"] == row["n"] and rows[name]["val_loss_mean"] == row["val_loss_mean"]
        assert rows[name].get("diff_mean") == row.get("diff_mean")
    assert (res / "val_loss.png").stat().st_size > 1000


def test_added_variant_from_the_command_line():
    grid = grids.default_grid()
    v = grids.parse_added("wide:config/unified_char.py:--n_embd=192,--n_head=6", grid)
    assert (v.name, v.config, v.overrides, v.baseline, v.sign) == (
        "wide", "config/unified_char.py", ["--n_embd=192", "--n_head=6"], "baseline", 0)
    assert grids.parse_added("x:config/unified_char.py::none", grid).baseline is None
    assert grids.parse_added("y:config/unified_char.py:--lr_schedule=wsd:baseline_wsd",
                             grid).baseline == "baseline_wsd"
    for bad in ["noscale:config/unified_char.py", "z:config/missing.py",
                "z:config/unified_char.py:n_embd=3", "z", "z:config/unified_char.py::nobody"]:
        with pytest.raises(SystemExit) as e:
            grids.parse_added(bad, grid)
        assert str(e.value.code).startswith("error: --add=") and "\n" not in str(e.value.code)


def test_an_added_row_carries_a_claim_and_a_sign():
    grid = grids.default_grid()
    v = grids.parse_added("gate:config/unified_char.py:--sv_reparam=er:unified:-1:ER: lower", grid)
    assert (v.baseline, v.sign, v.claim) == ("unified", -1, "ER: lower")   # colons kept
    assert grids.parse_added("gate:config/unified_char.py:::+1", grid).sign == 1
    for bad, why in (("gate:config/unified_char.py:::lower", "SIGN must be -1"),
                     ("gate:config/unified_char.py::none:+1", "a SIGN needs a BASELINE")):
        with pytest.raises(SystemExit) as e:
            grids.parse_added(bad, grid)
        assert why in str(e.value.code) and "\n" not in str(e.value.code)


def test_an_added_row_named_as_a_variant_must_run_its_flags(tmp_path, capsys):
    """Issue 32: --add='unified_novec:config/unified_char.py::...' ran unified under the control's
    name. A name of config/variants.py (or moe_NAME) is checked against the flags its config file and
    overrides resolve to; any other name is free."""
    base = ["--grid=lr", "--dry_run", "--seeds=1", f"--results_dir={tmp_path}"]
    with pytest.raises(SystemExit) as e:
        reproduce.main([*base, "--add=unified_novec:config/unified_char.py::baseline_lr1e-3"])
    assert str(e.value.code) == (
        "error: --add=unified_novec:config/unified_char.py::baseline_lr1e-3: 'unified_novec' names "
        "config/variants.py's 'unified_novec', which has sv_placement='dnp_novec', but "
        "config/unified_char.py runs sv_placement='dnp': give the row another name or that "
        "variant's flags")
    with pytest.raises(SystemExit, match="'moe_dp' names config/variants.py's 'dp'"):
        reproduce.main([*base, "--add=moe_dp:config/moe_baseline_char.py"])
    for ok in ("unified_novec:config/unified_char.py:--sv_placement=dnp_novec:baseline_lr1e-3",
               "unified_headgate:config/unified_char.py:--n_head=2:baseline_lr1e-3"):
        assert reproduce.main([*base, f"--add={ok}"]) == 0
    capsys.readouterr()


def test_the_summary_lists_the_rows_that_ran_and_no_absolute_path(tmp_path, capsys):
    """Issue 32: an --add run's summary listed the 20 rows of the grid that never ran, and wrote
    the absolute --results_dir into summary.md, which is committed."""
    grid = [Variant("baseline", "config/baseline_char.py", [], None, "", 0),
            Variant("hg", "config/hetero_char.py", [], "baseline", "HG", -1),
            Variant("dp", "config/dp_char.py", [], "baseline", "DP", -1)]
    results = {"baseline": {1: fake(2.0)}, "hg": {1: fake(1.9)}, "dp": {}}
    assert [r["variant"] for r in report.summarize(grid, results)] == ["baseline", "hg"]
    assert reproduce.summary_command(["--results_dir", str(tmp_path), "--seeds=2"]) == (
        "python -m study.reproduce --results_dir DIR --seeds=2")
    assert reproduce.summary_command([f"--results_dir={ROOT}/study/results/x"]) == (
        "python -m study.reproduce --results_dir=study/results/x")
    assert reproduce.main(["--summary_only", f"--results_dir={tmp_path / 'res'}"]) == 0
    md = (tmp_path / "res" / "summary.md").read_text()
    assert str(tmp_path) not in md and "--results_dir=DIR" in md and "| baseline |" not in md
    capsys.readouterr()


def test_no_committed_summary_holds_an_absolute_path():
    for path in glob.glob(os.path.join(ROOT, "study", "results", "*", "summary.md")):
        with open(path) as f:
            found = re.findall(r"(?<![\w.~])/[A-Za-z][^\s`|]*", f.read())
        assert not found, f"{path} names {found[0]}: summary.md is committed"


def test_cpu_dry_run_estimates_each_run_by_its_own_iterations_and_size(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = Variant("baseline", "config/baseline_char.py", [], None, "", 0)
    big = base._replace(name="big", overrides=["--n_layer=8", "--n_embd=256", "--n_head=8"])
    one = reproduce.local_estimate(base, 1000, [])
    # the default size is the unit
    assert one == grids.OVERHEAD_S + 1000 * grids.MS_PER_ITER / 1000
    assert (reproduce.local_estimate(base, 2000, []) - grids.OVERHEAD_S
            == pytest.approx(2 * (one - grids.OVERHEAD_S)))
    # 8x the parameters of 4x128 (and longer attention rows)
    assert reproduce.local_estimate(big, 1000, []) > 4 * one
    assert reproduce.main(["--grid=scaling", "--seeds=1", "--jobs=1", "--dry_run"]) == 0
    grid = grids.scaling_grid()
    want = sum(reproduce.local_estimate(
                   v, int(reproduce.run_args(v, 1000, [], 1, "x")[0].split("=")[1]), [])
               for v in grid)
    out = capsys.readouterr().out.splitlines()[0]
    assert (f"{len(grid)} to do; 66-3952 iterations each; estimate {want / 60:.0f} min with 1 jobs"
            in out), out


@pytest.mark.parametrize("arg", ["--seeds=0", "--jobs=0", "--max_iters=0", "--nproc_per_node=0",
                                 "--tokens=-1", "--tokens=nan", "--tokens=inf",
                                 # issue 31.4: nan planned 0 runs, "every run within"
                                 "--max_epochs=nan", "--max_epochs=inf", "--max_epochs=0",
                                 "--max_epochs=-1"])
def test_counts_out_of_range_are_one_usage_error(arg, capsys):
    with pytest.raises(SystemExit) as e:
        reproduce.main([arg, "--dry_run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and ": error: --" + arg[2:].split("=")[0] + " must be " in err[-1], err


def test_node_grid_dry_run_sizes_runs_by_tokens_and_estimates_time(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--grid=node", "--nproc_per_node=8", "--seeds=2", "--tokens=1e9", "--dry_run"]
    assert reproduce.main([*argv, "--tokens_per_s=1e6"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("to do")]
    # 1e9 tokens / 524,288 per iteration -> 1908 iterations; warmup 700 of 19,073 scales to 70
    assert len(lines) == 6 and all(
        line.startswith("to do  torchrun --nproc_per_node=8 --standalone train.py config/")
        for line in lines), out
    assert ("--max_iters=1908 --lr_decay_iters=1908 --warmup_iters=70 --eval_interval=190"
            in lines[0])
    assert ("6.00B tokens to train" in out
            and "estimate 1.7 h (at the given 1,000,000 tokens/s)" in out), out
    assert reproduce.main(["--grid=node", "--nproc_per_node=8", "--dry_run", "--nnodes=2",
                           "--node_rank=1", "--master_addr=10.0.0.1"]) == 0
    out = capsys.readouterr().out
    assert ("torchrun --nproc_per_node=8 --nnodes=2 --node_rank=1 --master_addr=10.0.0.1 "
            "--master_port=29500 train.py" in out)
    assert "90.00B tokens" in out and "16 x" in out and "assuming 40% MFU" in out, out


# --- the node grid on CPU: torchrun with 2 gloo processes, a run killed midway and resumed -------

NODE_TINY = (TINY.replace("--eval_interval=4", "--eval_interval=20")
             + " --gradient_accumulation_steps=2")
NODE_ARGV = ["--grid=pair", "--launcher=torchrun", "--nproc_per_node=2", "--seeds=1",
             "--tokens=12800",   # 100 iterations
             "--results_dir=node", f"--extra={NODE_TINY}"]
NODE_GRID = """
import sys
from study import reproduce
from study.grids import Variant
grids = {"pair": [Variant("a", "config/baseline_char.py", [], None, "", 0),
                  Variant("b", "config/baseline_char.py", [], "a", "same as a", -1)]}
sys.exit(reproduce.main(sys.argv[1:], grids))
"""


def descendants(pid):
    """pid and every process below it (torchrun starts its workers in sessions of their own)."""
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, IndexError):
            pass
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


@pytest.mark.slow
def test_node_grid_through_torchrun_resumes_a_killed_run_to_the_same_losses(
        workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    runs = {v: workdir / "node" / "runs" / v / "seed1" for v in "ab"}
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", NODE_GRID, *NODE_ARGV], cwd=workdir, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    # b (run second) has checkpointed at iteration 20 or later: kill everything
    while time.time() < deadline:
        latest = runs["b"] / "latest"
        if latest.exists() and int(re.findall(r"\d+", latest.read_text())[0]) >= 20:
            for pid in descendants(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    p.wait(timeout=60)
    assert ((runs["a"] / "result.json").exists()
            and not (runs["b"] / "result.json").exists()), p.stdout.read().decode()
    killed_at = max(r["iter"] for r in read_metrics(runs["b"], "train"))
    assert 20 <= killed_at < 100

    assert reproduce.main(NODE_ARGV, {"pair": [
        Variant("a", "config/baseline_char.py", [], None, "", 0),
        Variant("b", "config/baseline_char.py", [], "a", "same as a", -1)]}) == 0
    out = capsys.readouterr().out
    assert "1 done, 1 to do" in out and "b seed 1: resuming" in out and "resumed" in out, out
    assert "resuming from" in (runs["b"] / "train.log").read_text()
    # b continued from its checkpoint (one record per iteration, none twice) to a's losses,
    # bit for bit
    for kind, keys in (("eval", ("iter", "train_loss", "val_loss")),
                       ("train", ("iter", "loss", "lr"))):
        a, b = ([[r[k] for k in keys] for r in read_metrics(runs[v], kind)] for v in "ab")
        assert a == b and len(a) == (6 if kind == "eval" else 100)
    with open(workdir / "node" / "summary.json") as f:
        rows = {r["variant"]: r for r in json.load(f)["rows"]}
    assert rows["b"]["n"] == 1 and rows["b"]["diff_mean"] == 0.0


# ---- issue 14's reports: exact properties on made-up results (no training) ----------------------
def fake(val, seed=1):
    return {"val_loss": val, "seed": seed, "curve": [[0, 4.0], [10, val]], "wall_s": 1.0}


def test_budget_fit_recovers_a_power_law_and_inverts_it():
    E, A, alpha = 1.5, 0.3, 0.7
    budgets = [0.5, 1, 1.5, 2]
    fit = report.fit_budget(budgets, [E + A * c ** -alpha for c in budgets])
    assert abs(fit[0] - E) < 1e-3 and abs(fit[1] - A) < 1e-3 and abs(fit[2] - alpha) < 0.01
    assert abs(report.budget_needed((E, A, alpha), E + A * 1.3 ** -alpha) - 1.3) < 1e-9
    assert report.budget_needed((E, A, alpha), E - 0.01) == float("inf")   # below the asymptote


def test_scaling_report_factor_is_the_budget_the_baseline_needs_at_every_budget(monkeypatch):
    monkeypatch.setattr(report, "non_embedding_params",
                        lambda n_layer, n_embd: 12 * n_layer * n_embd ** 2)
    law = lambda c, s: 1.5 + 0.3 * c ** -0.7 + 0.001 * s   # the seeds differ by a constant
    results = {f"baseline_4x128_x{b}": {s: fake(law(float(b), s), s) for s in (1, 2)}
               for b in grids.BUDGETS}
    # what the baseline reaches at 1.25x
    results["unified_4x128"] = {s: fake(law(1.25, s), s) for s in (1, 2)}
    # at 1.5x: 1.8 / 1.5 = 1.2x
    results["dnp_4x128_x1.5"] = {s: fake(law(1.8, s), s) for s in (1, 2)}
    rows, fits = report.scaling_rows(results)
    row, dnp = sorted(rows, key=lambda r: r["variant"], reverse=True)
    assert row["size"] == "4x128" and row["seeds"] == [1, 2] and not row["extrapolated"]
    assert (abs(row["factor"] - 1.25) < 0.01
            and all(abs(f - 1.25) < 0.01 for f in row["factor_seeds"]))
    assert abs(row["mean"] - (law(1.25, 0) - law(1, 0))) < 1e-12 and row["std"] < 1e-12
    assert abs(row["epochs"] - 1000 * 768 / 1_003_854) < 1e-12
    assert abs(row["tokens_per_param"] - 1000 * 768 / (12 * 4 * 128 ** 2)) < 1e-12
    assert dnp["variant"] == "dnp" and dnp["budget"] == 1.5 and dnp["iters"] == 1500
    assert (abs(dnp["factor"] - 1.2) < 0.01
            and abs(dnp["mean"] - (law(1.8, 0) - law(1.5, 0))) < 1e-12)
    assert fits["4x128"]["variants"] == {"unified": {"1": pytest.approx(law(1.25, 1.5))},
                                         "dnp": {"1.5": pytest.approx(law(1.8, 1.5))}}
    lines = report.scaling_lines(rows)
    assert any(line.startswith("| 4x128 | dnp | 1.5x | ") and "| 1.20x |" in line
               for line in lines), lines


def test_size_lr_check_finds_each_familys_best_rate_and_the_tuned_gap():
    loss = {("baseline", "5e-4"): 2.9, ("baseline", "1e-3"): 2.7, ("baseline", "2e-3"): 2.6,
            ("baseline", "4e-3"): 2.65, ("unified", "1e-3"): 2.5, ("unified", "2e-3"): 2.4}
    name = {("baseline", "1e-3"): "baseline_2x64_x1", ("unified", "1e-3"): "unified_2x64"}
    results = {name.get(k, f"{k[0]}_2x64_lr{k[1]}"): {s: fake(v + 0.01 * s * (k[0] == "unified"), s)
                                                       for s in (1, 2)} for k, v in loss.items()}
    rows = report.size_lr_rows(results)
    assert (list(rows) == ["2x64"]
            and rows["2x64"]["best"] == {"baseline": "2e-3", "unified": "2e-3"})
    assert rows["2x64"]["mean"] == pytest.approx(-0.2 + 0.015)
    lines = "\n".join(report.size_lr_lines(rows))
    assert "| 2x64 | baseline | 2.9000 | 2.7000 | **2.6000** | 2.6500 |" in lines
    assert "**2.4150** (edge)" in lines   # unified ran no rate above 2e-3


def test_regime_rows_pair_unified_with_the_baseline_of_its_size_and_tokens_per_parameter():
    results = {}
    for v in grids.regime_grid():
        if v.name.endswith("_t100"):
            continue   # over the cap: not run
        gap = -0.1 if v.name.startswith("unified") else 0.0
        args = ["--max_iters=" + v.overrides[0].split("=")[1]]
        results[v.name] = {s: dict(fake(2.0 + gap + 0.01 * s, s), args=args, epochs=0.5)
                           for s in range(1, 7)}   # 6 seeds: a verdict (report.MIN_SEEDS)
    rows = report.regime_rows(results)
    assert [(r["size"], r["tokens_per_param"]) for r in rows] == [
        (s, t) for s in grids.REGIME_SIZES for t in (1.0, 10.0, 30.0)]
    assert all(r["mean"] == pytest.approx(-0.1) and r["verdict"] == "lower" and r["epochs"] == 0.5
               for r in rows)
    assert rows[1]["iters"] == round(133 * 10 / grids.TPP_1X)


def test_epoch_cap_skips_and_names_the_runs_that_read_the_corpus_more_often(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data" / "tiny_corpus"
    data.mkdir(parents=True)
    (data / "train.bin").write_bytes(bytes(2 * 200_000))   # 200k tokens
    argv = ["--grid=regime", "--dataset=tiny_corpus", "--seeds=1", "--dry_run"]
    # issue 31.4: meta.json's count is not what train.py reads (1: every run was skipped; 1e15:
    # every run was within); the file's size is
    for told in (1, 10**15):
        (data / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 65,
                                                    "train_tokens": told}))
        assert reproduce.main(argv) == 0
        out = capsys.readouterr().out
        # 2x64 at 1 token/param: 139 iterations x 768 = 0.53 epochs of 200k tokens; every other
        # run is over 1
        assert "skipped, over --max_epochs=1: baseline_2x64_t10 (5.3 epochs)" in out, out
        todo = [line for line in out.splitlines() if line.startswith("to do")]
        assert len(todo) == 2 and all(
            "--dataset=tiny_corpus" in line and "results/regime_tiny_corpus/" in line
            for line in todo), todo
    assert reproduce.main([*argv, "--max_epochs=6"]) == 0
    assert "baseline_3x96_t10 (16.6 epochs)" in capsys.readouterr().out   # 2x64 at 10 is now in
    with pytest.raises(SystemExit, match="no prepared data in data/absent"):
        reproduce.main(["--grid=regime", "--dataset=absent", "--dry_run"])


def test_the_cap_and_the_estimate_read_the_max_iters_train_py_runs_the_last(
        tmp_path, monkeypatch, capsys):
    """Issue 31.4: a run's arguments were read first-wins (its variant's --max_iters=139), while
    train.py reads them last-wins (--extra's 200000): 768-epoch runs were planned as within one."""
    assert reproduce.arg_value(["--max_iters=5", "--seed=1", "--max_iters=7"], "max_iters") == "7"
    assert reproduce.arg_value(["--max_iters_x=5"], "max_iters", "none") == "none"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "c").mkdir(parents=True)
    (tmp_path / "data" / "c" / "train.bin").write_bytes(bytes(2 * 200_000))
    argv = ["--grid=regime", "--dataset=c", "--seeds=1", "--dry_run", "--extra=--max_iters=200000"]
    assert reproduce.main([*argv, "--max_epochs=1"]) == 0
    out = capsys.readouterr().out
    # 200000 x 768 tokens of 200k: 768 epochs, for every run of the grid
    assert ("skipped, over --max_epochs=1: baseline_2x64_t1 (768.0 epochs), unified_2x64_t1 "
            "(768.0 epochs)" in out and "0 runs, 0 done, 0 to do" in out), out
    assert reproduce.main([*argv, "--max_epochs=1000"]) == 0
    out = capsys.readouterr().out
    assert "16 to do; 200000 iterations each; estimate" in out, out
    assert out.count("--max_iters=200000 --dataset=c --seed=1") == 16


def test_tuned_rows_pair_each_familys_best_rate_with_the_baselines_best_rate():
    best = {"baseline": "2e-3", "noscale": "4e-3", "unified": "1e-3", "baseline_muon": "4e-3",
            "unified_muon": "8e-3"}
    lrs, results = grids.LRS, {}
    for v in grids.lr_grid():
        family, lr = v.name.rsplit("_lr", 1)
        gap = abs(lrs.index(lr) - lrs.index(best[family]))
        if family == "unified" and gap > 1:
            continue   # not run: unified's best is bracketed all the same
        results[v.name] = {
            s: fake(2.0 + 0.05 * gap + 0.01 * s + (family == "noscale") * 0.003 * s, s)
            for s in ((1, 2, 3) if gap == 0 else (1,))}
    del results["baseline_muon_lr8e-3"]   # baseline_muon's best, 4e-3, then lacks a neighbour
    rows = {r["family"]: r for r in report.tuned_rows(grids.lr_grid(), results)}
    assert {f: r["best_lr"] for f, r in rows.items()} == best
    assert [f for f, r in rows.items() if not r["bracketed"]] == ["baseline_muon"]
    assert (rows["noscale"]["baseline"] == "baseline_lr2e-3"
            and rows["unified_muon"]["baseline"] == "baseline_muon_lr4e-3")
    # seed 1 picked the rates: the tuned pair is evaluated on seeds 2 and 3 (issue 33)
    assert (rows["noscale"]["seeds"] == [2, 3]
            and abs(rows["noscale"]["diff_mean"] - 0.0075) < 1e-12)   # 0.003 s
    half = 12.706 * 0.003 / 2 ** 0.5 / 2 ** 0.5   # diffs 0.006, 0.009: std 0.003 / sqrt(2)
    assert rows["noscale"]["ci95"] == pytest.approx([0.0075 - half, 0.0075 + half], abs=1e-12)
    assert "baseline" not in rows["baseline"]
    lines, _ = report.lr_report(results)
    assert ("--seeds=6 --variants=baseline_lr2e-3,noscale_lr4e-3,unified_lr1e-3,"
            "baseline_muon_lr4e-3,unified_muon_lr8e-3" in lines[-1])
    assert ("| noscale_lr4e-3 | baseline_lr2e-3 | 2 | +0.0075 ± 0.0021 | [-0.0116, +0.0266] |"
            in "\n".join(lines))


def test_summary_counts_seeds_agreeing_in_sign_and_a_t_interval():
    grid = [Variant("base", "c.py", [], None, "", 0),
            Variant("x", "c.py", [], "base", "x lowers the loss", -1)]
    diffs = [-0.02, -0.01, 0.005, -0.03]
    results = {"base": {s: fake(2.0, s) for s in range(1, 5)},
               "x": {s: fake(2.0 + d, s) for s, d in enumerate(diffs, 1)}}
    row = report.summarize(grid, results)[1]
    assert row["agree"] == 3
    half = 3.182 * statistics.stdev(diffs) / 2   # t(0.975, 3) s / sqrt(4)
    assert (abs(row["ci95"][0] - (statistics.mean(diffs) - half)) < 1e-9
            and abs(row["ci95"][1] - (statistics.mean(diffs) + half)) < 1e-9)


def test_the_verdict_is_the_95_interval_not_two_standard_errors():
    """ER's row once read "beyond noise" (|mean| > 2 standard errors) while its 95% interval
    covered 0."""
    # mean 2.5 SE from 0
    diffs = [-0.0048 + d for d in (-0.006, 0.006, -0.004, 0.004, -0.002, 0.002)]
    ci = report.ci95(diffs)
    assert (abs(statistics.mean(diffs)) > 2 * statistics.stdev(diffs) / 6 ** 0.5
            and ci[0] < 0 < ci[1])
    assert report.verdict(ci) == "not resolved"
    assert report.verdict([-0.03, -0.01]) == "lower" and report.verdict([0.01, 0.02]) == "higher"
    assert report.verdict(None) == "—"


def test_dnp_gain_splits_seed_by_seed_into_norm_and_vector_parts():
    """total = Norm part (control - baseline) + vector part (variant - control), over the seeds all
    three have; a seed missing from one of them is left out of all three."""
    base, ctrl, dnp = [2.0, 2.1, 2.05], [1.97, 2.06, 2.02], [1.96, 2.04, 2.015]
    results = {"baseline": {s: fake(x, s) for s, x in enumerate(base, 1)},
               "dnp_novec": {s: fake(x, s) for s, x in enumerate(ctrl, 1)},
               "dnp": {**{s: fake(x, s) for s, x in enumerate(dnp, 1)}, 4: fake(1.5, 4)}}
    lines, data = report.default_report(results)
    (row,) = data["splits"]
    assert row["seeds"] == [1, 2, 3]
    for key, a, b in (("total", dnp, base), ("norm", ctrl, base), ("vector", dnp, ctrl)):
        d = [x - y for x, y in zip(a, b)]
        assert abs(row[key]["mean"] - statistics.mean(d)) < 1e-12, key
        assert row[key]["ci95"] == report.ci95(d), key
    assert abs(row["total"]["mean"] - row["norm"]["mean"] - row["vector"]["mean"]) < 1e-12
    assert any(line.startswith("| dnp | dnp_novec | 3 |") for line in lines)


def test_the_wd_report_gives_the_final_vectors_of_each_kind_beside_the_losses():
    def run(loss, seed, g_in, g_out):   # which vector is which: as the run's model declares
        return {**fake(loss, seed), "config": "config/gemma_iwd_char.py", "args": [],
                "sv_means": {"blocks.0.attn.qkv.g_in": [1.0, g_in], "g_final": [1.0, g_in + 0.2],
                             "blocks.0.attn.q_norm.g": [1.0, g_out]}}
    results = {"gemma_none_wd1.0": {s: run(2.0, s, 1.0, 1.1) for s in (1, 2)},
               "gemma_iwd_wd1.0": {1: run(1.99, 1, 0.6, 1.1), 2: run(1.98, 2, 0.5, 1.1)}}
    lines, data = report.wd_report(results)
    (row,) = data["rows"]
    assert (row["variant"], row["baseline"], row["weight_decay"]) == (
        "gemma_iwd_wd1.0", "gemma_none_wd1.0", "1.0")
    assert abs(row["mean"] + 0.015) < 1e-12
    assert row["g"] == pytest.approx({"input": 0.55, "final": 0.75, "output": 1.1})
    assert row["g_baseline"] == pytest.approx({"input": 1.0, "final": 1.2, "output": 1.1})
    assert any("| 0.550 / 1.000 | 0.750 / 1.200 | 1.100 / 1.100 |" in line for line in lines)


def test_the_metrics_reader_skips_a_torn_last_line(tmp_path):
    lines = [json.dumps({"kind": "eval", "iter": i, "val_loss": 2.0 - i / 10}) for i in (0, 1)]
    # a write cut short
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"kind": "eval", "it')
    assert [r["iter"] for r in read_metrics(tmp_path)] == [0, 1]


def test_summary_only_rewrites_the_committed_summary_from_its_results_and_runs_nothing(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "study" / "results" / "default"
    shutil.copytree(os.path.join(ROOT, "study", "results", "default"), res,
                    ignore=shutil.ignore_patterns("*.png", "summary.*"))
    monkeypatch.setattr(reproduce.Runner, "__call__",
                        lambda *a, **k: pytest.fail("--summary_only must run nothing"))
    # the figures are not what is checked here
    monkeypatch.setattr(reproduce, "plot_grid", lambda *a, **k: None)
    assert reproduce.main(["--summary_only"]) == 0
    with open(res / "summary.json") as f:
        new = {r["variant"]: r for r in json.load(f)["rows"]}
    with open(os.path.join(ROOT, "study", "results", "default", "summary.json")) as f:
        old = {r["variant"]: r for r in json.load(f)["rows"]}
    assert set(new) == set(old) and all(new[v]["n"] >= 3 for v in new)
    for v, r in old.items():   # seeds 1-3 are committed for every variant: the same means over them
        if r.get("diff_mean") is not None and len(new[v]["paired_seeds"]) == 3:
            assert abs(new[v]["diff_mean"] - r["diff_mean"]) < 1e-12, v


def test_param_overheads_count_the_vectors_each_reading_adds(monkeypatch):
    L, d, H = 2, 64, 4
    monkeypatch.setattr(report, "OVERHEAD_SHAPES",
                        {"tiny": dict(n_layer=L, n_head=H, n_embd=d, vocab_size=100)})
    row = report.param_overheads()["tiny"]
    h = 32 * -(-8 * d // 3 // 32)   # SwiGLU's hidden width, 8/3 d rounded up to 32
    extra = {k: round(row[k] * row["baseline"]) for k in report.OVERHEAD_FLAGS}
    # g_q, g_k, g_v and g_gate, g_up for g_attn and g_ffn
    assert extra["HG"] == L * 3 * d
    # g_out over every output of q, k, v, gate, up
    assert extra["DNP, full"] == L * (3 * d + 2 * h)
    # one head-sized vector per q, k, v; a scalar per gate, up
    assert extra["DNP, head"] == L * (3 * d // H + 2)
    assert extra["unified, head"] < extra["unified, full"] and extra["DNP, head"] < extra["HG"]
    lines = report.overhead_lines(report.param_overheads())
    assert lines[-1].startswith("| tiny | ") and f"{row['HG']:.2e}" in lines[-1]


# ---- every grid row is what its name says -------------------------------------------------------
# the words of a row's name after its variant (helpers.VARIANTS): what each asks of the resolved
# config
MODIFIERS = {"muon": dict(optimizer="muon"), "wsd": dict(lr_schedule="wsd"),
             "head": dict(sv_dnp_width="head"), "novec": dict(sv_placement="dnp_novec"),
             "noiwd": dict(sv_weight_decay="none")}


def expected_config(name):
    """The config values a grid row's name promises: its variant's flags (helpers.VARIANTS;
    gemma_<policy> also its decay policy; moe_ a MoE FFN), then each modifier word, rate (lr),
    decay (wd) or size."""
    from helpers import VARIANTS
    words, want = name.split("_"), {}
    if words[0] == "moe":
        words, want["n_experts"] = words[1:], lambda n: n > 0
    head, lead = words[0], int(words[0] == "gemma")
    # [gemma_]<policy>: the longest decay policy its words name (iwd_blocks)
    n = max((i for i in range(lead + 1, len(words) + 1)
             if "_".join(words[lead:i]) in model_py.DECAY_POLICIES), default=None)
    if n is not None:
        head = "gemma" if lead else "baseline"
        want["sv_weight_decay"], words = "_".join(words[lead:n]), [head, *words[n:]]
    assert head in VARIANTS, (
        f"grid row {name!r}: {head!r} is not a named variant (tests/helpers.py VARIANTS)")
    want.update(VARIANTS[head])
    for w in words[1:]:
        if w in MODIFIERS:
            want.update(MODIFIERS[w])
        elif w.startswith("lr"):
            want["muon_lr" if "muon" in words else "learning_rate"] = float(w[2:])
        elif w.startswith("wd"):
            want["weight_decay"] = float(w[2:])
        elif w.startswith("sv"):
            want["sv_decay"] = float(w[2:])
        elif w == "half":
            want["train_tokens"] = grids.HALF_TRAIN
        elif w in grids.SIZES:
            n_layer, n_embd, _ = grids.SIZES[w]
            want.update(n_layer=n_layer, n_embd=n_embd)
        elif not re.fullmatch(r"x[\d.]+|t\d+|350m|none|iwd|all", w):   # budget, tokens/param
            raise AssertionError(f"grid row {name!r}: the word {w!r} has no meaning here "
                                 "(add it to MODIFIERS)")
    return want


@pytest.mark.parametrize("grid", sorted(grids.GRIDS))
def test_every_grid_row_runs_the_config_its_name_says(grid):
    """A row pointing at the wrong config file (or overrides) would label its results silently
    wrong."""
    from model import GPTConfig
    model_defaults = {f: getattr(GPTConfig, f)
                      for f in ("scale_vectors", "sv_hetero", "sv_placement", "sv_reparam",
                                "qk_norm", "post_norm", "sv_dnp_width")}
    for v in grids.GRIDS[grid]():
        cfg = reproduce.train_config(v.config, tuple(v.overrides))
        want = {**model_defaults, **expected_config(v.name)}
        wrong = {k: (cfg[k], w) for k, w in want.items()
                 if not (w(cfg[k]) if callable(w) else cfg[k] == w)}
        assert not wrong, (
            f"grid {grid}, row {v.name} ({v.config} {v.overrides}): (config, name) {wrong}")


def test_a_row_with_the_wrong_config_fails_the_check():
    v = Variant("unified_lr1e-3", "config/baseline_char.py", ["--learning_rate=1e-3"], None, "", 0)
    cfg = reproduce.train_config(v.config, tuple(v.overrides))
    assert any(cfg[k] != w for k, w in expected_config(v.name).items())


def test_the_overhead_table_reads_unified_as_the_named_variants_have_it():
    from helpers import VARIANTS
    assert report.UNIFIED_FLAGS == VARIANTS["unified"]


# ---- issue 20: one sentence and nothing written for bad input; nothing outside the folder touched
ONE = {"g": [Variant("a", "config/baseline_char.py", [], None, "", 0)]}


def one_line_error(e):
    msg = str(e.value.code)
    assert msg.startswith("error:") and "\n" not in msg, msg
    return msg


def test_an_added_variant_in_the_lr_grid_is_summarized_not_a_crash():
    """Issue 20.9: --grid=lr --add=mine:... ran, then crashed with a ValueError before any
    summary."""
    results = {"baseline_lr1e-3": {1: fake(2.0)}, "unified_lr1e-3": {1: fake(1.9)},
               "mine": {1: fake(1.8)}}
    lines, rep = report.lr_report(results)
    assert set(rep["sweep"]) == {"baseline", "unified"}
    grid = [*grids.lr_grid(), Variant("mine", "config/baseline_char.py", [], None, "(added)", 0)]
    assert [r["n"] for r in report.summarize(grid, results) if r["variant"] == "mine"] == [1]


@pytest.mark.parametrize("flag", ["--dry_run", "--summary_only"])
def test_a_torn_or_empty_result_is_left_out_with_a_note(flag, tmp_path, monkeypatch, capsys):
    """Issue 20.10: a torn or empty result.json was a JSONDecodeError under --summary_only or
    --dry_run."""
    monkeypatch.chdir(tmp_path)
    for seed, text in ((1, ""), (2, '{"variant": "a", "se')):
        (tmp_path / "res" / "runs" / "a" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "res" / "runs" / "a" / f"seed{seed}" / "result.json").write_text(text)
    assert reproduce.main(["--grid=g", "--seeds=2", "--results_dir=res", flag], ONE) == 0
    out = capsys.readouterr().out
    assert "0 done, 2 to do" in out and out.count("is not a complete result") == 2, out


@pytest.mark.parametrize("argv,words", [
    (["--add=..:config/baseline_char.py"], "NAME must be new to the grid"),
    (["--add=.x:config/baseline_char.py"], "not start with a dot"),
    (["--results_dir=README.md"], "is a file, not a folder"),
    (["--results_dir=README.md/x"], "is a file, not a folder"),
    # issue 31.8: an OSError traceback (File name too long)
    ([f"--dataset={'d' * 300}"], "the dataset name dddddddddddddddddddd... is 300 bytes long"),
    ([f"--dataset={'d' * 254}"], "has a name of 256 bytes"),   # g_ddd...: the results folder
    ([f"--results_dir=res/{'r' * 300}"], "has a name of 300 bytes"),
])
def test_a_name_outside_runs_or_a_file_as_results_dir_is_one_sentence(
        argv, words, tmp_path, monkeypatch):
    """Issue 20.12: --add=..:CONFIG wrote <results>/seed1 outside runs/; --results_dir=README.md
    was a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("not a folder\n")
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--grid=g", "--seeds=1", *argv], ONE)
    assert words in one_line_error(e)
    assert sorted(os.listdir(tmp_path)) == ["README.md"]   # nothing written


def test_a_results_dir_with_glob_characters_touches_only_itself(tmp_path, monkeypatch, capsys):
    """Issue 20.2 (reproduce.py's half): --results_dir='res[1]' matched res1 as a pattern, so
    starting a run deleted res1's checkpoints and its results counted as this folder's."""
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "res1" / "runs" / "a" / "seed1"
    other.mkdir(parents=True)
    for name in ("ckpt_0000010.pt", "latest", "metrics.jsonl"):
        (other / name).write_text("another grid's")
    assert (reproduce.checkpoints("res[1]/runs/a/seed1") == []
            and len(reproduce.checkpoints(str(other))) == 2)
    # train.py "fails" at once
    monkeypatch.setattr(reproduce.Children, "run", lambda self, cmd, **kw: 1)
    assert reproduce.main(["--grid=g", "--seeds=1", "--results_dir=res[1]"], ONE) == 1
    assert "FAILED" in capsys.readouterr().out
    assert sorted(os.listdir(other)) == ["ckpt_0000010.pt", "latest", "metrics.jsonl"]
    assert (tmp_path / "res[1]" / "runs" / "a" / "seed1" / "run.json").exists()


def test_a_second_reproduce_on_one_folder_is_one_sentence(tmp_path, monkeypatch):
    """Issue 20.11: two invocations on one results folder called each other's runs FAILED and
    garbled train.log."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce.Children, "run",
                        lambda self, cmd, **kw: pytest.fail("must not start"))
    held = reproduce.lock_results("res")
    try:
        with pytest.raises(SystemExit) as e:
            reproduce.main(["--grid=g", "--seeds=1", "--results_dir=res"], ONE)
        assert f"res is in use by another reproduce.py (pid {os.getpid()})" in one_line_error(e)
    finally:
        held.close()
    assert not (tmp_path / "res" / "runs").exists()


def write_result(run_dir, args, code):
    run_dir.mkdir(parents=True)
    r = {"variant": "a", "seed": 1, "args": args, "val_loss": 2.0, "curve": [[0, 4.0], [8, 2.0]],
         "wall_s": 1.0, "sv_means": {}, "code": code}
    (run_dir / "result.json").write_text(json.dumps(r))


def test_a_folder_holds_one_code_version_unless_mixed_code(tmp_path, monkeypatch, capsys):
    """Issue 19.5: runs of other code are not added to a folder silently; a grid whose code changes
    while it runs starts no further run."""
    monkeypatch.chdir(tmp_path)
    args = reproduce.run_args(ONE["g"][0], 8, [], 1, os.path.join("res", "runs", "a", "seed1"))
    # an older run's record
    write_result(tmp_path / "res" / "runs" / "a" / "seed1", args, "f2e3455-dirty")
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--grid=g", "--seeds=2", "--max_iters=8", "--results_dir=res"], ONE)
    msg = one_line_error(e)
    assert "holds runs of other code (1 of f2e3455-dirty)" in msg and "--mixed_code" in msg, msg
    # issue 31.13: a dry run shows the plan all the same, and says what a real run needs
    capsys.readouterr()
    assert reproduce.main(["--grid=g", "--seeds=2", "--max_iters=8", "--results_dir=res",
                           "--dry_run"], ONE) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("grid g: 1 variants x 2 seeds = 2 runs, 1 done, 1 to do"), out
    assert out[-1] == f"a real run of this command is refused: {msg[len('error: '):]}", out

    calls = []   # the first call is the grid's start; the code is edited after it
    monkeypatch.setattr(reproduce, "code_version",
                        lambda: calls.append(1) or {"commit": "c" * 40, "diff": None,
                                                    "id": "one" if len(calls) == 1 else "two"})
    monkeypatch.setattr(reproduce.Children, "run",
                        lambda self, cmd, **kw: pytest.fail("must not start"))
    capsys.readouterr()
    assert reproduce.main(["--grid=g", "--seeds=2", "--max_iters=8", "--results_dir=res2"],
                          ONE) == 1
    out = capsys.readouterr().out
    assert out.count("interrupted (not started: the code changed since this grid started "
                     "(one -> two)") == 2, out


def test_the_code_id_follows_the_python_code_not_the_commit(tmp_path, monkeypatch):
    """Two commits that differ in prose or results only share an id; a Python edit changes it, and
    committing the edit does not; an untracked .py file counts as an edit."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("a\n")
    git("add", "."), git("commit", "-qm", "one")
    monkeypatch.setattr(reproduce, "ROOT", str(tmp_path))
    first = reproduce.code_version()
    (tmp_path / "README.md").write_text("b\n")
    git("commit", "-qam", "prose")
    prose = reproduce.code_version()
    assert (prose["commit"] != first["commit"] and prose["id"] == first["id"]
            and prose["diff"] is None)
    (tmp_path / "train.py").write_text("x = 2\n")
    edited = reproduce.code_version()
    assert edited["diff"] is not None and edited["id"] != first["id"]
    git("commit", "-qam", "code")
    committed = reproduce.code_version()
    assert committed["diff"] is None and committed["id"] == edited["id"]
    (tmp_path / "new.py").write_text("y = 1\n")
    assert reproduce.code_version()["diff"] is not None
    git("add", "."), git("commit", "-qm", "new")


def test_the_code_version_names_the_commit_and_hashes_uncommitted_edits():
    code = reproduce.code_version()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *reproduce.CODE], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    assert (code["commit"] == head and (code["diff"] is None) == (not dirty)
            and len(code["id"]) == 12)
    assert report.code_id(code) == code["id"] and report.code_id(None) == "unknown"


LONG_GRID = """
import sys
from study import reproduce
from study.grids import Variant
sys.exit(reproduce.main(sys.argv[1:], \
{"g": [Variant("a", "config/baseline_char.py", [], None, "", 0)]}))
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow   # reproduce.py and a train.py in subprocesses
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_reproduce_stops_its_train_py_and_the_run_resumes_next_time(
        sig, workdir, monkeypatch, capsys):
    """Issue 20.11: `kill <reproduce pid>` left its train.py running as an orphan and the rerun
    called that run FAILED; SIGINT waited for the whole current run. Now the signal reaches
    train.py, which saves and exits; the run is "interrupted", and the same command resumes it."""
    monkeypatch.chdir(workdir)
    argv = ["--grid=g", "--seeds=1", "--max_iters=1000", "--jobs=1",
            f"--results_dir=sig{sig.value}",
            f"--extra={TINY.replace('--eval_interval=4', '--eval_interval=1000')}"]
    run = workdir / f"sig{sig.value}" / "runs" / "a" / "seed1"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", LONG_GRID, *argv], cwd=workdir, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, pids = time.time() + 120, []
    while time.time() < deadline and not any(r["iter"] >= 20 for r in read_metrics(run, "train")):
        time.sleep(0.05)
    pids = descendants(p.pid)
    assert len(pids) >= 2, "train.py did not start"
    os.kill(p.pid, sig)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + sig.value and "interrupted" in out and "FAILED" not in out, out
    assert not [q for q in pids if alive(q)], "a train.py outlived reproduce.py"
    stopped_at = max(r["iter"] for r in read_metrics(run, "train"))
    assert stopped_at < 1000 and (run / "latest").exists() and not (run / "result.json").exists()
    if sig == signal.SIGTERM:   # the same command, again: the run resumes from its checkpoint
        assert reproduce.main(argv, {"g": [
            Variant("a", "config/baseline_char.py", [], None, "", 0)]}) == 0
        out = capsys.readouterr().out
        assert "0 done, 1 to do" in out and "resumed" in out, out
        assert "resuming from" in (run / "train.log").read_text()


def test_the_summary_says_which_code_made_the_runs():
    one = {"id": "abc", "commit": "c" * 40, "diff": None}
    assert report.code_lines({"a": {1: {"code": one}, 2: {"code": one}}}) == \
        [f"Code: every run by abc (commit {'c' * 12})."]
    mixed = report.code_lines({"a": {1: {"code": one}, 2: {}}, "b": {1: {"code": "f2e3455-dirty"}}})
    assert mixed == [f"Code: the runs mix code versions (--mixed_code): 1 by abc "
                     f"(commit {'c' * 12}); 1 by f2e3455-dirty; 1 by unknown."]
    # issue 31.2: a result.json from before "codes" reads as its one code
    assert report.run_codes({"code": one}) == [one] and report.run_codes({}) == [None]
    assert report.run_codes({"code": one, "codes": [one, "x"]}) == [one, "x"]


# ---- issue 31: nothing deleted that the grid cannot account for; records survive a crash; every
# code a run ran under
def interrupted_run(tmp_path, change=None, loadable=True, run_json=""):
    """res/runs/a/seed1 of grid ONE (8 iterations) as a crash or a hand run leaves it: a
    checkpoint at iteration 4 of train.py's config (the grid's own, or `change`d), `latest`, and a
    run.json that is empty ("": renamed into place before its data reached the disk), torn, or
    missing (None). Returns (the folder, its files' bytes)."""
    import torch
    run = tmp_path / "res" / "runs" / "a" / "seed1"
    run.mkdir(parents=True)
    args = reproduce.run_args(ONE["g"][0], 8, [], 1, os.path.join("res", "runs", "a", "seed1"))
    config = {**reproduce.train_config("config/baseline_char.py", tuple(args)),
              "out_dir": "moved/elsewhere", "init_from": "resume", **(change or {})}
    state = {"model": {"w": torch.zeros(2)}, "optimizers": [], "model_args": {},
             "config": config, "iter_num": 4, "best_val_loss": 2.0}
    if loadable:
        torch.save(state, run / "ckpt_0000004.pt")
    else:
        (run / "ckpt_0000004.pt").write_bytes(b"not a checkpoint")
    (run / "latest").write_text("ckpt_0000004.pt")
    if run_json is not None:
        (run / "run.json").write_text(run_json)
    return run, {p.name: p.read_bytes() for p in run.iterdir()}


G = ["--grid=g", "--seeds=1", "--max_iters=8", "--results_dir=res"]


@pytest.mark.parametrize("run_json", ["", '{"args": ["--max_it', None])
def test_a_run_without_a_readable_run_json_resumes_from_its_checkpoints_own_config(
        run_json, tmp_path, monkeypatch, capsys):
    """Issue 31.1: an empty or torn run.json (or none: train.py run there by hand) made the grid
    delete the run's checkpoints and start it over; --dry_run listed it as "to do"."""
    monkeypatch.chdir(tmp_path)
    run, files = interrupted_run(tmp_path, run_json=run_json)
    assert reproduce.main([*G, "--dry_run"], ONE) == 0
    out = capsys.readouterr().out
    assert "1 runs, 0 done, 1 to do" in out and "\nresume python train.py" in out, out
    assert "without a readable run.json" in out and "--mixed_code" in out   # its code: unknown
    cmds = []
    monkeypatch.setattr(reproduce.Children, "run", lambda self, cmd, **kw: cmds.append(cmd) or 1)
    assert reproduce.main([*G, "--mixed_code"], ONE) == 1
    assert len(cmds) == 1 and cmds[0][-1] == "--init_from=resume", cmds
    assert (run / "ckpt_0000004.pt").read_bytes() == files["ckpt_0000004.pt"]
    state = json.loads((run / "run.json").read_text())   # written again, whole
    assert state["args"] == cmds[0][3:-1] and state["codes"] == [None, reproduce.code_version()]


@pytest.mark.parametrize("change, loadable, why", [
    ({"max_iters": 20, "device": "cpu"}, True,
     "ckpt_0000004.pt was trained with max_iters=20, not 8; device='cpu', not ''"),
    (None, False, "none of its checkpoints loads")])
def test_checkpoints_no_record_accounts_for_are_neither_resumed_nor_deleted(
        change, loadable, why, tmp_path, monkeypatch, capsys):
    """Issue 31.1: a run that train.py wrote into a run folder by hand (other settings), or one
    whose checkpoint does not load, was deleted without a word when its run.json was unreadable.
    Now the grid refuses in one sentence, --dry_run and --replace alike, and touches nothing."""
    monkeypatch.chdir(tmp_path)
    run, files = interrupted_run(tmp_path, change, loadable, run_json=None)
    monkeypatch.setattr(reproduce.Children, "run",
                        lambda self, cmd, **kw: pytest.fail("must not start"))
    for more in (["--dry_run"], ["--replace", "--mixed_code"]):
        with pytest.raises(SystemExit) as e:
            reproduce.main([*G, *more], ONE)
        msg = one_line_error(e)
        assert ("1 run folder(s) of res hold checkpoints of a run this grid cannot account for"
                in msg and why in msg and f"in {os.path.join('res', 'runs', 'a', 'seed1')}" in msg
                and "neither resumed nor deleted" in msg), msg
        assert {p.name: p.read_bytes() for p in run.iterdir()} == files
    assert reproduce.main([*G, "--summary_only"], ONE) == 0   # a summary touches no run


def test_every_record_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    """Issue 31.1: run.json was renamed into place without an fsync, so a crash could leave it
    empty. Each record: written to a temporary name, fsynced, renamed, the rename fsynced."""
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(
        ("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b)))
                        or replace(a, b))
    path = tmp_path / "run.json"
    reproduce.write_json(str(path), {"args": ["--seed=1"]})
    report.write_summary(str(tmp_path), [], ["# header"])
    for i, name in ((0, "run.json"), (3, "summary.md")):
        target = str(tmp_path / name)
        assert events[i][0] == "fsync" and events[i][1].startswith(target + ".tmp"), events
        assert events[i + 1:i + 3] == [("replace", target), ("fsync", str(tmp_path))], events
    assert json.loads(path.read_text()) == {"args": ["--seed=1"]}
    assert sorted(os.listdir(tmp_path)) == ["run.json", "summary.md"]


def test_a_run_resumed_under_other_code_records_every_code_and_the_summary_lists_it_as_mixed(
        tmp_path, monkeypatch, capsys):
    """Issue 31.2: with --mixed_code a run resumed under edited code recorded only the last code;
    result.json and summary.md said one code made it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "plot_grid", lambda *a, **k: None)
    run = tmp_path / "res" / "runs" / "a" / "seed1"
    one, two = ({"commit": c * 40, "diff": None, "id": name} for c, name in (("1", "one"),
                                                                            ("2", "two")))
    code = [one]
    monkeypatch.setattr(reproduce, "code_version", lambda: code[0])

    def train(self, cmd, **kw):
        """train.py: the first part checkpoints at iteration 4 and dies; the resumed one ends."""
        resumed = cmd[-1] == "--init_from=resume"
        (run / "ckpt_0000004.pt").write_bytes(b"ckpt")
        (run / "latest").write_text("ckpt_0000004.pt")
        evals = [{"kind": "eval", "iter": i, "val_loss": 2.0, "train_loss": 2.0}
                 for i in ((0, 4, 8) if resumed else (0, 4))]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
        return 0 if resumed else -9
    monkeypatch.setattr(reproduce.Children, "run", train)
    assert reproduce.main(G, ONE) == 1
    assert "FAILED (exit -9, stopped at iteration 4" in capsys.readouterr().out
    code[0] = two   # the code is edited, the run resumed under it
    assert reproduce.main([*G, "--mixed_code"], ONE) == 0
    assert "val 2.0000" in capsys.readouterr().out
    result = json.loads((run / "result.json").read_text())
    assert result["code"] == one and result["codes"] == [one, two] and result["resumed"]
    assert json.loads((run / "run.json").read_text())["codes"] == [one, two]
    mixed = (f"Code: the runs mix code versions (--mixed_code): 1 by one (commit {'1' * 12}) "
             f"then two (commit {'2' * 12}) (resumed under other code).")
    assert mixed in (tmp_path / "res" / "summary.md").read_text()
    # and the folder counts both codes: a third code is refused, naming each
    code[0] = {**one, "id": "three"}
    assert "(1 of one, 1 of two)" in str(reproduce.other_code("res", reproduce.folder_codes(
        "res", ONE["g"], reproduce.Grid(reproduce.parse_args(G, ONE)[0], ONE).args_for, []),
        code[0]))
