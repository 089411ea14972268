"""
Reproduce the paper's claims: a grid of variants x seeds of train.py, each compared to its
baseline seed by seed (a seed fixes the initialization and the batch order, identically across
variants), with a summary and plots in study/results/<grid>/.

CPU grids (Tiny Shakespeare, several single-process runs at a time), from the repository's root:

    python -m study.reproduce                 # the default grid, 3 seeds, 2 runs at a time
    python -m study.reproduce --dry_run       # list the runs and the time estimate
    python -m study.reproduce --summary_only  # the summary and plots of what is there, no run
    python -m study.reproduce --variants=noscale,unified --seeds=5   # a subset, with baselines
    python -m study.reproduce --add='wide:config/unified_char.py:--n_embd=192,--n_head=6'
    python -m study.reproduce --grid=lr --seeds=1   # learning-rate sweep of baseline, noscale,
                                    # unified (+ Muon); its summary names the command that adds
                                    # seeds at the best rates
    python -m study.reproduce --grid=scaling  # 4 sizes x 4 budgets: compute efficiency, scaling

Node grids (FineWeb-Edu, 124M/350M, one run at a time through torchrun on the GPUs of one node):

    python -m study.reproduce --grid=node --nproc_per_node=8 --seeds=1 --dry_run   # runs, estimate
    python -m study.reproduce --grid=node --nproc_per_node=8 --tokens=2.5e9 --seeds=1

Stop it at any time (SIGKILL too) and start it again: finished runs (result.json) are skipped,
interrupted ones resume from their newest checkpoint (train.py --init_from=resume), failed ones
are reported with their last log line and run again next time (a result.json that does not read
is no result). Every file in a run folder is accounted for at the moment the grid acts on it. A
run folder is the grid's when the run.json it wrote there before starting train.py names the
settings every checkpoint there was trained with (each checkpoint's own config), or it holds no
checkpoint: the grid owns its files (checkpoints, latest, metrics.jsonl, train.log, result.json),
resumes its run if those are the grid's settings, else (--replace) starts it afresh over them. A
checkpoint or metrics.jsonl that no run.json accounts for (none readable, a checkpoint trained
with other settings than it names, or one that does not load) is neither resumed nor deleted,
--replace or not: the grid is refused in one sentence naming its folder and why (a dry run too).
A run's folder is read again when its turn comes: a finished run copied in meanwhile is done, and
a file that came and that the grid cannot account for fails that run, left as it is.
Every record (run.json, result.json, the summaries) is written to a temporary name, fsynced, then
renamed. A folder holds one configuration: a run whose settings differ from the results already
there is refused unless --replace (or another --results_dir); adding seeds or variants to it is
not a change.
The summary always covers the whole grid, from every result of that configuration in the folder.

One reproduce.py at a time per results folder (<results>/lock). SIGTERM or SIGINT reaches every
train.py it started: they save a checkpoint and exit, and the next invocation resumes them. A grid
runs whatever the tree holds; each result.json records the code that ran it (its commit and a hash
of uncommitted Python edits; a resumed run's, the code that finished it).

Results are read by their row's name: a row (of a grid or --add) named after a variant of
config/variants.py must run what its name says (name_says), or the grid is refused.

The grids are grids.py, the statistics and reports report.py, the figures plots.py.
"""
import argparse
import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor, as_completed

from study.grids import (GRIDS, MAX_ITERS, MODIFIERS, MS_PER_ITER, OVERHEAD_S, SIZES,
                         is_node_grid, parse_added, sizing)
from study.plots import plot_grid, plot_report
from study.report import REPORTS, arg_value, ci95, code_lines, meta_gpt, summarize, write_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository


# ---- sizing of runs -----------------------------------------------------------------------------
def run_args(v, max_iters, extra, seed, run_dir, tokens=None, node=False):
    """train.py's arguments for one run (without --init_from): the schedule, the variant's
    overrides, the grid's extra overrides, seed and out_dir. A CPU grid's variant may bring its
    own --max_iters (and so its schedule); a node run is sized by `tokens` (None: its config's
    own budget)."""
    if node:
        schedule = node_sizing(v.config, tuple(v.overrides + extra), tokens)[0]
        return [*schedule, *v.overrides, *extra, f"--seed={seed}", f"--out_dir={run_dir}"]
    iters = int(arg_value(v.overrides, "max_iters", max_iters))
    rest = [o for o in v.overrides if not o.startswith("--max_iters=")]
    return [*sizing(iters), *rest, *extra, f"--seed={seed}", f"--out_dir={run_dir}"]


def train_config(config, overrides=()):
    """config.defaults.train_config (cached there); a bad value: its ConfigError, one sentence."""
    from config.defaults import train_config as resolve
    return resolve(config, tuple(overrides))


