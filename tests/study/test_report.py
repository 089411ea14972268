"""study/report.py and study/claims.py on made-up numbers: paired statistics, the claim rule,
pairs of one code, tuned pairs, the grids' reports, Holm; and the README's claims tables against
the committed results. The committed grids' summaries: test_reproduce.py."""
import statistics

import pytest

from study import claims, grids, plots, report
from study.grids import Variant


# pytest.approx's default (relative 1e-6), or abs=1e-12: a figure a few float64 operations make of
# made-up numbers (rounding: 1e-16); a wider tolerance says why beside it
def fake(val, seed=1, **more):
    return {"val_loss": val, "seed": seed, "curve": [[0, 4.0], [10, val]], "wall_s": 1.0, **more}


def test_the_paired_table_and_the_claim_rule():
    """t975: the table to 30 degrees of freedom, then within 2e-4 (12 seeds once took its last
    entry, 1.2% too wide); the whole val split where both have it; a row never run is not listed.
    A claim: under 6 seeds p >= 2/32; an interval excluding 0 with p >= 0.05 is no result, nor a
    mean 2.5 standard errors from 0 whose interval covers it (ER once read "beyond noise")."""
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
    """g per kind as the run's model declares it; decay alone: the product over the run's schedule
    of (1 - lr decay), here constant (no warmup, min_lr = learning_rate)."""
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


def code(c):   # a result.json's code record
    return {"commit": "c" * 40, "diff": None, "id": c}


def test_a_pair_is_of_one_code_and_a_summary_names_the_seeds_it_left_out(tmp_path):
    """Two runs of a seed pair only on one code (one config and seed under two codes differed by
    0.029); runs that record none pair only with each other; summary.md names the seeds left out;
    the DNP split needs a seed's three runs on one code."""
    base = {1: fake(2.0, 1, code=code("a")), 2: fake(2.0, 2, code=code("a")),
            3: fake(2.0, 3, code=code("a")), 4: fake(2.0, 4)}
    var = {1: fake(1.9, 1, code=code("a")), 2: fake(1.5, 2, code=code("b")),
           3: fake(1.8, 3, code=code("a")), 4: fake(1.7, 4)}
    seeds, diffs = report.paired_diffs(var, base)
    assert seeds == [1, 3, 4] and diffs == pytest.approx([-0.1, -0.2, -0.3])
    assert report.mixed_code(var, base) == [2] and report.mixed_code(base, base) == []
    grid = [Variant("base", "c.py", [], None, "", 0), Variant("x", "c.py", [], "base", "x", -1),
            Variant("y", "c.py", [], "base", "y", -1)]
    rows = report.summarize(grid, {"base": base, "x": var, "y": {2: var[2]}})
    assert rows[1]["paired_seeds"] == [1, 3, 4] and rows[1]["mixed_code_seeds"] == [2]
    assert (rows[2]["paired_seeds"], rows[2]["verdict"], rows[2]["agree"]) == ([], "—", None)
    report.write_summary(tmp_path, rows, ["# t"])
    assert "(n=3); seed 2 left out (two codes)" in (tmp_path / "summary.md").read_text()
    split, mixed = report.split_rows({"baseline": base, "dnp": var, "dnp_novec": base})
    assert split[0]["seeds"] == [1, 3, 4] and mixed[0]["seeds"] == [2]


def test_telemetry_of_two_variants_is_compared_seed_by_seed_on_one_code():
    """The spread of the column updates differs 20x more between seeds than between noscale and
    the baseline of one seed: the pair resolves what the two intervals cannot."""
    def run(cv, seed, **more):
        return fake(2.0, seed, preconditioning=[[10, {"head": {
            "g": [0.02, 0.9, 1.1, 1, 1, 1], "update_cv": cv}}]], **more)
    results = {"baseline": {s: run(0.1 + 0.02 * s, s) for s in range(1, 8)},
               "noscale": {s: run(0.099 + 0.02 * s + 1e-4 * (s % 2), s) for s in range(1, 8)}}
    results["noscale"][7] = run(0.5, 7, code=code("b"))   # another code: left out
    seeds, diffs = report.telemetry_pair(results["noscale"], results["baseline"], "update cv")
    assert seeds == list(range(1, 7)) and diffs == pytest.approx(
        [-0.001 + 1e-4 * (s % 2) for s in seeds], abs=1e-12)
    own = [report.telemetry(results[n])["update cv"]["ci95"] for n in ("noscale", "baseline")]
    assert own[0][1] > own[1][0] and report.ci95(diffs)[1] < 0   # the intervals overlap
    cell = f"{statistics.mean(diffs):+.4f} {report.interval(report.ci95(diffs))}, p = 0.031"
    last = report.telemetry_lines(results)[-1]
    assert last.startswith("| noscale | ") and last.endswith(f"| {cell} (n=6) |")


