"""
Pre-train the GPT of model.py on one process, or on many with DDP through torchrun.

    python train.py config/shakespeare_char.py                     # a CPU, a few minutes
    python train.py config/shakespeare_char.py --init_from=resume  # continue from the checkpoint
    python train.py config/shakespeare_char.py --overwrite=True    # start again over a run
    torchrun --standalone --nproc_per_node=8 train.py config/unified_124m.py

Every name in config/defaults.py is a config key: a config file sets some, then --key=value
overrides (configurator.py); `python train.py --help` lists them, with what they do and the values
they take (config/defaults.py's rules, checked before anything is written). Config files are
Python, executed by train.py: run only those you trust. The checks of the data and of a checkpoint
live in dataset.py and checkpoint.py, each bad input one sentence.
"""
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
import telemetry
from checkpoint import CheckpointError
from config.defaults import DEFAULTS, PAIR_RULES, TRAIN_RULES, help_comments
from configurator import (ConfigError, check_device, configure, default_device, differing_configs,
                          keep_freed_memory)
from dataset import TokenFile, dataset_dir, load_meta, vocabulary
from model import GPT, GPTConfig, peak_flops

# ---- config: every key of config/defaults.py becomes a global here ----------------------------
try:   # every check that needs no data comes first: nothing is written to out_dir before all pass
    config = configure(DEFAULTS, sys.argv[1:], TRAIN_RULES, PAIR_RULES, __doc__, help_comments)
    check_device(config["device"])
    checkpoint.check_out_dir(config["out_dir"], config["init_from"], config["overwrite"])
except (ConfigError, CheckpointError) as e:
    sys.exit(f"error: {e}")
globals().update(config)
lr_decay_iters = lr_decay_iters or max_iters

# ---- processes and device ----------------------------------------------------------------------
ddp = "RANK" in os.environ   # set by torchrun
device = device or default_device()
if ddp:
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    configs = [None] * world_size   # a config that reads RANK would hang the job or train wrong
    dist.all_gather_object(configs, config)
    differ = differing_configs(configs)
    if differ:   # every process finds it; the master says it
        sys.exit(f"error: {differ}" if rank == 0 else 1)
else:
    rank, world_size = 0, 1
master = rank == 0
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
if device_type == "cpu":
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    keep_freed_memory()   # else glibc faults every step's activations in afresh (configurator.py)
if master:
    threads = (f" ({torch.get_num_threads()} thread(s), --cpu_threads)" if device_type == "cpu"
               else "")
    print(f"{world_size} process(es) on {device}{threads} in {dtype}; {tokens_per_iter:,} tokens "
          f"per iteration ({accum} micro-steps x {world_size} processes x {batch_size} x "
          f"{block_size})")

# ---- data: uint16 token files; a batch depends only on (seed, step, micro-step) ---------------
data_dir = dataset_dir(dataset)
meta = load_meta(data_dir)
splits = {s: TokenFile(data_dir / f"{s}.bin", block_size, meta["vocab_size"],
                       limit=train_tokens if s == "train" else 0) for s in ("train", "val")}


def batch(split, starts):
    """x, y: the rows of the split at `starts`, y shifted by one, on the device."""
    rows = torch.from_numpy(splits[split].rows(starts))
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    if device_type == "cuda":
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))
    return x.to(device), y.to(device)


def train_batch(step, micro):
    """Micro-batch `micro` of this process at `step`: a pure function of (seed, step, global
    micro-batch), so a resumed run, and any split of the same global batch over processes, sees the
    same data."""
    rng = np.random.default_rng([seed, step, micro * world_size + rank])
    return batch("train", rng.integers(0, len(splits["train"]) - block_size - 1, size=batch_size))


