"""study/report.py and claims.py on made-up numbers; the README's claims tables regenerate."""
import itertools
import statistics
from types import SimpleNamespace

import numpy as np
import pytest

from study import claims, grids, plots, report
from study.grids import Variant


# pytest.approx's default (relative 1e-6), or abs=1e-12: a figure a few float64 operations make of
# made-up numbers (rounding: 1e-16); a wider tolerance says why beside it
def fake(val, seed=1, code=None, **more):   # a result.json; code: its code record's id
    return {"val_loss": val, "seed": seed, "curve": [[0, 4.0], [10, val]], "wall_s": 1.0,
            **({"code": {"commit": "c" * 40, "diff": None, "id": code}} if code else {}), **more}


def test_the_statistics_on_cases_worked_by_hand():
    assert report.sign_flip_p([3.0, 1.0, 1.0]) == 2 / 8   # |sum| >= 5: (+,+,+) and (-,-,-)
    assert report.sign_flip_p([1.0, -1.0]) == 1.0 and report.sign_flip_p([0.5]) is None
    # t975: the table to 30 degrees of freedom, then within 2e-4 (12 seeds once took its last
    # entry, 1.2% too wide)
    assert [report.t975(n) for n in (3, 11, 30)] == [3.182, 2.201, 2.042]
    assert [report.t975(n) for n in (40, 120)] == pytest.approx([2.021, 1.980], abs=2e-4)
    # Welch's df: 2n - 2 = 4 at equal sizes and variances; 2.8^2 / (1 + 1.8^2 / 5) = 4.76, so 4
    # (pooled: 6); its half width t(0.975, df) sqrt(s_a^2 / n_a + s_b^2 / n_b)
    for a, b, mean, half in (([1, 2, 3], [11, 12, 13], -10, 2.776 * (2 / 3) ** 0.5),
                             ([0, 2], [0, 0, 0, 6, 6, 6], -2, 2.776 * 2.8 ** 0.5)):
        d, ci = report.welch(a, b)
        assert [d, *ci] == pytest.approx([mean, mean - half, mean + half])
    assert report.permutation_p([1, 2, 3], [11, 12, 13]) == pytest.approx(2 / 20)
    assert report.permutation_p([1, 2], [2, 1]) == 1.0
    assert report.permutation_p([0], [1, 2, 3]) == 0.5   # |0 - 2| and |3 - 1| of 4 splits
    # every split, of sums from the pooled halves' subsets: the same as one by one, 5 + 4 values
    x = [0.3, -1.2, 0.8, 2.5, 0.1, 1.9, -0.4, 3.1, 0.7]
    far = [abs(sum(x[i] for i in c) / 5 - (sum(x) - sum(x[i] for i in c)) / 4)
           >= abs(sum(x[:5]) / 5 - sum(x[5:]) / 4) - 1e-12
           for c in itertools.combinations(range(9), 5)]
    assert report.permutation_p(x[:5], x[5:]) == sum(far) / len(far) and 0 < sum(far) < 126
    # Holm: the k-th smallest p times m - k + 1, kept monotone
    assert claims.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert claims.holm([0.5, 0.9]) == [1.0, 1.0] and claims.holm([None]) == [None]
    # the compute factor's L(C) = E + A C^-alpha, fitted and inverted
    E, A, alpha = 1.5, 0.3, 0.7
    fit = report.fit_budget([0.5, 1, 1.5, 2], [E + A * c ** -alpha for c in (0.5, 1, 1.5, 2)])
    assert fit == pytest.approx((E, A, alpha), abs=0.01)   # alpha on a grid of step 0.01
    assert report.budget_needed((E, A, alpha), E + A * 1.3 ** -alpha) == pytest.approx(1.3)
    assert report.budget_needed((E, A, alpha), E - 0.01) == float("inf")   # below the asymptote