@functools.lru_cache(maxsize=None)
def node_sizing(config, overrides=(), tokens=None):
    """(schedule arguments, tokens) of a node run of `tokens` tokens: max_iters from the config's
    tokens per iteration (gradient_accumulation_steps x batch_size x block_size, over all GPUs);
    warmup and decay scale with it, as fractions of the config's own schedule (700 of 19,073
    iterations for 10B tokens at 124M), so a shorter run is the same recipe, compressed; an
    evaluation (and checkpoint) at least every tenth of the run."""
    cfg = train_config(config, overrides)
    per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    iters = max(1, math.ceil(tokens / per_iter)) if tokens else cfg["max_iters"]
    scale = iters / cfg["max_iters"]
    decay = max(1, round((cfg["lr_decay_iters"] or cfg["max_iters"]) * scale))
    return ([f"--max_iters={iters}", f"--lr_decay_iters={decay}",
             f"--warmup_iters={round(cfg['warmup_iters'] * scale)}",
             f"--eval_interval={max(1, min(cfg['eval_interval'], iters // 10))}",
             "--keep_checkpoints=2"], iters * per_iter)


# Without a measured --tokens_per_s, a node's throughput is assumed: this fraction of the bf16
# dense peak of its GPUs (telemetry.peak_flops' table; H100 when this machine has none). nanoGPT's
# 124M reaches about 40% on A100s with torch.compile; measure yours with `python -m tools.gpu_check`
# (or bench.py) and pass it instead.
ASSUMED_MFU = 0.40


@functools.lru_cache(maxsize=None)
def flops_per_token(config, overrides=(), vocab_size=50257):
    from dataclasses import fields
    from model import GPTConfig
    cfg = train_config(config, overrides)
    model_keys = {f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"}
    return meta_gpt(**model_keys, vocab_size=vocab_size).flops_per_token()


def local_estimate(v, iters, extra):
    """Seconds for one CPU run: MS_PER_ITER scaled by the run's FLOPs per token against the
    default size (a floor of a quarter: at the smallest sizes Python's overhead, not arithmetic,
    sets the pace)."""
    # CPU grids train on Tiny Shakespeare's 65 characters
    char = functools.partial(flops_per_token, vocab_size=65)
    try:
        scale = char(v.config, tuple(v.overrides + extra)) / char("config/baseline_char.py")
    except (ValueError, TypeError):   # a model the config cannot build: its run will say why
        scale = 1.0
    return OVERHEAD_S + iters * MS_PER_ITER / 1000 * max(0.25, scale)


def train_tokens(dataset):
    """The training tokens of a prepared dataset (data/NAME under the working directory, as for
    train.py): the size of the train.bin that train.py reads, not meta.json's count (stale or
    edited, it would admit or skip anything); None when there is none."""
    from dataset import dataset_dir
    try:
        return os.path.getsize(dataset_dir(dataset) / "train.bin") // 2 or None
    except OSError:
        return None


def run_epochs(v, args, extra):
    """How many times a CPU run reads its training set (None when it is not prepared)."""
    cfg = train_config(v.config, tuple(args))
    n = train_tokens(cfg["dataset"])
    n = min(n, cfg["train_tokens"] or n) if n else n   # --train_tokens reads a part of it
    iters = int(arg_value(args, "max_iters"))
    per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    return iters * per_iter / n if n else None


def over_cap(jobs, cap, dataset):
    """(the jobs within `cap` epochs, one line naming each variant skipped); SystemExit when the
    training set is not there to count."""
    if any(j.epochs is None for j in jobs):
        from dataset import dataset_dir, load_meta
        load_meta(dataset_dir(dataset))   # not prepared: its one sentence says how to prepare it
        raise SystemExit(f"error: the epoch cap (--max_epochs={cap:g}) needs the size of the "
                         f"training set, and data/{dataset}/train.bin cannot be read: prepare "
                         "it again")
    skipped = {j.v.name: j.epochs for j in jobs if j.epochs > cap}
    note = (f"skipped, over --max_epochs={cap:g}: " + ", ".join(
        f"{name} ({e:.1f} epochs)" for name, e in skipped.items())) if skipped else ""
    return [j for j in jobs if j.epochs <= cap], note


def node_estimate(todo, tokens_per_s, gpus, extra):
    """(seconds, how) for the node runs in todo: from the given tokens/s, or from ASSUMED_MFU."""
    if tokens_per_s:
        return sum(n for _, n in todo) / tokens_per_s, f"at the given {tokens_per_s:,.0f} tokens/s"
    import torch
    from telemetry import GPU_PEAK_FLOPS, peak_flops
    if torch.cuda.is_available():
        peak, gpu = peak_flops(torch.device("cuda")), torch.cuda.get_device_name()
        if peak is None:   # a GPU not in telemetry.GPU_PEAK_FLOPS
            peak, gpu = GPU_PEAK_FLOPS["H100"], f"{gpu} (H100's peak assumed: not in the table)"
    else:
        peak, gpu = GPU_PEAK_FLOPS["H100"], "H100 (assumed: no GPU on this machine)"
    flops = sum(n * flops_per_token(v.config, tuple(v.overrides + extra)) for v, n in todo)
    return flops / (ASSUMED_MFU * peak * gpus), (
        f"assuming {ASSUMED_MFU:.0%} MFU on {gpus} x {gpu} at {peak / 1e12:.0f} TFLOP/s bf16 "
        "each; "
        "measure with `python -m tools.gpu_check` and pass --tokens_per_s for a better one")


# ---- the files of a results folder: read with checks, written atomically ------------------------
def load_json(path):
    """The dict in a JSON file; None when there is none, or it does not parse (a write cut
    short), or it holds something else."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


# what a result.json must hold to count (reproduce.py writes it; a hand-edited one may not)
RESULT_FIELDS = {"variant": str, "seed": int, "args": list, "val_loss": float, "curve": list,
                 "wall_s": float, "sv_means": dict}


def load_result(run_dir):
    """A run's result.json, or None: a torn, empty or edited one counts as no result (its run is
    run again)."""
    r = load_json(os.path.join(run_dir, "result.json"))
    ok = r is not None and all(isinstance(r.get(k), (int, float) if t is float else t)
                               for k, t in RESULT_FIELDS.items())
    return r if ok and math.isfinite(r["val_loss"]) else None


def write_json(path, obj):
    """A record a later run trusts (run.json, result.json, summary.json): written to a temporary
    name, fsynced, renamed (checkpoint.atomic_write)."""
    from checkpoint import atomic_write
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def checkpoints(run_dir):
    """A run folder's checkpoints and its `latest` pointer: names matched literally (a folder
    named res[1] is never a pattern that reaches res1)."""
    from checkpoint import step_of   # here: a dry run or a summary need not import torch
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(run_dir, n) for n in sorted(names)
            if step_of(n) is not None or n == "latest"]


def evals(run_dir, kind="eval"):
    """The records of one kind of a run's metrics.jsonl (a torn line skipped), in order."""
    from telemetry import read_metrics
    path = os.path.join(run_dir, "metrics.jsonl")
    records = read_metrics(path)[0] if os.path.exists(path) else []
    return [r for r in records if isinstance(r, dict) and r.get("kind") == kind]


