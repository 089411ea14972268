"""study/report.py on made-up numbers: paired statistics, the claim rule, tuned pairs, the grids'
reports. The committed grids' summaries: test_reproduce.py."""
import statistics

import pytest

from study import grids, plots, report
from study.grids import Variant


# pytest.approx's default (relative 1e-6), or abs=1e-12: a figure a few float64 operations make of
# made-up numbers (rounding: 1e-16); a wider tolerance says why beside it
def fake(val, seed=1, **more):
    return {"val_loss": val, "seed": seed, "curve": [[0, 4.0], [10, val]], "wall_s": 1.0, **more}


def test_the_paired_table_and_the_claim_rule():
    """t975: the table to 30 degrees of freedom, then within 2e-4 (issue 40: 12 seeds took its last
    entry, 1.2% too wide); the whole val split where both have it; a row never run is not listed.
    A claim (issue 40): under 6 seeds p >= 2/32; an interval excluding 0 with p >= 0.05 is no
    result, nor a mean 2.5 standard errors from 0 whose interval covers it (ER once read "beyond
    noise")."""
    assert report.sign_flip_p([3.0, 1.0, 1.0]) == 2 / 8   # |sum| >= 5: (+,+,+) and (-,-,-)
    assert report.sign_flip_p([1.0, -1.0]) == 1.0 and report.sign_flip_p([0.5]) is None
    assert [report.t975(n) for n in (3, 11, 30)] == [3.182, 2.201, 2.042]
    assert [report.t975(n) for n in (40, 120)] == pytest.approx([2.021, 1.980], abs=2e-4)
    grid = [Variant("base", "c.py", [], None, "", 0), Variant("x", "c.py", [], "base", "x", -1),
            Variant("never", "c.py", [], "base", "", -1)]
    diffs = [-0.02, -0.01, 0.005, -0.03]
    rows = report.summarize(grid, {"base": {s: fake(2.0, s) for s in range(1, 5)},
                                   "x": {s: fake(2.0 + d, s) for s, d in enumerate(diffs, 1)}})
    mean, half = statistics.mean(diffs), 3.182 * statistics.stdev(diffs) / 2   # t(0.975, 3)
    assert [r["variant"] for r in rows] == ["base", "x"] and rows[1]["agree"] == 3
    assert rows[1]["ci95"] == pytest.approx([mean - half, mean + half], abs=1e-12)
    a = {1: fake(2.0, val_loss_full=1.9), 2: fake(2.1, val_loss_full=1.8)}
    b = {1: fake(2.2, val_loss_full=2.0), 2: fake(2.2, val_loss_full=2.0)}
    assert report.paired_diffs(a, b)[1] == pytest.approx([-0.1, -0.2])
    # a baseline from before the whole-split record: both on the 20 batches
    assert report.paired_diffs(a, {1: fake(2.2), 2: fake(2.2)})[1] == pytest.approx([-0.2, -0.1])
    five = [-0.01, -0.012, -0.011, -0.009, -0.013]
    assert report.claim_verdict(five, -1) == "not resolved (n too small for p < 0.05)"
    six = five + [-0.01]
    assert report.claim_verdict(six, -1) == "holds" and report.claim_verdict(six, +1) == "opposite"
    assert report.claim_verdict(six) == "lower"
    skewed = [1.0, 1.0, 1.0, 1.0, 1.0, -0.2]   # [0.29, 1.31]; flipping -0.2 too: p = 4/64
    assert report.ci95(skewed)[0] > 0 and report.sign_flip_p(skewed) >= 0.05
    assert report.claim_verdict(skewed, +1) == "not resolved (the interval and p disagree)"
    er = [-0.0048 + d for d in (-0.006, 0.006, -0.004, 0.004, -0.002, 0.002)]
    assert report.claim_verdict(er, -1) == "not resolved" and report.verdict(None) == "—"


def test_the_tuned_pairs_leave_out_the_seeds_that_picked_the_rates():
    """Issue 40: rates picked over TUNE_SEEDS, the pairs over the later seeds."""
    results = {}
    for lr in grids.TUNE_LRS:
        for family, best in (("baseline", "1e-3"), ("noscale", "2e-3")):
            # the picking seeds say `best`; the later seeds say nothing of the rate
            results[family if lr == "1e-3" else f"{family}_lr{lr}"] = {s: fake(
                2.0 - 0.1 * (lr == best) * (s in grids.TUNE_SEEDS) + 0.01 * (family == "noscale")
                + 0.001 * s, s, val_loss_full=None) for s in range(1, 9)}
    picks, (same, tuned) = report.tuned_pairs(results)
    assert picks["baseline"]["best"] == "1e-3" and picks["noscale"]["best"] == "2e-3"
    assert same["seeds"] == list(range(1, 9)) and same["rates"] == ["1e-3", "1e-3"]
    assert (tuned["variant"], tuned["baseline"], tuned["seeds"]) == (
        "noscale_lr2e-3", "baseline", list(range(3, 9)))
    assert tuned["mean"] == pytest.approx(0.01) and tuned["verdict"] == "holds"


