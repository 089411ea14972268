"""
The statistics and reports of reproduce.py's grids, from their results ({variant: {seed: result}}):
the paired table of every grid (summary.md), and the claims as the paper measures them: tuned
against tuned (the lr grid), compute efficiency and scaling (the scaling grid), the parameter cost
of each variant. A pair is two runs of one seed and one code (code_id). Pure functions of the
results, so they are tested on made-up numbers.
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
    """A run's final validation loss: on the whole val split (val_loss_full) when full and it has
    one, else on the 20 fixed batches (15,360 of its 111,540 characters)."""
    return r["val_loss_full"] if full and r.get("val_loss_full") is not None else r["val_loss"]


def same_code(*runs):
    """Whether runs were made by one code (code_id; runs that record none are "unknown" and pair
    only with each other): one config and seed under two codes differed by up to 0.029, far more
    than the differences a pair measures."""
    return len({code_id(r.get("code")) for r in runs}) == 1


def paired_diffs(res, base):
    """(seeds both have on one code, variant minus baseline val loss seed by seed) of two
    {seed: result}; on the whole val split where every run of the pair has it."""
    seeds = sorted(s for s in set(res) & set(base) if same_code(res[s], base[s]))
    full = all(r[s].get("val_loss_full") is not None for r in (res, base) for s in seeds)
    return seeds, [loss_of(res[s], full) - loss_of(base[s], full) for s in seeds]


def mixed_code(res, base):
    """The seeds both have whose two runs are of two codes: left out of the pair."""
    return sorted(s for s in set(res) & set(base) if not same_code(res[s], base[s]))


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
    """The rule every claim row follows: under MIN_SEEDS seeds "not resolved (n too small for
    p < 0.05)"; else judge(the 95% interval, the exact sign-flip p)."""
    if len(diffs) < MIN_SEEDS:
        return "not resolved (n too small for p < 0.05)"
    return judge(ci95(diffs), sign_flip_p(diffs), sign)


def judge(ci, p, sign=0):
    """A direction only where the 95% interval excludes 0 and p is below 0.05, both (the claims
    table gives Holm's p): "holds" or "opposite" against the claim's sign, "lower" or "higher"
    where there is no claim; else "not resolved" (at few seeds either read alone misleads)."""
    if verdict(ci) == "not resolved" or p is None or p >= 0.05:
        return "not resolved" + (" (the interval and p disagree)"
                                 if verdict(ci) != "not resolved" else "")
    if not sign:
        return verdict(ci)
    return "holds" if (-1 if ci[1] < 0 else 1) == sign else "opposite"


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
            if mixed_code(res, base):   # only where there are: other summaries stay as they are
                row["mixed_code_seeds"] = mixed_code(res, base)
            d_mean, d_std = mean_std(diffs)
            matches = None if d_mean is None or not v.sign else bool(np.sign(d_mean) == v.sign)
            row.update(paired_seeds=seeds, diff_mean=d_mean, diff_std=d_std, ci95=ci95(diffs),
                       p=sign_flip_p(diffs),
                       agree=int(sum(np.sign(d) == v.sign for d in diffs))
                       if v.sign and seeds else None,
                       verdict=claim_verdict(diffs, v.sign) if seeds else "—",
                       direction_matches=matches)
        row["code_unrecorded"] = any(code_id(r.get("code")) == "unknown" for r in res.values())
        rows.append(row)
    return rows