def settings(args):
    """A run's arguments but its --out_dir, which only says where its folder is: a results folder
    moved or copied holds the same runs."""
    return None if args is None else [a for a in args if not a.startswith("--out_dir=")]


# train.py's keys that say how a run was started and where its folder is, not what it trains
HOW_STARTED = ("out_dir", "init_from", "overwrite")


def run_record(v, run_dir):
    """What run_dir holds of a run not done: None when it holds neither a checkpoint nor a
    metrics.jsonl (nothing to resume, nothing lost by starting afresh). Its run.json ({"args",
    "wall_s", "code"}, and "resume": whether a checkpoint is there) when that accounts for them:
    the grid wrote it before it started train.py there, and every checkpoint's own config
    (train.py's arguments as it read them) is what it names; so the run's files are the grid's
    (settings other than the grid's are a conflict: refuse_other_settings). Any other folder (no
    readable run.json, or a checkpoint of other settings than it names or that does not load:
    train.py run there by hand) is {"args": None, "why": words}: neither resumed nor deleted."""
    from checkpoint import step_of
    ckpt = any(step_of(p) is not None for p in checkpoints(run_dir))
    if not ckpt and not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return None
    state = load_json(os.path.join(run_dir, "run.json"))
    if state is None or not isinstance(state.get("args"), list) or not all(
            isinstance(a, str) for a in state["args"]):
        return {"args": None, "why": "no readable run.json"}
    why = checkpoint_mismatch(v, state["args"], run_dir) if ckpt else None
    return {**state, "resume": ckpt} if why is None else {"args": None, "why": why}


def checkpoint_mismatch(v, args, run_dir):
    """None if every checkpoint of run_dir loads and was trained with the config that its run.json's
    arguments `args` give train.py (HOW_STARTED aside; a key added since counts as its default);
    else the first that does not, and why (words)."""
    import checkpoint
    from config.defaults import DEFAULTS, train_config as resolve
    from configurator import ConfigError
    try:   # a run.json edited by hand may name what train.py refuses
        wanted = resolve(v.config, tuple(args))
    except ConfigError as e:
        return f"its run.json names settings train.py refuses ({str(e)[7:]})"   # "error: ..."
    for path in checkpoint.checkpoints(run_dir):
        try:
            saved = checkpoint.load(path)["config"]
        except checkpoint.CheckpointError:
            return f"{os.path.basename(path)} does not load"
        differ = [f"{k}={saved.get(k, DEFAULTS.get(k))!r} where its run.json says {x!r}"
                  for k, x in wanted.items()
                  if k not in HOW_STARTED and saved.get(k, DEFAULTS.get(k)) != x]
        if differ:
            return f"{os.path.basename(path)} was trained with {' and '.join(differ)}"
    return None


def resumable(job):
    """True if job's folder holds a checkpoint of an interrupted run with its settings."""
    return bool(job.record and job.record.get("resume")
                and settings(job.record["args"]) == settings(job.args))


def in_use(run_dir):
    """The pid of a train.py that holds run_dir's lock (checkpoint.lock), or None."""
    try:
        f = open(os.path.join(run_dir, "lock"))
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "unknown"
    return None


def lock_results(out):
    """Hold <out>/lock for the life of this invocation (checkpoint.hold_lock, train.py's too): a
    second reproduce.py on the folder is one sentence (it would call this one's runs FAILED and
    garble their logs)."""
    from checkpoint import hold_lock
    return hold_lock(os.path.join(out, "lock"), f"results folder {out}")


# ---- the code a run ran -------------------------------------------------------------------------
CODE = ("*.py",)   # what a run's numbers depend on: git pathspecs