def test_a_pair_is_of_one_seed_and_one_code_and_a_claim_needs_the_interval_and_p(tmp_path):
    """One config and seed under two codes differed by 0.029, more than a pair measures."""
    diffs = [-0.02, -0.01, 0.005, -0.03]   # seeds 1, 3, 4, and 5 (no code record: pairs with none)
    base = {s: fake(2.0, s, code="a" if s < 5 else None) for s in range(1, 6)}
    var = {s: fake(2.0 + d, s, code="a" if s < 5 else None) for s, d in zip((1, 3, 4, 5), diffs)}
    var[2] = fake(1.5, 2, code="b")   # two codes: left out, and named
    grid = [Variant("base", "c.py", [], None, "", 0)] + [
        Variant(name, "c.py", [], "base", name, -1) for name in ("x", "y", "never")]
    rows = report.summarize(grid, {"base": base, "x": var, "y": {2: var[2]}})
    mean, half = statistics.mean(diffs), 3.182 * statistics.stdev(diffs) / 2   # t(0.975, 3)
    assert [r["variant"] for r in rows] == ["base", "x", "y"]   # a row never run: not listed
    assert (rows[1]["paired_seeds"], rows[1]["mixed_code_seeds"], rows[1]["agree"]) == (
        [1, 3, 4, 5], [2], 3)
    assert rows[1]["ci95"] == pytest.approx([mean - half, mean + half], abs=1e-12)
    assert (rows[2]["paired_seeds"], rows[2]["verdict"], rows[2]["agree"]) == ([], "—", None)
    report.write_summary(tmp_path, rows, ["# t"])
    assert "(n=4); seed 2 left out (two codes)" in (tmp_path / "summary.md").read_text()
    split, mixed = report.split_rows({"baseline": base, "dnp": var, "dnp_novec": base})
    assert split[0]["seeds"] == [1, 3, 4, 5] and mixed[0]["seeds"] == [2]
    # the whole val split where both runs have it, else both on the 20 batches
    a = {1: fake(2.0, val_loss_full=1.9), 2: fake(2.1, val_loss_full=1.8)}
    b = {1: fake(2.2, val_loss_full=2.0), 2: fake(2.2, val_loss_full=2.0)}
    assert report.paired_diffs(a, b)[1] == pytest.approx([-0.1, -0.2])
    assert report.paired_diffs(a, {1: fake(2.2), 2: fake(2.2)})[1] == pytest.approx([-0.2, -0.1])
    # the rule: under 6 seeds p >= 2/32; an interval excluding 0 with p >= 0.05 is no result, nor
    # a mean 2.5 standard errors from 0 whose interval covers it (ER once read "beyond noise")
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