def seed_list(seeds):
    """"seeds 1-3, 7" of [1, 2, 3, 7]; "seed 4" of [4]."""
    runs, seeds = [], sorted(seeds)
    for s in seeds:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return ("seed " if len(seeds) == 1 else "seeds ") + text


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
            if r.get("mixed_code_seeds"):   # named, so that a short row is not read as all
                diff += f"; {seed_list(r['mixed_code_seeds'])} left out (two codes)"
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
              "pair's runs have it (val_loss_full), else on the 20 fixed batches. A pair is of "
              "one code: a seed whose two runs record two codes is left out and named (runs that "
              "record none pair only with each other). (code not recorded): a row with runs "
              "older than the code record. Every verdict of this page reads its row's own p; "
              "study/README.md's claims table reads Holm's p over its rows, and where the two "
              "differ says both (\"higher by its own p, not after Holm\").",
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
    (the seed that picked the rate would favour it). bracketed: both neighbours of the
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
    gap at each budget says whether the gain holds or fades with training length. A seed pairs
    where the variant's run and the baseline's at every budget (the fit reads them all) are of one
    code; mixed: the cells left out for two codes, with their seeds."""
    rows, fits, mixed = [], {}, []
    for size, (n_layer, n_embd, iters) in SIZES.items():
        base = {b: results.get(budget_name("baseline", size, b), {}) for b in BUDGETS}
        seeds = sorted(set.intersection(*(set(r) for r in base.values())))
        if not seeds:
            continue
        xs = [float(b) for b in BUDGETS]
        mean_curve = [float(np.mean([base[b][s]["val_loss"] for s in seeds])) for b in BUDGETS]
        fit = list(fit_budget(xs, mean_curve))
        # a fit whose E is negative, or whose alpha is at the grid's edge, says nothing
        degenerate = bool(fit[0] < 0 or not 0.02 < fit[2] < 4)   # fit: numpy floats
        fits[size] = {"budgets": xs, "iters": iters, "baseline": mean_curve, "fit": fit,
                      "degenerate": degenerate, "variants": {}}
        params = non_embedding_params(n_layer, n_embd)
        by_base = {budget_name("baseline", size, b): b for b in BUDGETS}
        for v in [v for v in scaling_grid() if v.baseline in by_base]:
            b = by_base[v.baseline]
            res = results.get(v.name, {})
            paired = [s for s in seeds if s in res
                      and same_code(res[s], *(base[c][s] for c in BUDGETS))]
            left = [s for s in seeds if s in res and s not in paired]
            if left:
                mixed.append({"variant": v.name, "baseline": v.baseline, "seeds": left})
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
    return rows, fits, mixed


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
            (a, res), (b, base) = (table[f][best[f]] for f in ("unified", "baseline"))
            seeds, diffs = paired_diffs(res, base)
            row.update(seeds=seeds, **part(diffs))
            if mixed_code(res, base):
                row["mixed"] = [{"variant": a, "baseline": b, "seeds": mixed_code(res, base)}]
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


def mixed_lines(mixed):
    """The pairs left out for two codes, one line ([] where none was)."""
    if not mixed:
        return []
    return ["", "Left out, a seed whose runs are of two codes: " + "; ".join(
        f"{m['variant']} - {m['baseline']} ({seed_list(m['seeds'])})" for m in mixed) + "."]


def scaling_report(results):
    rows, fits, mixed = scaling_rows(results)
    lrs, overheads = size_lr_rows(results), param_overheads()
    mixed += [m for r in lrs.values() for m in r.get("mixed", [])]
    data = {"rows": rows, "fits": fits, "lr_check": lrs, "overheads": overheads,
            "mixed_code": mixed}
    return (scaling_lines(rows) + mixed_lines(mixed) + size_lr_lines(lrs)
            + overhead_lines(overheads), data)


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
# unified's total and its Norm part, each against DNP's: HG + OR + IWD on top of DNP
BEYOND_DNP = [("unified", "dnp"), ("unified_novec", "dnp_novec")]


def part(diffs, sign=0):
    mean, std = mean_std(diffs)
    return {"mean": mean, "std": std, "ci95": ci95(diffs), "verdict": claim_verdict(diffs, sign),
            "p": sign_flip_p(diffs)}


def split_rows(results):
    """Per SPLITS row with results: total = variant - baseline = Norm part (control - baseline)
    + vector part (variant - control), each seed by seed over the seeds all three have on one
    code. (rows, the splits' seeds left out for two codes)"""
    rows, mixed = [], []
    for label, name, control, base in SPLITS:
        runs = [results.get(n, {}) for n in (name, control, base)]
        shared = set.intersection(*(set(r) for r in runs))
        seeds = sorted(s for s in shared if same_code(*(r[s] for r in runs)))
        if shared - set(seeds):
            mixed.append({"variant": f"{name} and {control}", "baseline": base,
                          "seeds": sorted(shared - set(seeds))})
        if len(seeds) < 2:
            continue
        full = all(r[s].get("val_loss_full") is not None for r in runs for s in seeds)
        v, c, b = (np.array([loss_of(r[s], full) for s in seeds]) for r in runs)
        rows.append({"label": label, "variant": name, "control": control, "baseline": base,
                     "seeds": seeds, "total": part(list(v - b)), "norm": part(list(c - b)),
                     "vector": part(list(v - c))})
    return rows, mixed


def p_value(p):
    """Two significant digits: 12 seeds of one sign give 2/4096 = 0.00049, not "0.000"."""
    return "—" if p is None else f"{p:.2g}"


def cell(p):
    sign = "" if p.get("p") is None else f", p = {p_value(p['p'])}"
    return f"{pm(p['mean'], p['std'], '+.4f')}, {interval(p['ci95'])}{sign}, {p['verdict']}"


def default_report(results):
    rows, mixed = split_rows(results)
    pairs = [(a, b) for a, b in BEYOND_DNP if a in results and b in results]
    mixed += [{"variant": a, "baseline": b, "seeds": mixed_code(results[a], results[b])}
              for a, b in pairs if mixed_code(results[a], results[b])]
    beyond = [r for r in (beyond_dnp(results, a, b) for a, b in pairs) if r["seeds"]]
    if not rows and not beyond:
        return [], None
    lines = []
    if rows:
        lines += ["## DNP's gain, split into its Norm and its vector", "",
                  "The control keeps DNP's Norm after the map and fixes `g_out` at 1 "
                  "(`sv_placement=\"dnp_novec\"`). Seed by seed: Norm part = control - baseline, "
                  "vector part = variant - control; they add up to the total. Each: mean ± std, "
                  "95% CI, the exact two-sided sign-flip p-value over the seeds, verdict.",
                  "", "| variant | control | n | total | Norm part | vector part |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['control']} | {len(r['seeds'])} | {cell(r['total'])} "
                  f"| {cell(r['norm'])} | {cell(r['vector'])} |" for r in rows]
    if beyond:
        lines += [""] * bool(lines) + [
            "What unified adds to DNP (its HG, OR and IWD), with the vector and without:", "",
            "| variant | vs | n | diff |", "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['baseline']} | {len(r['seeds'])} | {cell(r)} |"
                  for r in beyond]
    return lines + mixed_lines(mixed), {"splits": rows, "beyond_dnp": beyond,
                                        **({"mixed_code": mixed} if mixed else {})}


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


def final_gs(res):
    """{"input": [..], "final": [..], "output": [..]}: the final mean of each of the runs' vectors
    of each kind, over the seeds. An sv_means name is a vector's, or a row of it
    ("<vector>.<row>")."""
    by = {"input": [], "final": [], "output": []}
    for r in res.values():
        kinds = vector_kinds(r["config"], tuple(r["args"]))
        for name, curve in r.get("sv_means", {}).items():
            vector = max((v for v in kinds if name == v or name.startswith(v + ".")), key=len)
            by[kinds[vector]].append(curve[-1])
    return by


def final_g(res):
    """{"input": .., "final": .., "output": ..}: the final mean of g over the run's vectors of
    each kind, averaged over its seeds (None where it has none): how far weight decay pulled
    them."""
    return {k: mean_std(v)[0] for k, v in final_gs(res).items()}


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
             # over the folded model's own step: the folded step's prediction (study/NOTES.md)
             "AdamW exponent": lambda m: spread(m, "adamw_exp"),
             "SGD exponent": lambda m: spread(m, "sgd_exp"),
             "corr(g, col norm of W')": lambda m: m.get("corr_wg"),
             "update cv": lambda m: m.get("update_cv")}


