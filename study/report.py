"""
The statistics and reports of reproduce.py's grids, from their results ({variant: {seed: result}}):
the paired table of every grid (summary.md), and the claims as the paper measures them: tuned
against tuned (the lr grid), compute efficiency and scaling (the scaling grid), the parameter cost
of each variant. Pure functions of the results, so they are tested on made-up numbers.
"""
import functools
import os
import re

import numpy as np

from config.variants import UNIFIED
from study.grids import (BUDGETS, LRS, ROOT, SIZE_LRS, SIZES, TPP_1X, budget_name, lr_grid,
                         scaling_grid)


def meta_gpt(**fields):
    """A GPT of GPTConfig(**fields) on the meta device: sizes only, no memory, no init."""
    import torch
    from model import GPT, GPTConfig   # here: a summary without parameter counts needs no torch
    with torch.device("meta"):
        return GPT(GPTConfig(**fields))


def arg_value(args, key, default=None):
    """The value (text) of --key in a run's train.py arguments: the last one, as train.py reads
    its command line (a later --key=value wins), or `default` when there is none. Every reader of
    a run's arguments goes through here."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{key}=")]
    return values[-1] if values else default


# ---- the paired table of every grid -------------------------------------------------------------
def mean_std(xs):
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()) if len(xs) else None, float(xs.std(ddof=1)) if len(xs) > 1 else None


# Student's t, 97.5% quantile, for 1..30 degrees of freedom; beyond, the Cornish-Fisher expansion
# around the normal's 1.96 (within 2e-4 of the quantile from 30 on): 95% intervals of paired
# differences
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
        2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df):
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def loss_of(r, full=True):
    """A run's final validation loss: on the whole val split (val_loss_full, issue 33) when
    full and it has one, else on the 20 fixed batches."""
    return r["val_loss_full"] if full and r.get("val_loss_full") is not None else r["val_loss"]


def paired_diffs(res, base):
    """(seeds both have, variant minus baseline val loss seed by seed) of two {seed: result}; on
    the whole val split where every run of the pair has it."""
    seeds = sorted(set(res) & set(base))
    full = all(r.get("val_loss_full") is not None for d in (res, base) for r in d.values())
    return seeds, [loss_of(res[s], full) - loss_of(base[s], full) for s in seeds]


def sign_flip_p(diffs):
    """The exact two-sided p-value of a sign-flip (randomization) test of mean(diffs) = 0: over
    all 2^n sign patterns, the share whose |mean| is at least the observed one (n <= 20)."""
    d = np.asarray(diffs, float)
    if not 2 <= len(d) <= 20:
        return None
    signs = ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1) * 2 - 1
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))


def ci95(diffs):
    """95% t-interval [lo, hi] of the mean of paired differences; None under 2 of them."""
    mean, std = mean_std(diffs)
    if std is None:
        return None
    half = t975(len(diffs) - 1) * std / np.sqrt(len(diffs))
    return [float(mean - half), float(mean + half)]


def verdict(ci):
    """What a 95% interval of a paired difference says: "lower" or "higher" when it excludes 0,
    "not resolved" when it covers 0, "—" under 2 seeds."""
    if ci is None:
        return "—"
    return "lower" if ci[1] < 0 else "higher" if ci[0] > 0 else "not resolved"


MIN_SEEDS = 6   # under 6 paired seeds the exact sign-flip p is at least 2/32 > 0.05


def claim_verdict(diffs, sign=0):
    """The rule every claim row follows (issue 40): under MIN_SEEDS seeds "not resolved (n too
    small for p < 0.05)"; a direction only where the 95% interval excludes 0 and the exact
    sign-flip p is below 0.05, both: "holds" or "opposite" against the claim's sign, "lower" or
    "higher" where there is no claim; else "not resolved"."""
    if len(diffs) < MIN_SEEDS:
        return "not resolved (n too small for p < 0.05)"
    ci, p = ci95(diffs), sign_flip_p(diffs)
    if verdict(ci) == "not resolved" or p is None or p >= 0.05:
        return "not resolved" + (" (the interval and p disagree)"
                                 if verdict(ci) != "not resolved" else "")
    if not sign:
        return verdict(ci)
    return "holds" if np.sign(np.mean(diffs)) == sign else "opposite"


def summarize(grid, results):
    """A row per variant of the grid that has results (a row that never ran is not listed)."""
    rows = []
    for v in (v for v in grid if results.get(v.name)):
        res = results[v.name]
        mean, std = mean_std([loss_of(r) for r in res.values()])
        row = {"variant": v.name, "baseline": v.baseline, "n": len(res), "val_loss_mean": mean,
               "val_loss_std": std, "claim": v.claim, "expected_sign": v.sign,
               "seeds": sorted(res)}
        if v.baseline:
            base = results.get(v.baseline, {})
            seeds, diffs = paired_diffs(res, base)
            d_mean, d_std = mean_std(diffs)
            matches = None if d_mean is None or not v.sign else bool(np.sign(d_mean) == v.sign)
            row.update(paired_seeds=seeds, diff_mean=d_mean, diff_std=d_std, ci95=ci95(diffs),
                       p=sign_flip_p(diffs),
                       agree=int(sum(np.sign(d) == v.sign for d in diffs)) if v.sign else None,
                       verdict=claim_verdict(diffs, v.sign), direction_matches=matches)
        row["code_unrecorded"] = any(code_id(r.get("code")) == "unknown" for r in res.values())
        rows.append(row)
    return rows


def pm(m, s, fmt=".4f"):
    return "—" if m is None else f"{m:{fmt}}" + ("" if s is None else f" ± {s:.4f}")


def interval(ci):
    return "—" if ci is None else "[{:+.4f}, {:+.4f}]".format(*ci)


def write_summary(out, rows, header, more=()):
    word = {True: "yes", False: "no", None: "—"}
    lines = [*header, "", "| variant | vs | n | val loss (mean ± std) | paired diff (mean ± std) "
             "| 95% CI | p | agree | verdict | paper's claim | direction matches |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = ci = p = agree = said = ""
        if r["baseline"]:
            diff = f"{pm(r['diff_mean'], r['diff_std'], '+.4f')} (n={len(r['paired_seeds'])})"
            ci, p = interval(r["ci95"]), p_value(r.get("p"))
            agree = "—" if r["agree"] is None else f"{r['agree']}/{len(r['paired_seeds'])}"
            said = r["verdict"]
        loss = pm(r["val_loss_mean"], r["val_loss_std"])
        name = r["variant"] + (" (code not recorded)" if r.get("code_unrecorded") else "")
        lines.append(f"| {name} | {r['baseline'] or ''} | {r['n']} | {loss} | {diff} | {ci} "
                     f"| {p} | {agree} | {said} | {r['claim']} "
                     f"| {word[r.get('direction_matches')]} |")
    lines += ["", "Paired diff: variant minus its baseline, seed by seed (a seed fixes the shared "
              "initialization and the batch order). 95% CI: mean +- t(0.975, n-1) std / sqrt(n); "
              "p: the exact two-sided sign-flip p-value over the seeds. Verdict (report."
              "claim_verdict): under 6 seeds not resolved (p cannot go below 0.05); otherwise a "
              "direction (holds or opposite against the claim; lower or higher without one) only "
              "where the interval excludes 0 and p < 0.05, else not resolved. Agree: seeds whose "
              "difference has the claimed sign. Loss: on the whole validation split where a "
              "pair's runs have it (val_loss_full, from issue 33 on), else on the 20 fixed "
              "batches. (code not recorded): a row with runs older than the code record.",
              *(["", *more] if more else [])]
    from checkpoint import atomic_write   # a record: temporary name, fsync, rename
    text = "\n".join(lines) + "\n"
    atomic_write(os.path.join(out, "summary.md"), lambda f: f.write(text.encode()))


# ---- the claims as the paper measures them: tuned comparisons, compute efficiency, scaling ------
def lr_sweep(results, seeds=(1,)):
    """{family: {lr: mean val loss over `seeds`}} from the lr grid's names <family>_lr<lr>."""
    sweep = {}
    for name, res in results.items():
        family, sep, lr = name.rpartition("_lr")
        if sep and lr in LRS and any(s in res for s in seeds):   # not an --add variant
            losses = [res[s]["val_loss"] for s in seeds if s in res]
            sweep.setdefault(family, {})[lr] = float(np.mean(losses))
    return sweep