def test_the_size_and_muon_reports_leave_out_the_seeds_that_picked_the_rates():
    """The picking seeds favour the picked rates: a pair on them would too. Each contrast of two
    cells is given with and without the baseline seeds on the early plateau."""
    cells = [("2x64", 133), ("5x160", 1976), ("2x64", 1976), ("5x160", 133)]
    assert list(grids.SIZE_CELLS) == cells
    best = {("baseline", cells[0]): "2e-3", ("unified", cells[0]): "8e-3",
            ("baseline", cells[1]): "5e-4", ("unified", cells[1]): "2.5e-4",
            ("baseline", cells[2]): "1e-3", ("unified", cells[2]): "4e-3",
            ("baseline", cells[3]): "4e-3", ("unified", cells[3]): "2e-3"}
    gap = {cells[0]: lambda s: -0.2 + 0.01 * (s % 3), cells[1]: lambda s: -0.02 - 0.003 * (s % 2),
           cells[2]: lambda s: -0.05 + 0.002 * (s % 3), cells[3]: lambda s: -0.1 - 0.01 * (s % 2)}
    # the baseline of 2x64 at 133 steps ends on the plateau (above 2.68) at seeds 4 and 9
    plateau = lambda f, cell, s: 0.8 * (f == "baseline" and cell == cells[0] and s in (4, 9))
    results = {}
    for (f, cell), pick in best.items():
        for lr in grids.SIZE_CELLS[cell]:   # the picking seeds say `pick`, the later the gap
            results[grids.size_name(f, *cell, lr)] = {s: fake(
                2.0 + 0.001 * s + (0.05 * (lr != pick) if s in grids.TUNE_SEEDS
                                   else gap[cell](s) * (f == "unified") + plateau(f, cell, s)), s)
                for s in range(1, 11)}
    assert "baseline_2x64_lr2e-3" in results and "unified_5x160_s133_lr2e-3" in results
    picks, rows = report.size_cells(results)
    assert {(f, c): p["best"] for c, by in picks.items() for f, p in by.items()} == best
    assert [p["edge"] for p in picks[cells[0]].values()] == [False, True]   # 8e-3: the last rate
    later = list(range(3, 11))
    d = {c: [gap[c](s) - plateau("baseline", c, s) for s in later] for c in cells}
    assert [r["seeds"] for r in rows.values()] == [later] * 4
    assert [r["mean"] for r in rows.values()] == pytest.approx([statistics.mean(d[c])
                                                                for c in cells])
    assert [r["plateau"] for r in rows.values()] == [[4, 9], [], [], []]   # loss above 2.68
    contrasts = {c["name"]: c for c in report.size_contrasts(rows)}
    assert list(contrasts) == [name for name, *_ in report.SIZE_CONTRASTS]
    # a cell's gap minus another's (Welch: two cells' runs are of other sizes or lengths)
    for name, a, b, _ in report.SIZE_CONTRASTS:
        c = contrasts[name]
        assert c["all"]["mean"] == pytest.approx(statistics.mean(d[a]) - statistics.mean(d[b]))
        off = [x for x in (a, b) if x == cells[0]]   # no plateau seed, no second figure
        assert (c["off plateau"] is None) == (not off), name
    off = contrasts["size at 133 steps"]["off plateau"]   # without seeds 4 and 9 of 2x64 at 133
    kept = [gap[cells[0]](s) for s in later if s not in (4, 9)]
    assert rows[cells[0]]["off plateau"]["mean"] == pytest.approx(statistics.mean(kept))
    assert [r["off plateau"] for r in rows.values()][1:] == [None] * 3
    assert off["n"] == [8, 6] and off["mean"] == pytest.approx(
        statistics.mean(d[cells[3]]) - statistics.mean(kept))
    diagonal = contrasts["size at 0.96 tokens per parameter"]["all"]
    assert diagonal["p"] == pytest.approx(2 / 12870) and diagonal["verdict"] == "higher"
    lines = "\n".join(report.size_report(results)[0])
    picked = ",".join(grids.size_name(f, *c, p) for (f, c), p in best.items())
    assert f"--seeds={report.SIZE_SEEDS} --variants={picked}`" in lines
    assert "**" in lines and "(edge)" in lines and "| seeds 4, 9 |" in lines
    # before the pairs' seeds ran, and before anything ran
    first = {n: {s: res[s] for s in grids.TUNE_SEEDS} for n, res in results.items()}
    assert report.size_cells(first)[1] == {} and report.size_report({})[1]["pairs"] == []
    b, u = (v.name for v in grids.muon_grid())   # seed 1 picked their rates in the lr grid
    results = {b: {s: fake(2.0, s) for s in range(1, 10)},
               u: {s: fake(1.95 - 0.001 * s + 0.5 * (s == 1), s) for s in range(1, 10)}}
    (row,) = report.muon_report(results)[1]["rows"]
    assert row["seeds"] == list(range(2, 10)) and row["mean"] == pytest.approx(-0.0555)
    assert row["verdict"] == "holds" and report.muon_report({}) == ([], None)


