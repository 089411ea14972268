"""
The claims table of study/README.md and the mechanism's comparisons of study/NOTES.md, made from
the committed results (study/results/<grid>/runs) by one command:

    python -m study.claims            # rewrites both tables between their markers
    python -m study.claims --check    # exits 1 where a table is not what it makes

Each row is one comparison: variant minus control, paired by seed on one code
(report.paired_diffs), with the regime its runs trained in, read from their own settings. The
verdict reads Holm's p over the rows of a table with 6 seeds or more: one table, one family.
"""
import argparse
import functools
import glob
import json
import os
import sys
from collections import namedtuple

from study import report
from study.grids import ROOT, SIZE_CELLS, SIZES, TUNE_SEEDS

README, NOTES = (os.path.join(ROOT, "study", f) for f in ("README.md", "NOTES.md"))
RESULTS = os.path.join(ROOT, "study", "results")
# unified's step over the baseline's on the CPU recipe (study/BENCHMARKS.md, python -m tools.bench)
STEP_COST = {"compiled": 1.165, "eager": 1.475}

# claim and paper: the paper's words, on a claim's first row; pick: variant and control are
# families whose rates the grid's report picks on TUNE_SEEDS (left out of the pair); skip: seeds
# left out (they picked the rates elsewhere); stat: a report.TELEMETRY statistic or
# report.FROZEN_G, else the loss; kind: "pair", "cell" (a cell of the size grid, unified minus the
# baseline at their picked rates), "contrast" (one of report.SIZE_CONTRASTS, named by variant),
# each with "... off plateau" (without the baseline seeds on the early plateau, where there are),
# "factor" (the scaling grid's token factor)
Row = namedtuple("Row", "claim paper grid variant control sign what pick skip stat kind",
                 defaults=("", False, (), None, "pair"))
