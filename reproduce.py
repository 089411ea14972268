"""
Reproduce the paper's claims: a grid of variants x seeds of train.py, each compared to its
baseline seed by seed (a seed fixes the initialization and the batch order, identically across
variants), with a summary and plots in results/<grid>/.

CPU grids (Tiny Shakespeare, several single-process runs at a time):

    python reproduce.py                          # the default grid, 3 seeds, 2 runs at a time
    python reproduce.py --dry_run                # list the runs and the time estimate
    python reproduce.py --summary_only           # the summary and plots of what is there, no run
    python reproduce.py --variants=noscale,unified --seeds=5   # a subset (their baselines come along)
    python reproduce.py --add='wide:config/unified_char.py:--n_embd=192,--n_head=6'   # try an idea
    python reproduce.py --grid=lr --seeds=1      # learning-rate sweep of baseline, noscale, unified (+ Muon);
                                                 # its summary names the command that adds seeds at the best rates
    python reproduce.py --grid=scaling           # 4 sizes x 4 budgets: compute efficiency and scaling

Node grids (FineWeb-Edu, 124M/350M, one run at a time through torchrun on all GPUs):

    python reproduce.py --grid=node --nproc_per_node=8 --seeds=1 --dry_run   # runs and time estimate
    python reproduce.py --grid=node --nproc_per_node=8 --tokens=2.5e9 --seeds=1

Stop it at any time and start it again: finished runs (result.json) are skipped, interrupted ones
resume from their newest checkpoint (train.py --init_from=resume), failed ones are reported with
their last log line and run again next time. A folder holds one configuration: a run whose
settings differ from the results already there is refused unless --replace (or another --results_dir);
adding seeds or variants to it is not a change. The summary always covers the whole grid, from
every result of that configuration in the folder.
"""
import argparse
import functools
import glob
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

from plot_metrics import read_metrics

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
NOVEC = "DNP's vector, not only its Norm, lowers the loss: freezing g_out at 1 raises it (3.2)"
NOIWD = "IWD helps unified: without decay on its Input-Norm vectors the loss is higher (2.2, 4)"


def default_grid(size="char"):
    """The 17 variants of the CPU grid; size="124m" gives the same variants at the paper's 0.12B."""
    c = lambda name: f"config/{name}_{size}.py"
    v = [Variant("baseline", c("baseline"), [], None, "", 0),
         Variant("noscale", c("noscale"), [], "baseline",
                 "removing scale vectors raises the loss (+0.028 at the same lr, 0.12B; Fig. 1)", +1),
         Variant("gemma_none", c("gemma_none"), [], None, "", 0),
         Variant("gemma_iwd", c("gemma_iwd"), [], "gemma_none",
                 "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)", -1),
         Variant("gemma_all", c("gemma_all"), [], "gemma_iwd",
                 "decaying Output-Norm vectors too is worse than IWD (Gemma-0.5B; 2.2)", +1)]
    for name, claim in [("hetero", "HG: branch-specific vectors lower the loss (3.1)"),
                        ("dp", "DP: the loss descends at least as fast (3.2, Thm 3.1)"),
                        ("dnp", "DNP: dual placement with a norm lowers the loss (3.2)"),
                        ("or", "OR: magnitude-direction reparameterization lowers the loss (3.3)"),
                        ("er", "ER: exponential reparameterization lowers the loss (3.3)"),
                        ("unified", UNIFIED)]:
        v.append(Variant(name, c(name), [], "baseline", claim, -1))
    for tag, flag in [("muon", "--optimizer=muon"), ("wsd", "--lr_schedule=wsd")]:
        v += [Variant(f"baseline_{tag}", c("baseline"), [flag], None, "", 0),
              Variant(f"unified_{tag}", c("unified"), [flag], f"baseline_{tag}", MUON_WSD, -1)]
    # Muon and WSD together, the paper's 0.5B setting, each family at its best Muon rate of the lr grid
    tuned = {"baseline": ["--muon_lr=4e-3"], "unified": ["--muon_lr=1e-3"]} if size == "char" else {}
    muon_wsd = ["--optimizer=muon", "--lr_schedule=wsd"]
    v += [Variant("baseline_muon_wsd", c("baseline"), muon_wsd + tuned.get("baseline", []), None, "", 0),
          Variant("unified_muon_wsd", c("unified"), muon_wsd + tuned.get("unified", []),
                  "baseline_muon_wsd", MUON_WSD, -1)]
    # the controls: DNP's Norm without its vector (what the vector adds), unified without IWD
    v += [Variant("dnp_novec", c("dnp"), ["--sv_placement=dnp_novec"], "dnp", NOVEC, +1),
          Variant("unified_novec", c("unified"), ["--sv_placement=dnp_novec"], "unified", NOVEC, +1),
          Variant("unified_noiwd", c("unified"), ["--sv_weight_decay=none"], "unified", NOIWD, +1)]
    if all(os.path.exists(os.path.join(ROOT, c(f"moe_{k}"))) for k in ("baseline", "unified")):
        v += [Variant("moe_baseline", c("moe_baseline"), [], None, "", 0),
              Variant("moe_unified", c("moe_unified"), [], "moe_baseline", UNIFIED, -1)]
    return v


def core(grid):
    return [v for v in grid if v.name in ("baseline", "noscale", "unified")]


def node_grid(fn):
    """Marks a grid as a node grid: its runs go through torchrun, one at a time on all GPUs, sized by --tokens."""
    fn.node = True
    return fn


SCALE = "the gain of unified holds, or grows, with scale (0.12B to 2B; 4)"


@node_grid
def node_350m():
    """Both sizes, so a node can check that unified's gain holds at GPT-2 medium's size too."""
    return [Variant("baseline", "config/baseline_124m.py", [], None, "", 0),
            Variant("unified", "config/unified_124m.py", [], "baseline", UNIFIED, -1),
            Variant("baseline_350m", "config/baseline_350m.py", [], None, "", 0),
            Variant("unified_350m", "config/unified_350m.py", [], "baseline_350m", SCALE, -1)]