def test_the_power_report_splits_dnp_and_pairs_the_telemetry_by_seed_on_one_code(tmp_path):
    """total = Norm part + vector part seed by seed; a pair resolves what two intervals cannot."""
    def run(name, loss, s, **more):   # telemetry at iteration 0 (g without spread) and 10
        exp = 1.0 + 0.1 * (name == "dnp") + 0.01 * s
        # the update cv differs 20x more between seeds than between unified_novec and the baseline
        cv = 0.1 + 0.02 * s + (name == "unified_novec") * (1e-4 * (s % 2) - 0.001)
        at = [{"head": {"g": [g_std, 0.8, 1.2, 0.9, 1, 1.1], "corr_wg": 0.5, "update_exp": e,
                        "adamw_exp": e, "sgd_exp": 2 * e, "update_cv": cv}}
              for g_std, e in ((0.0, 9.0), (0.02, exp))]
        return fake(loss + 0.001 * s, s, preconditioning=[[0, at[0]], [10, at[1]]], **more)
    results = {n: {s: run(n, loss, s) for s in range(1, 7)} for n, loss in (
        ("baseline", 2.0), ("dnp", 1.95), ("dnp_novec", 1.96), ("unified_novec", 1.955))}
    results["unified"] = {s: fake(1.94 + 0.001 * s * (s % 2), s) for s in range(1, 7)}
    results["dnp"][7] = fake(1.5, 7)   # a seed dnp_novec lacks: left out of the split
    results["baseline"][7] = run("baseline", 2.0, 7)   # and unified_novec's seed 7 of another
    results["unified_novec"][7] = run("unified_novec", 1.955, 7, code="b")   # code: left out
    lines, data = report.power_report(results)
    # unified - dnp, seed by seed: -0.01 for an odd seed s, -0.01 - 0.001 s for an even one
    (split, _), (uni, novec) = data["splits"], data["beyond_dnp"]   # in SPLITS', BEYOND_DNP's order
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
    seeds, diffs = report.telemetry_pair(results["unified_novec"], results["baseline"], "update cv")
    assert seeds == list(range(1, 7)) and diffs == pytest.approx(
        [1e-4 * (s % 2) - 0.001 for s in seeds], abs=1e-12)
    own = [report.telemetry(results[n])["update cv"]["ci95"] for n in ("unified_novec", "baseline")]
    assert own[0][1] > own[1][0] and report.ci95(diffs)[1] < 0   # the intervals overlap
    cell = f"{statistics.mean(diffs):+.4f} {report.interval(report.ci95(diffs))}, p = 0.031"
    assert lines[-1].startswith("| unified_novec | ") and lines[-1].endswith(f"| {cell} (n=6) |")
    plots.plot_preconditioning(plots.pyplot(), tmp_path / "precond.png", results)
    assert (tmp_path / "precond.png").stat().st_size > 0


def test_the_telemetry_is_read_by_iteration_not_by_place():
    """A run that lacks a record (as a resume once lost one) is left out at that iteration, never
    read at another: seed 2 has none at 6, seed 3 none at 11, the last evaluation's step."""
    at = lambda cv: {"head": {"g": [0.0, 1, 1, 1, 1, 1], "update_cv": cv}}   # noqa: E731
    res = {1: fake(2.0, 1, preconditioning=[[1, at(0.1)], [6, at(0.2)], [11, at(0.3)]]),
           2: fake(2.0, 2, preconditioning=[[1, at(0.1)], [11, at(0.5)]]),
           3: fake(2.0, 3, preconditioning=[[1, at(0.1)], [6, at(0.7)]])}
    assert report.telemetry_seeds(res, "update cv") == {1: 0.3, 2: 0.5}   # at 11
    assert report.telemetry_seeds(res, "update cv", at=6) == {1: 0.2, 3: 0.7}
    drawn, nothing = [], lambda *a, **kw: None   # what each panel draws: a pyplot stood in for
    axes = SimpleNamespace(plot=lambda xs, ys, *a, **kw: drawn.append((list(xs), list(ys))),
                           set=nothing, legend=nothing)
    fig = SimpleNamespace(tight_layout=nothing, savefig=nothing)
    plt = SimpleNamespace(subplots=lambda rows, cols, **kw: (fig, [axes] * cols), close=nothing)
    plots.plot_preconditioning(plt, "precond.png", {"v": res})
    cv = list(plots.PRECOND).index("spread of the column updates (cv)")
    assert drawn[cv] == ([1, 6, 11], pytest.approx([0.1, 0.45, 0.4])), drawn[cv]


