"""
Reproduce the paper's claims at CPU size: a grid of variants x seeds of train.py on Tiny
Shakespeare, compared to their baselines seed by seed (a seed fixes the initialization and
the batch order, identically across variants), with a summary and plots in results/<grid>/.

    python reproduce.py                          # the default grid, 3 seeds, 2 runs at a time
    python reproduce.py --dry_run                # list the runs and the time estimate
    python reproduce.py --variants=noscale,unified --seeds=5   # a subset (their baselines come along)

Stop it at any time and start it again: finished runs (result.json) are skipped, failed or
interrupted ones are run again from scratch.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

ROOT = os.path.dirname(os.path.abspath(__file__))

# ---- sizing of the default grid: the one place to change it ----------------------------------------
# config/*_char.py (4 layers x 128, block 64, batch 12) for MAX_ITERS iterations instead of 2000, an
# evaluation every MAX_ITERS / 10. Measured (CPU time of single-thread runs, 2 at a time on 2 cores):
# 75 ms/iteration for the baseline, 110-135 for Gemma, DNP, unified and Muon, 100 on average over the
# 17 variants; ~13 s per run for start-up and evaluations. 51 runs x 1000 iterations: ~48 min.
MAX_ITERS = 1000
MS_PER_ITER, OVERHEAD_S = 100, 13


def sizing(max_iters):
    return [f"--max_iters={max_iters}", f"--lr_decay_iters={max_iters}", f"--eval_interval={max(max_iters // 10, 1)}",
            f"--warmup_iters={min(100, max_iters // 10)}", "--keep_checkpoints=1"]


# ---- grids: (name, config file, overrides, baseline it is paired with, the paper's claim, expected sign
# of (variant - baseline) val loss: -1 lower, +1 higher, 0 no claim) -----------------------------------
Variant = namedtuple("Variant", "name config overrides baseline claim sign")
UNIFIED = "unified (HG+DNP+OR+IWD) lowers the loss (~0.04, dense and MoE, 0.12B-2B; 1.22-1.25x compute)"
MUON_WSD = "unified still wins under Muon / WSD: a further 0.016-0.019 (0.5B, dense and MoE)"


def default_grid():
    v = [Variant("baseline", "config/baseline_char.py", [], None, "", 0),
         Variant("noscale", "config/noscale_char.py", [], "baseline",
                 "removing scale vectors raises the loss (+0.028 at the same lr, 0.12B; Fig. 1)", +1),
         Variant("gemma_none", "config/gemma_none_char.py", [], None, "", 0),
         Variant("gemma_iwd", "config/gemma_iwd_char.py", [], "gemma_none",
                 "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)", -1),
         Variant("gemma_all", "config/gemma_all_char.py", [], "gemma_iwd",
                 "decaying Output-Norm vectors too is worse than IWD (Gemma-0.5B; 2.2)", +1)]
    for name, claim in [("hetero", "HG: branch-specific vectors lower the loss (3.1)"),
                        ("dp", "DP: the loss descends at least as fast (3.2, Thm 3.1)"),
                        ("dnp", "DNP: dual placement with a norm lowers the loss (3.2)"),
                        ("or", "OR: magnitude-direction reparameterization lowers the loss (3.3)"),
                        ("er", "ER: exponential reparameterization lowers the loss (3.3)"),
                        ("unified", UNIFIED)]:
        v.append(Variant(name, f"config/{name}_char.py", [], "baseline", claim, -1))
    for tag, flag in [("muon", "--optimizer=muon"), ("wsd", "--lr_schedule=wsd")]:
        v += [Variant(f"baseline_{tag}", "config/baseline_char.py", [flag], None, "", 0),
              Variant(f"unified_{tag}", "config/unified_char.py", [flag], f"baseline_{tag}", MUON_WSD, -1)]
    if all(os.path.exists(os.path.join(ROOT, f"config/moe_{k}_char.py")) for k in ("baseline", "unified")):
        v += [Variant("moe_baseline", "config/moe_baseline_char.py", [], None, "", 0),
              Variant("moe_unified", "config/moe_unified_char.py", [], "moe_baseline", UNIFIED, -1)]
    return v


GRIDS = {"default": default_grid, "core": lambda: [v for v in default_grid() if v.name in ("baseline", "noscale", "unified")]}


# ---- runs -------------------------------------------------------------------------------------------
def read_evals(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "eval"]


def run_one(v, seed, args_list, out_dir, env):
    """Train one (variant, seed); return its result dict, or raise RuntimeError with the reason."""
    os.makedirs(out_dir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, v.config), *args_list]
    t0 = time.time()
    with open(os.path.join(out_dir, "train.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.time() - t0
    evals = read_evals(out_dir)
    max_iters = int(re.findall(r"--max_iters=(\d+)", " ".join(args_list))[-1])
    if rc != 0 or not evals or evals[-1]["iter"] != max_iters:
        with open(os.path.join(out_dir, "train.log")) as f:
            last = (f.read().strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"exit {rc}, {'stopped at iteration ' + str(evals[-1]['iter']) if evals else 'no evaluation'}: {last}")
    names = list(evals[-1].get("scale_vectors", {}))
    return {"variant": v.name, "seed": seed, "config": v.config, "args": args_list, "val_loss": evals[-1]["val_loss"],
            "train_loss": evals[-1]["train_loss"], "curve": [[r["iter"], r["val_loss"]] for r in evals], "wall_s": wall,
            "scale_vectors": evals[-1].get("scale_vectors", {}),
            "sv_means": {n: [r["scale_vectors"][n][0] for r in evals if n in r.get("scale_vectors", {})] for n in names}}


def load_result(run_dir):
    path = os.path.join(run_dir, "result.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


# ---- summary and plots ------------------------------------------------------------------------------
def mean_std(xs):
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()) if len(xs) else None, float(xs.std(ddof=1)) if len(xs) > 1 else None


def summarize(grid, results):
    rows = []
    for v in grid:
        res = results.get(v.name, {})
        mean, std = mean_std([r["val_loss"] for r in res.values()])
        row = {"variant": v.name, "baseline": v.baseline, "n": len(res), "val_loss_mean": mean, "val_loss_std": std,
               "claim": v.claim, "expected_sign": v.sign, "seeds": sorted(res)}
        if v.baseline:
            base = results.get(v.baseline, {})
            seeds = sorted(set(res) & set(base))
            d_mean, d_std = mean_std([res[s]["val_loss"] - base[s]["val_loss"] for s in seeds])
            row.update(paired_seeds=seeds, diff_mean=d_mean, diff_std=d_std,
                       within_noise=None if d_std is None else bool(abs(d_mean) <= 2 * d_std / np.sqrt(len(seeds))),
                       direction_matches=None if d_mean is None or not v.sign else bool(np.sign(d_mean) == v.sign))
        rows.append(row)
    return rows


def pm(m, s, fmt=".4f"):
    return "—" if m is None else f"{m:{fmt}}" + ("" if s is None else f" ± {s:.4f}")


def write_summary(out, rows, header):
    word = {True: "yes", False: "no", None: "—"}
    lines = [*header, "", "| variant | vs | n | val loss (mean ± std) | paired diff (mean ± std) | within noise "
             "| paper's claim | direction matches |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = noise = ""
        if r["baseline"]:
            diff = f"{pm(r['diff_mean'], r['diff_std'], '+.4f')} (n={len(r['paired_seeds'])})"
            noise = {True: "within noise", False: "beyond noise", None: "—"}[r["within_noise"]]
        lines.append(f"| {r['variant']} | {r['baseline'] or ''} | {r['n']} | {pm(r['val_loss_mean'], r['val_loss_std'])} "
                     f"| {diff} | {noise} | {r['claim']} | {word[r.get('direction_matches')]} |")
    lines += ["", "Paired diff: variant minus its baseline, seed by seed (a seed fixes the shared initialization and the "
              "batch order). Within noise: |mean| <= 2 std / sqrt(n), two standard errors."]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def root_of(grid, name):
    by = {v.name: v for v in grid}
    while by.get(name) and by[name].baseline in by:
        name = by[name].baseline
    return name


def plot(out, grid, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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

    shown = [n for n in ("baseline", "unified") if results.get(n)] or [v.name for v in have[:2]]
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


# ---- main -------------------------------------------------------------------------------------------
def main(argv=None, grids=GRIDS):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--grid", default="default", choices=sorted(grids))
    p.add_argument("--variants", default="", help="comma-separated subset of the grid (their baselines are added)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time; each gets cpu_count // jobs threads")
    p.add_argument("--max_iters", type=int, default=MAX_ITERS)
    p.add_argument("--extra", default="", help='more train.py overrides for every run, e.g. "--dataset=tiny --n_layer=2"')
    p.add_argument("--results_dir", default="", help="default: results/<grid>")
    p.add_argument("--keep_checkpoints", action="store_true", help="keep each finished run's last checkpoint")
    p.add_argument("--dry_run", action="store_true")
    a = p.parse_args(argv)
    grid = grids[a.grid]() if callable(grids[a.grid]) else list(grids[a.grid])
    if a.variants:
        want = set(a.variants.split(","))
        if want - {v.name for v in grid}:
            p.error(f"unknown variants {sorted(want - {v.name for v in grid})}; the grid has {[v.name for v in grid]}")
        want |= {v.baseline for v in grid if v.name in want and v.baseline}
        grid = [v for v in grid if v.name in want]
    out = a.results_dir or os.path.join("results", a.grid)
    extra = shlex.split(a.extra)
    jobs = []
    for seed in range(1, a.seeds + 1):   # seed by seed: an interrupted grid still has whole seeds
        for v in grid:
            run_dir = os.path.join(out, "runs", v.name, f"seed{seed}")
            args_list = [*sizing(a.max_iters), *v.overrides, *extra, f"--seed={seed}", f"--out_dir={run_dir}"]
            done = (load_result(run_dir) or {}).get("args") == args_list
            jobs.append((v, seed, args_list, run_dir, done))
    todo = [j for j in jobs if not j[4]]
    est = len(todo) * (OVERHEAD_S + a.max_iters * MS_PER_ITER / 1000) / max(1, min(a.jobs, os.cpu_count() or 1))
    print(f"grid {a.grid}: {len({j[0].name for j in jobs})} variants x {a.seeds} seeds = {len(jobs)} runs, "
          f"{len(jobs) - len(todo)} done, {len(todo)} to do; {a.max_iters} iterations each; "
          f"estimate {est / 60:.0f} min at the default model size with {a.jobs} jobs")
    if a.dry_run:
        for v, seed, args_list, _, done in jobs:
            print(("done  " if done else "to do ") + shlex.join(["python", "train.py", v.config, *args_list]))
        return 0
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // a.jobs)))
    t_start, failed = time.time(), []
    with ThreadPoolExecutor(a.jobs) as pool:
        futs = {pool.submit(run_one, v, s, al, d, env): (v, s, d) for v, s, al, d, _ in todo}
        try:
            for k, fut in enumerate(as_completed(futs), 1):
                v, s, d = futs[fut]
                eta = (time.time() - t_start) / k * (len(todo) - k)
                try:
                    res = fut.result()
                    write_json(os.path.join(d, "result.json"), res)
                    if not a.keep_checkpoints:   # ~10 MB a run; result.json and metrics.jsonl hold what is reported
                        for f in os.listdir(d):
                            if f.startswith("ckpt_") or f == "latest":
                                os.remove(os.path.join(d, f))
                    print(f"[{k}/{len(todo)}] {v.name} seed {s}: val {res['val_loss']:.4f} ({res['wall_s']:.0f} s), "
                          f"ETA {eta / 60:.1f} min", flush=True)
                except RuntimeError as e:
                    failed.append((v.name, s))
                    print(f"[{k}/{len(todo)}] {v.name} seed {s}: FAILED ({e}); log: {d}/train.log", flush=True)
        except KeyboardInterrupt:
            pool.shutdown(wait=True, cancel_futures=True)   # the runs get the same SIGINT, save and exit
            print("interrupted: run the same command again to continue")
            return 130
    results = {}
    for v, seed, args_list, run_dir, _ in jobs:
        r = load_result(run_dir)
        if r and r["args"] == args_list:   # not a result of other sizes or overrides
            results.setdefault(v.name, {})[seed] = r
    rows = summarize(grid, results)
    command = shlex.join(["python", "reproduce.py", *(sys.argv[1:] if argv is None else argv)])
    n_done = sum(len(r) for r in results.values())
    header = [f"# Reproduction: grid `{a.grid}`", "", f"Command: `{command}`", "",
              f"Runs: {n_done} of {len(jobs)} complete, {len(failed)} failed in this invocation. "
              f"Wall time of this invocation: {(time.time() - t_start) / 60:.1f} min; summed over all runs: "
              f"{sum(r['wall_s'] for res in results.values() for r in res.values()) / 60:.1f} min.",
              f"Each run: `python train.py <config> {shlex.join(sizing(a.max_iters))} <variant's overrides> {shlex.join(extra)} --seed=S --out_dir=...`"]
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "summary.json"), {"command": command, "runs": len(jobs), "complete": n_done, "rows": rows})
    write_summary(out, rows, header)
    if results:
        plot(out, grid, results)
    print(f"wrote {out}/summary.md, summary.json and plots" + (f"; {len(failed)} runs failed: run again to retry" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
