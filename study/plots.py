"""
The figures of reproduce.py's grids, from their results ({variant: {seed: result.json}}), and the
one way to get pyplot; reproduce.py draws with them.
"""
import os
import re

import numpy as np


def pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only, no window; imported here: reading results stays light
    import matplotlib.pyplot as plt
    return plt


def root_of(grid, name):
    by = {v.name: v for v in grid}
    while by.get(name) and by[name].baseline in by:
        name = by[name].baseline
    return name


def plot_grid(out, grid, results, ci=None):
    """reproduce.py's figures of a grid, from its results ({variant: {seed: result.json}}):
    val_loss.png (each baseline's group, mean and min-max over seeds), diff_vs_baseline.png
    (paired differences, shaded by ci(diffs) -> [lo, hi], report.ci95), precond.png (the
    preconditioning telemetry) and scale_vectors.png (the growth of every effective vector,
    paper 2.2)."""
    plt = pyplot()
    have = [v for v in grid if results.get(v.name)]
    groups = {}
    for v in have:
        groups.setdefault(root_of(grid, v.name), []).append(v)

    def curves(name, seeds=None):   # iters, (seeds x iters) val loss
        res = results[name]
        seeds = sorted(res) if seeds is None else seeds
        its = sorted(set.intersection(*(set(i for i, _ in res[s]["curve"]) for s in seeds)))
        ys = [[dict(map(tuple, res[s]["curve"]))[i] for i in its] for s in seeds]
        return np.array(its), np.array(ys)

    def panels(n):   # up to 3 a row; unused ones hidden
        cols = min(n, 3)
        rows = -(-n // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
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
        ax.set(xlabel="iteration", ylabel="validation loss",
               title=f"{root} group: mean, min-max over seeds")
        ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(os.path.join(out, "val_loss.png"), dpi=80), plt.close(fig)

    paired = {root: [v for v in vs if v.baseline and results.get(v.baseline)]
              for root, vs in groups.items()}
    paired = {k: vs for k, vs in paired.items() if vs}
    fig, axes = panels(max(len(paired), 1))
    for ax, (root, vs) in zip(axes, paired.items()):
        for v in vs:
            seeds = sorted(set(results[v.name]) & set(results[v.baseline]))
            its, ys = curves(v.name, seeds)
            its_b, yb = curves(v.baseline, seeds)
            common = np.intersect1d(its, its_b)
            d = ys[:, np.isin(its, common)] - yb[:, np.isin(its_b, common)]
            line, = ax.plot(common, d.mean(0), label=f"{v.name} - {v.baseline} (n={len(seeds)})",
                            lw=1)
            if len(seeds) > 1 and ci:   # the interval of the mean, evaluation by evaluation
                lo, hi = np.array([ci(list(col)) for col in d.T]).T
                ax.fill_between(common, lo, hi, color=line.get_color(), alpha=0.2)
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel="iteration", ylabel="paired val loss difference (20 batches)",
               title=f"{root} group: mean and 95% interval over seeds")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diff_vs_baseline.png"), dpi=80)
    plt.close(fig)
    plot_preconditioning(plt, os.path.join(out, "precond.png"), results)

    # noscale has none
    with_vectors = [v.name for v in have if next(iter(results[v.name].values()))["sv_means"]]
    shown = [n for n in ("baseline", "unified") if n in with_vectors] or with_vectors[:2]
    if not shown:
        return
    fig, axes = panels(len(shown))
    for ax, name in zip(axes, shown):
        res = results[name]
        names = list(next(iter(res.values()))["sv_means"])
        layers = [int(m) for n in names for m in re.findall(r"blocks\.(\d+)\.", n)]
        n_layer = 1 + max(layers or [0])
        labelled = set()
        for n in names:   # each run's means at its own evaluations, averaged by iteration
            runs = [dict(zip((i for i, _ in r["curve"]), r["sv_means"][n])) for r in res.values()
                    if len(r["sv_means"].get(n, [])) == len(r["curve"])]
            its = sorted(set().union(*runs))
            ys = [np.mean([run[i] for run in runs if i in run]) for i in its]
            layer = re.findall(r"blocks\.(\d+)\.", n)
            label = f"layer {layer[0]}" if layer else "final norm"
            ax.plot(its, ys, lw=0.8, label=None if label in labelled else label,
                    color=plt.get_cmap("viridis")(int(layer[0]) / max(n_layer - 1, 1))
                    if layer else "r")
            labelled.add(label)
        ax.set(xlabel="iteration", ylabel="mean of each effective vector (over seeds)",
               title=f"{name}: {len(names)} vectors, coloured by layer")
        ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(os.path.join(out, "scale_vectors.png"), dpi=80), plt.close(fig)


# telemetry.preconditioning's figures (study/README.md, "Preconditioning, measured"), per map: how
# to read one number off a map's record, and the panel's label
PRECOND = {"spread of g (std)": lambda m: m["g"][0],
           # the fits need some spread of g to be read (about 0.5%; none at init)
           "AdamW: exponent of |dW'_j| / |dW_j| (1: frozen g)":
               lambda m: m.get("adamw_exp") if m["g"][0] > 5e-3 else None,
           "SGD: exponent over the folded step (2: the paper's g^2)":
               lambda m: m.get("sgd_exp") if m["g"][0] > 5e-3 else None,
           "corr(g_j, |W'_j|)": lambda m: m.get("corr_wg"),
           "spread of the column updates (cv)": lambda m: m.get("update_cv")}


