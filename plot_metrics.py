"""
Plots of train.py's metrics.jsonl: of single runs, and of reproduce.py's grids. Also the one
reader of metrics.jsonl that reproduce.py and gpu_check.py use.

    python plot_metrics.py out/baseline_char out/unified_char --out=runs.png
    python plot_metrics.py --grid=results/default        # redraw a grid's figures from its result.json files

Runs: left, validation loss over training, one line per run. Then, for each run: the mean of
every effective scale vector over training, one line per vector (layer and branch),
coloured by depth: the growth the paper (section 2.2) calls self-amplifying. Last, for
MoE runs: the coefficient of variation of the experts' load, per layer.
"""
import argparse
import glob
import json
import os
import re

import numpy as np


def read_metrics(run_dir, kind="eval"):
    """The records of one kind ("eval" or "train") in run_dir/metrics.jsonl, in order; [] if there is none.
    A line torn by a kill or a full disk is skipped (checkpoint.read_metrics, train.py's reader on resume)."""
    from checkpoint import read_metrics as read_lines   # here: plotting alone need not import torch
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r for r in read_lines(path)[0] if isinstance(r, dict) and r.get("kind") == kind]


def pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only, no window; imported here so that reading metrics stays light
    import matplotlib.pyplot as plt
    return plt


def root_of(grid, name):
    by = {v.name: v for v in grid}
    while by.get(name) and by[name].baseline in by:
        name = by[name].baseline
    return name