def telemetry_seeds(res, stat, at=None):
    """{seed: the mean over the run's maps of one TELEMETRY statistic} over the step after one
    evaluation: the preconditioning record of result.json at iteration `at` (None: the latest any
    of the runs has), for the runs that have it (by iteration: a run that lacks it is left out)."""
    records = {s: dict(map(tuple, r.get("preconditioning") or ())) for s, r in res.items()}
    at = max((i for rec in records.values() for i in rec), default=None) if at is None else at
    out = {}
    for s, rec in records.items():
        xs = [TELEMETRY[stat](m) for m in rec.get(at, {}).values()]
        xs = [x for x in xs if x is not None]
        if xs:
            out[s] = float(np.mean(xs))
    return out


def telemetry(res, at=None):
    """{stat: {"mean": over seeds of the mean over maps, "ci95": over seeds}} of a variant."""
    out = {}
    for stat in TELEMETRY:
        per_seed = list(telemetry_seeds(res, stat, at).values())
        out[stat] = {"mean": float(np.mean(per_seed)) if per_seed else None,
                     "ci95": ci95(per_seed)}
    return out


def telemetry_pair(res, base, stat, at=None):
    """(seeds, differences) of a TELEMETRY statistic, variant minus base seed by seed, over the
    seeds both have on one code: the two runs of a seed share its initialization and batch order,
    so their difference varies less over seeds than either run does."""
    a, b = telemetry_seeds(res, stat, at), telemetry_seeds(base, stat, at)
    seeds = sorted(s for s in set(a) & set(b) if same_code(res[s], base[s]))
    return seeds, [a[s] - b[s] for s in seeds]


