"""
Pre-train the GPT of model.py on one process, or on many with DDP through torchrun.

    # a laptop CPU, a few minutes
    python train.py config/shakespeare_char.py
    # continue from the last checkpoint
    python train.py config/shakespeare_char.py --init_from=resume
    # start again in an out_dir that holds a run
    python train.py config/shakespeare_char.py --overwrite=True
    torchrun --standalone --nproc_per_node=8 train.py config/unified_124m.py

Every name in train_defaults.py is a config key: a config file sets some, then --key=value
overrides (configurator.py); `python train.py --help` lists them.
Config files are Python, executed by train.py: run only those you trust. The values each key
allows are one table, configurator.TRAIN_RULES, checked before anything is written.
"""
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
from configurator import TRAIN_RULES, ConfigError, check_device, configure
from model import GPT, GPTConfig, default_device, optimizer_step, peak_flops
from tokens import dataset_dir, load_meta, vocabulary
from train_defaults import DEFAULTS

# -----------------------------------------------------------------------------
# config keys: train_defaults.py holds each one with its default and what it means (out_dir,
# dataset, batch_size, the model's fields, learning_rate, max_iters, seed, ...); a config file
# sets some, then --key=value overrides; after the checks below, every key is a global here
try:   # every check that needs no data comes first: nothing is written to out_dir before all pass
    config = configure(DEFAULTS, sys.argv[1:], TRAIN_RULES)
    check_device(config["device"])
    checkpoint.check_out_dir(config["out_dir"], config["init_from"], config["overwrite"])
except (ConfigError, checkpoint.CheckpointError) as e:
    sys.exit(f"error: {e}")
globals().update(config)
lr_decay_iters = lr_decay_iters or max_iters
muon_lr = muon_lr or learning_rate

# ---- processes and device -----------------------------------------------------
ddp = "RANK" in os.environ   # set by torchrun
device = device or default_device()
if ddp:
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
else:
    rank, world_size = 0, 1
master = rank == 0
# one configuration for all: a config that reads RANK would hang the job (max_iters) or train
# silently wrong
if ddp:
    configs = [None] * world_size
    dist.all_gather_object(configs, config)
    differ = [k for k in config if any(c.get(k) != config[k] for c in configs)]
    if differ:   # every process finds it; the master says it
        by_rank = ", ".join(repr(c.get(differ[0])) for c in configs)
        sys.exit((f"error: the {world_size} processes run different configurations "
                  f"({', '.join(differ)}; {differ[0]}={by_rank} by rank): a config must not "
                  "depend on the process; give all the same one")
                 if master else 1)
if gradient_accumulation_steps % world_size:
    sys.exit(f"error: gradient_accumulation_steps={gradient_accumulation_steps} is not a multiple "
             f"of the {world_size} processes (it counts micro-steps over all of them): set it to a "
             "multiple of the process count")
accum = gradient_accumulation_steps // world_size   # micro-steps per process
device_type = torch.device(device).type
dtype = dtype or ("bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported()
                  else "float32")
autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if dtype == "bfloat16"
            else nullcontext())
# the weights (and the loss) in float64 for a reference run: its rounding stays far below what Adam
# could amplify into a visible step (tests/test_train.py's pinned run); else float32
weights_dtype = torch.float64 if dtype == "float64" else torch.float32
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
if master:
    print(f"{world_size} process(es) on {device} in {dtype}; {tokens_per_iter:,} tokens per "
          f"iteration ({accum} micro-steps x {world_size} processes x {batch_size} x {block_size})")

# ---- data: uint16 token files; batches depend only on (seed, step, micro-step) -------------
data_dir = str(dataset_dir(dataset))
meta = load_meta(data_dir)


# split -> (inode, size, mtime) of the file checked at start: read only while it stays that file
token_files = {}