def eval_batches(split, full=False):
    """This process's share of an evaluation's batches (x, y): eval_iters batches at evenly spaced,
    fixed offsets, identical for every run and variant; full=True: every target of the val split
    (windows that tile it, the last one shorter) and as many tokens from the start of the train
    split (the tables' figure: the batches sample 15k of 111k val tokens)."""
    if not full:
        starts = np.linspace(0, len(splits[split]) - block_size - 1,
                             eval_iters * batch_size).astype(np.int64)
        rows = batch_size
    else:   # as many train tokens as val ones, within train_tokens' prefix
        targets = min(len(splits[split]), len(splits["val"])) - 1
        starts = np.arange(targets // block_size) * block_size
        # a GPU's inference forward takes more rows than a training micro-batch; a CPU's is fastest
        # at about one (more leave its cache: on one thread, 256 x 64 took 1.3x as long as 12 x 64)
        rows = batch_size if device_type == "cpu" else max(batch_size, 2 ** 14 // block_size)
    for k in range(rank * rows, len(starts), world_size * rows):
        yield batch(split, starts[k : k + rows])
    if full and targets % block_size and rank == 0:   # the last, shorter window
        tail = torch.from_numpy(splits[split].read([len(starts) * block_size],
                                                   targets % block_size + 1))
        yield tail[:, :-1].to(device), tail[:, 1:].to(device)


# ---- model and optimizers, from scratch or from the last checkpoint ----------------------------
model_args = {f.name: config.get(f.name) for f in fields(GPTConfig) if f.name != "vocab_size"}
model_args["vocab_size"] = meta["vocab_size"]
iter_num, best_val_loss, ckpt = 0, float("inf"), None
try:
    if init_from == "resume":
        ckpt_path, ckpt = checkpoint.load_latest(out_dir, fallback=resume_fallback)
        notes = checkpoint.check_resume(ckpt_path, ckpt, config, model_args, vocabulary(meta),
                                        tokens_per_iter)
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        if master:
            print("\n".join(notes))
    gpt_config = GPTConfig(**model_args)
except (CheckpointError, ValueError) as e:   # ValueError: contradictory scale-vector flags
    sys.exit(f"error: {e}")
torch.manual_seed(seed)
model = raw_model = GPT(gpt_config).to(device, weights_dtype)
if master:
    print(f"model: {model.num_params() / 1e6:.2f}M parameters "
          f"({model.num_active_params() / 1e6:.2f}M active per token)")
optimizers = raw_model.configure_optimizers(
    learning_rate=learning_rate, weight_decay=weight_decay, betas=(beta1, beta2),
    sv_weight_decay=sv_weight_decay, sv_decay=None if sv_decay < 0 else sv_decay,
    optimizer=optimizer, muon_lr=muon_lr, muon_momentum=muon_momentum)
if master:   # a gain silently decayed toward 0 is the classic confound of a scale-vector study
    print(f"{'class':<10} {'optim':<6} {'tensors':>7} {'params':>12} {'lr':>8} {'decay':>6}")
    for g in (g for opt in optimizers for g in opt.param_groups):
        print(f"{g['name']:<10} {g['optimizer']:<6} {len(g['params']):>7} "
              f"{sum(p.numel() for p in g['params']):>12,} {g['base_lr']:>8.1e} "
              f"{g['weight_decay']:>6}")
param_names = {p: name for name, p in raw_model.named_parameters()}   # named in checkpoints
if ckpt:
    try:   # the weights, then the moments; this run's config keeps its own lr, decay, betas...
        checkpoint.restore_model(raw_model, ckpt["model"], ckpt_path)
        checkpoint.restore_optimizers(optimizers, ckpt["optimizers"], param_names, ckpt_path,
                                      iter_num)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
wandb_id = (ckpt or {}).get("wandb_id") or os.urandom(4).hex()   # a resume continues its run
ckpt = None   # free memory
if compile:
    model = torch.compile(model)
eval_model = model   # evaluations need no DDP: the processes sum their losses themselves
if ddp:
    model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)


@torch.inference_mode()
def evaluate(full=False):
    """Mean loss of each split over the targets of eval_batches, shared out over the processes and
    summed; with the model as the run has it (compiled or not)."""
    raw_model.eval()
    out = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=device, dtype=weights_dtype)   # loss sum, targets
        for x, y in eval_batches(split, full):
            with autocast:
                _, loss = eval_model(x, y)
            total += torch.stack([loss.to(weights_dtype) * y.numel(), total.new_tensor(y.numel())])
        if ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    raw_model.train()
    return out


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


# ---- the run folder: a lock, metrics.jsonl (one JSON record per line), checkpoints --------------
if master:   # a scratch run clears an earlier one (--overwrite=True); a resume trims its metrics
    try:
        lock = checkpoint.open_run(out_dir, init_from)   # held until the process exits
        run_log = telemetry.RunLog(out_dir, iter_num if init_from == "resume" else None, wandb=(
            wandb_log and dict(project=wandb_project, id=wandb_id, config=config,
                               name=wandb_run_name or os.path.basename(os.path.normpath(out_dir)))))
    except CheckpointError as e:
        sys.exit(f"error: {e}")
log_metrics = run_log.log if master else None


def save_checkpoint():
    """Called by every process: a checkpoint only of a finite last-step loss and finite weights (a
    NaN one must never become `latest`); the master writes it, the others wait until it is
    complete. No RNG state is saved: nothing draws from a global generator (batches come from
    (seed, step), the model has no dropout)."""
    weights_ok = torch.stack([p.isfinite().all() for p in raw_model.parameters()]).all()
    bad = torch.stack([~step_loss.isfinite(), ~weights_ok]).float()
    if ddp:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    stop_if_diverged("training loss", math.nan if bad[0] else 0.0)
    stop_if_diverged("a weight", math.nan if bad[1] else 0.0)
    path = None
    if master:
        state = {"model": raw_model.state_dict(), "model_args": model_args, "config": config,
                 "optimizers": [checkpoint.optimizer_state(o, param_names) for o in optimizers],
                 "iter_num": iter_num, "best_val_loss": best_val_loss, "vocab": vocabulary(meta),
                 "wandb_id": wandb_id}
        log_metrics(durable=True)
        try:
            path = checkpoint.save(out_dir, state, iter_num, keep_checkpoints)
        except CheckpointError as e:   # a full disk: `latest` still names the last checkpoint
            sys.exit(f"error: {e}")
        print(f"saved {path}")
    if ddp:
        dist.barrier()
    return path


