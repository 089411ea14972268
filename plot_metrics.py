"""
Plot the metrics.jsonl of one or more runs of train.py into a PNG.

    python plot_metrics.py out/baseline_char out/unified_char --out=runs.png

Left: validation loss over training, one line per run. Then, for each run: the mean of
every effective scale vector over training, one line per vector (layer and branch),
coloured by depth: the growth the paper (section 2.2) calls self-amplifying. Last, for
MoE runs: the coefficient of variation of the experts' load, per layer.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")   # files only, no window
import matplotlib.pyplot as plt


def read_evals(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} does not exist: is {run_dir} the out_dir of a train.py run?")
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "eval"]


def plot_runs(run_dirs, out):
    runs = {os.path.basename(os.path.normpath(d)): read_evals(d) for d in run_dirs}
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
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("runs", nargs="+", help="out_dir folders of train.py runs")
    parser.add_argument("--out", default="metrics.png")
    args = parser.parse_args()
    plot_runs(args.runs, args.out)