def file_id(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def changed(path):
    sys.exit(f"error: {path} changed under the running trainer (cut short, replaced or "
             "removed): restore it as it was, then continue from the last checkpoint with "
             "--init_from=resume")


def token_path(split):
    return os.path.join(data_dir, f"{split}.bin")


def split_len(split):
    """The split's number of tokens, as check_split found it; a file changed since (truncated,
    prepared again) is one sentence."""
    if file_id(token_path(split)) != token_files[split]:
        changed(token_path(split))
    return token_files[split][1] // 2   # uint16 tokens: two bytes each


def check_split(split):
    """At start, for both splits (a val split too short for block_size would otherwise fail only at
    the first eval): the file exists, holds more than block_size + 1 tokens, and no id beyond the
    vocabulary."""
    path = token_path(split)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        sys.exit(f"error: {path} is {'empty' if os.path.isfile(path) else 'missing'}: prepare the "
                 "dataset again (python prepare_data.py ...)")
    if os.path.getsize(path) % 2:   # uint16 tokens: two bytes each
        sys.exit(f"error: {path} has an odd number of bytes ({os.path.getsize(path):,}): it is "
                 "cut short or not uint16 tokens; prepare the dataset again")
    token_files[split] = file_id(path)
    data = np.memmap(path, dtype=np.uint16, mode="r")   # read once here; batches use pread
    if len(data) <= block_size + 1:
        sys.exit(f"error: {path} has {len(data)} tokens, not more than block_size={block_size} "
                 "+ 1: lower --block_size or prepare more text")
    # every token of a split of up to 256M tokens (~0.5 s); of a larger one (FineWeb: 20 GB) 16
    # spread-out slices of 4M, and batch_at checks each batch as it is drawn
    n = 1 << 22
    starts = (range(0, len(data), n) if len(data) <= 1 << 28
              else np.linspace(0, len(data) - n, 16).astype(np.int64))
    check_ids(path, max(int(data[i : i + n].max()) for i in starts))


def check_ids(path, top):
    if top >= meta["vocab_size"]:
        sys.exit(f"error: {path} holds token id {top}, beyond vocab_size={meta['vocab_size']} "
                 "in meta.json: the data and its meta.json disagree; prepare the dataset again")


for split in ("train", "val"):
    check_split(split)


def batch_at(split, starts):
    """x, y: the rows of block_size + 1 tokens of the split at `starts`, y shifted by one. Read with
    pread, not through a memmap: a file cut short after split_len looked at it gives a short read,
    one sentence, where reading a memmap would kill the process with SIGBUS and no message."""
    path, n = token_path(split), block_size + 1
    with open(path, "rb") as f:
        raw = [os.pread(f.fileno(), 2 * n, 2 * int(i)) for i in starts]
    if any(len(r) < 2 * n for r in raw):
        changed(path)
    rows = np.frombuffer(b"".join(raw), dtype=np.uint16).reshape(len(starts), n).astype(np.int64)
    x, y = np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])
    check_ids(path, rows.max())
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    if device_type == "cuda":
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))
    return x.to(device), y.to(device)


def train_batch(step, micro):
    """Micro-batch `micro` of this process at `step`: a pure function of (seed, step, global
    micro-batch), so a resumed run, and any split of the same global batch over processes, sees the
    same data."""
    rng = np.random.default_rng([seed, step, micro * world_size + rank])
    return batch_at("train", rng.integers(0, split_len("train") - block_size - 1, size=batch_size))


def eval_batches(split):
    """eval_iters batches at evenly spaced, fixed offsets: identical for every run and variant."""
    starts = np.linspace(0, split_len(split) - block_size - 1,
                         eval_iters * batch_size).astype(np.int64)
    for k in range(rank, eval_iters, world_size):   # shared out over processes, summed below
        yield batch_at(split, starts[k * batch_size : (k + 1) * batch_size])