# The spread of the column updates that a frozen g of a run's measured spread would give on its
# own (prediction 4 against the algebra of the fold, study/NOTES.md): res without vectors, with a
# frozen g, minus base (what base spreads beyond the fold's algebra); or res minus res with a
# frozen g (the algebra's share of res - base)
FROZEN_G, FOLD_SHARE = "update cv beyond a frozen g", "update cv of a frozen g"


def frozen_g(cv, g):
    """The update cv of columns g_j u_j, where u has cv `cv` and g the record's spread ([std, min,
    max, 10%, 50%, 90%]) and is independent of u: cv(g u)^2 = (1 + cv(u)^2)(1 + cv(g)^2) - 1 in
    the moments over the columns, cv(g) = std / median (the record keeps no mean; g is near
    symmetric, 0.023 around 1 at the recipe's rate)."""
    return float(np.sqrt((1 + cv ** 2) * (1 + (g[0] / g[4]) ** 2) - 1))


def frozen_g_pair(res, base, stat=FROZEN_G, at=-1):
    """(seeds, differences) of the update cv, per map, then the mean over the maps of a seed, seed
    by seed on one code: res's column updates (a run without vectors) times a frozen g of base's
    spread, minus base's own (FROZEN_G), or res's own minus that (FOLD_SHARE). Under AdamW a
    column of W' = W diag(g) moves by g_j times the map's own step for a frozen g: what base
    spreads beyond that is not the algebra of the fold."""
    seeds, diffs = [], []
    for s in sorted(set(res) & set(base)):
        if not (res[s].get("preconditioning") and base[s].get("preconditioning")
                and same_code(res[s], base[s])):
            continue
        mine, theirs = res[s]["preconditioning"][at][1], base[s]["preconditioning"][at][1]
        maps = [k for k in theirs if k in mine and theirs[k].get("update_cv") is not None]
        frozen = [frozen_g(mine[k]["update_cv"], theirs[k]["g"]) for k in maps]
        xs = ([f - theirs[k]["update_cv"] for f, k in zip(frozen, maps)] if stat == FROZEN_G
              else [mine[k]["update_cv"] - f for f, k in zip(frozen, maps)])
        if xs:
            seeds.append(s)
            diffs.append(float(np.mean(xs)))
    return seeds, diffs


def telemetry_lines(results):
    rows = {n: telemetry(res) for n, res in results.items()
            if any(r.get("preconditioning") for r in res.values())}
    if not rows:
        return []
    f = lambda x: "—" if x["mean"] is None else f"{x['mean']:.3f}" + (   # noqa: E731
        "" if x["ci95"] is None else " [{:.3f}, {:.3f}]".format(*x["ci95"]))
    lines = ["", "## The preconditioning, measured (study/NOTES.md's predictions)", "",
             "At the last evaluation, over the step after it: the mean over the maps a vector "
             "feeds (q|k|v, gate|up, the head), then over the seeds, with the 95% interval over "
             "the seeds. Update exponent: p of ||dW'_j|| ~ g_j^p; AdamW exponent: the same of "
             "||dW'_j|| over the folded model's own step ||dW_j|| (1 for a frozen g); SGD "
             "exponent: of what a plain SGD step would move W'_j by, over the folded model's own "
             "SGD step (2 for a frozen g: the paper's g_j^2). `precond.png`: over training.", "",
             "| variant | " + " | ".join(TELEMETRY) + " |", "|---" * (len(TELEMETRY) + 1) + "|",
             *[f"| {n} | " + " | ".join(f(row[s]) for s in TELEMETRY) + " |"
               for n, row in rows.items()]]
    return lines + telemetry_pair_lines(results, [n for n in rows if n != "baseline"])


def telemetry_pair_lines(results, names):
    """Each variant minus the baseline, paired by seed: mean [95% CI], p of each statistic."""
    def cell(seeds, diffs):
        if not seeds:
            return "—"
        p = p_value(sign_flip_p(diffs))
        return f"{np.mean(diffs):+.4f} {interval(ci95(diffs))}, p = {p} (n={len(seeds)})"
    if "baseline" not in results or not names:
        return []
    return ["", "Paired by seed (one code): each variant minus the baseline, mean [95% CI], the "
            "exact sign-flip p and n.", "", "| variant - baseline | " + " | ".join(TELEMETRY)
            + " |", "|---" * (len(TELEMETRY) + 1) + "|",
            *[f"| {n} | " + " | ".join(cell(*telemetry_pair(results[n], results["baseline"], s))
                                       for s in TELEMETRY) + " |" for n in names]]


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


