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
                          "adamw_exp": 9.0, "sgd_exp": 9.0, "update_cv": 0.1}}],
            [10, {"head": {"g": [g_std, 0.8, 1.2, 0.9, 1, 1.1], "corr_wg": 0.5,
                           "update_exp": exp, "adamw_exp": exp, "sgd_exp": 2 * exp,
                           "update_cv": 0.2}}]]


def test_the_power_report_splits_dnp_with_p_values_and_reads_the_telemetry(tmp_path):
    seeds = range(1, 7)
    results = {name: {s: {"val_loss": base + 0.001 * s, "curve": [[0, 4.0], [10, base]],
                          "preconditioning": precond(0.02, 1.0 + 0.1 * (name == "dnp")
                                                     + 0.01 * s)}
                      for s in seeds}
               for name, base in (("baseline", 2.0), ("dnp", 1.95), ("dnp_novec", 1.96))}
    lines, data = report.power_report(results)
    (split,) = data["splits"]
    assert split["vector"]["mean"] == pytest.approx(-0.01) and split["vector"]["p"] == 2 / 64
    text = "\n".join(lines)
    # exponents 1.11 ... 1.16 over the 6 seeds: mean 1.135, +- t(0.975, 5) 0.0187 / sqrt(6)
    assert "p = 0.031" in text and ("| dnp | 0.020 [0.020, 0.020] | 1.500 [1.500, 1.500] | 1.135 [1.115, 1.155] | "
                                   in text)
    # the exponent is read only where g has spread: not at init
    assert report.telemetry(results["dnp"], at=0)["update exponent"]["mean"] is None
    plots.plot_preconditioning(plots.pyplot(), tmp_path / "precond.png", results)
    assert (tmp_path / "precond.png").stat().st_size > 0


def test_a_claim_needs_6_seeds_and_the_interval_and_p_to_agree():
    """Issue 40: under 6 seeds the exact sign-flip p is at least 2/32, so no direction; at 6 of
    one sign p = 2/64 and the interval excludes 0: holds (or opposite, against the claim); an
    interval that excludes 0 with p >= 0.05 is not a result."""
    five = [-0.01, -0.012, -0.011, -0.009, -0.013]
    assert report.claim_verdict(five, -1) == "not resolved (n too small for p < 0.05)"
    six = five + [-0.01]
    assert report.claim_verdict(six, -1) == "holds" and report.claim_verdict(six, +1) == "opposite"
    assert report.claim_verdict(six) == "lower"
    # the interval [0.29, 1.31] excludes 0; flipping the -0.2 too reaches the sum: p = 4/64
    skewed = [1.0, 1.0, 1.0, 1.0, 1.0, -0.2]
    assert report.ci95(skewed)[0] > 0 and report.sign_flip_p(skewed) >= 0.05
    assert report.claim_verdict(skewed, +1) == "not resolved (the interval and p disagree)"


def test_the_t_quantile_beyond_10_degrees_of_freedom():
    """Issue 40: 12 seeds take t(0.975, 11) = 2.201, not the table's last entry (2.228, intervals
    1.2% too wide); beyond the table, within 2e-4 of the quantile."""
    assert report.t975(11) == 2.201 and report.t975(30) == 2.042
    assert report.t975(40) == pytest.approx(2.021, abs=2e-4)
    assert report.t975(120) == pytest.approx(1.980, abs=2e-4)


def result(loss, seed):
    return {"val_loss": loss, "val_loss_full": loss, "seed": seed}


def test_the_tuned_pairs_leave_out_the_seeds_that_picked_the_rates():
    """Each family's rate is picked by its mean over TUNE_SEEDS, and only the other seeds pair."""
    from study.grids import TUNE_LRS, TUNE_SEEDS
    results = {}
    for lr in TUNE_LRS:
        for family, best in (("baseline", "1e-3"), ("noscale", "2e-3")):
            name = family if lr == "1e-3" else f"{family}_lr{lr}"
            # seeds 1, 2 say `best`; the later seeds say nothing of the rate (they must not pick)
            results[name] = {s: result(2.0 - 0.1 * (lr == best) * (s in TUNE_SEEDS)
                                       + 0.01 * (family == "noscale") + 0.001 * s, s)
                             for s in range(1, 9)}
    picks, rows = report.tuned_pairs(results)
    assert picks["baseline"]["best"] == "1e-3" and picks["noscale"]["best"] == "2e-3"
    same, tuned = rows
    assert same["seeds"] == list(range(1, 9)) and same["rates"] == ["1e-3", "1e-3"]
    assert tuned["variant"] == "noscale_lr2e-3" and tuned["baseline"] == "baseline"
    assert tuned["seeds"] == list(range(3, 9)) and tuned["mean"] == pytest.approx(0.01)
    assert tuned["verdict"] == "holds"


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
