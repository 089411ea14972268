"""
A PNG of train.py runs, from their out_dir/metrics.jsonl:

    python -m tools.plot_metrics out/shakespeare_char   # -> out/shakespeare_char/metrics.png
    python -m tools.plot_metrics out/shakespeare_char out/unified_char --out=compare.png

Top row, one colour per run: the loss over the whole run (the training loss of every logged step,
thin, and the validation loss of every evaluation); the validation loss over the last half of
training alone, on its own scale, where the runs' differences show; with several runs, the gap
itself: each run's validation loss minus the first run's, at the evaluations they share. A line
of few points has markers, so that a short or interrupted run is visible too. Below, per run, the
mean of every effective scale vector over training: its colour the layer (the colour bar), its
dash the vector (the legend), g_final in black: the growth the paper (section 2.2) calls
self-amplifying. Last, for MoE runs: the coefficient of variation of the experts' load, per layer.
A grid of study/ is drawn by `python -m study.reproduce --summary_only`.
"""
import argparse
import json
import os
import re

# what the plot reads of each kind of record, and what train.py writes there
NEEDS = {"train": {"iter": "an integer", "loss": "a number"},
         "eval": {"iter": "an integer", "val_loss": "a number",
                  "scale_vectors": "a dict of {vector: [mean, min, max]}"}}
# a dash per kind of vector (the layer is the colour): as many as an MoE unified run has kinds
DASHES = ["-", (0, (5, 1.5)), (0, (1, 1.2)), (0, (5, 1.5, 1, 1.5)), (0, (9, 2)),
          (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (2, 2)), (0, (9, 2, 2, 2)), (0, (3, 4)),
          (0, (9, 2, 1, 2, 1, 2)), (0, (1, 3)), (0, (12, 3)), (0, (5, 4)), (0, (2, 1, 2, 4)),
          (0, (12, 2, 5, 2)), (0, (1, 1, 5, 1))]


def pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only, no window; imported here: --help stays light
    import matplotlib.pyplot as plt
    return plt


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def problem(record, kind):
    """What is wrong with a record of `kind` for the plot, in words, or None."""
    for key, what in NEEDS[kind].items():
        value = record.get(key)
        ok = (isinstance(value, int) and not isinstance(value, bool) if key == "iter" else
              number(value) if what == "a number" else
              isinstance(value, dict) and all(isinstance(v, list) and v and number(v[0])
                                              for v in value.values()))
        if not ok:
            return (f"its {key!r} is {value!r}, not {what}" if key in record else
                    f"it has no {key!r} ({what})")
    moe = record.get("moe", {})
    if not (isinstance(moe, dict) and all(isinstance(v, dict) and number(v.get("cv"))
                                          for v in moe.values())):
        return "its 'moe' is not a dict of {layer: {'cv': number, ...}}"
    return None


def read_metrics(run_dir):
    """{"eval": [...], "train": [...]}: the records of run_dir/metrics.jsonl in order (none without
    that file). A line torn by a kill or a full disk is skipped (as train.py's reader on
    resume), other kinds ignored; a train or eval record without what the plot reads is one
    sentence that names the file and the line."""
    path = os.path.join(run_dir, "metrics.jsonl")
    runs = {kind: [] for kind in NEEDS}
    if not os.path.exists(path):
        return runs
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("kind") if isinstance(record, dict) else None
            if kind not in NEEDS:
                continue
            why = problem(record, kind)
            if why:
                raise SystemExit(f"error: {path}, line {n}: a {kind} record that train.py did "
                                 f"not write ({why}): remove or fix that line")
            runs[kind].append(record)
    return runs


def draw(ax, xs, ys, **kw):
    """A line with a marker at each point: one point is then a dot, not an invisible line."""
    return ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=4, **kw)[0]