def test_the_size_report_picks_each_rate_pairs_the_other_seeds_and_takes_the_trend():
    """Each family's rate at each size by the mean loss over TUNE_SEEDS ((edge): the best at the
    end of the rates run), unified minus the baseline at those rates on the other seeds, the gap
    at 5x160 minus at 2x64 (Welch: two sizes' seeds are independent); on any part of the grid."""
    best = {("baseline", "2x64"): "2e-3", ("unified", "2x64"): "8e-3",
            ("baseline", "5x160"): "5e-4", ("unified", "5x160"): "2.5e-4"}
    gap = {"2x64": lambda s: -0.2 + 0.01 * (s % 3), "5x160": lambda s: -0.02 - 0.003 * (s % 2)}
    results = {}
    for (f, size), pick in best.items():
        for lr in grids.SIZE_TREND_LRS[size]:
            results[f"{f}_{size}_lr{lr}"] = {s: fake(
                2.0 + 0.001 * s + (0.05 * (lr != pick) if s in grids.TUNE_SEEDS
                                   else gap[size](s) * (f == "unified")), s, val_loss_full=None)
                for s in range(1, 11)}
    picks, rows, trend = report.size_trend(results)
    assert {(f, size): p["best"] for size, by in picks.items() for f, p in by.items()} == best
    assert [picks[s][f]["edge"] for s, f in (("2x64", "baseline"), ("2x64", "unified"))] == [
        False, True]
    later = list(range(3, 11))
    d2, d5 = ([gap[size](s) for s in later] for size in ("2x64", "5x160"))
    assert [r["seeds"] for r in rows] == [later, later]
    assert [r["mean"] for r in rows] == pytest.approx([statistics.mean(d2), statistics.mean(d5)])
    assert trend["mean"] == pytest.approx(statistics.mean(d5) - statistics.mean(d2))
    assert trend["p"] == pytest.approx(2 / 12870) and trend["verdict"] == "higher"
    lines = "\n".join(report.size_report(results)[0])
    picked = ",".join(f"{f}_{size}_lr{p}" for (f, size), p in best.items())
    assert f"--seeds={report.SIZE_SEEDS} --variants={picked}`" in lines
    assert "**" in lines and "(edge)" in lines and "permutation p = " in lines
    # before the pairs' seeds ran, and before anything ran
    first = {n: {s: r for s, r in res.items() if s in grids.TUNE_SEEDS}
             for n, res in results.items()}
    assert report.size_trend(first)[1:] == ([], None) and report.size_report({})[1]["pairs"] == []


def test_welch_and_the_permutation_p_on_cases_worked_by_hand():
    # equal sizes and variances: df = 2n - 2 = 4, the half width t(0.975, 4) sqrt(2 s^2 / n)
    mean, ci = report.welch([1, 2, 3], [11, 12, 13])
    assert mean == -10 and ci == pytest.approx([-10 - 2.776 * (2 / 3) ** 0.5,
                                                -10 + 2.776 * (2 / 3) ** 0.5])
    # unequal: df = 2.8^2 / (1^2 / 1 + 1.8^2 / 5) = 4.76, down to 4 (pooled: 6)
    mean, ci = report.welch([0, 2], [0, 0, 0, 6, 6, 6])
    assert mean == -2 and ci == pytest.approx([-2 - 2.776 * 2.8 ** 0.5, -2 + 2.776 * 2.8 ** 0.5])
    assert report.permutation_p([1, 2, 3], [11, 12, 13]) == pytest.approx(2 / 20)
    assert report.permutation_p([1, 2], [2, 1]) == 1.0
    assert report.permutation_p([0], [1, 2, 3]) == 0.5   # |0 - 2| and |3 - 1| of 4 splits