def plot_preconditioning(plt, path, results):
    """precond.png: each statistic over training, the mean over the maps a vector feeds and over
    seeds, one line per variant that recorded it; nothing without a record."""
    have = {n: res for n, res in results.items()
            if all(r.get("preconditioning") for r in res.values())}
    if not have:
        return
    fig, axes = plt.subplots(1, len(PRECOND), figsize=(4.5 * len(PRECOND), 3.6))
    for ax, (label, pick) in zip(axes, PRECOND.items()):
        for name, res in have.items():
            runs = [dict(map(tuple, r["preconditioning"])) for r in res.values()]
            its = sorted(set().union(*runs))   # by iteration: a run that lacks one is left out
            ys = []
            for it in its:
                xs = [pick(m) for run in runs for m in run.get(it, {}).values()]
                xs = [x for x in xs if x is not None]
                ys.append(np.mean(xs) if xs else np.nan)
            ax.plot(its, ys, "o-", ms=2, lw=1, label=f"{name} (n={len(res)})")
        ax.set(xlabel="iteration", title=label)
        ax.legend(fontsize=6)
    fig.tight_layout(), fig.savefig(path, dpi=80), plt.close(fig)


def plot_report(out, grid_name, report):
    """The figures of reproduce.py's reports (summary.json's "report"): lr_sweep.png for the lr
    grid; compute_efficiency.png (each size's fitted baseline L(C) and the variants' points) and
    scaling.png (gap and compute factor against model size) for the scaling grid."""
    plt = pyplot()
    if grid_name == "lr":
        fig, ax = plt.subplots(figsize=(6, 4))
        for family, by in report["sweep"].items():
            lrs = sorted(by, key=float)
            ax.plot([float(x) for x in lrs], [by[x] for x in lrs], "o-", label=family, lw=1)
        ax.set(xscale="log", xlabel="learning rate (muon_lr for Muon families)",
               ylabel="validation loss", title="learning-rate sweep (seed 1)")
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
            for name, by_budget in f["variants"].items():
                bs = sorted(by_budget, key=float)
                ax.plot([float(b) for b in bs], [by_budget[b] for b in bs], "s--", lw=0.8,
                        label=name)
            ax.set(xscale="log", xlabel=f"budget (x {f['iters']} iterations)",
                   ylabel="validation loss", title=size)
            ax.set_xticks(f["budgets"], [f"{b:g}x" for b in f["budgets"]], minor=False)
            ax.minorticks_off()
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "compute_efficiency.png"), dpi=80)
        plt.close(fig)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
        at_1x = [r for r in report["rows"] if r["budget"] == 1]
        for name in sorted({r["variant"] for r in at_1x}):
            rows = [r for r in at_1x if r["variant"] == name]
            p = [r["params"] for r in rows]
            ax1.errorbar(p, [r["mean"] for r in rows], yerr=[r["std"] or 0 for r in rows],
                         fmt="o-", label=name)
            ax2.plot(p, [min(r["factor"], 10) for r in rows], "o-", label=name)
        ax1.axhline(0, color="k", lw=0.5)
        ax1.set(xscale="log", xlabel="non-embedding parameters",
                ylabel="val loss - baseline (same budget)", title="gap")
        ax2.axhline(1, color="k", lw=0.5)
        ax2.set(xscale="log", xlabel="non-embedding parameters", ylabel="compute factor (x)",
                title="compute efficiency")
        ax1.legend(fontsize=7), ax2.legend(fontsize=7)
        fig.tight_layout(), fig.savefig(os.path.join(out, "scaling.png"), dpi=80), plt.close(fig)
        plot_gap_vs_tokens(plt, os.path.join(out, "gap_vs_length.png"), report["rows"],
                           "unified and DNP against the baseline at each budget")
    if grid_name == "regime":
        plot_gap_vs_tokens(plt, os.path.join(out, "gap_vs_tokens.png"),
                           [dict(r, variant="unified") for r in report["rows"]],
                           "unified against the baseline")


def plot_gap_vs_tokens(plt, path, rows, title):
    """The gap (variant - baseline at the same budget; mean and std over seeds) against tokens per
    parameter: one line per size, solid for unified, dashed for DNP."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, size in enumerate(dict.fromkeys(r["size"] for r in rows)):
        for name, style in (("unified", "o-"), ("dnp", "s--")):
            line = sorted((r for r in rows if r["size"] == size and r["variant"] == name),
                          key=lambda r: r["tokens_per_param"])
            if line:
                ax.errorbar([r["tokens_per_param"] for r in line], [r["mean"] for r in line],
                            yerr=[r["std"] or 0 for r in line], fmt=style, color=f"C{i}",
                            label=f"{name} {size}", capsize=2, lw=1)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlabel="training tokens per non-embedding parameter",
           ylabel="val loss - baseline (same budget)", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(path, dpi=80), plt.close(fig)