def code_version():
    """{"commit", "diff", "id"} of the code in this checkout (its .py files, CODE):
    HEAD's commit; a hash of its uncommitted code edits (`git diff HEAD` and untracked code files;
    None when there are none); and "id", a hash of the code files as they are, so two checkouts
    of the same code share it (two commits that differ only in results or prose, an edit and its
    commit). None outside git."""
    def git(*args):
        p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=60)
        if p.returncode:
            raise OSError(p.stderr.decode(errors="replace"))
        return p.stdout

    def hash_files(names):
        h = hashlib.sha256()
        for name in sorted(n for n in names.split(b"\0") if n):
            path = os.path.join(ROOT, name.decode())
            if os.path.isfile(path):   # a deleted file is in the diff, not here
                with open(path, "rb") as f:
                    h.update(name + b"\0" + f.read())
        return h

    try:
        commit = git("rev-parse", "HEAD").decode().strip()
        edits = hashlib.sha256(git("diff", "HEAD", "--binary", "--", *CODE))
        untracked = git("ls-files", "-z", "--others", "--exclude-standard", "--", *CODE)
        edits.update(hash_files(untracked).digest())
        clean = hashlib.sha256(hashlib.sha256(b"").digest()).hexdigest()
        files = hash_files(git("ls-files", "-z", "--cached", "--others", "--exclude-standard",
                               "--", *CODE))
    except (OSError, subprocess.SubprocessError):
        return None
    diff = edits.hexdigest()[:16] if edits.hexdigest() != clean else None
    return {"commit": commit, "diff": diff, "id": files.hexdigest()[:12]}


# ---- running the grid's runs --------------------------------------------------------------------
class Interrupted(Exception):
    """A run stopped by a signal to reproduce.py (or never started): it resumes next time."""


NOT_STARTED = "not started"


class Children:
    """The train.py processes of this invocation. A SIGTERM or SIGINT to reproduce.py reaches each
    of them once (they run in sessions of their own, so a terminal's Ctrl-C is not delivered
    twice): they save and exit, and no new run starts. Nothing is left running when it ends."""

    def __init__(self):
        self.lock, self.procs, self.stop = threading.RLock(), set(), None

    def forward(self, sig, frame=None):
        with self.lock:
            self.stop = self.stop or sig
            procs = list(self.procs)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)

    @contextlib.contextmanager
    def forwarding(self):
        sigs = (signal.SIGTERM, signal.SIGINT)
        try:
            old = {s: signal.signal(s, self.forward) for s in sigs}
        except ValueError:   # not the main thread (an embedding): no handlers to install
            old = {}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def run(self, cmd, **kw):
        """cmd's return code; Interrupted if a stop came first."""
        with self.lock:
            if self.stop:
                raise Interrupted(NOT_STARTED)
            p = subprocess.Popen(cmd, start_new_session=True, **kw)
            self.procs.add(p)
            if self.stop:   # the signal came between the check and the start (one thread: RLock)
                p.send_signal(self.stop)
        try:
            return p.wait()
        finally:
            with self.lock:
                self.procs.discard(p)


# record: run_record's (what the folder holds of a run), for a job not done
Job = namedtuple("Job", "v seed args run_dir done epochs record", defaults=(None, None))


class Runner:
    """Runs one (variant, seed) at a time (called from several threads on a CPU grid)."""

    def __init__(self, env, children, torchrun=None, recheck=lambda job: job):
        self.env, self.children, self.torchrun, self.recheck = env, children, torchrun, recheck

    def __call__(self, job, checked=False):
        """Train job, resuming its interrupted run if there is one, as its folder is when its turn
        comes (recheck; checked: done just before); its result dict, None if it is done by then.
        Raises RuntimeError (failed: run again next time) or Interrupted (stopped: resumes next
        time)."""
        job = job if checked else self.recheck(job)
        if job.done:
            return None
        resume, t0 = resumable(job), time.time()
        state = self.start(job, resume)
        cmd = [*self.launch(), os.path.join(ROOT, "train.py"), os.path.join(ROOT, job.v.config),
               *job.args, *(["--init_from=resume"] if resume else [])]
        log_path = os.path.join(job.run_dir, "train.log")
        with open(log_path, "a" if resume else "w") as log:
            if resume:
                log.write(f"\n---- reproduce.py: resuming: {shlex.join(cmd)}\n")
                log.flush()
            rc = self.children.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        state["wall_s"] += time.time() - t0
        write_json(os.path.join(job.run_dir, "run.json"), state)
        return self.result(job, rc, state["wall_s"], resume, state["code"], log_path)

    def launch(self):
        if self.torchrun is None:
            return [sys.executable]
        return [sys.executable, "-m", "torch.distributed.run", *self.torchrun]

    def start(self, job, resume):
        """The run's record, written to its run.json before it starts: its wall time so far and
        the code in the tree now. A run started afresh first loses the files of the run before it
        (train.py refuses to start over a checkpoint or a metrics.jsonl; a result.json no longer
        says what the folder holds): they are the grid's, since a folder no record accounts for
        at this run's turn never gets here (recheck)."""
        os.makedirs(job.run_dir, exist_ok=True)
        if not resume:
            logs = [os.path.join(job.run_dir, n) for n in ("metrics.jsonl", "result.json")]
            for f in checkpoints(job.run_dir) + logs:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f)
        state = {"args": job.args, "wall_s": job.record.get("wall_s", 0) if resume else 0,
                 "code": code_version()}
        write_json(os.path.join(job.run_dir, "run.json"), state)
        return state

    def result(self, job, rc, wall, resume, code, log_path):
        records = evals(job.run_dir)
        max_iters = int(arg_value(job.args, "max_iters"))
        if not records or records[-1]["iter"] != max_iters or rc != 0:
            at = f"stopped at iteration {records[-1]['iter']}" if records else "no evaluation"
            if self.children.stop:
                raise Interrupted(f"{at}, by a signal to reproduce.py")
            with open(log_path, errors="replace") as f:
                last = (f.read().strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"exit {rc}, {at}: {last}")
        last = records[-1]
        vectors = last.get("scale_vectors", {})
        means = {n: [r["scale_vectors"][n][0] for r in records if n in r.get("scale_vectors", {})]
                 for n in vectors}
        final = next((r for r in evals(job.run_dir, "final") if r.get("iter") == max_iters),
                     {})   # the whole val split, at the run's end
        return {"variant": job.v.name, "seed": job.seed, "config": job.v.config, "args": job.args,
                "val_loss": last["val_loss"], "train_loss": last["train_loss"],
                "val_loss_full": final.get("val_loss"), "train_loss_full": final.get("train_loss"),
                "preconditioning": [[r["iter"], r["maps"]] for r in evals(job.run_dir, "precond")],
                "curve": [[r["iter"], r["val_loss"]] for r in records], "wall_s": wall,
                "scale_vectors": vectors, "sv_means": means, "code": code,
                **({"epochs": job.epochs} if job.epochs is not None else {}),
                **({"resumed": True} if resume else {})}