PICKED, RATES = "each at its rate (picked on seeds 1-2)", "each at its rate of the lr grid"
UNTIED = "2x64_untied_lr2e-3"
TEN = "10x the matrices' 0.1"   # a vector's decay of 1.0 beside the recipe's weight decay
FROZEN = "with a frozen g of the baseline's spread"
CLAIMS = [
    Row("no vectors: higher loss", "+0.028 same lr; +0.015 retuned (0.12B)", "tuned", "noscale",
        "baseline", +1, "same lr"),
    Row("", "", "tuned", "noscale", "baseline", +1, PICKED, pick=True),
    Row("unified: lower loss", "about -0.04 (0.12B-2B)", "power", "unified", "baseline", -1),
    Row("", "", "default", "unified", "baseline", -1),
    Row("unified: less compute", "1.22-1.25x compute", "scaling", "unified", "baseline", -1,
        kind="factor"),
    Row("DNP: lower loss", "(3.2)", "power", "dnp", "baseline", -1),
    Row("... its Norm after the map", "", "power", "dnp_novec", "baseline", 0),
    Row("... its vector", "freezing `g_out` raises the loss", "power", "dnp", "dnp_novec", -1),
    Row("", "", "power", "unified", "unified_novec", -1),
    Row("", "", "tuned", "dnp", "dnp_novec", -1, PICKED, pick=True),
    Row("unified beyond DNP (its HG, OR, IWD)", "", "power", "unified", "dnp", 0),
    Row("", "", "power", "unified_novec", "dnp_novec", 0),
    Row("HG, DP, OR, ER: lower loss", "(3.1-3.3)", "default", "hetero", "baseline", -1),
    *[Row("", "", "default", v, "baseline", -1) for v in ("dp", "or", "er")],
    Row("DNP, head-sized `g_out`", "7.85e-5 extra params", "scaling", "dnp_head_4x128",
        "baseline_4x128_x1", -1),
    Row("", "", "scaling", "unified_head_4x128", "baseline_4x128_x1", -1),
    Row("unified under Muon; + WSD; WSD", "a further 0.016-0.019 (0.5B)", "lr",
        "unified_muon_lr1e-3", "baseline_muon_lr4e-3", -1, RATES, skip=(1,)),
    Row("", "", "muon", "unified_muon_lr1e-3", "baseline_muon_lr4e-3", -1, RATES, skip=(1,)),
    Row("", "", "default", "unified_muon_wsd", "baseline_muon_wsd", -1, RATES),
    Row("", "", "default", "unified_wsd", "baseline_wsd", -1),
    Row("unified, MoE", "about -0.04", "default", "moe_unified", "moe_baseline", -1),
    Row("IWD: lower loss, plain Pre-Norm", "IWD below no decay (2.2)", "decay", "iwd_sv0.1",
        "baseline", -1, "vectors at 0.1"),
    Row("", "", "decay", "iwd_sv1.0", "baseline", -1, f"vectors at 1.0, {TEN}"),
    Row("", "", "decay", "iwd_blocks_sv0.1", "baseline", 0, "all but `g_final`, at 0.1"),
    Row("", "", "decay", "iwd_blocks_sv1.0", "baseline", 0, f"all but `g_final`, at 1.0, {TEN}"),
    Row("", "", "decay", "iwd_blocks_sv1.0", "iwd_sv1.0", 0, f"`g_final` spared, at 1.0, {TEN}"),
    Row("... the head untied", "", "untied", f"iwd_{UNTIED}_sv0.1", f"baseline_{UNTIED}", -1,
        "vectors at 0.1"),
    Row("", "", "untied", f"iwd_{UNTIED}_sv1.0", f"baseline_{UNTIED}", -1,
        f"vectors at 1.0, {TEN}"),
    Row("", "", "untied", f"iwd_blocks_{UNTIED}_sv0.1", f"baseline_{UNTIED}", 0,
        "all but `g_final`, at 0.1"),
    Row("", "", "untied", f"iwd_blocks_{UNTIED}_sv1.0", f"baseline_{UNTIED}", 0,
        f"all but `g_final`, at 1.0, {TEN}"),
    Row("... Gemma-style (QK-norm, post-norm)", "", "default", "gemma_iwd", "gemma_none", -1,
        "vectors at 0.1"),
    Row("", "", "iwd", "gemma_iwd_sv1", "gemma_none_sv1", -1, f"vectors at 1.0, {TEN}"),
    Row("decay on Output-Norm vectors", "harmful (2.2)", "decay", "gemma_owd_sv0.1",
        "gemma_none", +1, "at 0.1"),
    Row("", "", "decay", "gemma_owd_sv1.0", "gemma_none", +1, f"at 1.0, {TEN}"),
    Row("the gain with model size", "holds or grows, 0.12B to 2B", "scaling", "unified_2x64",
        "baseline_2x64_x1", -1, "same lr"),
    Row("", "", "scaling", "unified_5x160", "baseline_5x160_x1", -1, "same lr"),
    *[Row("", "", "size", report.cell_label(c), "", -1, PICKED, kind=kind)
      for c in sorted(SIZE_CELLS, key=lambda c: (SIZES[c[0]], c[1]))
      for kind in ("cell", "cell off plateau")],
    # the paper's claim is of size: a gap at the larger size minus at the smaller at or below 0
    *[Row("", "", "size", name, "", -1 if name.startswith("size") else 0, "Welch, permutation p",
          kind=kind) for name, *_ in report.SIZE_CONTRASTS
      for kind in ("contrast", "contrast off plateau")],
    Row("the gain across regimes", "100 tokens/param, one pass", "regime", "unified_2x64_t1",
        "baseline_2x64_t1", -1),
    *[Row("", "", "regime", f"unified_{s}", f"baseline_{s}", -1)
      for s in ("2x64_t10", "2x64_t30", "3x96_t1", "3x96_t10")],
]
MECHANISM = [
    Row("1. the spread of `g` grows from 0", "self-amplifying: it grows", "tuned",
        "baseline_lr4e-3", "baseline_lr5e-4", +1, stat="g std"),
    Row("", "", "power", "unified", "baseline", 0, stat="g std"),
    Row("3. corr(g_j, \\|\\|W'_j\\|\\|) > 0 and growing", "large columns get larger `g`",
        "tuned", "baseline_lr4e-3", "baseline_lr5e-4", +1, stat="corr(g, col norm of W')"),
    Row("", "", "tuned", "dnp", "baseline", 0, stat="corr(g, col norm of W')"),
    Row("", "", "power", "unified", "baseline", 0, stat="corr(g, col norm of W')"),
    Row("4. without vectors the column updates spread less", "lower: nothing preconditions "
        "them", "tuned", "noscale", "baseline", -1, stat="update cv"),
    # the comparison's words whole: each term is a run, or one with a frozen g (report.frozen_g)
    Row("", "", "tuned", "noscale", "baseline", 0, f"noscale - noscale {FROZEN}: the fold's "
        "arithmetic", stat=report.FOLD_SHARE),
    Row("... beyond the fold's arithmetic", "lower, beyond a frozen `g`", "tuned", "noscale",
        "baseline", -1, f"noscale {FROZEN} - baseline", stat=report.FROZEN_G),
    Row("the folded step's SGD exponent", "2 ± 0.1 each", "tuned", "dnp", "baseline", 0,
        stat="SGD exponent"),
]


