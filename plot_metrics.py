"""
Plots of train.py's metrics.jsonl: of single runs, and of reproduce.py's grids (drawn by plots.py,
the module reproduce.py uses too).

    python plot_metrics.py out/baseline_char out/unified_char --out=runs.png
    # redraw a grid's figures from its result.json files
    python plot_metrics.py --grid=results/default

Runs: left, validation loss over training, one line per run. Then, for each run: the mean of
every effective scale vector over training, one line per vector (layer and branch),
coloured by depth: the growth the paper (section 2.2) calls self-amplifying. Last, for
MoE runs: the coefficient of variation of the experts' load, per layer.
"""
import argparse
import glob
import json
import os

from plots import plot_grid, pyplot


def read_metrics(run_dir, kind="eval"):
    """The records of one kind ("eval" or "train") in run_dir/metrics.jsonl, in order; [] if there
    is none. A line torn by a kill or a full disk is skipped (checkpoint.read_metrics, train.py's
    reader on resume)."""
    from checkpoint import read_metrics as read_lines   # here: plotting alone need not import torch
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r for r in read_lines(path)[0] if isinstance(r, dict) and r.get("kind") == kind]


def plot_runs(run_dirs, out):
    plt = pyplot()
    runs = {os.path.basename(os.path.normpath(d)): read_metrics(d) for d in run_dirs}
    for d, evals in zip(run_dirs, runs.values()):
        if not evals:
            raise SystemExit(f"error: {d} holds no evaluation in metrics.jsonl: give the out_dir "
                             "of a train.py run that reached its first evaluation")
    moe = any(r.get("moe") for evals in runs.values() for r in evals)
    fig, axes = plt.subplots(1, 1 + len(runs) + moe, figsize=(5 * (1 + len(runs) + moe), 4),
                             squeeze=False)
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
                ax.plot(its, [r["moe"][layer]["cv"] for r in evals if layer in r.get("moe", {})],
                        label=f"{name} {layer}", lw=0.8)
        ax.set(xlabel="iteration", ylabel="coefficient of variation of expert load",
               title="MoE load balance (0: even)")
        ax.legend(fontsize=6)
    for ax, (name, evals) in zip(axes[0, 1:], runs.items()):
        names = list(evals[-1].get("scale_vectors", {}))
        cmap = plt.get_cmap("viridis")
        for i, vec in enumerate(names):
            its = [r["iter"] for r in evals if vec in r["scale_vectors"]]
            means = [r["scale_vectors"][vec][0] for r in evals if vec in r["scale_vectors"]]
            ax.plot(its, means, color=cmap(i / max(len(names) - 1, 1)), lw=0.8)
        ax.set(xlabel="iteration", ylabel="mean of the effective vector",
               title=(f"{name}: {len(names)} scale vectors" if names
                      else f"{name}: no scale vectors"))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


def grid_results(results_dir):
    """{variant: {seed: result}} of every result.json under results_dir/runs, and the variants as
    plot_grid wants them (baselines read from summary.json when there is one)."""
    from collections import namedtuple
    V = namedtuple("V", "name baseline")
    results = {}
    pattern = os.path.join(glob.escape(results_dir), "runs", "*", "seed*", "result.json")
    for path in sorted(glob.glob(pattern)):   # the folder's own name is no pattern
        with open(path) as f:
            r = json.load(f)
        results.setdefault(r["variant"], {})[r["seed"]] = r
    base = {}
    if os.path.exists(os.path.join(results_dir, "summary.json")):
        with open(os.path.join(results_dir, "summary.json")) as f:
            base = {row["variant"]: row["baseline"] for row in json.load(f)["rows"]}
    return [V(n, base.get(n)) for n in results], results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("runs", nargs="*", help="out_dir folders of train.py runs")
    parser.add_argument("--out", default="metrics.png")
    parser.add_argument("--grid",
                        help="a results folder of reproduce.py: redraw its three figures there")
    args = parser.parse_args()
    if args.grid:
        grid, results = grid_results(args.grid)
        if not results:
            raise SystemExit(f"error: {args.grid} holds no runs/*/seed*/result.json: give a "
                             "results folder of reproduce.py")
        plot_grid(args.grid, grid, results)
        print(f"wrote {args.grid}/val_loss.png, diff_vs_baseline.png and scale_vectors.png")
    elif args.runs:
        plot_runs(args.runs, args.out)
    else:
        parser.error("give run folders, or --grid=RESULTS_DIR")