def tuned_rows(grid, results):
    """Tuned against tuned: each family at the rate that was best in the sweep (seed 1), paired
    seed by seed with its baseline family at *that* family's best rate, on the other seeds only
    (the seed that picked the rate is not evaluated: issue 33). bracketed: both neighbours of the
    best rate in LRS were measured (or it is at the end of LRS); otherwise the optimum may lie
    further out."""
    sweep, rows = lr_sweep(results), {}
    for family, by in sweep.items():
        best = min(by, key=by.get)
        i = LRS.index(best)
        bracketed = all(LRS[j] in by for j in (i - 1, i + 1) if 0 <= j < len(LRS))
        rows[family] = {"family": family, "best_lr": best, "variant": f"{family}_lr{best}",
                        "bracketed": bracketed}
    by_name = {v.name: v for v in grid}
    for r in rows.values():
        v = by_name[r["variant"]]
        base = rows.get(v.baseline.rsplit("_lr", 1)[0]) if v.baseline else None
        if base:
            drop = lambda res: {s: x for s, x in res.items() if s != 1}   # noqa: E731
            seeds, diffs = paired_diffs(drop(results[r["variant"]]),
                                        drop(results[base["variant"]]))
            r.update(baseline=base["variant"], seeds=seeds, claim=v.claim, ci95=ci95(diffs),
                     **dict(zip(("diff_mean", "diff_std"), mean_std(diffs))))
    return list(rows.values())


def fit_budget(budgets, losses):
    """L(C) = E + A C^-alpha, the paper's form of a loss-compute scaling law; least squares, alpha
    on a fine grid (E and A are linear given alpha: a line fit of L on C^-alpha, every alpha at
    once; the grid's 400 separate solves took most of a scaling summary's time). Returns (E, A,
    alpha); ValueError when no alpha gives A > 0."""
    C, L = np.asarray(budgets, float), np.asarray(losses, float)
    alphas = np.linspace(0.02, 4, 400)
    X = C[None, :] ** -alphas[:, None]   # (alpha, budget)
    dx = X - X.mean(1, keepdims=True)
    A = (dx * (L - L.mean())).sum(1) / (dx ** 2).sum(1)
    E = L.mean() - A * X.mean(1)
    sse = ((E[:, None] + A[:, None] * X - L) ** 2).sum(1)
    if not (A > 0).any():
        raise ValueError("no decreasing power law fits these losses")
    i = int(np.argmin(np.where(A > 0, sse, np.inf)))
    return float(E[i]), float(A[i]), float(alphas[i])