def test_the_untied_report_gives_the_spread_of_g_and_muon_leaves_out_the_picking_seed():
    """untied: g per class, its mean and its std over the runs' vectors and seeds; muon: unified
    minus the baseline on seeds 2-9 (seed 1 picked the rates in the lr grid)."""
    by = {v.name: v for v in grids.untied_grid()}
    base, iwd = "baseline_2x64_untied_lr2e-3", "iwd_2x64_untied_lr2e-3_sv1.0"

    def run(name, loss, seed, g):   # g: the blocks' four vectors; g_final 0.1 below their mean
        names = ["blocks.0.attn.qkv.g_in", "blocks.0.mlp.gate_up.g_in", "blocks.1.attn.qkv.g_in",
                 "blocks.1.mlp.gate_up.g_in"]
        return fake(loss, seed, config=by[name].config, args=by[name].overrides,
                    sv_means={**{n: [1.0, x] for n, x in zip(names, g)},
                              "g_final": [1.0, statistics.mean(g) - 0.1]})
    gs = {1: [0.5, 0.6, 0.7, 0.8], 2: [0.4, 0.6, 0.6, 0.6]}
    results = {base: {s: run(base, 2.0, s, [1.0] * 4) for s in gs},
               iwd: {s: run(iwd, 2.1, s, g) for s, g in gs.items()}}
    lines, data = report.untied_report(results)
    row = next(r for r in data["rows"] if r["variant"] == iwd)
    flat = gs[1] + gs[2]
    assert row["g"]["input"] == pytest.approx(statistics.mean(flat))
    assert row["g_std"]["input"] == pytest.approx(statistics.stdev(flat))
    assert row["g_std"]["final"] == pytest.approx(statistics.stdev([0.55, 0.45]))
    assert row["mean"] == pytest.approx(0.1) and f"± {statistics.stdev(flat):.3f}" in lines[-1]

    b, u = (v.name for v in grids.muon_grid())
    results = {b: {s: fake(2.0, s) for s in range(1, 10)},
               u: {s: fake(1.95 - 0.001 * s + 0.5 * (s == 1), s) for s in range(1, 10)}}
    (row,) = report.muon_report(results)[1]["rows"]
    assert row["seeds"] == list(range(2, 10)) and row["mean"] == pytest.approx(-0.0555)
    assert row["verdict"] == "holds" and report.muon_report({}) == ([], None)


def test_holm_multiplies_the_kth_smallest_p_by_m_minus_k_plus_1_monotone():
    assert claims.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert claims.holm([0.5, 0.9]) == [1.0, 1.0] and claims.holm([None]) == [None]


def test_a_claims_table_reads_holms_p_and_states_each_rows_regime():
    """The family: the rows of 6 seeds or more; a direction only where the interval and Holm's p
    agree, "in this regime", which the row states from its runs' own settings."""
    def runs(shift, seeds, *args, wobble=0.0):
        return {s: fake(2.0 + shift + 0.001 * s * (s % 2) + wobble * (-1) ** s, s,
                        config="config/baseline_char.py", args=["--max_iters=1000", *args])
                for s in seeds}
    ten, untied = range(1, 11), "--tie_embeddings=False"
    data = {"g": {"base": runs(0, ten), "a": runs(-0.1, ten), "b": runs(5e-4, ten, wobble=3e-3),
                  "c": runs(-0.1, range(1, 4)), "f": runs(-0.1, range(1, 7)),
                  "base_untied": runs(0, ten, untied),
                  "d": runs(-0.1, ten, untied, "--learning_rate=2e-3")}}
    rows = [claims.Row("x", "", "g", v, "base", -1) for v in "abcfe"]
    rows.insert(3, claims.Row("", "", "g", "d", "base_untied", +1))
    lines = claims.table(rows, load=data.get)
    assert "over the 4 rows with 6 seeds" in lines[0]
    a, b, c, d, f, e = (line.split(" | ") for line in lines[-6:])
    assert a[3] == "4x128, 0.96 tok/param, 0.77 epochs, head tied, lr 1e-3"   # the recipe
    assert (a[8], a[9]) == (report.p_value(4 * 2 / 1024), "holds in this regime |")
    assert b[9] == "not resolved |" and c[9] == "not resolved (n too small) |"
    assert d[3].endswith("head untied, lr 2e-3 / 1e-3") and d[9] == "opposite in this regime |"
    assert (f[7], f[9]) == (report.p_value(2 / 64), "not resolved after Holm |")
    assert e[5] == "not run yet"


def test_the_readme_claims_tables_are_what_the_committed_results_make():
    """A stale table fails: `python -m study.claims` rewrites them."""
    with open(claims.README) as f:
        text = f.read()
    assert claims.spliced(text, claims.blocks()) == text, "run python -m study.claims"