LRS = ("5e-4", "1e-3", "2e-3", "4e-3", "8e-3")   # factors of 2 around the recipe's 1e-3


def lr_grid():
    """The paper compares against well-tuned baselines: every family at each learning rate, paired with the baseline at the same rate."""
    v = []
    for lr in LRS:
        adamw = [f"--learning_rate={lr}", f"--min_lr={float(lr) / 10:g}"]   # the schedule ends at lr / 10
        muon = ["--optimizer=muon", f"--muon_lr={lr}"]                     # AdamW's part keeps 1e-3 -> 1e-4
        v += [Variant(f"baseline_lr{lr}", "config/baseline_char.py", adamw, None, "", 0),
              Variant(f"noscale_lr{lr}", "config/noscale_char.py", adamw, f"baseline_lr{lr}",
                      "removing scale vectors raises the loss (+0.028 same lr, +0.015 retuned, 0.12B)", +1),
              Variant(f"unified_lr{lr}", "config/unified_char.py", adamw, f"baseline_lr{lr}", UNIFIED, -1),
              Variant(f"baseline_muon_lr{lr}", "config/baseline_char.py", muon, None, "", 0),
              Variant(f"unified_muon_lr{lr}", "config/unified_char.py", muon, f"baseline_muon_lr{lr}", MUON_WSD, -1)]
    return v


# Compute efficiency and scaling: model sizes (layers x width, head size 32) at a fixed number of tokens per parameter: the
# 4x128 recipe's 1000 iterations x 768 tokens over its 0.80M non-embedding parameters (0.955 tokens per
# parameter, 0.77 epochs). The baseline also trains at 0.5x-2x of that budget, each with a complete
# schedule, so the budget it needs to match unified's loss can be read off a fit.
SIZES = {"2x64": (2, 64, 133), "3x96": (3, 96, 413), "4x128": (4, 128, 1000), "5x160": (5, 160, 1976)}
BUDGETS = ("0.5", "1", "1.5", "2")