def plot_grid(out, grid, results):
    """reproduce.py's three figures of a grid, from its results ({variant: {seed: result.json}}): val_loss.png
    (each baseline's group, mean and min-max over seeds), diff_vs_baseline.png (paired differences) and
    scale_vectors.png (the growth of every effective vector, paper 2.2)."""
    plt = pyplot()
    have = [v for v in grid if results.get(v.name)]
    groups = {}
    for v in have:
        groups.setdefault(root_of(grid, v.name), []).append(v)

    def curves(name, seeds=None):   # iters, (seeds x iters) val loss
        res = results[name]
        seeds = sorted(res) if seeds is None else seeds
        its = sorted(set.intersection(*(set(i for i, _ in res[s]["curve"]) for s in seeds)))
        return np.array(its), np.array([[dict(map(tuple, res[s]["curve"]))[i] for i in its] for s in seeds])

    def panels(n):   # up to 3 a row; unused ones hidden
        cols = min(n, 3)
        fig, axes = plt.subplots(-(-n // cols), cols, figsize=(5.5 * cols, 4 * -(-n // cols)), squeeze=False)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        return fig, axes.flat

    fig, axes = panels(len(groups))
    for ax, (root, vs) in zip(axes, groups.items()):
        tail = []
        for v in vs:
            its, ys = curves(v.name)
            line, = ax.plot(its, ys.mean(0), label=f"{v.name} (n={len(ys)})", lw=1)
            ax.fill_between(its, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
            tail += list(ys.mean(0)[its >= its[-1] * 0.3])
        if tail:
            ax.set_ylim(min(tail) - 0.02, max(tail) + 0.02)
        ax.set(xlabel="iteration", ylabel="validation loss", title=f"{root} group: mean, min-max over seeds")
        ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(os.path.join(out, "val_loss.png"), dpi=80), plt.close(fig)

    paired = {root: [v for v in vs if v.baseline and results.get(v.baseline)] for root, vs in groups.items()}
    paired = {k: vs for k, vs in paired.items() if vs}
    fig, axes = panels(max(len(paired), 1))
    for ax, (root, vs) in zip(axes, paired.items()):
        for v in vs:
            seeds = sorted(set(results[v.name]) & set(results[v.baseline]))
            its, ys = curves(v.name, seeds)
            its_b, yb = curves(v.baseline, seeds)
            common = np.intersect1d(its, its_b)
            d = ys[:, np.isin(its, common)] - yb[:, np.isin(its_b, common)]
            line, = ax.plot(common, d.mean(0), label=f"{v.name} - {v.baseline} (n={len(seeds)})", lw=1)
            if len(seeds) > 1:
                ax.fill_between(common, d.mean(0) - d.std(0, ddof=1), d.mean(0) + d.std(0, ddof=1), color=line.get_color(), alpha=0.2)
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel="iteration", ylabel="paired val loss difference", title=f"{root} group: mean ± std over seeds")
        ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(os.path.join(out, "diff_vs_baseline.png"), dpi=80), plt.close(fig)

    with_vectors = [v.name for v in have if next(iter(results[v.name].values()))["sv_means"]]   # noscale has none
    shown = [n for n in ("baseline", "unified") if n in with_vectors] or with_vectors[:2]
    if not shown:
        return
    fig, axes = panels(len(shown))
    for ax, name in zip(axes, shown):
        res = results[name]
        its = np.array([i for i, _ in next(iter(res.values()))["curve"]])
        names = list(next(iter(res.values()))["sv_means"])
        n_layer = 1 + max([int(m) for n in names for m in re.findall(r"blocks\.(\d+)\.", n)] or [0])
        labelled = set()
        for n in names:
            ys = np.mean([r["sv_means"][n] for r in res.values() if len(r["sv_means"].get(n, [])) == len(its)], axis=0)
            layer = re.findall(r"blocks\.(\d+)\.", n)
            label = f"layer {layer[0]}" if layer else "final norm"
            ax.plot(its[: len(ys)], ys, lw=0.8, label=None if label in labelled else label,
                    color=plt.get_cmap("viridis")(int(layer[0]) / max(n_layer - 1, 1)) if layer else "r")
            labelled.add(label)
        ax.set(xlabel="iteration", ylabel="mean of each effective vector (over seeds)",
               title=f"{name}: {len(names)} vectors, coloured by layer")
        ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(os.path.join(out, "scale_vectors.png"), dpi=80), plt.close(fig)


def plot_report(out, grid_name, report):
    """The figures of reproduce.py's reports (summary.json's "report"): lr_sweep.png for the lr grid;
    compute_efficiency.png (each size's fitted baseline L(C) and the variants' points) and scaling.png (gap
    and compute factor against model size) for the scaling grid."""
    plt = pyplot()
    if grid_name == "lr":
        fig, ax = plt.subplots(figsize=(6, 4))
        for family, by in report["sweep"].items():
            lrs = sorted(by, key=float)
            ax.plot([float(x) for x in lrs], [by[x] for x in lrs], "o-", label=family, lw=1)
        ax.set(xscale="log", xlabel="learning rate (muon_lr for Muon families)", ylabel="validation loss",
               title="learning-rate sweep (seed 1)")
        ax.legend(fontsize=7)
        fig.tight_layout(), fig.savefig(os.path.join(out, "lr_sweep.png"), dpi=80), plt.close(fig)
    if grid_name == "scaling":
        fits = report["fits"]
        fig, axes = plt.subplots(1, len(fits), figsize=(4 * len(fits), 3.6), squeeze=False)
        for ax, (size, f) in zip(axes[0], fits.items()):
            E, A, alpha = f["fit"]
            c = np.geomspace(min(f["budgets"]) / 1.5, max(f["budgets"]) * 1.5, 100)
            ax.plot(f["budgets"], f["baseline"], "ko", label="baseline (mean over seeds)")
            ax.plot(c, E + A * c ** -alpha, "k-", lw=0.8, label=f"fit E + A C^-{alpha:.2f}")
            for name, loss in f["variants"].items():
                ax.plot([1], [loss], "s", label=f"{name} at 1x")
                ax.axhline(loss, lw=0.5, ls=":", color=ax.lines[-1].get_color())
            ax.set(xscale="log", xlabel=f"budget (x {f['iters']} iterations)", ylabel="validation loss", title=size)
            ax.set_xticks(f["budgets"], [f"{b:g}x" for b in f["budgets"]], minor=False), ax.minorticks_off()
            ax.legend(fontsize=6)
        fig.tight_layout(), fig.savefig(os.path.join(out, "compute_efficiency.png"), dpi=80), plt.close(fig)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
        for name in sorted({r["variant"] for r in report["rows"]}):
            rows = [r for r in report["rows"] if r["variant"] == name]
            p = [r["params"] for r in rows]
            ax1.errorbar(p, [r["gap_mean"] for r in rows], yerr=[r["gap_std"] or 0 for r in rows], fmt="o-", label=name)
            ax2.plot(p, [min(r["factor"], 10) for r in rows], "o-", label=name)
        ax1.axhline(0, color="k", lw=0.5)
        ax1.set(xscale="log", xlabel="non-embedding parameters", ylabel="val loss - baseline (same budget)", title="gap")
        ax2.axhline(1, color="k", lw=0.5)
        ax2.set(xscale="log", xlabel="non-embedding parameters", ylabel="compute factor (x)", title="compute efficiency")
        ax1.legend(fontsize=7), ax2.legend(fontsize=7)
        fig.tight_layout(), fig.savefig(os.path.join(out, "scaling.png"), dpi=80), plt.close(fig)


def plot_runs(run_dirs, out):
    plt = pyplot()
    runs = {os.path.basename(os.path.normpath(d)): read_metrics(d) for d in run_dirs}
    for d, evals in zip(run_dirs, runs.values()):
        if not evals:
            raise SystemExit(f"error: {d} holds no evaluation in metrics.jsonl: give the out_dir of a train.py run "
                             "that reached its first evaluation")
    moe = any(r.get("moe") for evals in runs.values() for r in evals)
    fig, axes = plt.subplots(1, 1 + len(runs) + moe, figsize=(5 * (1 + len(runs) + moe), 4), squeeze=False)
    ax = axes[0, 0]
    for name, evals in runs.items():
        ax.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], label=name)
    ax.set(xlabel="iteration", ylabel="validation loss", title="validation loss")
    ax.legend()
    if moe:   # MoE: how unevenly the routed experts are loaded, per layer
        ax = axes[0, -1]
        for name, evals in runs.items():
            for layer in evals[-1].get("moe", {}):
                its = [r["iter"] for r in evals if layer in r.get("moe", {})]
                ax.plot(its, [r["moe"][layer]["cv"] for r in evals if layer in r.get("moe", {})], label=f"{name} {layer}", lw=0.8)
        ax.set(xlabel="iteration", ylabel="coefficient of variation of expert load", title="MoE load balance (0: even)")
        ax.legend(fontsize=6)
    for ax, (name, evals) in zip(axes[0, 1:], runs.items()):
        names = list(evals[-1].get("scale_vectors", {}))
        cmap = plt.get_cmap("viridis")
        for i, vec in enumerate(names):
            its = [r["iter"] for r in evals if vec in r["scale_vectors"]]
            means = [r["scale_vectors"][vec][0] for r in evals if vec in r["scale_vectors"]]
            ax.plot(its, means, color=cmap(i / max(len(names) - 1, 1)), lw=0.8)
        ax.set(xlabel="iteration", ylabel="mean of the effective vector",
               title=f"{name}: {len(names)} scale vectors" if names else f"{name}: no scale vectors")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


