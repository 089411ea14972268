"""reproduce.py on a tiny grid (2 variants x 2 seeds, a few steps): its summary holds the numbers of the
runs' metrics files, a failed run is reported and run again next time, and a finished grid trains nothing."""
import json
import os
import statistics

import reproduce
from reproduce import Variant

TINY = ("--dataset=tiny --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 --vocab_pad=1 "
        "--eval_iters=2 --device=cpu --log_interval=1 --learning_rate=3e-3 --min_lr=3e-4 --eval_interval=4")


def final_val(path):
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "eval"][-1]["val_loss"]


def test_tiny_grid_summary_matches_metrics_failures_rerun_and_restart_trains_nothing(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    cfg = workdir / "hetero_tiny.py"
    cfg.write_text("sv_hetero = True\nsv_placement = 'bogus'\n")   # invalid: train.py exits 1
    grids = {"tiny": [Variant("base", "config/baseline_char.py", [], None, "", 0),
                      Variant("hg", str(cfg), [], "base", "HG lowers the loss", -1)]}
    argv = ["--grid=tiny", "--seeds=2", "--max_iters=8", "--jobs=2", f"--extra={TINY}", "--results_dir=res"]
    runs = {(v, s): workdir / "res" / "runs" / v / f"seed{s}" for v in ("base", "hg") for s in (1, 2)}

    assert reproduce.main(argv, grids) == 1
    out = capsys.readouterr().out
    assert "0 done, 4 to do" in out and out.count("FAILED") == 2 and "sv_placement" in out, out
    assert not (runs["hg", 1] / "result.json").exists() and (runs["base", 1] / "result.json").exists()
    base_mtime = os.path.getmtime(runs["base", 1] / "metrics.jsonl")

    cfg.write_text("sv_hetero = True\n")   # fixed: the same command runs only the two failed runs again
    assert reproduce.main(argv, grids) == 0
    out = capsys.readouterr().out
    assert "2 done, 2 to do" in out and "FAILED" not in out, out
    assert os.path.getmtime(runs["base", 1] / "metrics.jsonl") == base_mtime

    val = {k: final_val(d / "metrics.jsonl") for k, d in runs.items()}
    with open(workdir / "res" / "summary.json") as f:
        rows = {r["variant"]: r for r in json.load(f)["rows"]}
    for v in ("base", "hg"):
        assert rows[v]["n"] == 2
        assert abs(rows[v]["val_loss_mean"] - statistics.mean([val[v, 1], val[v, 2]])) < 1e-12
        assert abs(rows[v]["val_loss_std"] - statistics.stdev([val[v, 1], val[v, 2]])) < 1e-12
    diffs = [val["hg", s] - val["base", s] for s in (1, 2)]
    assert abs(rows["hg"]["diff_mean"] - statistics.mean(diffs)) < 1e-12
    assert abs(rows["hg"]["diff_std"] - statistics.stdev(diffs)) < 1e-12
    assert rows["hg"]["within_noise"] == (abs(statistics.mean(diffs)) <= 2 * statistics.stdev(diffs) / 2 ** 0.5)
    assert rows["hg"]["direction_matches"] == (statistics.mean(diffs) < 0)
    md = (workdir / "res" / "summary.md").read_text()
    assert f"{statistics.mean(diffs):+.4f} ± {statistics.stdev(diffs):.4f}" in md and "HG lowers the loss" in md
    for png in ("val_loss.png", "diff_vs_baseline.png", "scale_vectors.png"):
        assert (workdir / "res" / png).stat().st_size > 1000

    mtimes = {k: os.path.getmtime(d / "metrics.jsonl") for k, d in runs.items()}
    assert reproduce.main(argv, grids) == 0
    assert "4 done, 0 to do" in capsys.readouterr().out
    assert {k: os.path.getmtime(d / "metrics.jsonl") for k, d in runs.items()} == mtimes
