"""
Pre-train the GPT of model.py on one process, or on many with DDP through torchrun.

    python train.py config/shakespeare_char.py                     # a CPU, a few minutes
    python train.py config/shakespeare_char.py --init_from=resume  # go on (none yet: from scratch)
    torchrun --standalone --nproc_per_node=8 train.py config/unified_124m.py

Every name in config/defaults.py is a key. A config file sets some, then --key=value overrides them
(configurator.py), and `python train.py --help` lists them all. Config files are Python and run
here, so run only those you trust. Bad input (a key, the data, a checkpoint) ends the run with one
sentence from where it is checked, before anything is written.
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
from config.defaults import DEFAULTS, PAIR_RULES, TRAIN_RULES, help_comments
from configurator import configure
from dataset import dataset_dir, eval_windows, load_meta, read_rows, token_file, vocabulary
from model import GPT, REPARAMS, GPTConfig
from runtime import any_process, build, pick_device, setup_cpu

# ---- config: every key of config/defaults.py becomes a global here ------------------------------
config = configure(DEFAULTS, sys.argv[1:], TRAIN_RULES, PAIR_RULES, __doc__, help_comments)
globals().update(config)
init_from = checkpoint.check_out_dir(out_dir, init_from, overwrite)   # none to resume: scratch
lr_decay_iters = lr_decay_iters or max_iters

# ---- processes and device ----------------------------------------------------------------------
ddp = "RANK" in os.environ   # set by torchrun
device = pick_device(device)
if ddp:
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
else:
    rank, world_size = 0, 1
master = rank == 0
if gradient_accumulation_steps % world_size:
    sys.exit(f"error: gradient_accumulation_steps={gradient_accumulation_steps} counts the "
             f"micro-steps of all {world_size} processes: set it to a multiple of {world_size}")
accum = gradient_accumulation_steps // world_size   # micro-steps per process
device_type = torch.device(device).type
dtype = dtype or ("bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported()
                  else "float32")
autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if dtype == "bfloat16"
            else nullcontext())
weights_dtype = torch.float64 if dtype == "float64" else torch.float32   # float64: a reference run
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
threads = f" ({setup_cpu(cpu_threads)})" if device_type == "cpu" else ""
if master:
    print(f"{world_size} process(es) on {device}{threads} in {dtype}; {tokens_per_iter:,} tokens "
          f"per iteration ({accum} micro-steps x {world_size} x {batch_size} x {block_size})")

# ---- data: uint16 token files, and a batch that depends only on (seed, step, micro-step) -------
data_dir = dataset_dir(dataset)
meta = load_meta(data_dir)
splits = {s: token_file(data_dir, s, block_size, meta["vocab_size"], train_tokens * (s == "train"))
          for s in ("train", "val")}


def batch(split, starts, n=block_size + 1):
    """x and y, a row of n - 1 tokens of the split from each start, y shifted by one token."""
    rows = torch.from_numpy(read_rows(splits[split], starts, n, meta["vocab_size"]))
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    if device_type == "cuda":
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))
    return x.to(device), y.to(device)


def train_batch(step, micro):
    """This process's micro-batch `micro` at `step`, a function of the seed, the step and the
    global micro-batch only, so that a resumed run, or another number of processes, sees the same
    data."""
    rng = np.random.default_rng([seed, step, micro * world_size + rank])
    return batch("train", rng.integers(0, len(splits["train"]) - block_size - 1, size=batch_size))


def eval_batches(split, full=False):
    """This process's batches of an evaluation: eval_iters batches at fixed offsets, or with full,
    every target of the val split and as many tokens of the train split."""
    n = min(len(splits[split]), len(splits["val"])) if full else len(splits[split])
    for starts, length in eval_windows(n, block_size, batch_size, None if full else eval_iters,
                                       rank, world_size):
        yield batch(split, starts, length)


# ---- model and optimizers, from scratch or from the last checkpoint ----------------------------
model_args = {f.name: config.get(f.name) for f in fields(GPTConfig) if f.name != "vocab_size"}
model_args["vocab_size"] = meta["vocab_size"]
iter_num, best_val_loss, ckpt = 0, float("inf"), None
if init_from == "resume":
    ckpt_path, ckpt = checkpoint.load_latest(out_dir)
    note = checkpoint.check_resume(ckpt_path, ckpt, config, model_args, vocabulary(meta))
    iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    if master:
        print(note)
torch.manual_seed(seed)
model = raw_model = build(lambda: GPT(GPTConfig(**model_args)), device, weights_dtype)
optimizers = raw_model.configure_optimizers(
    learning_rate=learning_rate, weight_decay=weight_decay, betas=(beta1, beta2),
    sv_weight_decay=sv_weight_decay, sv_decay=None if sv_decay < 0 else sv_decay,
    optimizer=optimizer, muon_lr=muon_lr, muon_momentum=muon_momentum)
if master:   # which vectors are decayed is printed, since a silent decay would confound the study
    print(f"model: {model.num_params() / 1e6:.2f}M parameters "
          f"({model.num_active_params() / 1e6:.2f}M active per token)")
    print(f"{'class':<10} {'optim':<6} {'tensors':>7} {'params':>12} {'lr':>8} {'decay':>6}")
    for g in (g for opt in optimizers for g in opt.param_groups):
        to_g = g["name"].startswith("sv_") and g["weight_decay"] > 0   # decay's raw 0 (REPARAMS)
        print(f"{g['name']:<10} {g['optimizer']:<6} {len(g['params']):>7} "
              f"{sum(p.numel() for p in g['params']):>12,} {g['base_lr'] * g['lr_mult']:>8.1e} "
              f"{g['weight_decay']:>6}" + f" toward g = {REPARAMS[sv_reparam].g_at_zero:g}" * to_g)
if ckpt:   # the weights and the moments, while this run keeps its own lr, decay and betas
    checkpoint.restore(raw_model, optimizers, ckpt, ckpt_path)
wandb_id = (ckpt or {}).get("wandb_id") or os.urandom(4).hex()   # a resume continues its run
ckpt = None   # free memory
if compile:
    model = torch.compile(model)
eval_model = model   # evaluations need no DDP, since the processes sum their losses themselves
if ddp:
    model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)


@torch.inference_mode()
def evaluate(full=False):
    """Mean loss of each split over the targets of eval_batches, summed over the processes."""
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
    """Every group's learning rate at step `it` over its peak. A linear warmup, then the schedule,
    which reaches min_lr / learning_rate at lr_decay_iters."""
    floor = min_lr / learning_rate
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if lr_schedule == "constant":
        return 1.0
    if lr_schedule == "cosine":
        progress = min((it - warmup_iters) / max(lr_decay_iters - warmup_iters, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_start = max(warmup_iters, lr_decay_iters * (1 - wsd_decay_frac))   # wsd
    progress = min(max(it - decay_start, 0) / max(lr_decay_iters - decay_start, 1), 1.0)
    return floor + (1 - floor) * (1 - (progress if wsd_shape == "linear" else math.sqrt(progress)))


# ---- the run folder: its lock, its log and its checkpoints ------------------------------------
if master:   # the lock is held until the process exits, and a resume trims the log
    lock = checkpoint.open_run(out_dir, init_from)
    run_log = telemetry.RunLog(out_dir, iter_num if init_from == "resume" else None,
                               config if wandb_log else None, wandb_id)


def save_checkpoint():
    """Every process calls it. The master writes, and the others wait for it."""
    if master:   # no RNG state is saved, since a batch is a function of (seed, step)
        run_log.log(durable=True)
        print("saved", checkpoint.save(out_dir, {
            "model": raw_model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
            "model_args": model_args, "config": config, "iter_num": iter_num,
            "best_val_loss": best_val_loss, "vocab": vocabulary(meta), "wandb_id": wandb_id},
            keep_checkpoints))
    if ddp:
        dist.barrier()


stop = []   # SIGTERM and SIGINT finish the step, save and exit 0
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda sig, frame: stop.append(sig))


# ---- the training loop --------------------------------------------------------------------------
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
peak = mfu_peak_flops or telemetry.peak_flops(
    torch.device(device), torch.bfloat16 if dtype == "bfloat16" else weights_dtype)
start_iter, timed_steps = iter_num, 0
t_run = t0 = time.perf_counter()
while True:
    evaluating = iter_num % eval_interval == 0 or iter_num == max_iters
    # paper 2.2, the maps before the step after an evaluation, for that step's precond record
    before = telemetry.fed_maps(raw_model) if master and evaluating else None
    # a resumed run's first step was evaluated before its checkpoint was saved
    if evaluating and not (iter_num == start_iter and init_from == "resume"):
        losses = evaluate()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}")
            run_log.log({"kind": "eval", "iter": iter_num, "train_loss": losses["train"],
                         "val_loss": losses["val"], "lr": learning_rate * lr_factor(iter_num),
                         "scale_vectors": telemetry.vector_stats(raw_model),
                         "moe": raw_model.moe_stats()})
        checkpoint.check_finite("validation loss", losses["val"], iter_num, out_dir)
        best_val_loss = min(best_val_loss, losses["val"])
        if final_eval and start_iter < iter_num == max_iters:   # before the last checkpoint
            if master:
                print(f"evaluating the whole val split ({len(splits['val']) - 1:,} tokens) and as "
                      "many tokens of the train split", flush=True)
            t_eval = time.perf_counter()
            losses = evaluate(full=True)
            if master:
                took, run = time.perf_counter() - t_eval, time.perf_counter() - t_run
                print(f"whole val split: loss {losses['val']:.4f} (train: {losses['train']:.4f}), "
                      f"in {took:.1f} s, {100 * took / run:.0f}% of the run")
                run_log.log({"kind": "final", "iter": iter_num, "val_loss": losses["val"],
                             "train_loss": losses["train"]})
        if iter_num > start_iter:
            save_checkpoint()
        t0, timed_steps = time.perf_counter(), 0   # evaluations are not training time
    if iter_num >= max_iters:
        break
    if any_process(bool(stop), device):   # every process stops at the same step
        if master:
            print(f"stop signal at step {iter_num}: saving and exiting")
        save_checkpoint()   # its barrier keeps every process until the master has written
        break

    factor = lr_factor(iter_num)
    for group in (g for opt in optimizers for g in opt.param_groups):
        group["lr"] = group["base_lr"] * group["lr_mult"] * factor
    step_loss = torch.zeros((), device=device, dtype=weights_dtype)
    for micro in range(accum):
        x, y = train_batch(iter_num, micro)
        # DDP all-reduces the gradients on the last micro-step only
        with model.no_sync() if ddp and micro < accum - 1 else nullcontext():
            with autocast:
                _, loss = model(x, y)
                loss = loss / accum
            loss.backward()
        step_loss += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               grad_clip if grad_clip > 0 else float("inf"))
    # paper 2.2, what a plain SGD step would do to the folded maps, from this step's gradients
    sgd = telemetry.sgd_ratios(raw_model, learning_rate * factor) if before is not None else None
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    raw_model.update_expert_bias(reduce=dist.all_reduce if ddp else None)   # an MoE's balance
    iter_num += 1
    timed_steps += 1
    if master and before is not None:   # paper 2.2, one step of the maps the vectors precondition
        run_log.log({"kind": "precond", "iter": iter_num,
                     "maps": telemetry.preconditioning(raw_model, before, sgd)})

    if iter_num % log_interval == 0 or iter_num in (start_iter + 1, max_iters):
        if ddp:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        loss_f = step_loss.item()   # the only wait for the device, once per log interval
        dt = (time.perf_counter() - t0) / timed_steps
        t0, timed_steps = time.perf_counter(), 0
        checkpoint.check_finite("training loss", loss_f, iter_num, out_dir)
        if master:
            mfu = flops_per_iter / dt / peak if peak else None   # only against a known peak
            left = int(dt * (max_iters - iter_num))   # evaluations are not counted
            print(f"iter {iter_num}/{max_iters}: loss {loss_f:.4f}, lr {learning_rate * factor:.2e}"
                  f", {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s"
                  + (f", mfu {100 * mfu:.1f}%" if mfu is not None else "")
                  + f", eta {left // 3600}h{left // 60 % 60:02d}m{left % 60:02d}s")
            run_log.log({"kind": "train", "iter": iter_num, "loss": loss_f,
                         "lr": learning_rate * factor, "grad_norm": grad_norm.item(),
                         "ms_per_iter": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                         "mfu": mfu})

if ddp:   # every process leaves together, so none tears down gloo while another still writes
    dist.barrier()
    dist.destroy_process_group()