def budget_needed(fit, loss):
    """The budget at which the fitted baseline reaches `loss` (inf below its asymptote E)."""
    E, A, alpha = fit
    return float((A / (loss - E)) ** (1 / alpha)) if loss > E else float("inf")


def non_embedding_params(n_layer, n_embd):
    # the char recipe's other sizes (block 64, 65 characters)
    m = meta_gpt(block_size=64, vocab_size=65, vocab_pad=1, n_layer=n_layer, n_head=n_embd // 32,
                 n_embd=n_embd)
    return m.num_params() - m.wte.weight.numel()


TRAIN_TOKENS = 1_003_854   # Tiny Shakespeare's training characters: the CPU grids' epochs
TOKENS_PER_ITER = 768       # the char recipe's batch 12 x block 64


def scaling_rows(results, tokens_per_iter=TOKENS_PER_ITER, train_tokens=TRAIN_TOKENS):
    """Per size, family and budget: the family's loss against the baseline at the same budget
    (paired by seed), and the compute factor: the budget the baseline's fitted L(C) needs to reach
    the family's loss, over the budget the family used (the paper: 1.22-1.25x at 0.12B-2B). The
    gap at each budget says whether the gain holds or fades with training length."""
    rows, fits = [], {}
    for size, (n_layer, n_embd, iters) in SIZES.items():
        base = {b: results.get(budget_name("baseline", size, b), {}) for b in BUDGETS}
        seeds = sorted(set.intersection(*(set(r) for r in base.values())))
        if not seeds:
            continue
        xs = [float(b) for b in BUDGETS]
        mean_curve = [float(np.mean([base[b][s]["val_loss"] for s in seeds])) for b in BUDGETS]
        fit = list(fit_budget(xs, mean_curve))
        # a fit whose E is negative, or whose alpha is at the grid's edge, says nothing (issue 33)
        degenerate = bool(fit[0] < 0 or not 0.02 < fit[2] < 4)   # fit: numpy floats
        fits[size] = {"budgets": xs, "iters": iters, "baseline": mean_curve, "fit": fit,
                      "degenerate": degenerate, "variants": {}}
        params = non_embedding_params(n_layer, n_embd)
        by_base = {budget_name("baseline", size, b): b for b in BUDGETS}
        for v in [v for v in scaling_grid() if v.baseline in by_base]:
            b = by_base[v.baseline]
            res = results.get(v.name, {})
            paired = [s for s in seeds if s in res]
            if not paired:
                continue
            curve = lambda s: [base[c][s]["val_loss"] for c in BUDGETS]   # noqa: E731
            per_seed = [budget_needed(fit_budget(xs, curve(s)), res[s]["val_loss"]) / float(b)
                        for s in paired]
            # against the baseline of the same seeds
            loss = float(np.mean([res[s]["val_loss"] for s in paired]))
            paired_curve = [np.mean([base[c][s]["val_loss"] for s in paired]) for c in BUDGETS]
            needed = budget_needed(fit_budget(xs, paired_curve), loss)
            label = v.name.split(f"_{size}")[0]
            fits[size]["variants"].setdefault(label, {})[b] = loss
            diffs = [res[s]["val_loss"] - base[b][s]["val_loss"] for s in paired]
            n_iter = round(iters * float(b))
            rows.append({"size": size, "variant": label, "budget": float(b), "params": params,
                         "iters": n_iter, "tokens_per_param": n_iter * tokens_per_iter / params,
                         "epochs": n_iter * tokens_per_iter / train_tokens, "seeds": paired,
                         **part(diffs), "factor": needed / float(b),
                         "factor_seeds": per_seed, "extrapolated": not xs[0] <= needed <= xs[-1],
                         "degenerate": degenerate})
    return rows, fits