def layer_and_kind(name):
    """('blocks.3.attn.qkv.g_in.q') -> (3, 'attn.qkv.g_in.q'); an MoE expert's number is dropped
    (one kind for all experts); (None, name) outside the blocks (g_final)."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.*)", name)
    if not m:
        return None, name
    return int(m.group(1)), re.sub(r"\.experts\.(g_\w+)\.\d+\.", r".experts.\1.", m.group(2))


def plot_losses(axes, runs):
    """The loss over the whole run, the validation loss over the last half, and the gap to the
    first run at the evaluations all share (axes[2], with several runs)."""
    whole, zoom = axes[0], axes[1]
    last = max((r["iter"] for recs in runs.values() for r in recs["eval"] + recs["train"]),
               default=0)
    half = last // 2
    for i, (name, recs) in enumerate(runs.items()):
        steps, evals = recs["train"], recs["eval"]
        draw(whole, [r["iter"] for r in steps], [r["loss"] for r in steps], color=f"C{i}",
             lw=0.5, alpha=0.5, label=f"{name} train (each step)")
        draw(whole, [r["iter"] for r in evals], [r["val_loss"] for r in evals], color=f"C{i}",
             label=f"{name} val")
        late = [r for r in evals if r["iter"] >= half]
        draw(zoom, [r["iter"] for r in late], [r["val_loss"] for r in late], color=f"C{i}",
             label=f"{name} val" + (f" (last {late[-1]['val_loss']:.4f})" if late else ": none"))
    whole.set(xlabel="iteration", ylabel="loss", title="loss")
    zoom.set(xlabel="iteration", ylabel="validation loss",
             title=f"val loss, last half (iteration >= {half})")
    for ax in (whole, zoom):
        ax.legend(fontsize=7)
    if len(runs) < 2:
        return
    gap, (first, base) = axes[2], next(iter(runs.items()))
    ref = {r["iter"]: r["val_loss"] for r in base["eval"]}
    gap.axhline(0, color="C0", lw=1, label=f"{first} (the reference)")
    for i, (name, recs) in list(enumerate(runs.items()))[1:]:
        shared = [r for r in recs["eval"] if r["iter"] in ref]
        xs, ys = [r["iter"] for r in shared], [r["val_loss"] - ref[r["iter"]] for r in shared]
        draw(gap, xs, ys, color=f"C{i}", label=f"{name} - {first}" + (
            f" (last {ys[-1]:+.4f} at {xs[-1]})" if xs else ": no shared evaluation"))
    gap.set(xlabel="iteration", ylabel=f"val loss minus {first}'s",
            title=f"gap to {first} (below 0: lower loss)")
    gap.legend(fontsize=7)


def plot_vectors(ax, name, evals, plt):
    """Each effective vector's mean over training: colour by layer (a colour bar), dash by kind (a
    legend); g_final (any vector outside the blocks) solid black."""
    names = list(evals[-1]["scale_vectors"]) if evals else []
    sites = {v: layer_and_kind(v) for v in names}
    layers = sorted({layer for layer, _ in sites.values() if layer is not None})
    kinds = list(dict.fromkeys(kind for layer, kind in sites.values() if layer is not None))
    cmap = plt.get_cmap("viridis")
    norm = plt.Normalize(min(layers, default=0) - 0.5, max(layers, default=0) + 0.5)
    style = {kind: dict(linestyle=DASHES[i % len(DASHES)], lw=0.8) for i, kind in enumerate(kinds)}
    for v, (layer, kind) in sites.items():
        rows = [r for r in evals if v in r["scale_vectors"]]
        draw(ax, [r["iter"] for r in rows], [r["scale_vectors"][v][0] for r in rows], label=v,
             **(style[kind] if layer is not None else dict(lw=1.6)),
             color="black" if layer is None else cmap(norm(layer)))
    ax.set(xlabel="iteration", ylabel="mean of the effective vector",
           title=f"{name}: {len(names)} scale vectors" if names else f"{name}: no scale vectors")
    if not names:
        return
    ax.legend(handles=[plt.Line2D([], [], color="gray", label=k, **style[k]) for k in kinds]
              + [plt.Line2D([], [], color="black", lw=1.6, label=v)
                 for v, (layer, _) in sites.items() if layer is None],
              fontsize=6, ncol=1 + len(sites) // 30 + len(kinds) // 9, title="vector (dash)",
              title_fontsize=6)
    if layers:
        bar = plt.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, ticks=layers)
        bar.set_label("layer")


def plot_runs(run_dirs, out):
    plt = pyplot()
    runs = {os.path.basename(os.path.normpath(d)): read_metrics(d) for d in run_dirs}
    for d, recs in zip(run_dirs, runs.values()):
        if not recs["eval"] and not recs["train"]:
            raise SystemExit(f"error: {d} holds no record in metrics.jsonl: give the out_dir of a "
                             "train.py run that reached its first log line")
    moe = any(r.get("moe") for recs in runs.values() for r in recs["eval"])
    top = 2 + (len(runs) > 1)
    cols = max(top, len(runs) + moe)
    fig, axes = plt.subplots(2, cols, figsize=(5.5 * cols, 8.5), squeeze=False)
    plot_losses(axes[0], runs)
    for ax, (name, recs) in zip(axes[1], runs.items()):
        plot_vectors(ax, name, recs["eval"], plt)
    if moe:   # MoE: how unevenly the routed experts are loaded, per layer
        ax = axes[1, len(runs)]
        for name, recs in runs.items():
            evals = recs["eval"]
            for layer in evals[-1].get("moe", {}) if evals else {}:
                rows = [r for r in evals if layer in r.get("moe", {})]
                draw(ax, [r["iter"] for r in rows], [r["moe"][layer]["cv"] for r in rows],
                     label=f"{name} {layer}", lw=0.8)
        ax.set(xlabel="iteration", ylabel="coefficient of variation of expert load",
               title="MoE load balance (0: even)")
        ax.legend(fontsize=6)
    for ax in [*axes[0, top:], *axes[1, len(runs) + moe:]]:
        ax.set_axis_off()   # a cell the grid has and no panel needs
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:   # a missing folder, a read-only run folder
        raise SystemExit(f"error: cannot write {out} ({e.strerror}): give --out=a writable path")
    finally:
        plt.close(fig)
    print(f"wrote {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tools.plot_metrics",
        description="A PNG of train.py runs from their metrics.jsonl: the loss over the whole "
                    "run, the validation loss over the last half on its own scale, each run's "
                    "gap to the first run at their shared evaluations, each run's scale vectors "
                    "over training (colour: layer, dash: vector) and, for MoE runs, the experts' "
                    "load balance.")
    parser.add_argument("runs", nargs="+", help="out_dir folders of train.py runs; the first is "
                                                "the reference of the gap panel")
    parser.add_argument("--out", help="the PNG to write; default: metrics.png in the first run's "
                                      "folder (metrics_compared.png for several runs)")
    args = parser.parse_args(argv)
    name = "metrics.png" if len(args.runs) == 1 else "metrics_compared.png"
    plot_runs(args.runs, args.out or os.path.join(args.runs[0], name))


if __name__ == "__main__":
    main()