def recheck(g, replace, job):
    """job as its folder is right before the grid acts on it (resumes it, or deletes its files to
    start afresh), not as it was at the grid's start: a run copied in since is done, and a file the
    grid cannot account for now, or a run of other settings (without --replace), refuses it."""
    pid = in_use(job.run_dir)
    if pid:
        raise RuntimeError(f"not started: a train.py (pid {pid}) still runs in {job.run_dir}; "
                           "stop it first")
    job = g.job(job.v, job.seed)
    try:
        if not replace:
            refuse_other_settings(g.out, [job])
        refuse_unaccounted(g.out, [job])
    except SystemExit as e:
        raise RuntimeError(f"not started: {str(e.code).removeprefix('error: ')}") from None
    return job


def collect(out, grid, args_for):
    """{variant: {seed: result}}: every seed of every variant in the folder whose result has these
    settings (not a result of other sizes or overrides); names matched literally."""
    results = {}
    for v in grid:
        vdir = os.path.join(out, "runs", v.name)
        for name in sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []:
            m = re.fullmatch(r"seed(\d+)", name)
            r = load_result(os.path.join(vdir, name)) if m else None
            if r and settings(r["args"]) == settings(args_for(v, int(m.group(1)))):
                results.setdefault(v.name, {})[int(m.group(1))] = r
    return results


def finish(d, res, keep):
    write_json(os.path.join(d, "result.json"), res)
    if not keep:   # a CPU run's checkpoint is ~10 MB; result.json and metrics.jsonl hold the rest
        for f in checkpoints(d):
            os.remove(f)


# ---- the command line, step by step -------------------------------------------------------------
def parse_args(argv, grids):
    p = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])   # a paragraph
    p.add_argument("--grid", default="default", choices=sorted(grids))
    p.add_argument("--variants", default="",
                   help="comma-separated subset of the grid (their baselines are added)")
    p.add_argument("--add", action="append", default=[],
                   metavar="NAME:CONFIG[:OVERRIDES[:BASELINE[:SIGN[:CLAIM]]]]",
                   help="a new variant, e.g. 'wide:config/unified_char.py:--n_embd=192,"
                        "--n_head=6' (paired with the grid's baseline unless BASELINE is given, "
                        "or none; SIGN -1/+1: the claim is a lower/higher loss); repeatable")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--extra", default="",
                   help='more train.py overrides for every run, e.g. "--dataset=tiny --n_layer=2"')
    p.add_argument("--results_dir", default="",
                   help="default: study/results/<grid>, or study/results/<grid>_<dataset> with "
                        "--dataset")
    p.add_argument("--dataset", default="",
                   help="train every run on data/NAME (prepare_data.py), not its config's")
    p.add_argument("--max_epochs", type=float,
                   help="skip the runs that would repeat the training set more often (default: "
                        "the grid's own cap: 1 for regime, none for the others)")
    p.add_argument("--replace", action="store_true",
                   help="run over results of other settings in the folder")
    p.add_argument("--keep_checkpoints", action="store_true",
                   help="keep each finished run's checkpoints (always on a node grid)")
    p.add_argument("--dry_run", action="store_true",
                   help="list the runs and the time estimate, run nothing")
    p.add_argument("--summary_only", action="store_true",
                   help="run nothing: write the summary and plots from the results in the folder "
                        "(e.g. copied from a cluster)")
    cpu = p.add_argument_group("CPU grids: several single-process runs at a time")
    cpu.add_argument("--jobs", type=int, default=2,
                     help="runs at a time; each gets cpu_count // jobs threads")
    cpu.add_argument("--max_iters", type=int, default=MAX_ITERS)
    node = p.add_argument_group("node grids: one run at a time through torchrun, on all GPUs")
    node.add_argument("--tokens", type=float,
                      help="tokens per run (default: the configs' own, 10B)")
    node.add_argument("--tokens_per_s", type=float,
                      help="the node's measured training tokens/s, for --dry_run's estimate")
    node.add_argument("--nproc_per_node", type=int, default=1,
                      help="GPUs per node: processes per run")
    a = p.parse_args(argv)
    for key in ("seeds", "jobs", "max_iters", "nproc_per_node"):
        if getattr(a, key) < 1:
            p.error(f"--{key} must be at least 1, not {getattr(a, key)}")
    if a.tokens is not None and not 0 < a.tokens < float("inf"):
        p.error(f"--tokens must be a positive number of tokens, not {a.tokens:g}")
    if a.max_epochs is not None and not 0 < a.max_epochs < float("inf"):
        p.error(f"--max_epochs must be a positive number of epochs, not {a.max_epochs:g}")
    a.argv = sys.argv[1:] if argv is None else argv
    return a, p