# ---- model, optimizer, checkpoint ------------------------------------------------------
model_args = {f.name: config.get(f.name) for f in fields(GPTConfig) if f.name != "vocab_size"}
model_args["vocab_size"] = meta["vocab_size"]
iter_num, best_val_loss, ckpt = 0, float("inf"), None
if init_from == "resume":
    try:
        ckpt_path, ckpt = checkpoint.load_latest(out_dir, fallback=resume_fallback)
    except checkpoint.CheckpointError as e:
        sys.exit(f"error: {e}")
    # a model key added since the checkpoint was written counts as its default (what the checkpoint
    # trained with)
    saved = {**{f.name: f.default for f in fields(GPTConfig)}, **ckpt["model_args"],
             "optimizer": ckpt["config"].get("optimizer", "adamw")}
    mismatched = {k: (saved.get(k), v) for k, v in {**model_args, "optimizer": optimizer}.items()
                  if saved.get(k) != v}
    if mismatched:
        sys.exit(f"error: {ckpt_path} was trained with a different model or optimizer; "
                 "mismatched keys (checkpoint, requested): "
                 + ", ".join(f"{k}=({a!r}, {b!r})" for k, (a, b) in mismatched.items()))
    # a checkpoint before the record: not checked
    if ckpt.get("vocab", vocabulary(meta)) != vocabulary(meta):
        sys.exit(f"error: {ckpt_path} was trained on another vocabulary than {data_dir}/meta.json "
                 "now holds (the same token ids would mean other text): prepare "
                 f"--dataset={dataset} as it was, or train into a new out_dir")
    iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    if master:
        print(f"resuming from {ckpt_path} at iteration {iter_num}")
        if iter_num >= max_iters:   # e.g. a requeued job whose run had finished
            print(f"{ckpt_path} is at iteration {iter_num} and max_iters={max_iters}: nothing to "
                  "train (raise --max_iters to go on)")
        # the command line wins on resume (learning rate, max_iters, batch); a new global batch is
        # legal but worth a line
        old = ckpt["config"]
        old_tokens = (old.get("gradient_accumulation_steps", 0) * old.get("batch_size", 0)
                      * old.get("block_size", 0))
        if old_tokens != tokens_per_iter:
            print(f"warning: the checkpoint was trained with {old_tokens:,} tokens per iteration, "
                  f"this run uses {tokens_per_iter:,} (gradient_accumulation_steps x batch_size x "
                  "block_size)")

try:
    gpt_config = GPTConfig(**model_args)
except ValueError as e:   # an unknown or contradictory scale-vector flag
    sys.exit(f"error: {e}")
torch.manual_seed(seed)
model = GPT(gpt_config).to(device, weights_dtype)
if ckpt:
    try:
        checkpoint.restore_model(model, ckpt["model"], ckpt_path)
    except checkpoint.CheckpointError as e:
        sys.exit(f"error: {e}")
raw_model = model
if master:
    print(f"model: {model.num_params() / 1e6:.2f}M parameters "
          f"({model.num_active_params() / 1e6:.2f}M active per token)")


def make_optimizers():
    """AdamW over the classes of GPT.param_groups(); with optimizer="muon", Muon takes the 2-D
    hidden matrices instead. Prints what each class gets: a gain silently decayed toward 0 is the
    classic confound of a scale-vector study."""
    groups = raw_model.param_groups(weight_decay, sv_weight_decay, muon=optimizer == "muon")
    for g in groups:
        g["base_lr"] = muon_lr if g["optimizer"] == "muon" else learning_rate
    muon_groups = [g for g in groups if g["optimizer"] == "muon"]
    adamw_groups = [g for g in groups if g["optimizer"] == "adamw"]
    if master:
        print(f"{'class':<10} {'optim':<6} {'tensors':>7} {'params':>12} {'lr':>8} {'decay':>6}")
        for g in groups:
            print(f"{g['name']:<10} {g['optimizer']:<6} {len(g['params']):>7} "
                  f"{sum(p.numel() for p in g['params']):>12,} "
                  f"{g['base_lr']:>8.1e} {g['weight_decay']:>6}")
    # the fused kernel: one pass over all tensors (on a CPU, 3-4x faster than the per-tensor loop)
    opts = [torch.optim.AdamW(adamw_groups, lr=learning_rate, betas=(beta1, beta2),
                              fused=device_type in ("cuda", "cpu"))]
    if muon_groups:
        opts.append(torch.optim.Muon(muon_groups, lr=muon_lr, momentum=muon_momentum,
                                     adjust_lr_fn="match_rms_adamw"))
    return opts