@functools.lru_cache(maxsize=None)
def load(grid):
    """{variant: {seed: result}} of a committed grid; {} before it ran."""
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, grid, "runs", "*", "seed*",
                                              "result.json"))):
        with open(path) as f:
            r = json.load(f)
        out.setdefault(path.split(os.sep)[-3], {})[r["seed"]] = r
    return out


@functools.lru_cache(maxsize=None)
def settings(config, args):
    from config.defaults import DEFAULTS
    from configurator import configure
    return configure(DEFAULTS, [os.path.join(ROOT, config), *args])


def rate(c):
    """"lr 1e-3", "muon_lr 2.5e-4": the peak rate of a run's settings, one rounding."""
    muon = c["optimizer"] == "muon" and c["muon_lr"]
    m, e = f"{muon or c['learning_rate']:.1e}".split("e")
    return f"{'muon_lr' if muon else 'lr'} {m.rstrip('0').rstrip('.')}e{int(e)}"


def regime(r, other=None):
    """The words of a run's regime: size, steps, tokens per non-embedding parameter, epochs, the
    head tied or not, the rate (other: the control's run; "lr a / b": the run's, the control's,
    where they differ)."""
    run = lambda x: settings(x["config"], tuple(a for a in x["args"]   # noqa: E731
                                                  if not a.startswith(("--seed=", "--out_dir="))))
    c = run(r)
    tokens = c["max_iters"] * c["batch_size"] * c["block_size"] * c["gradient_accumulation_steps"]
    epochs = r.get("epochs") or tokens / (c["train_tokens"] or report.TRAIN_TOKENS)
    lr = rate(c) + (f" / {rate(run(other)).split()[-1]}"
                    if other and rate(run(other)) != rate(c) else "")
    per_param = tokens / report.non_embedding_params(c["n_layer"], c["n_embd"])
    return (f"{c['n_layer']}x{c['n_embd']}, {c['max_iters']} steps, {per_param:.2g} tok/param, "
            f"{epochs:.2g} epochs, head {'tied' if c['tie_embeddings'] else 'untied'}, {lr}")


def picked(results, family):
    """The tuned grid's variant of `family` at the rate its report picked; None before the picking
    seeds ran."""
    pick = report.tuned_pairs(results)[0].get(family)
    return pick and (family if pick["best"] == "1e-3" else f"{family}_lr{pick['best']}")


def pair(row, results):
    """(variant, control, seeds, diffs, seeds of two codes left out) of a "pair" row."""
    a, b = row.variant, row.control
    skip = TUNE_SEEDS if row.pick else row.skip
    if row.pick:
        a, b = picked(results, a), picked(results, b)
    res, base = ({s: r for s, r in results.get(n, {}).items() if s not in skip} for n in (a, b))
    if row.stat in (report.FROZEN_G, report.FOLD_SHARE):
        seeds, diffs = report.frozen_g_pair(res, base, row.stat)
    elif row.stat:
        seeds, diffs = report.telemetry_pair(res, base, row.stat)
    else:
        seeds, diffs = report.paired_diffs(res, base)
    return a, b, seeds, diffs, report.mixed_code(res, base)


def compute(row, load=load):
    """A row's figures: {"what", "n", "p", "below", and where it ran "regime", "ci95", "text"};
    "n" 0 where its grid has not run it yet; None for a row that does not apply (a contrast
    without the plateau's seeds where no seed is on it)."""
    results = load(row.grid)
    if row.kind == "factor":
        return factor(row, results)
    if row.kind.startswith("contrast"):
        return contrast(row, results)
    if row.kind.startswith("cell"):
        return cell(row, results)
    a, b, seeds, diffs, mixed = pair(row, results)
    what = (row.what if row.stat in (report.FROZEN_G, report.FOLD_SHARE) else
            f"{a or row.variant} - {b or row.control}" + (f", {row.what}" if row.what else ""))
    if row.skip or row.pick:
        what += f", {report.seed_list(seeds)}" if seeds else ""
    if mixed:
        what += f" ({report.seed_list(mixed)} of two codes left out)"
    out = {"what": f"{what} (`{row.grid}`)", "n": len(seeds), "p": report.sign_flip_p(diffs),
           "below": sum(d < 0 for d in diffs)}
    if seeds:
        mean, std = report.mean_std(diffs)
        out.update(regime=regime(results[a][seeds[0]], results[b][seeds[0]]),
                   ci95=report.ci95(diffs),
                   text=f"{report.pm(mean, std, '+.4f')} {report.interval(report.ci95(diffs))}")
    return out