def stop_if_diverged(which, value):
    """A non-finite loss or weight ends the run before anything is saved, naming the last good
    checkpoint."""
    if not math.isfinite(value):
        sys.exit(f"error: {which} is {value} at step {iter_num}; " + (
                 f"the last good checkpoint is {last_ckpt}: resume from it with --init_from=resume "
                 "and a lower learning_rate" if last_ckpt
                 else "no checkpoint was saved: start again with a lower learning_rate"))


# preemption: SIGTERM / SIGINT finish the step, save, and exit 0
stop_signal = []
signal.signal(signal.SIGTERM, lambda sig, frame: stop_signal.append(sig))
signal.signal(signal.SIGINT, lambda sig, frame: stop_signal.append(sig))


def stop_requested():
    """Under DDP the processes agree every step (a 1-element all-reduce): torchrun kills 30 s after
    SIGTERM, too soon for a check every log_interval steps, and all must stop together."""
    if not ddp:
        return bool(stop_signal)
    flag = torch.tensor(float(bool(stop_signal)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


# ---- the training loop --------------------------------------------------------------------------
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
peak = mfu_peak_flops or peak_flops(torch.device(device), torch.bfloat16 if dtype == "bfloat16"
                                    else weights_dtype)
start_iter, last_ckpt = iter_num, (ckpt_path if init_from == "resume" else None)
step_loss = torch.zeros((), device=device, dtype=weights_dtype)   # checked before every save
t0, timed_steps, before = time.perf_counter(), 0, None
t_run = t0
while True:
    # a resumed run's first step was evaluated before its checkpoint was saved (a stop signal during
    # the step-0 evaluation saves ckpt_0000000.pt after it): not again
    evaluated_before_saving = iter_num == start_iter and init_from == "resume"
    if (iter_num % eval_interval == 0 or iter_num == max_iters) and not evaluated_before_saving:
        losses = evaluate()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}")
            log_metrics({"kind": "eval", "iter": iter_num, "train_loss": losses["train"],
                         "val_loss": losses["val"], "lr": learning_rate * lr_factor(iter_num),
                         "scale_vectors": telemetry.vector_stats(raw_model),
                         "moe": raw_model.moe_stats()})
            before = telemetry.fed_maps(raw_model)   # for the next step's update
        stop_if_diverged("validation loss", losses["val"])
        best_val_loss = min(best_val_loss, losses["val"])
        if iter_num > start_iter:
            last_ckpt = save_checkpoint()
        t0, timed_steps = time.perf_counter(), 0   # evaluation is not training time
    if iter_num >= max_iters:
        if final_eval and (iter_num > start_iter or init_from == "resume"):
            t_eval = time.perf_counter()
            losses = evaluate(full=True)
            if master:
                took, run = time.perf_counter() - t_eval, time.perf_counter() - t_run
                print(f"whole val split: loss {losses['val']:.4f} (train split, as many tokens: "
                      f"{losses['train']:.4f}), in {took:.1f} s: {100 * took / run:.0f}% of the "
                      "run")
                log_metrics({"kind": "final", "iter": iter_num, "val_loss": losses["val"],
                             "train_loss": losses["train"]})
        break
    if stop_requested():
        if master:
            print(f"stop signal at step {iter_num}: saving and exiting")
        save_checkpoint()   # ends with a barrier: no process leaves while the master writes
        break

    factor = lr_factor(iter_num)
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
    # paper 2.2: what a plain SGD step would do to the folded maps, from this step's gradients
    sgd = telemetry.sgd_ratios(raw_model, learning_rate * factor) if before is not None else None
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    raw_model.update_expert_bias(reduce=dist.all_reduce if ddp else None)   # MoE; else nothing
    iter_num += 1
    timed_steps += 1
    if master and before is not None:   # paper 2.2: one step of the maps the vectors precondition
        log_metrics({"kind": "precond", "iter": iter_num,
                     "maps": telemetry.preconditioning(raw_model, before, sgd)})
        before = None

    if iter_num % log_interval == 0 or iter_num in (start_iter + 1, max_iters):   # first, last
        if ddp:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        loss_f = step_loss.item()   # waits for the device: only once per log interval
        dt = (time.perf_counter() - t0) / timed_steps
        t0, timed_steps = time.perf_counter(), 0
        stop_if_diverged("training loss", loss_f)
        if master:
            mfu = flops_per_iter / dt / peak if peak else None   # only against a known peak
            left = int(dt * (max_iters - iter_num))   # of training; evaluations not counted
            print(f"iter {iter_num}/{max_iters}: loss {loss_f:.4f}, lr {learning_rate * factor:.2e}"
                  f", {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s"
                  + (f", mfu {100 * mfu:.1f}%" if mfu is not None else "")
                  + f", eta {left // 3600}h{left // 60 % 60:02d}m{left % 60:02d}s")
            log_metrics({"kind": "train", "iter": iter_num, "loss": loss_f,
                         "lr": learning_rate * factor, "grad_norm": grad_norm.item(),
                         "ms_per_iter": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                         "mfu": mfu})

if ddp:   # together: a rank that tore gloo down while rank 0 still wrote aborted once (SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