def scaling_lines(rows):
    f = lambda x: "∞" if x == float("inf") else f"{x:.2f}"   # noqa: E731
    lines = ["## Compute efficiency, scaling and training length", "",
             f"Each size trains at {', '.join(BUDGETS)} x its budget (1x: a fixed "
             f"{TPP_1X:.3f} tokens per non-embedding parameter; a complete schedule each); the "
             "baseline's loss is fitted as L(C) = E + A C^-alpha over those budgets (means over "
             "the variant's seeds). Gap: the variant minus the baseline at the same budget, seed "
             "by seed, with its 95% interval and verdict. Token factor: the budget at which the "
             "fitted baseline reaches the variant's loss, over the budget the variant used; it is "
             "a factor of training tokens at one size, not the paper's compute factor across "
             "sizes (1.22-1.25x); beyond 2x it is extrapolated, and where the fit is degenerate "
             "(E < 0, or alpha at the edge of its grid, 0.02-4) it says nothing. Per-seed "
             "factors fit each seed's own curve. `gap_vs_length.png`: the gap against tokens per "
             "parameter, one line per size.", "",
             "| size | variant | budget | tokens/param | epochs | seeds "
             "| gap (mean ± std) | 95% CI | verdict | token factor (same size) | per seed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["params"], r["variant"], r["budget"])):
        beyond = (" (degenerate fit)" if r.get("degenerate")
                  else " (extrapolated)" if r["extrapolated"] else "")
        lines.append(f"| {r['size']} | {r['variant']} | {r['budget']:g}x "
                     f"| {r['tokens_per_param']:.2f} | {r['epochs']:.2f} | {len(r['seeds'])} "
                     f"| {pm(r['mean'], r['std'], '+.4f')} | {interval(r['ci95'])} "
                     f"| {r['verdict']} | {f(r['factor'])}x{beyond} "
                     f"| {', '.join(f(x) for x in r['factor_seeds'])} |")
    return lines


def size_lr_rows(results):
    """The lr check at the smallest and the largest size: {size: {family: {lr: mean val loss}}},
    and per size the best rate of each family and unified's gap at the best rates (paired)."""
    out = {}
    for size in SIZES:
        runs = {("baseline", "1e-3"): budget_name("baseline", size, "1"),
                ("unified", "1e-3"): budget_name("unified", size, "1")}
        runs.update({(f, lr): f"{f}_{size}_lr{lr}" for f in ("baseline", "unified")
                     for lr in SIZE_LRS.get(size, ())})
        if not any(results.get(n) for (f, lr), n in runs.items() if lr != "1e-3"):
            continue
        table = {}
        for (f, lr), name in runs.items():
            if results.get(name):
                table.setdefault(f, {})[lr] = (name, results[name])
        best = {f: min(t, key=lambda lr: mean_std([r["val_loss"] for r in t[lr][1].values()])[0])
                for f, t in table.items()}
        row = {"size": size, "losses": {f: {lr: mean_std([r["val_loss"] for r in res.values()])[0]
                                            for lr, (_, res) in t.items()}
                                        for f, t in table.items()}, "best": best}
        if len(best) == 2:
            seeds, diffs = paired_diffs(table["unified"][best["unified"]][1],
                                        table["baseline"][best["baseline"]][1])
            row.update(seeds=seeds, **part(diffs))
        out[size] = row
    return out


def size_lr_lines(rows):
    lrs = sorted({"1e-3", *(lr for size in rows for lr in SIZE_LRS[size])}, key=float)
    lines = ["", "### Learning rate at the smallest and the largest size", "",
             "Mean validation loss at the 1x budget over the seeds run; **bold**: the family's "
             "best, (edge) when no larger or smaller rate was run beside it. Tuned: unified at its "
             "best rate minus the baseline at its best, paired by "
             "seed (the lr grid swept 4x128).", "",
             "| size | family | " + " | ".join(lrs) + " | tuned gap | 95% CI | verdict |",
             "|---" * (len(lrs) + 5) + "|"]
    for size, r in rows.items():
        for f, by in r["losses"].items():
            cells = [("**%.4f**" if lr == r["best"][f] else "%.4f") % by[lr] if lr in by else "—"
                     for lr in lrs]
            ran = sorted(by, key=float)
            if r["best"][f] in (ran[0], ran[-1]):   # the optimum may lie further out
                cells[lrs.index(r["best"][f])] += " (edge)"
            tuned = [pm(r["mean"], r["std"], "+.4f"), interval(r["ci95"]), r["verdict"]] \
                if f == "unified" and "mean" in r else ["", "", ""]
            lines.append(f"| {size} | {f} | " + " | ".join(cells + tuned) + " |")
    return lines


def lr_report(results):
    sweep, rows = lr_sweep(results), tuned_rows(lr_grid(), results)
    lines = ["## Learning-rate sweep", "",
             "Validation loss, seed 1. AdamW families sweep `learning_rate` (the schedule ends at "
             "a tenth of it); Muon families sweep `muon_lr` (AdamW's part keeps 1e-3). **Bold**: "
             "the family's best rate. A best rate whose neighbours were not both measured is "
             "marked: the optimum may lie further out. — : not run (a family whose loss already "
             "rose at the rate before needs no larger one).", "",
             "| family | " + " | ".join(LRS) + " | best |", "|---" * (len(LRS) + 2) + "|"]
    for r in rows:
        by = sweep[r["family"]]
        cells = [("**%.4f**" if lr == r["best_lr"] else "%.4f") % by[lr] if lr in by else "—"
                 for lr in LRS]
        mark = "" if r["bracketed"] else " (not bracketed)"
        lines.append(f"| {r['family']} | {' | '.join(cells)} | {r['best_lr']}{mark} |")
    lines += ["", "### Tuned against tuned", "",
              "Each family at its best rate against its baseline at the baseline's best rate, "
              "paired by seed, on the seeds after the first (seed 1 picked the rates).", "",
              "| variant | vs | seeds | paired diff (mean ± std) | 95% CI | paper's claim |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['baseline']} | {len(r['seeds'])} "
              f"| {pm(r['diff_mean'], r['diff_std'], '+.4f')} | {interval(r['ci95'])} "
              f"| {r['claim']} |" for r in rows if r.get("baseline")]
    best = ",".join(r["variant"] for r in rows)
    n = max((len(results.get(r["variant"], {})) for r in rows), default=0)   # seeds run
    lines += ["", "More seeds at the best rates: "
              f"`python -m study.reproduce --grid=lr --seeds={max(3, n + 3)} --variants={best}`"]
    return lines, {"sweep": sweep, "tuned": rows}


# The extra parameters of HG and of each width of DNP's g_out (sv_dnp_width), as fractions of the
# baseline's (the paper: "at most 7.85e-5"), at GPT-2 small's shape and two larger ones; counted
# on the meta device
OVERHEAD_SHAPES = {"124M (12 x 768)": {},
                   "0.5B-like (24 x 1280)": dict(n_layer=24, n_head=20, n_embd=1280),
                   "1B-like (16 x 2048)": dict(n_layer=16, n_head=32, n_embd=2048)}
UNIFIED_FLAGS = {k: v for k, v in UNIFIED.items() if k != "sv_weight_decay"}   # the model's
OVERHEAD_FLAGS = {"HG": dict(sv_hetero=True), "DNP, full": dict(sv_placement="dnp"),
                  "DNP, head": dict(sv_placement="dnp", sv_dnp_width="head"),
                  "unified, full": UNIFIED_FLAGS,
                  "unified, head": dict(UNIFIED_FLAGS, sv_dnp_width="head")}


def param_overheads():
    """{shape: {"baseline": parameters, variant: (its parameters - the baseline's) / the
    baseline's}}."""
    table = {}
    for shape, dims in OVERHEAD_SHAPES.items():
        base = meta_gpt(**dims).num_params()
        table[shape] = {"baseline": base, **{k: (meta_gpt(**dims, **f).num_params() - base) / base
                                             for k, f in OVERHEAD_FLAGS.items()}}
    return table


def overhead_lines(table):
    cells = lambda row: " | ".join(f"{row[k]:.2e}" for k in OVERHEAD_FLAGS)   # noqa: E731
    return ["", "### Extra parameters: HG and the width of DNP's g_out", "",
            "Fractions of the baseline's parameters (the paper: \"at most 7.85e-5\"); "
            "`sv_dnp_width`: \"full\", the map's output width, or \"head\", one head-sized vector "
            "per q, k, v and a scalar per gate, up (DESIGN.md).", "",
            "| shape (layers x width) | baseline | " + " | ".join(OVERHEAD_FLAGS) + " |",
            "|---" * (len(OVERHEAD_FLAGS) + 2) + "|",
            *[f"| {shape} | {row['baseline'] / 1e6:.0f}M | " + cells(row) + " |"
              for shape, row in table.items()]]


def scaling_report(results):
    rows, fits = scaling_rows(results)
    lrs, overheads = size_lr_rows(results), param_overheads()
    data = {"rows": rows, "fits": fits, "lr_check": lrs, "overheads": overheads}
    return scaling_lines(rows) + size_lr_lines(lrs) + overhead_lines(overheads), data


def regime_rows(results):
    """Per size and tokens per parameter of the regime grid: unified minus the baseline, paired,
    with the epochs each read (result.json's, else of Tiny Shakespeare)."""
    from study.grids import regime_grid
    rows = []
    for v in regime_grid():
        if not v.baseline or not results.get(v.name) or not results.get(v.baseline):
            continue
        size, tpp = re.fullmatch(r"unified_(\w+)_t(\d+)", v.name).groups()
        seeds, diffs = paired_diffs(results[v.name], results[v.baseline])
        if not seeds:
            continue
        res = results[v.name][seeds[0]]
        iters = int(arg_value(res["args"], "max_iters"))
        epochs = res.get("epochs", iters * TOKENS_PER_ITER / TRAIN_TOKENS)
        base = mean_std([r["val_loss"] for r in results[v.baseline].values()])[0]
        rows.append({"size": size, "tokens_per_param": float(tpp), "epochs": epochs,
                     "iters": iters, "seeds": seeds, "baseline_loss": base, **part(diffs)})
    return rows


def regime_report(results):
    rows = regime_rows(results)
    lines = ["## Regimes: the gain against tokens per parameter", "",
             "Unified minus the baseline at the same size and budget, seed by seed. Runs that "
             "would read the training set more than --max_epochs times are not run (reproduce.py "
             "names them).", "", "| size | tokens/param | iters | epochs | n | baseline loss "
             "| gap (mean ± std) | 95% CI | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['size']} | {r['tokens_per_param']:g} | {r['iters']} | {r['epochs']:.2f} "
              f"| {len(r['seeds'])} | {r['baseline_loss']:.4f} | {pm(r['mean'], r['std'], '+.4f')} "
              f"| {interval(r['ci95'])} | {r['verdict']} |" for r in rows]
    return lines, {"rows": rows}


# ---- the controls: what DNP's vector adds, and where weight decay acts --------------------------
# (label, variant, its control, baseline): the variant's gain over the baseline, split at the
# control that keeps DNP's Norm after the map and fixes g_out at 1 (sv_placement="dnp_novec",
# DESIGN.md)
SPLITS = [("DNP", "dnp", "dnp_novec", "baseline"),
          ("unified", "unified", "unified_novec", "baseline")]
# unified's total and its Norm part, each against DNP's (issue 40): HG + OR + IWD on top of DNP
BEYOND_DNP = [("unified", "dnp"), ("unified_novec", "dnp_novec")]


def part(diffs, sign=0):
    mean, std = mean_std(diffs)
    return {"mean": mean, "std": std, "ci95": ci95(diffs), "verdict": claim_verdict(diffs, sign),
            "p": sign_flip_p(diffs)}


def split_rows(results):
    """Per SPLITS row with results: total = variant - baseline = Norm part (control - baseline)
    + vector part (variant - control), each seed by seed over the seeds all three have."""
    rows = []
    for label, name, control, base in SPLITS:
        runs = [results.get(n, {}) for n in (name, control, base)]
        seeds = sorted(set.intersection(*(set(r) for r in runs)))
        if len(seeds) < 2:
            continue
        full = all(r[s].get("val_loss_full") is not None for r in runs for s in seeds)
        v, c, b = (np.array([loss_of(r[s], full) for s in seeds]) for r in runs)
        rows.append({"label": label, "variant": name, "control": control, "baseline": base,
                     "seeds": seeds, "total": part(list(v - b)), "norm": part(list(c - b)),
                     "vector": part(list(v - c))})
    return rows


def p_value(p):
    """Two significant digits: 12 seeds of one sign give 2/4096 = 0.00049, not "0.000"."""
    return "—" if p is None else f"{p:.2g}"


def cell(p):
    sign = "" if p.get("p") is None else f", p = {p_value(p['p'])}"
    return f"{pm(p['mean'], p['std'], '+.4f')}, {interval(p['ci95'])}{sign}, {p['verdict']}"


def default_report(results):
    rows = split_rows(results)
    if not rows:
        return [], None
    lines = ["## DNP's gain, split into its Norm and its vector", "",
             "The control keeps DNP's Norm after the map and fixes `g_out` at 1 "
             "(`sv_placement=\"dnp_novec\"`). Seed by seed: Norm part = control - baseline, "
             "vector part = variant - control; they add up to the total. Each: mean ± std, "
             "95% CI, the exact two-sided sign-flip p-value over the seeds, verdict.",
             "", "| variant | control | n | total | Norm part | vector part |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['control']} | {len(r['seeds'])} | {cell(r['total'])} "
              f"| {cell(r['norm'])} | {cell(r['vector'])} |" for r in rows]
    beyond = [beyond_dnp(results, a, b) for a, b in BEYOND_DNP if a in results and b in results]
    if beyond:
        lines += ["", "What unified adds to DNP (its HG, OR and IWD), with the vector and without:",
                  "", "| variant | vs | n | diff |", "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['baseline']} | {len(r['seeds'])} | {cell(r)} |"
                  for r in beyond]
    return lines, {"splits": rows, "beyond_dnp": beyond}


def beyond_dnp(results, a, b):
    seeds, diffs = paired_diffs(results[a], results[b])
    return {"variant": a, "baseline": b, "seeds": seeds, **part(diffs)}


@functools.lru_cache(maxsize=None)
def vector_kinds(config, args=()):
    """{vector: "input" | "final" | "output"} of the model a run trained (its config file and
    train.py arguments), as each ScaleVector declares where it acts (GPT.vector_sites): "input"
    where it folds into a block's linear map, "final" for g_final (it folds into the head),
    "output" where a Norm stands between."""
    from dataclasses import fields
    from config.defaults import DEFAULTS
    from configurator import configure
    from model import GPTConfig
    cfg = configure(DEFAULTS, [os.path.join(ROOT, config), *args])
    model = meta_gpt(**{f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"})
    return {name: "final" if name == "g_final" else "input" if sites else "output"
            for name, sites in model.vector_sites().items()}


def final_g(res):
    """{"input": .., "final": .., "output": ..}: the final mean of g over the run's vectors of
    each kind, averaged over its seeds (None where it has none): how far weight decay pulled
    them. An sv_means name is a vector's, or a row of it ("<vector>.<row>")."""
    by = {"input": [], "final": [], "output": []}
    for r in res.values():
        kinds = vector_kinds(r["config"], tuple(r["args"]))
        for name, curve in r.get("sv_means", {}).items():
            vector = max((v for v in kinds if name == v or name.startswith(v + ".")), key=len)
            by[kinds[vector]].append(curve[-1])
    return {k: float(np.mean(v)) if v else None for k, v in by.items()}


def wd_rows(results):
    from study.grids import wd_grid
    rows = []
    for v in wd_grid():
        if not v.baseline or v.name not in results or v.baseline not in results:
            continue
        seeds, diffs = paired_diffs(results[v.name], results[v.baseline])
        rows.append({"variant": v.name, "baseline": v.baseline, "claim": v.claim,
                     "weight_decay": v.name.rpartition("_wd")[2], "seeds": seeds, **part(diffs),
                     "g": final_g(results[v.name]), "g_baseline": final_g(results[v.baseline])})
    return rows


def wd_report(results):
    rows = wd_rows(results)
    g = lambda x: "—" if x is None else f"{x:.3f}"
    lines = ["## Weight decay where it can act", "",
             "Final mean of `g` over the blocks' Input-Norm vectors (they fold into a linear map; "
             "IWD decays them), g_final (an Input-Norm vector too, before the head) and the "
             "Output-Norm ones (qk_norm, post_norm, DNP's `g_out`), "
             "variant / vs, averaged over seeds. A plain vector starts at 1. The 0.1 rows are the "
             "default grid's.",
             "", "| weight decay | variant | vs | n | diff (mean ± std) | 95% CI | verdict "
             "| g, blocks' Input-Norms | g_final | g, Output-Norm |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['weight_decay']} | {r['variant']} | {r['baseline']} | {len(r['seeds'])} "
              f"| {pm(r['mean'], r['std'], '+.4f')} | {interval(r['ci95'])} | {r['verdict']} | "
              + " | ".join(f"{g(r['g'][k])} / {g(r['g_baseline'][k])}"
                           for k in ("input", "final", "output")) + " |" for r in rows]
    return lines, {"rows": rows}


# the preconditioning record's statistics (telemetry.preconditioning), per map; an exponent is read
# only where g has some spread (about 0.5%; none at init)
def spread(m, key):
    return m.get(key) if m["g"][0] > 5e-3 else None


TELEMETRY = {"g std": lambda m: m["g"][0], "g max/min": lambda m: m["g"][2] / m["g"][1],
             "update exponent": lambda m: spread(m, "update_exp"),
             # over the folded model's own step: prediction 1 (AdamW), 2 (SGD), DESIGN.md
             "AdamW exponent": lambda m: spread(m, "adamw_exp"),
             "SGD exponent": lambda m: spread(m, "sgd_exp"),
             "corr(g, col norm of W')": lambda m: m.get("corr_wg"),
             "update cv": lambda m: m.get("update_cv")}


def telemetry(res, at=-1):
    """The preconditioning record (result.json's) at one evaluation of a run, summed up over its
    maps: {stat: {"mean": over seeds of the mean over maps, "ci95": over seeds}}."""
    out = {}
    for stat, f in TELEMETRY.items():
        per_seed = []
        for r in res.values():
            xs = [f(m) for m in (r["preconditioning"][at][1].values()
                                 if r.get("preconditioning") else ())]
            xs = [x for x in xs if x is not None]
            if xs:
                per_seed.append(float(np.mean(xs)))
        out[stat] = {"mean": float(np.mean(per_seed)) if per_seed else None,
                     "ci95": ci95(per_seed)}
    return out


def telemetry_lines(results):
    rows = {n: telemetry(res) for n, res in results.items()
            if any(r.get("preconditioning") for r in res.values())}
    if not rows:
        return []
    f = lambda x: "—" if x["mean"] is None else f"{x['mean']:.3f}" + (   # noqa: E731
        "" if x["ci95"] is None else " [{:.3f}, {:.3f}]".format(*x["ci95"]))
    return ["", "## The preconditioning, measured (DESIGN.md's predictions)", "",
            "At the last evaluation, over the step after it: the mean over the maps a vector "
            "feeds (q|k|v, gate|up, the head), then over the seeds, with the 95% interval over "
            "the seeds. Update exponent: p of ||dW'_j|| ~ g_j^p; AdamW exponent: the same of "
            "||dW'_j|| over the folded model's own step ||dW_j|| (1 for a frozen g); SGD "
            "exponent: of what a plain SGD step would move W'_j by, over the folded model's own "
            "SGD step (2 for a frozen g: the paper's g_j^2). `precond.png`: over training.", "",
            "| variant | " + " | ".join(TELEMETRY) + " |", "|---" * (len(TELEMETRY) + 1) + "|",
            *[f"| {n} | " + " | ".join(f(row[s]) for s in TELEMETRY) + " |"
              for n, row in rows.items()]]


def power_report(results):
    lines, data = default_report(results)
    return lines + telemetry_lines(results), data


def decay_alone(res):
    """What weight decay alone makes of a vector that starts at 1 and that the loss does not
    resist: the product over the steps of (1 - lr_t * decay), lr_t the run's warmup and cosine
    (train.py's lr_factor; the iwd grid runs it), decay its sv_decay or weight_decay."""
    from configurator import configure
    from config.defaults import DEFAULTS
    r = next(iter(res.values()))
    c = configure(DEFAULTS, [os.path.join(ROOT, r["config"]), *r["args"]])
    lr, floor, warm, end = c["learning_rate"], c["min_lr"], c["warmup_iters"], c["max_iters"]
    decay = c["sv_decay"] if c["sv_decay"] >= 0 else c["weight_decay"]
    its = np.arange(end)
    cos = floor + (lr - floor) * 0.5 * (1 + np.cos(np.pi * np.minimum(
        (its - warm) / max((c["lr_decay_iters"] or end) - warm, 1), 1)))
    lrs = np.where(its < warm, lr * (its + 1) / (warm + 1), cos)
    return float(np.prod(1 - lrs * decay))


def decay_table(grid, results, title):
    """A decay grid's pairs with the final mean of g per class and what decay alone makes of g."""
    g = lambda x: "—" if x is None else f"{x:.3f}"   # noqa: E731
    lines = [title, "",
             "Final mean of `g` per class (averaged over the seeds), beside what decay alone "
             "would make of a vector at 1 that the loss did not resist (the run's schedule).", "",
             "| variant | vs | n | diff (mean ± std) | 95% CI | p | verdict | g, blocks' "
             "Input-Norms | g_final | g, Output-Norms | decay alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for v in grid:
        if v.name not in results:
            continue
        res = results[v.name]
        seeds, diffs = paired_diffs(res, results.get(v.baseline, {})) if v.baseline else ([], [])
        row = {"variant": v.name, "baseline": v.baseline, "seeds": seeds, "claim": v.claim,
               **part(diffs, v.sign), "g": final_g(res), "alone": decay_alone(res)}
        rows.append(row)
        lines.append(f"| {v.name} | {v.baseline or ''} | {len(seeds)} "
                     f"| {pm(row['mean'], row['std'], '+.4f')} | {interval(row['ci95'])} "
                     f"| {p_value(row['p'])} | {row['verdict'] if v.baseline else ''} "
                     f"| {g(row['g']['input'])} | {g(row['g']['final'])} "
                     f"| {g(row['g']['output'])} | {row['alone']:.3f} |")
    return lines, {"rows": rows}


def iwd_report(results):
    from study.grids import iwd_grid
    return decay_table(iwd_grid(), results,
                       "## IWD where it can act: vectors at 1.0, matrices at 0.1")


def decay_report(results):
    from study.grids import decay_grid
    return decay_table(decay_grid(), results,
                       "## Weight decay and the Norm's kind: the plain Pre-Norm model (IWD), the "
                       "Gemma-style one (Output-Norm vectors only)")


def tuned_pairs(results):
    """The tuned grid (issue 40): each pair at the same rate (1e-3, every seed), and each family at
    its best rate of TUNE_LRS by the mean loss over TUNE_SEEDS, paired with its baseline family at
    that one's best rate on the other seeds only (the seeds that picked the rates are left out).
    (picks {family: {"losses": {lr: mean}, "best": lr, "edge": bool}}, pair rows)."""
    from study.grids import TUNE_LRS, TUNE_SEEDS, TUNED_FAMILIES, TUNED_PAIRS
    name = lambda f, lr: f if lr == "1e-3" else f"{f}_lr{lr}"   # noqa: E731
    picks = {}
    for f in TUNED_FAMILIES:
        by = {lr: float(np.mean([loss_of(results[name(f, lr)][s]) for s in TUNE_SEEDS]))
              for lr in TUNE_LRS if all(s in results.get(name(f, lr), {}) for s in TUNE_SEEDS)}
        if by:
            best = min(by, key=by.get)
            picks[f] = {"losses": by, "best": best,
                        "edge": best in (TUNE_LRS[0], TUNE_LRS[-1])}
    rows = []
    for f, (base, claim, sign) in TUNED_PAIRS.items():
        if not results.get(f) or not results.get(base):
            continue
        seeds, diffs = paired_diffs(results[f], results[base])
        rows.append({"variant": f, "baseline": base, "rates": ["1e-3", "1e-3"], "claim": claim,
                     "seeds": seeds, **part(diffs, sign)})
        if f in picks and base in picks:
            a, b = name(f, picks[f]["best"]), name(base, picks[base]["best"])
            left = lambda res: {s: r for s, r in res.items() if s not in TUNE_SEEDS}  # noqa: E731
            seeds, diffs = paired_diffs(left(results.get(a, {})), left(results.get(b, {})))
            if seeds:
                rows.append({"variant": a, "baseline": b, "claim": claim, "seeds": seeds,
                             "rates": [picks[f]["best"], picks[base]["best"]],
                             **part(diffs, sign)})
    return picks, rows


def tuned_report(results):
    from study.grids import TUNE_LRS, TUNE_SEEDS
    picks, rows = tuned_pairs(results)
    seeds = ", ".join(map(str, TUNE_SEEDS))
    lines = ["## Removing the vectors, and DNP's vector, at the same rate and tuned", "",
             f"Mean validation loss over seeds {seeds}, which pick each family's rate "
             "(**bold**; (edge): at the end of the sweep) and are then left out of the tuned "
             "pairs.", "", "| family | " + " | ".join(TUNE_LRS) + " |",
             "|---" * (len(TUNE_LRS) + 1) + "|"]
    for f, p in picks.items():
        cells = [("**%.4f**" if lr == p["best"] else "%.4f") % p["losses"][lr]
                 + (" (edge)" if lr == p["best"] and p["edge"] else "")
                 if lr in p["losses"] else "—" for lr in TUNE_LRS]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines += ["", "| variant | vs | rates | n | diff (mean ± std) | 95% CI | p | verdict "
              "| paper's claim |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['baseline']} | {r['rates'][0]} / {r['rates'][1]} "
              f"| {len(r['seeds'])} | {pm(r['mean'], r['std'], '+.4f')} | {interval(r['ci95'])} "
              f"| {p_value(r['p'])} | {r['verdict']} | {r['claim']} |" for r in rows]
    return lines + telemetry_lines(results), {"picks": picks, "pairs": rows}


def repeat_report(results):
    """The 5x160 gap at 1x on the whole training split and on its first half (which repeats
    the corpus twice as often)."""
    lines = ["## Length against repetition at 5x160", "",
             "Unified minus the baseline at the 1x budget, seed by seed, on the whole training "
             "split and on its first half (the same validation split): the half reads its text "
             "twice as often, as the whole does at 2x.", "",
             "| training split | epochs | n | gap (mean ± std) | 95% CI | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    for tag, label in (("", "whole"), ("_half", "first half")):
        a, b = results.get(f"unified_5x160{tag}", {}), results.get(f"baseline_5x160{tag}", {})
        seeds, diffs = paired_diffs(a, b)
        if not seeds:
            continue
        args = a[seeds[0]]["args"]
        read = int(arg_value(args, "train_tokens", "0")) or TRAIN_TOKENS
        epochs = int(arg_value(args, "max_iters")) * TOKENS_PER_ITER / read
        row = {"split": label, "epochs": epochs, "seeds": seeds, **part(diffs, -1)}
        rows.append(row)
        p = p_value(row["p"])
        lines.append(f"| {label} | {epochs:.2f} | {len(seeds)} "
                     f"| {pm(row['mean'], row['std'], '+.4f')} | {interval(row['ci95'])} | {p} "
                     f"| {row['verdict']} |")
    return lines, {"rows": rows}


# grids with more to say than the paired table: (markdown lines, data for summary.json and plots)
REPORTS = {"lr": lr_report, "scaling": scaling_report, "default": default_report, "wd": wd_report,
           "regime": regime_report, "power": power_report, "iwd": iwd_report,
           "repeat": repeat_report, "tuned": tuned_report, "decay": decay_report}


# ---- the code each result came from ------------------------------------------------------------
def code_id(code):
    """The label two runs of the same code share: the "id" of reproduce.code_version(); an older
    result's string (git describe) as it is; "unknown" for a result that does not say."""
    return code.get("id", "unknown") if isinstance(code, dict) else code or "unknown"


def code_label(c):
    label = code_id(c)
    if isinstance(c, dict):
        edits = f", uncommitted edits {c['diff']}" if c.get("diff") else ""
        label += f" (commit {str(c.get('commit'))[:12]}{edits})"
    return label


def code_lines(results):
    """summary.md's line on the code of the results: one version, or how many runs each made."""
    labels = [code_label(r.get("code")) for res in results.values() for r in res.values()]
    runs = {k: labels.count(k) for k in sorted(set(labels))}
    if len(runs) <= 1:
        return [f"Code: every run by {next(iter(runs), 'no run')}."]
    return [f"Code: the runs mix code versions: "
            f"{'; '.join(f'{n} by {k}' for k, n in runs.items())}."]