def scaling_grid():
    v = []
    for size, (n_layer, n_embd, iters) in SIZES.items():
        shape = [f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_embd // 32}"]
        for b in BUDGETS:
            v.append(Variant(f"baseline_{size}_x{b}", "config/baseline_char.py",
                             [f"--max_iters={round(iters * float(b))}", *shape], None, "", 0))
        v.append(Variant(f"unified_{size}", "config/unified_char.py", [f"--max_iters={iters}", *shape],
                         f"baseline_{size}_x1", UNIFIED, -1))
        if size == "4x128":   # DNP alone, and both with a head-sized g_out, at the recipe's size
            for name, claim in [("dnp", "DNP: dual placement with a norm lowers the loss (3.2)"),
                                ("dnp_head", "DNP with a head-sized g_out (sv_dnp_width='head')"),
                                ("unified_head", "unified with a head-sized g_out (sv_dnp_width='head')")]:
                v.append(Variant(f"{name}_{size}", f"config/{name}_char.py", [f"--max_iters={iters}", *shape],
                                 f"baseline_{size}_x1", claim, -1))
    return v


# IWD where decay can act: at weight_decay 0.1 a decayed vector shrinks by ~5% in 1000 steps; at 1.0 by
# ~40% (exp(-sum of lr * wd)). The 0.1 rows are the default grid's (gemma_*, unified, unified_noiwd).
WDS = ("0.3", "1.0")


def wd_grid():
    v = []
    for wd in WDS:
        f = [f"--weight_decay={wd}"]
        v += [Variant(f"gemma_none_wd{wd}", "config/gemma_none_char.py", f, None, "", 0),
              Variant(f"gemma_iwd_wd{wd}", "config/gemma_iwd_char.py", f, f"gemma_none_wd{wd}",
                      "IWD beats no decay on scale vectors (Gemma-0.5B, QK-norm + post-norm; 2.2)", -1),
              Variant(f"gemma_all_wd{wd}", "config/gemma_all_char.py", f, f"gemma_iwd_wd{wd}",
                      "decaying Output-Norm vectors too is worse than IWD (Gemma-0.5B; 2.2)", +1),
              Variant(f"unified_wd{wd}", "config/unified_char.py", f, None, "", 0),
              Variant(f"unified_noiwd_wd{wd}", "config/unified_char.py", f + ["--sv_weight_decay=none"],
                      f"unified_wd{wd}", NOIWD, +1)]
    return v


GRIDS = {"default": default_grid, "core": lambda: core(default_grid()),
         # the paper's 0.12B table on one node: baseline, noscale, unified; node_full: every variant
         "node": node_grid(lambda: core(default_grid("124m"))), "node_full": node_grid(lambda: default_grid("124m")),
         "node_350m": node_350m, "lr": lr_grid, "scaling": scaling_grid, "wd": wd_grid}


def is_node_grid(grids, name):
    return getattr(grids[name], "node", False)


def parse_added(spec, grid):
    """--add=NAME:CONFIG[:OVERRIDES[:BASELINE]]: a variant from the command line. OVERRIDES are train.py's
    --key=value, separated by commas or spaces; BASELINE defaults to the grid's `baseline` ("none": unpaired)."""
    name, config, overrides, baseline = (spec.split(":", 3) + ["", "", ""])[:4]
    names = {v.name for v in grid}
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in names:
        raise SystemExit(f"error: --add={spec}: NAME must be new to the grid and made of letters, digits, _ . - "
                         f"(the grid has {sorted(names)})")
    if not os.path.isfile(os.path.join(ROOT, config)):
        raise SystemExit(f"error: --add={spec}: config file {config!r} not found (give a path relative to the repo, "
                         "e.g. config/unified_char.py)")
    baseline = None if baseline == "none" else baseline or ("baseline" if "baseline" in names else None)
    if baseline and baseline not in names:
        raise SystemExit(f"error: --add={spec}: baseline {baseline!r} is not in the grid; name one of {sorted(names)} or none")
    overrides = [o for o in re.split(r"[,\s]+", overrides) if o]
    if any(not o.startswith("--") or "=" not in o for o in overrides):
        raise SystemExit(f"error: --add={spec}: overrides must be train.py's --key=value, separated by commas")
    return Variant(name, config, overrides, baseline, "(added on the command line)", 0)


# ---- sizing of runs ----------------------------------------------------------------------------------
def run_args(v, max_iters, extra, seed, run_dir, tokens=None, node=False):
    """train.py's arguments for one run (without --init_from): the schedule, the variant's overrides, the
    grid's extra overrides, seed and out_dir. A CPU grid's variant may bring its own --max_iters (and so its
    schedule); a node run is sized by `tokens` (None: its config's own budget)."""
    if node:
        return [*node_sizing(v.config, tuple(v.overrides + extra), tokens)[0], *v.overrides, *extra,
                f"--seed={seed}", f"--out_dir={run_dir}"]
    own = [o for o in v.overrides if o.startswith("--max_iters=")]
    iters = int(own[-1].split("=")[1]) if own else max_iters
    rest = [o for o in v.overrides if not o.startswith("--max_iters=")]
    return [*sizing(iters), *rest, *extra, f"--seed={seed}", f"--out_dir={run_dir}"]


@functools.lru_cache(maxsize=None)
def train_config(config, overrides=()):
    """train.py's config for a config file and overrides, as train.py would see it (without running it)."""
    from bench import train_config_defaults
    from configurator import ConfigError, configure
    try:
        return configure(train_config_defaults(), [os.path.join(ROOT, config), *overrides])
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None


@functools.lru_cache(maxsize=None)
def node_sizing(config, overrides=(), tokens=None):
    """(schedule arguments, tokens) of a node run of `tokens` tokens: max_iters from the config's tokens per
    iteration (gradient_accumulation_steps x batch_size x block_size, over all GPUs); warmup and decay scale
    with it, as fractions of the config's own schedule (700 of 19,073 iterations for 10B tokens at 124M), so a
    shorter run is the same recipe, compressed; an evaluation (and checkpoint) at least every tenth of the run."""
    cfg = train_config(config, overrides)
    per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    iters = max(1, math.ceil(tokens / per_iter)) if tokens else cfg["max_iters"]
    scale = iters / cfg["max_iters"]
    return ([f"--max_iters={iters}", f"--lr_decay_iters={max(1, round((cfg['lr_decay_iters'] or cfg['max_iters']) * scale))}",
             f"--warmup_iters={round(cfg['warmup_iters'] * scale)}",
             f"--eval_interval={max(1, min(cfg['eval_interval'], iters // 10))}", "--keep_checkpoints=2"], iters * per_iter)


# Without a measured --tokens_per_s, a node's throughput is assumed: this fraction of the bf16 dense peak of
# its GPUs (model.peak_flops' table; H100 when this machine has none). nanoGPT's 124M reaches about 40% on
# A100s with torch.compile; measure yours with `python gpu_check.py` (or bench.py) and pass it instead.
ASSUMED_MFU = 0.40


def meta_gpt(**fields):
    """A GPT of GPTConfig(**fields) on the meta device: sizes only, no memory and no initialization."""
    import torch
    from model import GPT, GPTConfig   # here: a dry run or a summary of results need not import torch
    with torch.device("meta"):
        return GPT(GPTConfig(**fields))


@functools.lru_cache(maxsize=None)
def flops_per_token(config, overrides=(), vocab_size=50257):
    from dataclasses import fields
    from model import GPTConfig
    cfg = train_config(config, overrides)
    model = meta_gpt(**{f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"}, vocab_size=vocab_size)
    return model.flops_per_token()


def local_estimate(v, iters, extra):
    """Seconds for one CPU run: MS_PER_ITER scaled by the run's FLOPs per token against the default size (a
    floor of a quarter: at the smallest sizes Python's overhead, not arithmetic, sets the pace)."""
    char = functools.partial(flops_per_token, vocab_size=65)   # CPU grids train on Tiny Shakespeare's 65 characters
    try:
        scale = char(v.config, tuple(v.overrides + extra)) / char("config/baseline_char.py")
    except (ValueError, TypeError):   # a model the config cannot build: its run will say why
        scale = 1.0
    return OVERHEAD_S + iters * MS_PER_ITER / 1000 * max(0.25, scale)


def node_estimate(todo, tokens_per_s, gpus, extra):
    """(seconds, how) for the node runs in todo: from the given tokens/s, or from ASSUMED_MFU."""
    if tokens_per_s:
        return sum(n for _, n in todo) / tokens_per_s, f"at the given {tokens_per_s:,.0f} tokens/s"
    import torch
    from model import GPU_PEAK_FLOPS, peak_flops
    if torch.cuda.is_available():
        peak, gpu = peak_flops(torch.device("cuda")), torch.cuda.get_device_name()
        if peak is None:   # a GPU not in model.GPU_PEAK_FLOPS
            peak, gpu = GPU_PEAK_FLOPS["H100"], f"{gpu} (H100's peak assumed: not in model.GPU_PEAK_FLOPS)"
    else:
        peak, gpu = GPU_PEAK_FLOPS["H100"], "H100 (assumed: no GPU on this machine)"
    secs = sum(n * flops_per_token(v.config, tuple(v.overrides + extra)) / (ASSUMED_MFU * peak * gpus) for v, n in todo)
    return secs, (f"assuming {ASSUMED_MFU:.0%} MFU on {gpus} x {gpu} at {peak / 1e12:.0f} TFLOP/s bf16 each; "
                  "measure with `python gpu_check.py` and pass --tokens_per_s for a better one")


# ---- runs -------------------------------------------------------------------------------------------
def load_json(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)


def load_result(run_dir):
    return load_json(os.path.join(run_dir, "result.json"))


def write_json(path, obj):
    tmp = f"{path}.tmp{socket.gethostname()}.{os.getpid()}"   # nodes sharing a folder never share a temp file
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def checkpoints(run_dir):
    """A run folder's checkpoints (checkpoint.checkpoints, by iteration) and its `latest` pointer."""
    import checkpoint   # here: a dry run or a summary need not import torch
    return checkpoint.checkpoints(run_dir) + glob.glob(os.path.join(run_dir, "latest"))


def resumable(run_dir, args_list):
    """True if run_dir holds a checkpoint of an interrupted run with exactly these arguments."""
    return (load_json(os.path.join(run_dir, "run.json")) or {}).get("args") == args_list and \
        os.path.exists(os.path.join(run_dir, "latest"))


def run_one(v, seed, args_list, out_dir, env, torchrun=None):
    """Train one (variant, seed), resuming its interrupted run if there is one; return its result dict (None
    when the run finished on another node, whose rank 0 holds the metrics), or raise RuntimeError with the reason.
    torchrun: None runs one process; else torchrun's own arguments (--nproc_per_node=8 ...)."""
    os.makedirs(out_dir, exist_ok=True)
    state_path, log_path = os.path.join(out_dir, "run.json"), os.path.join(out_dir, "train.log")
    resume = resumable(out_dir, args_list)
    wall_before = (load_json(state_path) or {}).get("wall_s", 0) if resume else 0
    if not resume:   # checkpoints of other settings must not be resumed later
        for f in checkpoints(out_dir):
            os.remove(f)
        write_json(state_path, {"args": args_list, "wall_s": 0})
    launch = [sys.executable] if torchrun is None else [sys.executable, "-m", "torch.distributed.run", *torchrun]
    cmd = [*launch, os.path.join(ROOT, "train.py"), os.path.join(ROOT, v.config), *args_list,
           *(["--init_from=resume"] if resume else [])]
    t0 = time.time()
    with open(log_path, "a" if resume else "w") as log:
        if resume:
            log.write(f"\n---- reproduce.py: resuming: {shlex.join(cmd)}\n")
            log.flush()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = wall_before + time.time() - t0
    write_json(state_path, {"args": args_list, "wall_s": wall})
    evals = read_metrics(out_dir)
    max_iters = int(re.findall(r"--max_iters=(\d+)", " ".join(args_list))[-1])
    if rc == 0 and not evals and torchrun and any(a.startswith("--node_rank=") and a != "--node_rank=0" for a in torchrun):
        return None
    if rc != 0 or not evals or evals[-1]["iter"] != max_iters:
        with open(log_path) as f:
            last = (f.read().strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"exit {rc}, {'stopped at iteration ' + str(evals[-1]['iter']) if evals else 'no evaluation'}: {last}")
    names = list(evals[-1].get("scale_vectors", {}))
    return {"variant": v.name, "seed": seed, "config": v.config, "args": args_list, "val_loss": evals[-1]["val_loss"],
            "train_loss": evals[-1]["train_loss"], "curve": [[r["iter"], r["val_loss"]] for r in evals], "wall_s": wall,
            "scale_vectors": evals[-1].get("scale_vectors", {}),
            "sv_means": {n: [r["scale_vectors"][n][0] for r in evals if n in r.get("scale_vectors", {})] for n in names},
            "code": code_version(), **({"resumed": True} if resume else {})}


@functools.lru_cache(maxsize=None)
def code_version():
    """The commit the runs' code comes from ("-dirty" with local edits), so that a result says what made it;
    None outside a git checkout."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def collect(out, grid, args_for, seeds=None):
    """{variant: {seed: result}}: every seed of every variant in the folder whose result has these settings."""
    results = {}
    for v in grid:
        for d in glob.glob(os.path.join(out, "runs", glob.escape(v.name), "seed*")):
            m = re.fullmatch(r"seed(\d+)", os.path.basename(d))
            r = load_result(d) if m and (seeds is None or int(m.group(1)) in seeds) else None
            if r and r["args"] == args_for(v, int(m.group(1))):   # not a result of other sizes or overrides
                results.setdefault(v.name, {})[int(m.group(1))] = r
    return results


def finish(d, res, keep):
    write_json(os.path.join(d, "result.json"), res)
    if not keep:   # a CPU run's checkpoint is ~10 MB; result.json and metrics.jsonl hold what is reported
        for f in checkpoints(d):
            os.remove(f)


# ---- summary and plots ------------------------------------------------------------------------------
def mean_std(xs):
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()) if len(xs) else None, float(xs.std(ddof=1)) if len(xs) > 1 else None


# Student's t, 97.5% quantile, for 1..10 degrees of freedom (then ~1.96): 95% intervals of paired differences
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def paired_diffs(res, base):
    """(seeds both have, variant minus baseline val loss seed by seed) for two {seed: result} dicts."""
    seeds = sorted(set(res) & set(base))
    return seeds, [res[s]["val_loss"] - base[s]["val_loss"] for s in seeds]


def ci95(diffs):
    """95% t-interval [lo, hi] of the mean of paired differences; None under 2 of them."""
    mean, std = mean_std(diffs)
    if std is None:
        return None
    half = T975[min(len(diffs) - 1, len(T975)) - 1] * std / np.sqrt(len(diffs))
    return [float(mean - half), float(mean + half)]


def summarize(grid, results):
    rows = []
    for v in grid:
        res = results.get(v.name, {})
        mean, std = mean_std([r["val_loss"] for r in res.values()])
        row = {"variant": v.name, "baseline": v.baseline, "n": len(res), "val_loss_mean": mean, "val_loss_std": std,
               "claim": v.claim, "expected_sign": v.sign, "seeds": sorted(res)}
        if v.baseline:
            base = results.get(v.baseline, {})
            seeds, diffs = paired_diffs(res, base)
            d_mean, d_std = mean_std(diffs)
            row.update(paired_seeds=seeds, diff_mean=d_mean, diff_std=d_std, ci95=ci95(diffs),
                       agree=int(sum(np.sign(d) == v.sign for d in diffs)) if v.sign else None,
                       within_noise=None if d_std is None else bool(abs(d_mean) <= 2 * d_std / np.sqrt(len(seeds))),
                       direction_matches=None if d_mean is None or not v.sign else bool(np.sign(d_mean) == v.sign))
        rows.append(row)
    return rows


def pm(m, s, fmt=".4f"):
    return "—" if m is None else f"{m:{fmt}}" + ("" if s is None else f" ± {s:.4f}")


def interval(ci):
    return "—" if ci is None else "[{:+.4f}, {:+.4f}]".format(*ci)


def write_summary(out, rows, header, more=()):
    word = {True: "yes", False: "no", None: "—"}
    lines = [*header, "", "| variant | vs | n | val loss (mean ± std) | paired diff (mean ± std) | 95% CI | agree "
             "| within noise | paper's claim | direction matches |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = ci = agree = noise = ""
        if r["baseline"]:
            diff = f"{pm(r['diff_mean'], r['diff_std'], '+.4f')} (n={len(r['paired_seeds'])})"
            ci = interval(r["ci95"])
            agree = "—" if r["agree"] is None else f"{r['agree']}/{len(r['paired_seeds'])}"
            noise = {True: "within noise", False: "beyond noise", None: "—"}[r["within_noise"]]
        lines.append(f"| {r['variant']} | {r['baseline'] or ''} | {r['n']} | {pm(r['val_loss_mean'], r['val_loss_std'])} "
                     f"| {diff} | {ci} | {agree} | {noise} | {r['claim']} | {word[r.get('direction_matches')]} |")
    lines += ["", "Paired diff: variant minus its baseline, seed by seed (a seed fixes the shared initialization and the "
              "batch order). Within noise: |mean| <= 2 std / sqrt(n), two standard errors. 95% CI: mean +- "
              "t(0.975, n-1) std / sqrt(n). Agree: seeds whose difference has the claimed sign.", *(["", *more] if more else [])]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ---- the claims as the paper measures them: tuned comparisons, compute efficiency, scaling ----------
def lr_sweep(results, seeds=(1,)):
    """{family: {lr: mean val loss over `seeds`}} from the lr grid's variant names <family>_lr<lr>."""
    sweep = {}
    for name, res in results.items():
        family, lr = name.rsplit("_lr", 1)
        if any(s in res for s in seeds):
            sweep.setdefault(family, {})[lr] = float(np.mean([res[s]["val_loss"] for s in seeds if s in res]))
    return sweep


def tuned_rows(grid, results):
    """Tuned against tuned: each family at the rate that was best in the sweep (seed 1), paired
    seed by seed with its baseline family at *that* family's best rate. bracketed: both neighbours of the best
    rate in LRS were measured (or it is at the end of LRS); otherwise the optimum may lie further out."""
    sweep, rows = lr_sweep(results), {}
    for family, by in sweep.items():
        best = min(by, key=by.get)
        i = LRS.index(best)
        rows[family] = {"family": family, "best_lr": best, "variant": f"{family}_lr{best}",
                        "bracketed": all(LRS[j] in by for j in (i - 1, i + 1) if 0 <= j < len(LRS))}
    by_name = {v.name: v for v in grid}
    for r in rows.values():
        v = by_name[r["variant"]]
        base = rows.get(v.baseline.rsplit("_lr", 1)[0]) if v.baseline else None
        if base:
            seeds, diffs = paired_diffs(results[r["variant"]], results[base["variant"]])
            r.update(baseline=base["variant"], seeds=seeds, claim=v.claim, ci95=ci95(diffs),
                     **dict(zip(("diff_mean", "diff_std"), mean_std(diffs))))
    return list(rows.values())


def fit_budget(budgets, losses):
    """L(C) = E + A C^-alpha, the paper's form of a loss-compute scaling law; least squares, alpha on a fine
    grid (E and A are linear given alpha). Returns (E, A, alpha)."""
    C, L = np.asarray(budgets, float), np.asarray(losses, float)
    fits = []
    for alpha in np.linspace(0.02, 4, 400):
        X = np.stack([np.ones_like(C), C ** -alpha], 1)
        coef = np.linalg.lstsq(X, L, rcond=None)[0]
        if coef[1] > 0:
            fits.append((((X @ coef - L) ** 2).sum(), coef[0], coef[1], alpha))
    return min(fits)[1:]


def budget_needed(fit, loss):
    """The budget at which the fitted baseline reaches `loss` (inf below its asymptote E)."""
    E, A, alpha = fit
    return float((A / (loss - E)) ** (1 / alpha)) if loss > E else float("inf")


def non_embedding_params(n_layer, n_embd):
    # the char recipe's other sizes (block 64, 65 characters)
    m = meta_gpt(block_size=64, vocab_size=65, vocab_pad=1, n_layer=n_layer, n_head=n_embd // 32, n_embd=n_embd)
    return m.num_params() - m.wte.weight.numel()


def scaling_rows(results, tokens_per_iter=768, train_tokens=1_003_854):
    """Per size: unified's (and DNP's) loss against the baseline at the same budget (paired by seed), and the
    compute-efficiency factor: the budget the baseline's fitted L(C) needs to reach the variant's loss,
    over the budget the variant used (1x). The paper: 1.22-1.25x at 0.12B-2B."""
    rows, fits = [], {}
    for size, (n_layer, n_embd, iters) in SIZES.items():
        base = {b: results.get(f"baseline_{size}_x{b}", {}) for b in BUDGETS}
        seeds = sorted(set.intersection(*(set(r) for r in base.values())))
        if not seeds:
            continue
        xs = [float(b) for b in BUDGETS]
        mean_curve = [float(np.mean([base[b][s]["val_loss"] for s in seeds])) for b in BUDGETS]
        fits[size] = {"budgets": xs, "iters": iters, "baseline": mean_curve, "fit": list(fit_budget(xs, mean_curve)), "variants": {}}
        for name in [v.name for v in scaling_grid() if v.name.endswith(f"_{size}") and v.baseline]:
            res, paired = results.get(name, {}), [s for s in seeds if s in results.get(name, {})]
            if not paired:
                continue
            per_seed = [budget_needed(fit_budget(xs, [base[b][s]["val_loss"] for b in BUDGETS]), res[s]["val_loss"]) for s in paired]
            loss = float(np.mean([res[s]["val_loss"] for s in paired]))   # against the baseline of the same seeds
            factor = budget_needed(fit_budget(xs, [np.mean([base[b][s]["val_loss"] for s in paired]) for b in BUDGETS]), loss)
            label = name[: -len(size) - 1]
            fits[size]["variants"][label] = loss
            gap = mean_std([res[s]["val_loss"] - base["1"][s]["val_loss"] for s in paired])
            rows.append({"size": size, "variant": label, "params": non_embedding_params(n_layer, n_embd),
                         "iters": iters, "epochs_1x": iters * tokens_per_iter / train_tokens,
                         "epochs_2x": 2 * iters * tokens_per_iter / train_tokens, "seeds": paired,
                         "gap_mean": gap[0], "gap_std": gap[1], "factor": factor,
                         "factor_seeds": per_seed, "extrapolated": not xs[0] <= factor <= xs[-1]})
    return rows, fits


def scaling_lines(rows):
    f = lambda x: "∞" if x == float("inf") else f"{x:.2f}"
    lines = ["## Compute efficiency and scaling", "",
             f"Each size trains at {', '.join(BUDGETS)} x its budget (a fixed {768_000 / 803_968:.3f} tokens per non-embedding "
             "parameter, a complete schedule each); the baseline's loss is fitted as L(C) = E + A C^-alpha over those "
             "budgets (means over the variant's seeds). Factor: the budget at which the fitted baseline reaches the variant's loss, "
             "over the 1x budget the variant used (the paper: 1.22-1.25x). Per-seed factors fit each seed's own curve.", "",
             "| size | variant | non-emb. params | iters at 1x | epochs at 1x / 2x | seeds | loss - baseline (same budget) "
             "| compute factor | per seed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['variant']} | {r['params'] / 1e6:.3f}M | {r['iters']} | {r['epochs_1x']:.2f} / "
                     f"{r['epochs_2x']:.2f} | {len(r['seeds'])} | {pm(r['gap_mean'], r['gap_std'], '+.4f')} | "
                     f"{f(r['factor'])}x{' (beyond the fitted range)' if r['extrapolated'] else ''} | "
                     f"{', '.join(f(x) for x in r['factor_seeds'])} |")
    return lines


def lr_report(results):
    sweep, rows = lr_sweep(results), tuned_rows(lr_grid(), results)
    lines = ["## Learning-rate sweep", "",
             "Validation loss, seed 1. AdamW families sweep `learning_rate` (the schedule ends at a tenth of it); Muon "
             "families sweep `muon_lr` (AdamW's part keeps 1e-3). **Bold**: the family's best rate. A best rate whose "
             "neighbours were not both measured is marked: the optimum may lie further out. — : not run (a family "
             "whose loss already rose at the rate before needs no larger one).", "",
             "| family | " + " | ".join(LRS) + " | best |", "|---" * (len(LRS) + 2) + "|"]
    for r in rows:
        by = sweep[r["family"]]
        cells = [("**%.4f**" if lr == r["best_lr"] else "%.4f") % by[lr] if lr in by else "—" for lr in LRS]
        lines.append(f"| {r['family']} | {' | '.join(cells)} | {r['best_lr']}{'' if r['bracketed'] else ' (not bracketed)'} |")
    lines += ["", "### Tuned against tuned", "", "Each family at its best rate against its baseline at the baseline's "
              "best rate, paired by seed.", "", "| variant | vs | seeds | paired diff (mean ± std) | 95% CI | paper's claim |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['baseline']} | {len(r['seeds'])} | {pm(r['diff_mean'], r['diff_std'], '+.4f')} "
              f"| {interval(r['ci95'])} | {r['claim']} |" for r in rows if r.get("baseline")]
    best, n = ",".join(r["variant"] for r in rows), max((len(r.get("seeds", [])) for r in rows), default=0)
    lines += ["", f"More seeds at the best rates: `python reproduce.py --grid=lr --seeds={max(3, n + 3)} --variants={best}`"]
    return lines, {"sweep": sweep, "tuned": rows}


# The extra parameters of HG and of each width of DNP's g_out (sv_dnp_width), as fractions of the baseline's
# (the paper: "at most 7.85e-5"), at GPT-2 small's shape and two larger ones; counted on the meta device
OVERHEAD_SHAPES = {"124M (12 x 768)": {}, "0.5B-like (24 x 1280)": dict(n_layer=24, n_head=20, n_embd=1280),
                   "1B-like (16 x 2048)": dict(n_layer=16, n_head=32, n_embd=2048)}
UNIFIED_FLAGS = dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or")
OVERHEAD_FLAGS = {"HG": dict(sv_hetero=True), "DNP, full": dict(sv_placement="dnp"),
                  "DNP, head": dict(sv_placement="dnp", sv_dnp_width="head"), "unified, full": UNIFIED_FLAGS,
                  "unified, head": dict(UNIFIED_FLAGS, sv_dnp_width="head")}


def param_overheads():
    """{shape: {"baseline": parameters, variant: (its parameters - the baseline's) / the baseline's}}."""
    table = {}
    for shape, dims in OVERHEAD_SHAPES.items():
        base = meta_gpt(**dims).num_params()
        table[shape] = {"baseline": base, **{k: (meta_gpt(**dims, **f).num_params() - base) / base
                                             for k, f in OVERHEAD_FLAGS.items()}}
    return table


def overhead_lines(table):
    return ["", "### Extra parameters: HG and the width of DNP's g_out", "",
            "Fractions of the baseline's parameters (the paper: \"at most 7.85e-5\"); `sv_dnp_width`: \"full\", the map's "
            "output width, or \"head\", one head-sized vector per q, k, v and a scalar per gate, up (DESIGN.md).", "",
            "| shape (layers x width) | baseline | " + " | ".join(OVERHEAD_FLAGS) + " |", "|---" * (len(OVERHEAD_FLAGS) + 2) + "|",
            *[f"| {shape} | {row['baseline'] / 1e6:.0f}M | " + " | ".join(f"{row[k]:.2e}" for k in OVERHEAD_FLAGS) + " |"
              for shape, row in table.items()]]


def scaling_report(results):
    rows, fits = scaling_rows(results)
    overheads = param_overheads()
    return scaling_lines(rows) + overhead_lines(overheads), {"rows": rows, "fits": fits, "overheads": overheads}


# grids with more to say than the paired table: (markdown lines, data for summary.json and the plots)
REPORTS = {"lr": lr_report, "scaling": scaling_report}


# ---- main -------------------------------------------------------------------------------------------
def torchrun_args(a):
    """torchrun's own arguments: one node (--standalone), static multi-node, or a rendezvous endpoint."""
    n = [f"--nproc_per_node={a.nproc_per_node}"]
    if a.rdzv_endpoint:
        return [*n, f"--nnodes={a.nnodes}", f"--rdzv_backend={a.rdzv_backend}", f"--rdzv_endpoint={a.rdzv_endpoint}",
                f"--rdzv_id={a.rdzv_id}"]
    if a.nnodes != "1":
        return [*n, f"--nnodes={a.nnodes}", f"--node_rank={a.node_rank}", f"--master_addr={a.master_addr}",
                f"--master_port={a.master_port}"]
    return [*n, "--standalone"]


def conflicts(jobs):
    """Runs that would overwrite a finished or resumable run of other settings: [(run_dir, old args, new args)]."""
    out = []
    for v, seed, args_list, run_dir, done in jobs:
        old = (load_result(run_dir) or {}).get("args")
        if old is None and checkpoints(run_dir):
            old = (load_json(os.path.join(run_dir, "run.json")) or {}).get("args")
        if not done and old is not None and old != args_list:
            out.append((run_dir, old, args_list))
    return out


def plan(a, jobs, todo, node, extra, tokens):
    """The grid's first line: runs done and to do, and how long those to do should take."""
    line = (f"grid {a.grid}: {len({j[0].name for j in jobs})} variants x {a.seeds} seeds = {len(jobs)} runs, "
            f"{len(jobs) - len(todo)} done, {len(todo)} to do")
    if not todo:
        return line
    if node:
        sized = [(j[0], node_sizing(j[0].config, tuple(j[0].overrides + extra), tokens)[1]) for j in todo]
        gpus = a.nproc_per_node * (int(a.nnodes) if a.nnodes.isdigit() else 1)
        secs, how = node_estimate(sized, a.tokens_per_s, gpus, extra)
        return (f"{line}; {sum(n for _, n in sized) / 1e9:.2f}B tokens to train, one run at a time on {gpus} GPUs; "
                f"estimate {secs / 3600:.1f} h ({how})")
    iters = [int(next(x for x in j[2] if x.startswith("--max_iters=")).split("=")[1]) for j in todo]
    secs = sum(local_estimate(j[0], n, extra) for j, n in zip(todo, iters)) / max(1, min(a.jobs, os.cpu_count() or 1))
    span = f"{min(iters)}-{max(iters)}" if min(iters) < max(iters) else str(iters[0])
    return f"{line}; {span} iterations each; estimate {secs / 60:.0f} min with {a.jobs} jobs"


def main(argv=None, grids=GRIDS):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--grid", default="default", choices=sorted(grids))
    p.add_argument("--variants", default="", help="comma-separated subset of the grid (their baselines are added)")
    p.add_argument("--add", action="append", default=[], metavar="NAME:CONFIG[:OVERRIDES[:BASELINE]]",
                   help="a new variant, e.g. 'wide:config/unified_char.py:--n_embd=192,--n_head=6' (paired with "
                        "the grid's baseline unless BASELINE is given, or none); repeatable")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--extra", default="", help='more train.py overrides for every run, e.g. "--dataset=tiny --n_layer=2"')
    p.add_argument("--results_dir", default="", help="default: results/<grid>")
    p.add_argument("--replace", action="store_true", help="run over results of other settings in the folder")
    p.add_argument("--keep_checkpoints", action="store_true", help="keep each finished run's checkpoints (always on a node grid)")
    p.add_argument("--dry_run", action="store_true", help="list the runs and the time estimate, run nothing")
    p.add_argument("--summary_only", action="store_true",
                   help="run nothing: write the summary and plots from the results in the folder (e.g. copied from a cluster)")
    cpu = p.add_argument_group("CPU grids: several single-process runs at a time")
    cpu.add_argument("--jobs", type=int, default=2, help="runs at a time; each gets cpu_count // jobs threads")
    cpu.add_argument("--max_iters", type=int, default=MAX_ITERS)
    node = p.add_argument_group("node grids: one run at a time through torchrun, on all GPUs")
    node.add_argument("--launcher", choices=["local", "torchrun"], help="default: torchrun for node grids, local otherwise")
    node.add_argument("--tokens", type=float, help="tokens per run (default: the configs' own, 10B)")
    node.add_argument("--tokens_per_s", type=float, help="the node's measured training tokens/s, for --dry_run's estimate")
    node.add_argument("--nproc_per_node", type=int, default=1, help="GPUs per node: processes per run")
    node.add_argument("--nnodes", default="1")
    node.add_argument("--node_rank", type=int, default=0)
    node.add_argument("--master_addr", default="127.0.0.1")
    node.add_argument("--master_port", type=int, default=29500)
    node.add_argument("--rdzv_backend", default="c10d")
    node.add_argument("--rdzv_endpoint", default="", help="host:port: a rendezvous instead of --master_addr")
    node.add_argument("--rdzv_id", default="reproduce")
    a = p.parse_args(argv)
    for key in ("seeds", "jobs", "max_iters", "nproc_per_node"):
        if getattr(a, key) < 1:
            p.error(f"--{key} must be at least 1, not {getattr(a, key)}")
    if a.tokens is not None and not 0 < a.tokens < float("inf"):
        p.error(f"--tokens must be a positive number of tokens, not {a.tokens:g}")
    full = grids[a.grid]() if callable(grids[a.grid]) else list(grids[a.grid])
    for spec in a.add:
        full.append(parse_added(spec, full))
    grid = full
    if a.variants:
        want = set(a.variants.split(","))
        if want - {v.name for v in full}:
            p.error(f"unknown variants {sorted(want - {v.name for v in full})}; the grid has {[v.name for v in full]}")
        want |= {v.baseline for v in full if v.name in want and v.baseline} | {s.split(":")[0] for s in a.add}
        grid = [v for v in full if v.name in want]
    # node grids (and --launcher=torchrun): torchrun on all GPUs, one run at a time, sized by --tokens
    node = (a.launcher or ("torchrun" if is_node_grid(grids, a.grid) else "local")) == "torchrun"
    torchrun = torchrun_args(a) if node else None
    out = a.results_dir or os.path.join("results", a.grid)
    extra = shlex.split(a.extra)
    tokens = int(a.tokens) if a.tokens else None

    def args_for(v, seed):
        return run_args(v, a.max_iters, extra, seed, os.path.join(out, "runs", v.name, f"seed{seed}"), tokens, node)

    jobs = []
    for seed in range(1, a.seeds + 1):   # seed by seed: an interrupted grid still has whole seeds
        for v in grid:
            run_dir = os.path.join(out, "runs", v.name, f"seed{seed}")
            args_list = args_for(v, seed)
            jobs.append((v, seed, args_list, run_dir, (load_result(run_dir) or {}).get("args") == args_list))
    clash = conflicts(jobs)
    if clash and not a.replace:
        run_dir, old, new = clash[0]
        was, now = [x for x in old if x not in new], [x for x in new if x not in old]
        raise SystemExit(f"error: {out} already holds {len(clash)} of these runs with other settings (e.g. {run_dir} "
                         f"has {shlex.join(was) or 'fewer arguments'} where this has {shlex.join(now) or 'none'}): write to another folder with --results_dir=DIR, or pass --replace to run "
                         "them again over the old ones")
    todo = [j for j in jobs if not j[4]]
    print(plan(a, jobs, todo, node, extra, tokens))
    if a.dry_run:
        for v, seed, args_list, run_dir, done in jobs:
            launch = ["python", "train.py"] if torchrun is None else ["torchrun", *torchrun, "train.py"]
            state = "done  " if done else "resume" if resumable(run_dir, args_list) else "to do "
            print(f"{state} " + shlex.join([*launch, v.config, *args_list]))
        return 0
    if a.summary_only:
        todo = []

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    keep = a.keep_checkpoints or torchrun is not None   # a node run's model is worth keeping
    t_start, failed = time.time(), []

    def report(k, v, s, d, res=None, err=None):
        eta = (time.time() - t_start) / k * (len(todo) - k)
        if err:
            failed.append((v.name, s))
            print(f"[{k}/{len(todo)}] {v.name} seed {s}: FAILED ({err}); log: {d}/train.log", flush=True)
        elif res is None:
            print(f"[{k}/{len(todo)}] {v.name} seed {s}: finished (its metrics are on the node of rank 0)", flush=True)
        else:
            finish(d, res, keep)
            print(f"[{k}/{len(todo)}] {v.name} seed {s}: val {res['val_loss']:.4f} ({res['wall_s']:.0f} s"
                  f"{', resumed' if res.get('resumed') else ''}), ETA {eta / 60:.1f} min", flush=True)

    if torchrun is not None:   # one run at a time, each on all the node's GPUs
        try:
            for k, (v, s, al, d, _) in enumerate(todo, 1):
                print(f"[{k}/{len(todo)}] {v.name} seed {s}: {'resuming' if resumable(d, al) else 'starting'}, "
                      f"log: {d}/train.log", flush=True)
                try:
                    report(k, v, s, d, res=run_one(v, s, al, d, env, torchrun))
                except RuntimeError as e:
                    report(k, v, s, d, err=e)
        except KeyboardInterrupt:   # torchrun passes the SIGINT on: train.py saves and exits
            print("interrupted: run the same command again to resume")
            return 130
    else:                      # several single-process runs at a time
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // a.jobs)))
        with ThreadPoolExecutor(a.jobs) as pool:
            futs = {pool.submit(run_one, v, s, al, d, env): (v, s, d) for v, s, al, d, _ in todo}
            try:
                for k, fut in enumerate(as_completed(futs), 1):
                    try:
                        report(k, *futs[fut], res=fut.result())
                    except RuntimeError as e:
                        report(k, *futs[fut], err=e)
            except KeyboardInterrupt:
                pool.shutdown(wait=True, cancel_futures=True)   # the runs get the same SIGINT, save and exit
                print("interrupted: run the same command again to resume")
                return 130

    results = collect(out, full, args_for)   # the whole grid, not only this invocation's runs
    rows = summarize(full, results)
    command = shlex.join(["python", "reproduce.py", *(sys.argv[1:] if argv is None else argv)])
    n_done = sum(len(r) for r in results.values())
    launch = "python train.py" if torchrun is None else shlex.join(["torchrun", *torchrun, "train.py"])
    schedule = "<schedule for --tokens>" if node else shlex.join(sizing(a.max_iters))
    header = [f"# Reproduction: grid `{a.grid}`", "", f"Last command: `{command}`", "",
              f"Runs: {n_done} complete in {out} with these settings (all seeds found), {len(failed)} failed in the "
              f"last invocation. Wall time of the last invocation: {(time.time() - t_start) / 60:.1f} min; summed over "
              f"all runs: {sum(r['wall_s'] for res in results.values() for r in res.values()) / 60:.1f} min.",
              f"Each run: `{launch} <config> {schedule} <variant's overrides> {shlex.join(extra)} --seed=S --out_dir=...`"]
    os.makedirs(out, exist_ok=True)
    lines, report = REPORTS[a.grid](results) if a.grid in REPORTS and results else ([], None)
    write_json(os.path.join(out, "summary.json"), {"command": command, "runs": n_done, "complete": n_done, "rows": rows,
                                                   **({"report": report} if report else {})})
    write_summary(out, rows, header, lines)
    if results:
        from plot_metrics import plot_grid, plot_report
        plot_grid(out, full, results)
        if report:
            plot_report(out, a.grid, report)
    print(f"wrote {out}/summary.md, summary.json and plots" + (f"; {len(failed)} runs failed: run again to retry" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