def grid_results(results_dir):
    """{variant: {seed: result}} of every result.json under results_dir/runs, and the variants as plot_grid
    wants them (baselines read from summary.json when there is one)."""
    from collections import namedtuple
    V = namedtuple("V", "name baseline")
    results = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "runs", "*", "seed*", "result.json"))):
        with open(path) as f:
            r = json.load(f)
        results.setdefault(r["variant"], {})[r["seed"]] = r
    base = {}
    if os.path.exists(os.path.join(results_dir, "summary.json")):
        with open(os.path.join(results_dir, "summary.json")) as f:
            base = {row["variant"]: row["baseline"] for row in json.load(f)["rows"]}
    return [V(n, base.get(n)) for n in results], results


def time_to_loss(results, variant, reference="baseline", step_time_ratio=1.0):
    """Wall-clock efficiency of `variant` against `reference` from a grid's curves ({variant: {seed:
    result}}, as grid_results returns them): the step at which the seed-mean validation curve of
    `variant` first reaches the reference's final seed-mean loss (linear between evaluations), the
    token efficiency (the reference's steps over those), and the wall-clock efficiency (the same
    over step_time_ratio, the variant's step time over the reference's, from bench.py
    --interleave=True). None for the steps if it never gets there."""
    def mean_curve(name):
        curves = [dict(r["curve"]) for r in results[name].values()]
        steps = sorted(set.intersection(*(set(c) for c in curves)))   # evaluations every seed has
        return steps, [float(np.mean([c[s] for c in curves])) for s in steps]

    ref_steps, ref_loss = mean_curve(reference)
    target, steps, loss = ref_loss[-1], *mean_curve(variant)
    reached = None
    for i, (s, l) in enumerate(zip(steps, loss)):
        if l <= target:
            if i == 0:
                reached = s
            else:   # linear between the evaluation before and this one
                s0, l0 = steps[i - 1], loss[i - 1]
                reached = s0 + (s - s0) * (l0 - target) / (l0 - l)
            break
    tokens = ref_steps[-1] / reached if reached else None
    wallclock = tokens / step_time_ratio if tokens else None
    return {"target_loss": target, "reference_steps": ref_steps[-1], "steps": reached,
            "token_efficiency": tokens, "wallclock_efficiency": wallclock}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("runs", nargs="*", help="out_dir folders of train.py runs")
    parser.add_argument("--out", default="metrics.png")
    parser.add_argument("--grid", help="a results folder of reproduce.py: redraw its three figures there")
    args = parser.parse_args()
    if args.grid:
        grid, results = grid_results(args.grid)
        if not results:
            raise SystemExit(f"error: {args.grid} holds no runs/*/seed*/result.json: give a results folder of reproduce.py")
        plot_grid(args.grid, grid, results)
        print(f"wrote {args.grid}/val_loss.png, diff_vs_baseline.png and scale_vectors.png")
    elif args.runs:
        plot_runs(args.runs, args.out)
    else:
        parser.error("give run folders, or --grid=RESULTS_DIR")