def choose_variants(a, p, grids):
    """(the whole grid with --add's variants, the subset to run: --variants, their baselines)."""
    rows = grids[a.grid]() if callable(grids[a.grid]) else grids[a.grid]
    full = [check_named(v) for v in rows]
    for spec in a.add:
        full.append(check_named(parse_added(spec, full), spec))
    if not a.variants:
        return full, full
    want, names = set(a.variants.split(",")), [v.name for v in full]
    if want - set(names):
        p.error(f"unknown variants {sorted(want - set(names))}; the grid has {names}")
    want |= {v.baseline for v in full if v.name in want and v.baseline}
    want |= {s.split(":")[0] for s in a.add}
    return full, [v for v in full if v.name in want]


def name_says(name):
    """What a row's name says of its config (train.py's keys; "moe_" is n_experts > 0, checked by
    check_named), or None if it is not a variant of config/variants.py followed by words
    of these: a rate (lr<r>; muon_lr after muon), a decay (wd<d>; sv<d>: the vectors'), a size of
    SIZES, steps (s<n>: max_iters), MODIFIERS; a budget (x<b>), tokens per parameter (t<n>) and
    350m say nothing."""
    from config.variants import named_flags, variant_of
    head = variant_of(name)
    want = named_flags(head) if head else None
    for w in filter(None, name.removeprefix("moe_")[len(head or ""):].split("_")):
        key = {"lr": "muon_lr" if "_muon" in name else "learning_rate", "wd": "weight_decay",
               "sv": "sv_decay"}.get(w[:2])
        if w in MODIFIERS or w in SIZES:
            want |= MODIFIERS.get(w) or dict(zip(("n_layer", "n_embd"), SIZES[w][:2]))
        elif key and re.fullmatch(r"[\d.e-]+", w[2:]):
            want[key] = float(w[2:])
        elif re.fullmatch(r"s\d+", w):
            want["max_iters"] = int(w[1:])
        elif not re.fullmatch(r"x[\d.]+|t\d+|350m", w):
            return None
    return want


def check_named(v, spec=None):
    """A row whose name says what it runs (name_says: a variant of config/variants.py, its
    MoE twin moe_NAME, and further words) must run that, since results are read by their row's
    name; returns the row."""
    want, cfg = name_says(v.name), train_config(v.config, tuple(v.overrides))
    bad = [f"{k}={cfg[k]!r}, not {x!r}" for k, x in (want or {}).items() if cfg[k] != x] + (
        [f"n_experts={cfg['n_experts']}"] if want is not None and (
            cfg["n_experts"] > 0) != v.name.startswith("moe_") else [])
    if bad:
        raise SystemExit(f"error: {f'--add={spec}' if spec else f'grid row {v.name}'}: its "
                         f"name says otherwise of what {' '.join([v.config, *v.overrides])} runs: "
                         f"{'; '.join(bad)} (study/reproduce.py, name_says): give the row another "
                         "name or the flags its name says")
    return v


class Grid:
    """One invocation's settings: where its runs go and with which arguments."""

    def __init__(self, a, grids):
        # node grids: torchrun on all GPUs of this node, one run at a time, sized by --tokens
        self.node = is_node_grid(grids, a.grid)
        self.torchrun = ([f"--nproc_per_node={a.nproc_per_node}", "--standalone"] if self.node
                         else None)
        named = f"{a.grid}_{a.dataset}" if a.dataset else a.grid
        self.out = a.results_dir or os.path.join("study", "results", named)
        self.extra = shlex.split(a.extra) + ([f"--dataset={a.dataset}"] if a.dataset else [])
        self.tokens = int(a.tokens) if a.tokens else None
        self.max_iters = a.max_iters

    def run_dir(self, v, seed):
        return os.path.join(self.out, "runs", v.name, f"seed{seed}")

    def args_for(self, v, seed):
        return run_args(v, self.max_iters, self.extra, seed, self.run_dir(v, seed), self.tokens,
                        self.node)

    def jobs(self, variants, seeds):
        """Seed by seed (an interrupted grid still has whole seeds)."""
        return [self.job(v, seed) for seed in range(1, seeds + 1) for v in variants]

    def job(self, v, seed):
        """A run as its folder is now: whether it is done, and what its folder holds of an
        interrupted run if not."""
        args, run_dir = self.args_for(v, seed), self.run_dir(v, seed)
        done = settings((load_result(run_dir) or {}).get("args")) == settings(args)
        epochs = None if self.node else run_epochs(v, args, self.extra)
        record = None if done else run_record(v, run_dir)
        return Job(v, seed, args, run_dir, done, epochs, record)


