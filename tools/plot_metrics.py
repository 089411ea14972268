"""
A PNG of train.py runs, from their out_dir/metrics.jsonl:

    python -m tools.plot_metrics out/shakespeare_char   # -> out/shakespeare_char/metrics.png
    python -m tools.plot_metrics out/shakespeare_char out/unified_char --out=compare.png

Left: the loss over training, one colour per run: the training loss of every logged step (thin)
and the validation loss of every evaluation; a line of few points has markers, so that a short or
interrupted run (one evaluation, a few logged steps) is visible too. Then, per run: the mean of
every effective scale vector over training, one line per vector (layer and branch), coloured by
depth: the growth the paper (section 2.2) calls self-amplifying. Last, for MoE runs: the
coefficient of variation of the experts' load, per layer. A grid of study/ is drawn by
`python -m study.reproduce --summary_only`.
"""
import argparse
import os

from checkpoint import read_metrics as read_lines


def pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only, no window; imported here: --help stays light
    import matplotlib.pyplot as plt
    return plt


def read_metrics(run_dir, kind="eval"):
    """The records of one kind ("eval" or "train") in run_dir/metrics.jsonl, in order; [] if there
    is none. A line torn by a kill or a full disk is skipped (train.py's reader on resume)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r for r in read_lines(path)[0] if isinstance(r, dict) and r.get("kind") == kind]


def draw(ax, xs, ys, **kw):
    """A line with a marker at each point: one point is then a dot, not an invisible line."""
    ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=4, **kw)


def plot_runs(run_dirs, out):
    plt = pyplot()
    runs = {os.path.basename(os.path.normpath(d)): (read_metrics(d), read_metrics(d, "train"))
            for d in run_dirs}
    for d, (evals, steps) in zip(run_dirs, runs.values()):
        if not evals and not steps:
            raise SystemExit(f"error: {d} holds no record in metrics.jsonl: give the out_dir of a "
                             "train.py run that reached its first log line")
    moe = any(r.get("moe") for evals, _ in runs.values() for r in evals)
    n = 1 + len(runs) + moe
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    ax = axes[0, 0]
    for i, (name, (evals, steps)) in enumerate(runs.items()):
        colour = f"C{i}"
        draw(ax, [r["iter"] for r in steps], [r["loss"] for r in steps], color=colour, lw=0.5,
             alpha=0.5, label=f"{name} train (each step)")
        draw(ax, [r["iter"] for r in evals], [r["val_loss"] for r in evals], color=colour,
             label=f"{name} val")
    ax.set(xlabel="iteration", ylabel="loss", title="loss")
    ax.legend(fontsize=7)
    if moe:   # MoE: how unevenly the routed experts are loaded, per layer
        ax = axes[0, -1]
        for name, (evals, _) in runs.items():
            for layer in evals[-1].get("moe", {}) if evals else {}:
                rows = [r for r in evals if layer in r.get("moe", {})]
                draw(ax, [r["iter"] for r in rows], [r["moe"][layer]["cv"] for r in rows],
                     label=f"{name} {layer}", lw=0.8)
        ax.set(xlabel="iteration", ylabel="coefficient of variation of expert load",
               title="MoE load balance (0: even)")
        ax.legend(fontsize=6)
    for ax, (name, (evals, _)) in zip(axes[0, 1:], runs.items()):
        names = list(evals[-1].get("scale_vectors", {})) if evals else []
        cmap = plt.get_cmap("viridis")
        for i, vec in enumerate(names):
            rows = [r for r in evals if vec in r["scale_vectors"]]
            draw(ax, [r["iter"] for r in rows], [r["scale_vectors"][vec][0] for r in rows],
                 color=cmap(i / max(len(names) - 1, 1)), lw=0.8)
        ax.set(xlabel="iteration", ylabel="mean of the effective vector",
               title=(f"{name}: {len(names)} scale vectors" if names
                      else f"{name}: no scale vectors"))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("runs", nargs="+", help="out_dir folders of train.py runs")
    parser.add_argument("--out", help="the PNG to write; default: metrics.png in the first run's "
                                      "folder (metrics_compared.png for several runs)")
    args = parser.parse_args(argv)
    name = "metrics.png" if len(args.runs) == 1 else "metrics_compared.png"
    plot_runs(args.runs, args.out or os.path.join(args.runs[0], name))


if __name__ == "__main__":
    main()