FIGURES = {}   # id(results): (results, size_figures'), so that a grid's contrasts run once


def size_figures(results):
    """report.size_cells' rows by cell label and report.size_contrasts by name."""
    if id(results) not in FIGURES:
        rows = report.size_cells(results)[1]
        FIGURES[id(results)] = results, ({r["cell"]: r for r in rows.values()},
                                         {c["name"]: c for c in report.size_contrasts(rows)})
    return FIGURES[id(results)][1]


def cell_regime(results, r):
    return regime(results[r["variant"]][r["seeds"][0]], results[r["baseline"]][r["seeds"][0]])


def plateau_words(r):
    return (f"; the baseline's {report.seed_list(r['plateau'])} on the early plateau"
            if r["plateau"] else "")


def cell(row, results):
    """A cell of the size grid: unified minus the baseline at their picked rates, with every seed
    or ("cell off plateau") without the baseline seeds on the early plateau; None where none is."""
    r = size_figures(results)[0].get(row.variant)
    off = row.kind.endswith("plateau")
    if off and not (r and r["plateau"]):
        return None
    out = {"what": f"{row.variant}: unified - baseline, {row.what} (`{row.grid}`)", "n": 0}
    if r:
        figs = r["off plateau"] if off else r
        seeds = [s for s in r["seeds"] if not (off and s in r["plateau"])]
        diffs = [d for s, d in zip(r["seeds"], r["diffs"]) if s in seeds]
        out.update(what=f"{r['variant']} - {r['baseline']}, {row.what}, "
                        f"{report.seed_list(seeds)}"
                        + (f", without the baseline's plateau ({report.seed_list(r['plateau'])})"
                           if off else plateau_words(r)) + f" (`{row.grid}`)",
                   n=len(seeds), p=figs["p"], below=sum(d < 0 for d in diffs),
                   ci95=figs["ci95"], regime=cell_regime(results, r),
                   text=f"{report.pm(figs['mean'], figs['std'], '+.4f')} "
                        f"{report.interval(figs['ci95'])}")
    return out


def contrast(row, results):
    """One of report.SIZE_CONTRASTS, a cell's gap minus another's, with every seed or without the
    baseline seeds on the early plateau."""
    cells, contrasts = size_figures(results)
    c = contrasts.get(row.variant)
    off = row.kind.endswith("plateau")
    out = {"what": f"{row.variant}, {row.what} (`{row.grid}`)", "n": 0}
    if c is None:
        return None if off else out
    if off and c["off plateau"] is None:
        return None
    figs, (a, b) = c["off plateau" if off else "all"], (cells[x] for x in c["cells"])
    seeds = ", ".join(f"{report.seed_list(r['plateau'])} of {r['cell']}"
                      for r in (a, b) if r["plateau"])
    out.update(what=f"{row.variant}: the gap at {a['cell']} minus at {b['cell']} ({c['differs']}), "
                    f"{row.what}" + (f", without the baseline's plateau ({seeds})" if off else "")
                    + f" (`{row.grid}`)",
               n=min(figs["n"]), n_text=" + ".join(map(str, figs["n"])), p=figs["p"],
               ci95=figs["ci95"], text=f"{figs['mean']:+.4f} {report.interval(figs['ci95'])}",
               regime="; ".join(cell_regime(results, r) for r in (a, b)))
    return out


def factor(row, results):
    """unified's token factor at the 1x budget, per size (report.scaling_rows): the budget the
    baseline's fit needs for unified's loss, over unified's; then over unified's step cost."""
    rows = [r for r in report.scaling_rows(results)[0] if r["budget"] == 1
            and r["variant"] == row.variant] if results else []
    out = {"what": f"token factor at one size: the budget the baseline's fit needs for "
                   f"{row.variant}'s loss at 1x, over 1x (`{row.grid}`)", "n": 0}
    if not rows:
        return out
    at = next((r for r in rows if r["size"] == "4x128"), rows[0])   # the recipe's size
    sizes = ", ".join(f"{r['size']} {r['factor']:.2f}x" + " (degenerate fit)" * r["degenerate"]
                      for r in rows)
    cost = ", ".join(f"{c}x {k}" for k, c in STEP_COST.items())
    net = ", ".join(f"{at['factor'] / c:.2f}x {k}" for k, c in STEP_COST.items())
    base = results[f"{row.control}_{at['size']}_x1"][at["seeds"][0]]
    out.update(n=len(at["seeds"]), regime=regime(base), text=f"tokens {at['factor']:.2f}x at "
               f"{at['size']} ({sizes}); over unified's step cost ({cost}): {net}")
    return out