optimizers = make_optimizers()
# each optimizer state names its parameter
param_names = {p: name for name, p in raw_model.named_parameters()}
if ckpt:
    config_hparams = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                      for opt in optimizers]
    # checked against the model first; loading also restores the saved lr, weight decay, betas...
    try:
        checkpoint.restore_optimizers(optimizers, ckpt["optimizers"], param_names, ckpt_path)
    except checkpoint.CheckpointError as e:
        sys.exit(f"error: {e}")
    for opt, hparams in zip(optimizers, config_hparams):
        for group, h in zip(opt.param_groups, hparams):
            group.update(h)    # ...but the config of this run is the one to follow
ckpt = None   # free memory
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)


def save_checkpoint():
    """Called by every process: a checkpoint only of a finite last-step loss and finite weights (a
    NaN one must never become `latest`); the master writes it, the others wait until it is complete.
    No RNG state is saved: nothing draws from a global generator (batches come from (seed, step),
    the model has no dropout)."""
    weights_ok = torch.stack([p.isfinite().all() for p in raw_model.parameters()]).all()
    bad = torch.stack([~step_loss.isfinite(), ~weights_ok]).float()
    if ddp:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    stop_if_diverged("training loss", math.nan if bad[0] else 0.0)
    stop_if_diverged("a weight", math.nan if bad[1] else 0.0)
    path = None
    if master:
        state = {"model": raw_model.state_dict(),
                 "optimizers": [checkpoint.optimizer_state(o, param_names) for o in optimizers],
                 "model_args": model_args, "config": config, "iter_num": iter_num,
                 "best_val_loss": best_val_loss,
                 "vocab": vocabulary(meta)}
        try:
            path = checkpoint.save(out_dir, state, iter_num, keep_checkpoints)
        # a full disk: `latest` still names the previous checkpoint
        except checkpoint.CheckpointError as e:
            sys.exit(f"error: {e}")
        print(f"saved {path}")
    if ddp:
        dist.barrier()
    return path