def test_prediction_4_is_read_against_a_frozen_g_of_the_measured_spread():
    """A frozen g multiplies each folded column's update by g_j: its spread alone spreads them."""
    # every pair (j, k) of g_j and u_k: g independent of u, so the moments factorize exactly
    u, g = np.array([0.8, 1.0, 1.3, 0.9]), np.array([0.96, 1.0, 1.04])   # g's median: its mean
    cv = lambda x: x.std() / x.mean()   # noqa: E731
    assert report.frozen_g(cv(u), [g.std(), 0.96, 1.04, 0.96, 1.0, 1.04]) == pytest.approx(
        cv(np.outer(g, u)), rel=1e-12)

    def run(seed, cvs, g_std=0.0, code="a"):   # a preconditioning record at the last evaluation
        maps = {m: {"g": [g_std, 0.9, 1.1, 0.95, 1.0, 1.05], "update_cv": c}
                for m, c in zip(("head", "blocks.0.attn.qkv"), cvs)}
        return fake(2.0, seed, code=code, preconditioning=[[0, {}], [10, maps]])
    frozen = [report.frozen_g(c, [0.05, 0, 0, 0, 1.0]) for c in (0.1, 0.2)]
    noscale = {s: run(s, (0.1, 0.2)) for s in (1, 2, 3)}
    # seed 1 spreads exactly as the fold's algebra says, seed 2 more, seed 3: another code
    base = {1: run(1, frozen, 0.05), 2: run(2, [f + 0.01 for f in frozen], 0.05),
            3: run(3, frozen, 0.05, code="b")}
    seeds, beyond = report.frozen_g_pair(noscale, base)
    assert seeds == [1, 2] and beyond == pytest.approx([0.0, -0.01], abs=1e-12)
    _, share = report.frozen_g_pair(noscale, base, report.FOLD_SHARE)
    assert share == pytest.approx([statistics.mean((0.1 - frozen[0], 0.2 - frozen[1]))] * 2)
    observed = report.telemetry_pair(noscale, base, "update cv")[1]   # the two parts add up
    assert [a + b for a, b in zip(share, beyond)] == pytest.approx(observed, abs=1e-12)


def test_the_decay_reports_give_g_per_kind_its_spread_and_what_decay_alone_makes_of_it():
    """A mean g near decay alone's may be of vectors at 1 and at 0: its std over them says."""
    def run(loss, seed, g_in, *more):   # a constant rate, no warmup: decay alone (1 - lr wd)^100
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
    # untied: the vectors' spread; g_final 0.1 below the mean of the blocks' four Input-Norm ones
    gs = {1: [0.5, 0.6, 0.7, 0.8], 2: [0.4, 0.6, 0.6, 0.6]}
    names = [f"blocks.{i}.{m}.g_in" for i in (0, 1) for m in ("attn.qkv", "mlp.gate_up")]

    def untied(v, loss):
        return {s: fake(loss, s, config=v.config, args=v.overrides, sv_means={
            **{n: [1.0, x] for n, x in zip(names, g)}, "g_final": [1.0, statistics.mean(g) - 0.1]})
            for s, g in gs.items()}
    base, iwd = grids.untied_grid()[:2]   # no decay, and IWD
    lines, data = report.untied_report({base.name: untied(base, 2.0), iwd.name: untied(iwd, 2.1)})
    row = data["rows"][1]
    flat = gs[1] + gs[2]
    assert row["g"]["input"] == pytest.approx(statistics.mean(flat))
    assert row["g_std"]["input"] == pytest.approx(statistics.stdev(flat))
    assert row["g_std"]["final"] == pytest.approx(statistics.stdev([0.55, 0.45]))
    assert row["mean"] == pytest.approx(0.1) and f"± {statistics.stdev(flat):.3f}" in lines[-1]


def test_a_claims_table_reads_holms_p_states_each_rows_regime_and_the_readmes_regenerate():
    """A direction only where the interval and Holm's p agree, and only "in this regime"."""
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
    assert "over the 4 rows with 6 seeds" in lines[0]   # the family: the rows of 6 seeds or more
    a, b, c, d, f, e = (line.split(" | ") for line in lines[-6:])
    assert a[3] == "4x128, 1000 steps, 0.96 tok/param, 0.77 epochs, head tied, lr 1e-3"
    assert (a[8], a[9]) == (report.p_value(4 * 2 / 1024), "holds in this regime |")
    # a claim not resolved: the effect of its sign the interval leaves out
    low = report.ci95([r[s]["val_loss"] - data["g"]["base"][s]["val_loss"]
                       for r in [data["g"]["b"]] for s in ten])[0]
    assert b[9] == f"not resolved; the interval excludes a diff below {low:+.4f} |", b[9]
    assert c[9] == "not resolved (n too small) |"
    assert d[3].endswith("head untied, lr 2e-3 / 1e-3") and d[9] == "opposite in this regime |"
    # its own p resolves it, Holm's does not: both said, as the grid's summary reads its own p
    assert (f[7], f[9]) == (report.p_value(2 / 64), "holds by its own p, not after Holm |")
    assert e[5] == "not run yet"
    for path, made in claims.blocks().items():   # a stale table fails
        with open(path) as doc:
            text = doc.read()
        assert claims.spliced(text, made) == text, f"{path}: run python -m study.claims"