def conflicts(jobs):
    """Runs that would start over a run of other settings (finished, or with a checkpoint or a
    log that run_record accounts for): [(run_dir, old args, new args)]."""
    out = []
    for job in jobs:
        old = (load_result(job.run_dir) or {}).get("args")
        if old is None and job.record:
            old = job.record["args"]
        if not job.done and old is not None and settings(old) != settings(job.args):
            out.append((job.run_dir, old, job.args))
    return out


def refuse_file(out):
    """A results folder that is a file (or in one) is one sentence before anything runs, not a
    traceback when its lock is taken."""
    path = out
    while path and not os.path.exists(path):   # the part of it that exists
        path = os.path.dirname(path)
    if path and not os.path.isdir(path):
        where = "a file" if path == out else f"in the file {path}"
        raise SystemExit(f"error: the results folder {out} is {where}: move it away or pass "
                         "another --results_dir")


def refuse_other_settings(out, jobs):
    clash = conflicts(jobs)
    if clash:
        run_dir, old, new = clash[0]
        old, new = settings(old), settings(new)   # where each folder is: no setting
        was, now = [x for x in old if x not in new], [x for x in new if x not in old]
        raise SystemExit(f"error: {out} already holds {len(clash)} of these runs with other "
                         f"settings (e.g. {run_dir} has {shlex.join(was) or 'fewer arguments'} "
                         f"where this has {shlex.join(now) or 'none'}): write to another folder "
                         "with --results_dir=DIR, or pass --replace to run them again over the "
                         "old ones")


def refuse_unaccounted(out, jobs):
    """A run folder with checkpoints or a metrics.jsonl that no record accounts for (run_record)
    is neither resumed nor deleted, even with --replace: one sentence naming each and why."""
    lost = [f"{j.run_dir}: {j.record['why']}" for j in jobs if j.record and not j.record["args"]]
    if lost:
        raise SystemExit(f"error: run folders of {out} hold checkpoints or logs this grid cannot "
                         f"account for ({'; '.join(lost)}): they are neither resumed nor "
                         "deleted; move them elsewhere (or delete them yourself), or use another "
                         "--results_dir")


def plan(a, g, jobs, todo):
    """The grid's first line: runs done and to do, and how long those to do should take."""
    line = (f"grid {a.grid}: {len({j.v.name for j in jobs})} variants x {a.seeds} seeds = "
            f"{len(jobs)} runs, {len(jobs) - len(todo)} done, {len(todo)} to do")
    if not todo:
        return line
    if g.node:
        sized = [(j.v, node_sizing(j.v.config, tuple(j.v.overrides + g.extra), g.tokens)[1])
                 for j in todo]
        secs, how = node_estimate(sized, a.tokens_per_s, a.nproc_per_node, g.extra)
        return (f"{line}; {sum(n for _, n in sized) / 1e9:.2f}B tokens to train, one run at a "
                f"time on {a.nproc_per_node} GPUs; estimate {secs / 3600:.1f} h ({how})")
    iters = [int(arg_value(j.args, "max_iters")) for j in todo]
    at_once = max(1, min(a.jobs, os.cpu_count() or 1))
    secs = sum(local_estimate(j.v, n, g.extra) for j, n in zip(todo, iters)) / at_once
    span = f"{min(iters)}-{max(iters)}" if min(iters) < max(iters) else str(iters[0])
    return f"{line}; {span} iterations each; estimate {secs / 60:.0f} min with {a.jobs} jobs"


def print_jobs(g, jobs):
    launch = ["python"] if g.torchrun is None else ["torchrun", *g.torchrun]
    for job in jobs:
        state = "done  " if job.done else "resume" if resumable(job) else "to do "
        print(f"{state} " + shlex.join([*launch, "train.py", job.v.config, *job.args]))


class Progress:
    """One line per finished run: its loss, or why it failed or stopped; failed and stopped runs
    counted."""

    def __init__(self, todo, keep):
        self.n, self.keep, self.t_start, self.k = len(todo), keep, time.time(), 0
        self.failed, self.stopped = [], []

    def __call__(self, job, res=None, err=None):
        self.k += 1
        head = f"[{self.k}/{self.n}] {job.v.name} seed {job.seed}"
        if isinstance(err, Interrupted):
            self.stopped.append(job)
            if str(err) != NOT_STARTED:   # after a stop signal, the runs still queued say nothing
                print(f"{head}: interrupted ({err}); it resumes next time", flush=True)
        elif err:
            self.failed.append(job)
            print(f"{head}: FAILED ({err}); log: {job.run_dir}/train.log", flush=True)
        elif res is None:
            print(f"{head}: done by its turn (a result of these settings came): left as it is",
                  flush=True)
        else:
            finish(job.run_dir, res, self.keep)
            eta = (time.time() - self.t_start) / self.k * (self.n - self.k)
            resumed = ", resumed" if res.get("resumed") else ""
            print(f"{head}: val {res['val_loss']:.4f} ({res['wall_s']:.0f} s{resumed}), "
                  f"ETA {eta / 60:.1f} min", flush=True)