def lr_factor(it):
    """The multiplier of every group's learning rate at step `it`: linear warmup, then the schedule,
    which ends at min_lr / learning_rate at lr_decay_iters."""
    floor = min_lr / learning_rate
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if lr_schedule == "constant":
        return 1.0
    if lr_schedule == "cosine":
        progress = min((it - warmup_iters) / max(lr_decay_iters - warmup_iters, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # wsd: stable, then decay
    decay_start = max(warmup_iters, lr_decay_iters * (1 - wsd_decay_frac))
    progress = min(max(it - decay_start, 0) / max(lr_decay_iters - decay_start, 1), 1.0)
    return floor + (1 - floor) * (1 - (progress if wsd_shape == "linear" else math.sqrt(progress)))


@torch.no_grad()
def evaluate():
    """Mean loss over the fixed batches of each split, summed over processes."""
    raw_model.eval()
    out = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=device, dtype=weights_dtype)
        for x, y in eval_batches(split):
            with autocast:
                _, loss = raw_model(x, y)
            total += torch.stack([loss.to(weights_dtype), torch.ones_like(total[0])])
        if ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    raw_model.train()
    return out


# ---- the run folder, written from here on: a lock, then metrics ---------------------------
# (one JSON record per line, for plots)
metrics_path = os.path.join(out_dir, "metrics.jsonl")
if master:
    try:
        # one trainer per out_dir (a requeued job overlapping the old one)
        checkpoint.lock(out_dir)
        if init_from == "scratch":
            # a former run is here only with --overwrite=True (check_out_dir)
            checkpoint.clear_run(out_dir)
        else:
            # a link would log into another run's (or any) file
            checkpoint.private_file(metrics_path)
            checkpoint.trim_metrics(metrics_path, iter_num)
        metrics_file = checkpoint.open_append(metrics_path)
    except checkpoint.CheckpointError as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        sys.exit(f"error: {checkpoint.write_error(metrics_path, e, out_dir)}")


def log_metrics(record):
    try:
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
    except OSError as e:
        sys.exit(f"error: {checkpoint.write_error(metrics_path, e, out_dir)}")


# ---- preemption: SIGTERM / SIGINT finish the step, save, and exit 0 -----------------------
stop_signal = []
signal.signal(signal.SIGTERM, lambda sig, frame: stop_signal.append(sig))
signal.signal(signal.SIGINT, lambda sig, frame: stop_signal.append(sig))


def stop_requested():
    if not ddp:
        return bool(stop_signal)
    # the processes agree every step: torchrun sends SIGKILL 30 s after SIGTERM, too soon for a
    # check every log_interval steps; one 1-element all-reduce per step is cheap
    flag = torch.tensor(float(bool(stop_signal)), device=device)
    # all stop together, or the others would wait forever
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def stop_if_diverged(which, value):
    """A non-finite loss or weight ends the run before anything is saved, naming the last good
    checkpoint."""
    if not math.isfinite(value):
        sys.exit(f"error: {which} is {value} at step {iter_num}; " + (
                 f"the last good checkpoint is {last_ckpt}: resume from it with --init_from=resume "
                 "and a lower learning_rate"
                 if last_ckpt
                 else "no checkpoint was saved: start again with a lower learning_rate"))


# ---- the training loop ---------------------------------------------------------------------
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
peak = mfu_peak_flops or peak_flops(torch.device(device),
                                    torch.bfloat16 if dtype == "bfloat16" else torch.float32)
start_iter, last_ckpt = iter_num, (ckpt_path if init_from == "resume" else None)
step_loss = torch.zeros((), device=device, dtype=weights_dtype)   # checked before every save
t0, timed_steps = time.perf_counter(), 0
while True:
    # a resumed run's first step was evaluated before its checkpoint was saved (a stop signal during
    # the step-0 evaluation saves ckpt_0000000.pt after it): not again
    if ((iter_num % eval_interval == 0 or iter_num == max_iters)
            and not (iter_num == start_iter and init_from == "resume")):
        losses = evaluate()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}")
            log_metrics({"kind": "eval", "iter": iter_num, "train_loss": losses["train"],
                         "val_loss": losses["val"], "lr": learning_rate * lr_factor(iter_num),
                         "scale_vectors": raw_model.scale_vector_stats(),
                         "moe": raw_model.moe_stats()})
        stop_if_diverged("validation loss", losses["val"])
        best_val_loss = min(best_val_loss, losses["val"])
        if iter_num > start_iter:
            last_ckpt = save_checkpoint()
        t0, timed_steps = time.perf_counter(), 0   # evaluation is not training time
    if iter_num >= max_iters:
        break
    if stop_requested():
        if master:
            print(f"stop signal at step {iter_num}: saving and exiting")
        # ends with a barrier: no process tears down the group while the master writes
        save_checkpoint()
        break

    factor = lr_factor(iter_num)
    lr = learning_rate * factor
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor
    step_loss = torch.zeros((), device=device, dtype=weights_dtype)
    for micro in range(accum):
        x, y = train_batch(iter_num, micro)
        # DDP: all-reduce gradients on the last micro-step only
        with model.no_sync() if ddp and micro < accum - 1 else nullcontext():
            with autocast:
                _, loss = model(x, y)
                loss = loss / accum
            loss.backward()
        step_loss += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               grad_clip if grad_clip > 0 else float("inf"))
    # the steps, a decay policy's own pull (model.DECAY_POLICIES), zero_grad
    optimizer_step(optimizers)
    # MoE load balancing; else a no-op
    raw_model.update_expert_bias(reduce=dist.all_reduce if ddp else None)
    iter_num += 1
    timed_steps += 1

    if iter_num % log_interval == 0:
        if ddp:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        loss_f = step_loss.item()   # waits for the device: only once per log interval
        dt = (time.perf_counter() - t0) / timed_steps
        t0, timed_steps = time.perf_counter(), 0
        stop_if_diverged("training loss", loss_f)
        if master:
            # only against a known peak (a CPU has none)
            mfu = flops_per_iter / dt / peak if peak else None
            print(f"iter {iter_num}: loss {loss_f:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                  f"{tokens_per_iter / dt:,.0f} tok/s"
                  + (f", mfu {100 * mfu:.1f}%" if mfu is not None else ""))
            log_metrics({"kind": "train", "iter": iter_num, "loss": loss_f, "lr": lr,
                         "grad_norm": grad_norm.item(), "ms_per_iter": 1000 * dt,
                         "tokens_per_s": tokens_per_iter / dt, "mfu": mfu})

if ddp:
    dist.destroy_process_group()