def decay_table(grid, results, title, spread=False):
    """A decay grid's pairs with the final mean of g per class and what decay alone makes of g;
    spread: with the std of the vectors' final means over the run's vectors and seeds too (a mean
    near decay alone's may be of vectors at 1 and at 0)."""
    g = lambda x: "—" if x is None else f"{x:.3f}"   # noqa: E731
    lines = [title, "",
             "Final mean of `g` per class (averaged over the seeds"
             + (" ± the std over the runs' vectors and seeds" if spread else "")
             + "), beside what decay alone would make of a vector at 1 that the loss did not "
             "resist (the run's schedule).", "",
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
        cells = [g(row["g"][k]) for k in ("input", "final", "output")]
        if spread:
            row["g_std"] = {k: mean_std(xs)[1] for k, xs in final_gs(res).items()}
            cells = [c + ("" if row["g_std"][k] is None else f" ± {row['g_std'][k]:.3f}")
                     for c, k in zip(cells, ("input", "final", "output"))]
        rows.append(row)
        lines.append(f"| {v.name} | {v.baseline or ''} | {len(seeds)} "
                     f"| {pm(row['mean'], row['std'], '+.4f')} | {interval(row['ci95'])} "
                     f"| {p_value(row['p'])} | {row['verdict'] if v.baseline else ''} "
                     f"| {' | '.join(cells)} | {row['alone']:.3f} |")
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


def pick_rate(results, name, lrs, seeds):
    """A family's rate: {"losses": {lr: mean loss over `seeds`}, "best": lr, "edge": the best is
    at an end of the rates run (the optimum may lie further out)}; None where no rate has every
    seed. name(lr): the family's variant at that rate."""
    by = {lr: float(np.mean([loss_of(results[name(lr)][s]) for s in seeds]))
          for lr in lrs if all(s in results.get(name(lr), {}) for s in seeds)}
    if not by:
        return None
    best = min(by, key=by.get)
    return {"losses": by, "best": best, "edge": best in (list(by)[0], list(by)[-1])}


def pick_cells(pick, lrs):
    """A pick's row of losses, one cell per rate of lrs: the best in bold, "—" where not run."""
    return [("**%.4f**" if lr == pick["best"] else "%.4f") % pick["losses"][lr]
            + (" (edge)" if lr == pick["best"] and pick["edge"] else "")
            if lr in pick["losses"] else "—" for lr in lrs]


def left_out(res, seeds):
    """res without the seeds that picked the rates (they would favour the picked ones)."""
    return {s: r for s, r in res.items() if s not in seeds}


def tuned_pairs(results):
    """The tuned grid: each pair at the same rate (1e-3, every seed), and each family at its best
    rate of TUNE_LRS by the mean loss over TUNE_SEEDS, paired with its baseline family at that
    one's best rate on the other seeds only (the seeds that picked the rates are left out).
    (picks {family: pick_rate's}, pair rows)."""
    from study.grids import TUNE_LRS, TUNE_SEEDS, TUNED_FAMILIES, TUNED_PAIRS
    name = lambda f, lr: f if lr == "1e-3" else f"{f}_lr{lr}"   # noqa: E731
    picks = {f: pick_rate(results, functools.partial(name, f), TUNE_LRS, TUNE_SEEDS)
             for f in TUNED_FAMILIES}
    picks = {f: p for f, p in picks.items() if p}
    rows = []
    for f, (base, claim, sign) in TUNED_PAIRS.items():
        if not results.get(f) or not results.get(base):
            continue
        seeds, diffs = paired_diffs(results[f], results[base])
        rows.append({"variant": f, "baseline": base, "rates": ["1e-3", "1e-3"], "claim": claim,
                     "seeds": seeds, **part(diffs, sign)})
        if f in picks and base in picks:
            a, b = name(f, picks[f]["best"]), name(base, picks[base]["best"])
            seeds, diffs = paired_diffs(left_out(results.get(a, {}), TUNE_SEEDS),
                                        left_out(results.get(b, {}), TUNE_SEEDS))
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
    lines += [f"| {f} | " + " | ".join(pick_cells(p, TUNE_LRS)) + " |" for f, p in picks.items()]
    lines += ["", "| variant | vs | rates | n | diff (mean ± std) | 95% CI | p | verdict "
              "| paper's claim |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['baseline']} | {r['rates'][0]} / {r['rates'][1]} "
              f"| {len(r['seeds'])} | {pm(r['mean'], r['std'], '+.4f')} | {interval(r['ci95'])} "
              f"| {p_value(r['p'])} | {r['verdict']} | {r['claim']} |" for r in rows]
    return lines + telemetry_lines(results), {"picks": picks, "pairs": rows}


def untied_report(results):
    from study.grids import untied_grid
    return decay_table(untied_grid(), results, "## IWD with the head untied: 2x64, 3 epochs, lr "
                       "2e-3, matrices at 0.1, vectors at 0.1 and 1.0", spread=True)


def welch(a, b):
    """mean(a) - mean(b) and its 95% Welch interval, for two independent samples (2 or more
    each); Welch-Satterthwaite's degrees of freedom, rounded down (t975 takes whole ones)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d, half = a.mean() - b.mean(), t975(max(int(df), 1)) * np.sqrt(va + vb)
    return float(d), [float(d - half), float(d + half)]


def permutation_p(a, b):
    """The exact two-sided p of a permutation test of mean(a) = mean(b), two independent samples:
    over every split of the pooled values into groups of their sizes, the share whose |difference
    of means| is at least the observed one (26 values at most: 10M splits). A split's group of
    len(a) is some values of the pooled first half and the rest of the second, so every sum is
    one of a half's subset sums plus one of the other's: no loop over the splits themselves."""
    x = np.concatenate([np.asarray(a, float), np.asarray(b, float)])
    if len(x) > 26:
        return None
    k, observed = len(a), abs(np.mean(a) - np.mean(b)) - 1e-12
    first, second = subset_sums(x[:len(x) // 2]), subset_sums(x[len(x) // 2:])
    hits = total = 0
    for c, sums in enumerate(first):
        if 0 <= k - c < len(second):
            both = sums[:, None] + second[k - c][None, :]
            hits += int(np.sum(np.abs(both / k - (x.sum() - both) / (len(x) - k)) >= observed))
            total += both.size
    return hits / total


def subset_sums(v):
    """[the sums of every subset of v of c values, for c = 0 .. len(v)]."""
    bits = (np.arange(2 ** len(v))[:, None] >> np.arange(len(v))) & 1
    sums, counts = bits @ v, bits.sum(1)
    return [sums[counts == c] for c in range(len(v) + 1)]


# the size grid's: TUNE_SEEDS pick each family's rate, the 12 after them pair (8 were predicted;
# with 12 a pair's p can pass Holm over the claims table's rows)
SIZE_SEEDS = 14


# A baseline seed on the early plateau of the size grid's smallest, shortest cell: its final
# whole-split val loss above the val split's character-bigram cross-entropy (2.48, a bigram table
# fit on the training split) plus 0.2. Each contrast is given with and without such seeds.
PLATEAU = 2.68
# The size grid's contrasts, one cell's gap minus another's: (name, cell, the cell it is minus,
# what else differs between them). At equal steps two sizes see the same tokens, epochs and
# warmup; at equal tokens per parameter (the scaling grid's 1x) the larger one trains 15x the
# steps. The paper: the gain holds or grows with size (a size contrast at or below 0).
AT_EQUAL_STEPS = "the same tokens, epochs and warmup; parameters, rates and loss level differ"
AT_EQUAL_SIZE = "steps, epochs, warmup, rates and loss level differ"
SIZE_CONTRASTS = [("size at 133 steps", ("5x160", 133), ("2x64", 133), AT_EQUAL_STEPS),
                  ("size at 1976 steps", ("5x160", 1976), ("2x64", 1976), AT_EQUAL_STEPS),
                  ("size at 0.96 tokens per parameter", ("5x160", 1976), ("2x64", 133),
                   "parameters, steps, epochs, warmup, rates and loss level differ"),
                  ("length at 2x64", ("2x64", 1976), ("2x64", 133), AT_EQUAL_SIZE),
                  ("length at 5x160", ("5x160", 1976), ("5x160", 133), AT_EQUAL_SIZE)]


def cell_label(cell):
    return f"{cell[0]} at {cell[1]} steps"


def size_cells(results):
    """The size grid's cells (grids.SIZE_CELLS): in each, each family's rate picked by the mean
    loss over TUNE_SEEDS, then unified minus the baseline at their picked rates, paired by seed on
    the other seeds, with the seeds whose baseline is on the early plateau (PLATEAU) and the
    pair without them. (picks {cell: {family: pick_rate's}}, rows {cell: row})."""
    from study.grids import SIZE_CELLS, TUNE_SEEDS, size_name
    picks, rows = {}, {}
    for cell, lrs in SIZE_CELLS.items():
        for f in ("baseline", "unified"):
            pick = pick_rate(results, functools.partial(size_name, f, *cell), lrs, TUNE_SEEDS)
            if pick:
                picks.setdefault(cell, {})[f] = pick
        if len(picks.get(cell, {})) < 2:
            continue
        a, b = (size_name(f, *cell, picks[cell][f]["best"]) for f in ("unified", "baseline"))
        res, base = (left_out(results.get(n, {}), TUNE_SEEDS) for n in (a, b))
        seeds, diffs = paired_diffs(res, base)
        if seeds:
            plateau = [s for s in seeds if loss_of(base[s]) > PLATEAU]
            rows[cell] = {"cell": cell_label(cell), "variant": a, "baseline": b, "seeds": seeds,
                          "diffs": diffs, **part(diffs, -1), "plateau": plateau,
                          "off plateau": part([d for s, d in zip(seeds, diffs)
                                               if s not in plateau], -1) if plateau else None}
    return picks, rows


def gap_contrast(a, b, plateau=True):
    """Cell a's gap minus cell b's (rows of size_cells): Welch's interval and a permutation p, as
    two cells' runs are of other sizes or lengths; plateau=False: without the seeds on the early
    plateau. None under 2 seeds a cell."""
    da, db = ([d for s, d in zip(r["seeds"], r["diffs"]) if plateau or s not in r["plateau"]]
              for r in (a, b))
    if min(len(da), len(db)) < 2:
        return None
    mean, ci = welch(da, db)
    p = permutation_p(da, db)
    enough = min(len(da), len(db)) >= MIN_SEEDS
    return {"n": [len(da), len(db)], "mean": mean, "ci95": ci, "p": p,
            "verdict": judge(ci, p) if enough else "not resolved (n too small for p < 0.05)"}


def size_contrasts(rows):
    """[{"name", "cells": [a, b], "all": gap_contrast, "off plateau": the same without the
    plateau's seeds (None where neither cell has one)}] of SIZE_CONTRASTS whose cells ran."""
    out = []
    for name, a, b, differs in SIZE_CONTRASTS:
        if a in rows and b in rows and gap_contrast(rows[a], rows[b]):
            some = rows[a]["plateau"] or rows[b]["plateau"]
            out.append({"name": name, "cells": [cell_label(a), cell_label(b)], "differs": differs,
                        "all": gap_contrast(rows[a], rows[b]),
                        "off plateau": gap_contrast(rows[a], rows[b], False) if some else None})
    return out


def contrast_cell(c):
    if c is None:
        return "|  |  |"
    n = " + ".join(map(str, c["n"]))
    return f"{c['mean']:+.4f} {interval(c['ci95'])} ({n}) | {p_value(c['p'])} | {c['verdict']} |"


def size_report(results):
    from study.grids import SIZE_CELLS, TUNE_SEEDS, size_name
    picks, rows = size_cells(results)
    contrasts = size_contrasts(rows)
    lrs = sorted({lr for x in SIZE_CELLS.values() for lr in x}, key=float)
    lines = ["## The gain against model size and training length, each family at its own rate",
             "", f"Mean validation loss over seeds {', '.join(map(str, TUNE_SEEDS))}, which pick "
             "each family's rate in each cell, a size at a number of steps (**bold**; (edge): at "
             "the end of the rates run, the optimum may lie further out), and are then left out "
             "of the pairs.", "",
             "| cell | family | " + " | ".join(lrs) + " |", "|---" * (len(lrs) + 2) + "|"]
    lines += [f"| {cell_label(cell)} | {f} | " + " | ".join(pick_cells(p, lrs)) + " |"
              for cell, by in picks.items() for f, p in by.items()]
    picked = [size_name(f, *cell, p["best"]) for cell, by in picks.items() for f, p in by.items()]
    if picked:
        lines += ["", "The picked rows' other seeds: `python -m study.reproduce --grid=size "
                  f"--seeds={SIZE_SEEDS} --variants={','.join(picked)}`"]
    lines += ["", "Unified minus the baseline at their picked rates, paired by seed; plateau: the "
              f"seeds whose baseline ends above {PLATEAU} (the val split's character-bigram loss, "
              "2.48, plus 0.2):", "",
              "| cell | variant | vs | n | diff (mean ± std) | 95% CI | p | verdict | plateau "
              "| without the plateau's |", "|---|---|---|---|---|---|---|---|---|---|"]
    off = lambda o: "" if o is None else (   # noqa: E731
        f"{pm(o['mean'], o['std'], '+.4f')} {interval(o['ci95'])}, p = {p_value(o['p'])}, "
        f"{o['verdict']}")
    lines += [f"| {r['cell']} | {r['variant']} | {r['baseline']} | {len(r['seeds'])} "
              f"| {pm(r['mean'], r['std'], '+.4f')} | {interval(r['ci95'])} "
              f"| {p_value(r['p'])} | {r['verdict']} "
              f"| {seed_list(r['plateau']) if r['plateau'] else 'none'} | {off(r['off plateau'])} |"
              for r in rows.values()]
    if contrasts:
        lines += ["", "The contrasts, one cell's gap minus another's (above 0: a smaller gain in "
                  "the first): the difference of means, its 95% Welch interval (n + n), the "
                  "exact permutation p and the verdict, with every seed and without the plateau's "
                  "(blank: no seed of either cell on it).", "",
                  "| contrast | cells | all seeds | p | verdict | without the plateau's | p "
                  "| verdict |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['name']} | {c['cells'][0]} minus {c['cells'][1]} ({c['differs']}) | "
                  f"{contrast_cell(c['all'])} {contrast_cell(c['off plateau'])}"
                  for c in contrasts]
    return lines, {"picks": [{"cell": cell_label(c), "family": f, **p}
                             for c, by in picks.items() for f, p in by.items()],
                   "pairs": list(rows.values()), "contrasts": contrasts}


MUON_PICKED_ON = (1,)   # the lr grid's seed that picked the muon grid's rates


def muon_report(results):
    """The muon grid: unified minus the baseline under Muon, each at the muon_lr the lr grid's
    seed 1 picked, paired by seed on the seeds after it, all of one code."""
    from study.grids import MUON_WSD, muon_grid
    base, unified = (v.name for v in muon_grid())
    seeds, diffs = paired_diffs(left_out(results.get(unified, {}), MUON_PICKED_ON),
                                left_out(results.get(base, {}), MUON_PICKED_ON))
    if not seeds:
        return [], None
    row = {"variant": unified, "baseline": base, "seeds": seeds, "claim": MUON_WSD,
           **part(diffs, -1)}
    return ["## Unified under Muon, each at its picked muon_lr", "",
            "Unified minus the baseline seed by seed, leaving out seed 1 (it picked the rates in "
            "the lr grid).", "", "| variant | vs | n | diff (mean ± std) | 95% CI | p | verdict "
            "| paper's claim |", "|---|---|---|---|---|---|---|---|",
            f"| {unified} | {base} | {len(seeds)} | {pm(row['mean'], row['std'], '+.4f')} "
            f"| {interval(row['ci95'])} | {p_value(row['p'])} | {row['verdict']} "
            f"| {row['claim']} |"], {"rows": [row]}


def repeat_report(results):
    """The 5x160 gap at 1x on the whole training split and on its first half (which repeats
    the corpus twice as often)."""
    lines = ["## Length against repetition at 5x160", "",
             "Unified minus the baseline at the 1x budget, seed by seed, on the whole training "
             "split and on its first half (the same validation split): the half reads its text "
             "twice as often, as the whole does at 2x.", "",
             "| training split | epochs | n | gap (mean ± std) | 95% CI | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    rows, gaps, runs = [], {}, {}
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
        gaps[label], runs[label] = dict(zip(seeds, diffs)), a
        p = p_value(row["p"])
        lines.append(f"| {label} | {epochs:.2f} | {len(seeds)} "
                     f"| {pm(row['mean'], row['std'], '+.4f')} | {interval(row['ci95'])} | {p} "
                     f"| {row['verdict']} |")
    seeds = sorted(s for s in set(gaps.get("whole", ())) & set(gaps.get("first half", ()))
                   if same_code(runs["whole"][s], runs["first half"][s]))
    if seeds:   # the two gaps of a seed share its initialization and batch order: paired
        both = part([gaps["first half"][s] - gaps["whole"][s] for s in seeds])
        rows.append({"split": "first half minus whole", "seeds": seeds, **both})
        lines.append(f"| first half minus whole | | {len(seeds)} "
                     f"| {pm(both['mean'], both['std'], '+.4f')} | {interval(both['ci95'])} "
                     f"| {p_value(both['p'])} | {both['verdict']} |")
    return lines, {"rows": rows}


# grids with more to say than the paired table: (markdown lines, data for summary.json and plots)
REPORTS = {"lr": lr_report, "scaling": scaling_report, "default": default_report, "wd": wd_report,
           "regime": regime_report, "power": power_report, "iwd": iwd_report,
           "repeat": repeat_report, "tuned": tuned_report, "decay": decay_report,
           "untied": untied_report, "size": size_report, "muon": muon_report}


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
