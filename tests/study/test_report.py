"""study/report.py's figures: time_to_loss (a variant's wall-clock efficiency from a grid's
validation curves), the sign-flip p-values, the whole-split loss, and the reports of the power,
iwd and scaling grids (issue 33), on made-up numbers."""
import pytest

from study import plots, report
from study.report import time_to_loss


def runs(*curves):
    return {seed: {"curve": curve} for seed, curve in enumerate(curves, 1)}


def test_time_to_loss_interpolates_the_seed_mean_curves():
    # seed means: reference 4, 2, 1 (target 1); variant 4, 1.5, 0.8: it reaches 1 at
    # 100 + 100 * 0.5 / 0.7
    results = {"baseline": runs([[0, 4], [100, 2.5], [200, 1.25]],
                                [[0, 4], [100, 1.5], [200, 0.75]]),
               "unified": runs([[0, 4], [100, 1.5], [200, 0.8]])}
    r = time_to_loss(results, "unified", step_time_ratio=1.25)
    assert r["target_loss"] == 1.0 and r["reference_steps"] == 200
    assert r["steps"] == pytest.approx(100 + 100 * 0.5 / 0.7)
    assert r["token_efficiency"] == pytest.approx(200 / r["steps"])
    assert r["wallclock_efficiency"] == pytest.approx(r["token_efficiency"] / 1.25)


def test_time_to_loss_says_so_when_the_variant_never_gets_there():
    results = {"baseline": runs([[0, 4], [100, 1.0]]), "noscale": runs([[0, 4], [100, 1.1]])}
    r = time_to_loss(results, "noscale")
    assert r["steps"] is None and r["token_efficiency"] is None
    assert r["wallclock_efficiency"] is None


# ---- issue 33: the power split's p-values, the whole-split loss, the iwd and repeat reports -----

def test_the_sign_flip_p_value_is_exact():
    """Six diffs of one sign: 2 of the 64 sign patterns are as extreme (two-sided); a pattern
    whose mean is 0 is not significant at all."""
    assert report.sign_flip_p([0.1, 0.2, 0.1, 0.3, 0.2, 0.1]) == 2 / 64
    assert report.sign_flip_p([1.0, -1.0]) == 1.0
    # [3, 1, 1]: the patterns with |sum| >= 5 are (+,+,+), (-,-,-): 2 of 8
    assert report.sign_flip_p([3.0, 1.0, 1.0]) == 2 / 8
    assert report.sign_flip_p([0.5]) is None


def test_pairs_use_the_whole_val_split_when_both_runs_have_it():
    a = {1: {"val_loss": 2.0, "val_loss_full": 1.9}, 2: {"val_loss": 2.1, "val_loss_full": 1.8}}
    b = {1: {"val_loss": 2.2, "val_loss_full": 2.0}, 2: {"val_loss": 2.2, "val_loss_full": 2.0}}
    assert report.paired_diffs(a, b)[1] == pytest.approx([-0.1, -0.2])
    old = {1: {"val_loss": 2.2}, 2: {"val_loss": 2.2}}   # a run from before the record
    assert report.paired_diffs(a, old)[1] == pytest.approx([-0.2, -0.1])


def precond(g_std, exp):
    return [[0, {"head": {"g": [0.0, 1, 1, 1, 1, 1], "corr_wg": None, "update_exp": 9.0,
                          "update_corr": None, "update_cv": 0.1}}],
            [10, {"head": {"g": [g_std, 0.8, 1.2, 0.9, 1, 1.1], "corr_wg": 0.5,
                           "update_exp": exp, "update_corr": 0.9, "update_cv": 0.2}}]]


def test_the_power_report_splits_dnp_with_p_values_and_reads_the_telemetry(tmp_path):
    seeds = range(1, 7)
    results = {name: {s: {"val_loss": base + 0.001 * s, "curve": [[0, 4.0], [10, base]],
                          "preconditioning": precond(0.02, 1.0 + 0.1 * (name == "dnp"))}
                      for s in seeds}
               for name, base in (("baseline", 2.0), ("dnp", 1.95), ("dnp_novec", 1.96))}
    lines, data = report.power_report(results)
    (split,) = data["splits"]
    assert split["vector"]["mean"] == pytest.approx(-0.01) and split["vector"]["p"] == 2 / 64
    text = "\n".join(lines)
    assert "p = 0.031" in text and "| dnp | 0.020 | 1.500 | 1.100 | 0.900 | 0.500 | 0.200 |" in text
    # the exponent is read only where g has spread: not at init
    assert report.telemetry(results["dnp"], at=0)["update exponent"] is None
    plots.plot_preconditioning(plots.pyplot(), tmp_path / "precond.png", results)
    assert (tmp_path / "precond.png").stat().st_size > 0


def test_decay_alone_follows_the_runs_schedule():
    """No warmup, a constant rate (min_lr = learning_rate): (1 - lr * decay)^steps."""
    res = {1: {"config": "config/gemma_iwd_char.py",
               "args": ["--max_iters=100", "--warmup_iters=0", "--learning_rate=1e-2",
                        "--min_lr=1e-2", "--sv_decay=1.0"]}}
    assert report.decay_alone(res) == pytest.approx((1 - 1e-2) ** 100)
    res[1]["args"] = res[1]["args"][:-1] + ["--weight_decay=0.5"]   # sv_decay -1: weight_decay
    assert report.decay_alone(res) == pytest.approx((1 - 0.5e-2) ** 100)


def test_a_degenerate_budget_fit_is_flagged():
    """E < 0 or alpha at the grid's edge: the token factor says nothing, and the table says so."""
    rows = [{"size": "2x64", "variant": "unified", "budget": 1.0, "params": 1, "tokens_per_param":
             1.0, "epochs": 0.1, "seeds": [1], "mean": -0.1, "std": None, "ci95": None,
             "verdict": "—", "factor": 1.4, "factor_seeds": [1.4], "extrapolated": False,
             "degenerate": True}]
    assert "1.40x (degenerate fit)" in "\n".join(report.scaling_lines(rows))


def test_the_scaling_report_of_the_committed_runs_is_json_with_its_degenerate_fit_flagged():
    """The committed scaling grid's 2x64 fit is degenerate: its flag was a numpy bool, which
    summary.json could not hold (a TypeError once the flag was added)."""
    import glob
    import json
    import os
    from conftest import ROOT
    from study.reproduce import load_result
    results = {}
    for run_dir in glob.glob(os.path.join(ROOT, "study", "results", "scaling", "runs", "*",
                                          "seed*")):
        r = load_result(run_dir)
        results.setdefault(r["variant"], {})[r["seed"]] = r
    lines, data = report.scaling_report(results)
    assert json.loads(json.dumps(data))["fits"]["2x64"]["degenerate"] is True
    assert any("(degenerate fit)" in line for line in lines)