def test_the_dnp_split_adds_up_with_p_values_and_the_telemetry_is_read(tmp_path):
    """total = Norm part (control - baseline) + vector part (variant - control), over the seeds
    all three have; the preconditioning exponents over seeds, read only where g has spread."""
    def precond(g_std, exp):   # telemetry at iteration 0 (g without spread) and 10
        return [[0, {"head": {"g": [0.0, 1, 1, 1, 1, 1], "corr_wg": None, "update_exp": 9.0,
                              "adamw_exp": 9.0, "sgd_exp": 9.0, "update_cv": 0.1}}],
                [10, {"head": {"g": [g_std, 0.8, 1.2, 0.9, 1, 1.1], "corr_wg": 0.5,
                               "update_exp": exp, "adamw_exp": exp, "sgd_exp": 2 * exp,
                               "update_cv": 0.2}}]]
    results = {name: {s: fake(base + 0.001 * s, s, preconditioning=precond(
        0.02, 1.0 + 0.1 * (name == "dnp") + 0.01 * s)) for s in range(1, 7)}
        for name, base in (("baseline", 2.0), ("dnp", 1.95), ("dnp_novec", 1.96),
                           ("unified_novec", 1.955))}
    results["unified"] = {s: fake(1.94 + 0.001 * s * (s % 2), s) for s in range(1, 7)}
    results["dnp"][7] = fake(1.5, 7)   # a seed the others lack: left out of all three
    lines, data = report.power_report(results)
    split = data["splits"][0]
    # unified - dnp, seed by seed: -0.01 for an odd seed s, -0.01 - 0.001 s for an even one
    uni, novec = data["beyond_dnp"]   # BEYOND_DNP's pairs, in its order
    assert [(r["variant"], r["baseline"]) for r in data["beyond_dnp"]] == report.BEYOND_DNP
    assert uni["seeds"] == list(range(1, 7)) and uni["mean"] == pytest.approx(-0.01 - 0.002)
    assert novec["mean"] == pytest.approx(-0.005) and novec["p"] == 2 / 64
    assert split["seeds"] == list(range(1, 7))
    assert [split[k]["mean"] for k in ("total", "norm", "vector")] == pytest.approx(
        [-0.05, -0.04, -0.01])
    assert split["vector"]["p"] == 2 / 64 and split["vector"]["verdict"] == "lower"
    # exponents 1.11 ... 1.16 over the 6 seeds: mean 1.135, +- t(0.975, 5) 0.0187 / sqrt(6)
    assert ("| dnp | 0.020 [0.020, 0.020] | 1.500 [1.500, 1.500] | 1.135 [1.115, 1.155] | "
            in "\n".join(lines))
    assert report.telemetry(results["dnp"], at=0)["update exponent"]["mean"] is None
    plots.plot_preconditioning(plots.pyplot(), tmp_path / "precond.png", results)
    assert (tmp_path / "precond.png").stat().st_size > 0


def test_the_decay_reports_give_g_per_kind_and_what_decay_alone_makes_of_it():
    """g per kind as the run's model declares it (issue 33); decay alone: the product over the
    run's schedule of (1 - lr decay), here constant (no warmup, min_lr = learning_rate)."""
    def run(loss, seed, g_in, *more):
        return fake(loss, seed, config="config/gemma_iwd_char.py", args=[
            "--max_iters=100", "--warmup_iters=0", "--learning_rate=1e-2", "--min_lr=1e-2",
            *more], sv_means={"blocks.0.attn.qkv.g_in": [1.0, g_in], "g_final": [1, g_in + 0.2],
                              "blocks.0.attn.q_norm.g": [1.0, 1.1]})
    results = {"gemma_none_wd1.0": {s: run(2.0, s, 1.0) for s in (1, 2)},
               "gemma_iwd_wd1.0": {1: run(1.99, 1, 0.6), 2: run(1.98, 2, 0.5)}}
    (row,) = report.wd_report(results)[1]["rows"]
    assert row["mean"] == pytest.approx(-0.015) and row["weight_decay"] == "1.0"
    assert row["g"] == pytest.approx({"input": 0.55, "final": 0.75, "output": 1.1})
    assert row["g_baseline"] == pytest.approx({"input": 1.0, "final": 1.2, "output": 1.1})
    assert report.decay_alone({1: run(2, 1, 1, "--sv_decay=1.0")}) == pytest.approx(0.99 ** 100)
    # sv_decay -1 (the default): weight_decay's
    assert report.decay_alone({1: run(2, 1, 1, "--weight_decay=0.5")}) == pytest.approx(0.995**100)


def test_the_budget_fit_recovers_a_power_law_and_inverts_it():
    """The compute factor's L(C) = E + A C^-alpha (on the committed runs: test_reproduce.py)."""
    E, A, alpha = 1.5, 0.3, 0.7
    fit = report.fit_budget([0.5, 1, 1.5, 2], [E + A * c ** -alpha for c in (0.5, 1, 1.5, 2)])
    assert fit == pytest.approx((E, A, alpha), abs=0.01)   # alpha on a grid of step 0.01
    assert report.budget_needed((E, A, alpha), E + A * 1.3 ** -alpha) == pytest.approx(1.3)
    assert report.budget_needed((E, A, alpha), E - 0.01) == float("inf")   # below the asymptote