def run_all(a, g, todo, runner, progress):
    """Every run of todo: one at a time on all GPUs (node), or a.jobs single-process runs at a
    time (CPU)."""
    if g.node:
        for job in todo:
            try:
                job = runner.recheck(job)   # the line says what runs
                if not runner.children.stop and not job.done:
                    how = "resuming" if resumable(job) else "starting"
                    print(f"[{progress.k + 1}/{progress.n}] {job.v.name} seed {job.seed}: {how}, "
                          f"log: {job.run_dir}/train.log", flush=True)
                progress(job, res=runner(job, checked=True))
            except (RuntimeError, Interrupted) as e:
                progress(job, err=e)
        return
    with ThreadPoolExecutor(a.jobs) as pool:
        futs = {pool.submit(runner, job): job for job in todo}
        for fut in as_completed(futs):
            try:
                progress(futs[fut], res=fut.result())
            except (RuntimeError, Interrupted) as e:
                progress(futs[fut], err=e)


def write_reports(a, g, full):
    """summary.md, summary.json and the figures, from every result of the grid in the folder (the
    whole grid, not only this invocation's runs): made of those results alone, so that the same
    results give the same summary whenever it is made."""
    results = collect(g.out, full, g.args_for)
    rows = summarize(full, results)
    command = shlex.join(["python", "-m", "study.reproduce", *a.argv])
    n_done = sum(len(r) for r in results.values())
    launch = "python train.py" if g.torchrun is None else shlex.join(["torchrun", *g.torchrun,
                                                                      "train.py"])
    schedule = "<schedule for --tokens>" if g.node else shlex.join(sizing(a.max_iters))
    own = sorted({int(arg_value(v.overrides, "max_iters")) for v in full
                  if arg_value(v.overrides, "max_iters") is not None})
    if own and not g.node:   # the scaling grid sizes each row itself: say so, not one length
        schedule = (f"<schedule of --max_iters={a.max_iters}, or of the variant's own "
                    f"--max_iters: {own[0]} to {own[-1]} in this grid>")
    wall = sum(r["wall_s"] for res in results.values() for r in res.values())
    header = [f"# Reproduction: grid `{a.grid}`", "", f"Last command: `{command}`", "",
              f"Runs: {n_done} complete in {g.out} with these settings (all seeds found); "
              f"their wall time, summed: {wall / 60:.1f} min.",
              f"Each run: `{launch} <config> {schedule} <variant's overrides> "
              f"{shlex.join(g.extra)} --seed=S --out_dir=...`", "", *code_lines(results)]
    os.makedirs(g.out, exist_ok=True)
    lines, report = REPORTS[a.grid](results) if a.grid in REPORTS and results else ([], None)
    summary = {"command": command, "runs": n_done, "complete": n_done, "rows": rows,
               **({"report": report} if report else {})}
    write_json(os.path.join(g.out, "summary.json"), summary)
    write_summary(g.out, rows, header, lines)
    if results:
        plot_grid(g.out, full, results, ci=ci95)
        if report:
            plot_report(g.out, a.grid, report)


def main(argv=None, grids=GRIDS):
    a, parser = parse_args(argv, grids)
    full, grid = choose_variants(a, parser, grids)
    g = Grid(a, grids)
    refuse_file(g.out)
    jobs = g.jobs(grid, a.seeds)
    cap = a.max_epochs if a.max_epochs is not None else getattr(grids[a.grid], "max_epochs", None)
    if cap is not None and not g.node:
        jobs, note = over_cap(jobs, cap, a.dataset or "shakespeare_char")
        print(note or f"every run within --max_epochs={cap:g}")
    if not a.replace:
        refuse_other_settings(g.out, jobs)
    todo = [] if a.summary_only else [j for j in jobs if not j.done]
    if todo:
        refuse_unaccounted(g.out, jobs)
    print(plan(a, g, jobs, [j for j in jobs if not j.done]))
    if a.dry_run:
        print_jobs(g, jobs)
        return 0

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not g.node:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // a.jobs)))
    keep = a.keep_checkpoints or g.node   # a node run's model is worth keeping
    progress = Progress(todo, keep)
    lock = lock_results(g.out)
    try:
        with Children().forwarding() as children:
            runner = Runner(env, children, g.torchrun, functools.partial(recheck, g, a.replace))
            run_all(a, g, todo, runner, progress)
        if children.stop:
            print(f"interrupted: {len(progress.stopped)} runs stopped; run the same command again "
                  "to resume them")
            return 128 + children.stop
        write_reports(a, g, full)
    finally:
        lock.close()
    failed, stopped = len(progress.failed), len(progress.stopped)
    print(f"wrote {g.out}/summary.md, summary.json and plots"
          + (f"; {failed} runs failed: run again to retry" if failed else "")
          + (f"; {stopped} not started: run again" if stopped else ""))
    return 1 if failed or stopped else 0


if __name__ == "__main__":
    sys.exit(main())