def holm(ps):
    """Holm's step-down adjustment of p-values, in their order (None: not in the family): the
    k-th smallest of m is multiplied by m - k + 1, and none is below one before it."""
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    out, floor = [None] * len(ps), 0.0
    for k, i in enumerate(order):
        floor = max(floor, min(1.0, (len(order) - k) * ps[i]))
        out[i] = floor
    return out


def table(rows, load=load, first=("claim", "paper")):
    """The markdown lines of a table of rows, Holm over its rows of MIN_SEEDS seeds or more;
    first: the names of its first two columns."""
    figs = [compute(r, load) for r in rows]
    rows, figs = zip(*[(r, f) for r, f in zip(rows, figs) if f is not None])
    family = [f.get("p") if f["n"] >= report.MIN_SEEDS else None for f in figs]
    adjusted = holm(family)
    m, n = sum(p is not None for p in family), report.MIN_SEEDS
    lines = [f"Holm's adjustment runs over the {m} rows with {n} seeds or more; the verdict reads",
             f"its p (under {n} seeds: not resolved, n too small).", "",
             f"| {' | '.join(first)} | comparison (grid) | regime | n | diff ± std [95% CI] "
             "| below 0 | p | Holm p | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row, f, p_holm in zip(rows, figs, adjusted):
        ran = bool(f["n"])
        cells = [row.claim, row.paper, f["what"], f.get("regime", ""),
                 f.get("n_text", f["n"]) if ran else "", f.get("text", "not run yet"),
                 f"{f['below']}/{f['n']}" if ran and f.get("below") is not None else "",
                 report.p_value(f.get("p")) if ran and f.get("p") is not None else "",
                 report.p_value(p_holm) if p_holm is not None else "", said(row, f, p_holm)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def said(row, f, p_holm):
    """The verdict, by report.judge on the interval and Holm's p; where the row's own p resolves
    it and Holm's does not, both; a claim not resolved, with the claimed effect its interval
    excludes (the paper's direction beyond the interval's end)."""
    if not f["n"]:
        return ""
    if row.kind == "factor":
        return f"no test: a factor of tokens, {f['n']} seeds"
    if p_holm is None:
        return "not resolved (n too small)"
    word, own = (report.judge(f["ci95"], p, row.sign) for p in (p_holm, f["p"]))
    if not word.startswith("not"):
        return f"{word} in this regime"
    if not own.startswith("not"):   # the interval and the row's own p alone agree
        return f"{own} by its own p, not after Holm"
    if row.sign:   # the claimed effect its interval leaves possible
        side, bound = ("below", f["ci95"][0]) if row.sign < 0 else ("above", f["ci95"][1])
        word += f"; the interval excludes a diff {side} {bound:+.4f}"
    return word


def blocks(load=load):
    """{file: {block: its lines}}."""
    return {README: {"claims": table(CLAIMS, load)},
            NOTES: {"mechanism": table(MECHANISM, load, ("prediction", "predicted"))}}


def begin(name):
    return f"<!-- {name}: made by `python -m study.claims` from the committed results -->"


def end(name):
    return f"<!-- /{name} -->"


def spliced(text, made):
    """text with each block's lines between its markers replaced by made[name]."""
    for name, lines in made.items():
        head, rest = text.split(begin(name) + "\n", 1)
        _, tail = rest.split(end(name), 1)
        text = head + begin(name) + "\n" + "\n".join(lines) + "\n" + end(name) + tail
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description="The claims table of study/README.md and the "
                                "mechanism's of study/NOTES.md, from the committed results.")
    p.add_argument("--check", action="store_true",
                   help="change nothing: exit 1 where a table is stale")
    a = p.parse_args(argv)
    stale = []
    for path, made in blocks().items():
        with open(path) as f:
            old = f.read()
        new = spliced(old, made)
        if new != old and not a.check:
            with open(path, "w") as f:
                f.write(new)
        stale += [os.path.relpath(path, ROOT)] * (new != old)
    if a.check:
        print(f"stale: {', '.join(stale)}: run python -m study.claims" if stale
              else "the claims and mechanism tables are up to date")
        return int(bool(stale))
    print("wrote the claims table of study/README.md and the mechanism's of study/NOTES.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
