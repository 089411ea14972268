"""
Pre-train the GPT of model.py on one process, or on many with DDP through torchrun.

    python train.py config/shakespeare_char.py                     # a CPU, a few minutes
    python train.py config/shakespeare_char.py --init_from=resume  # go on (none yet: from scratch)
    torchrun --standalone --nproc_per_node=8 train.py config/unified_124m.py

Every name in config/defaults.py is a key: a config file sets some, then --key=value overrides
(configurator.py); `python train.py --help` lists them. Config files are Python, executed here: run
only those you trust. A bad input (a key, the data, a checkpoint) ends the run with one sentence,
raised where it is checked (configurator.py, dataset.py, checkpoint.py), before anything is written.
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
from dataset import dataset_dir, load_meta, read_rows, token_file, vocabulary
from model import GPT, GPTConfig
from runtime import build, pick_device, setup_cpu

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
# float64 weights for a reference run: rounding far below what Adam could amplify into a visible
# step (the pinned run of tests/test_train.py); else float32
weights_dtype = torch.float64 if dtype == "float64" else torch.float32
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
if device_type == "cpu":
    setup_cpu(cpu_threads)
if master:
    threads = f" ({torch.get_num_threads()} threads)" if device_type == "cpu" else ""
    print(f"{world_size} process(es) on {device}{threads} in {dtype}; {tokens_per_iter:,} tokens "
          f"per iteration ({accum} micro-steps x {world_size} x {batch_size} x {block_size})")

# ---- data: uint16 token files; a batch depends only on (seed, step, micro-step) ---------------
data_dir = dataset_dir(dataset)
meta = load_meta(data_dir)
splits = {s: token_file(data_dir, s, block_size, meta["vocab_size"], train_tokens * (s == "train"))
          for s in ("train", "val")}


def batch(split, starts, n=block_size + 1):
    """x, y: a row of n - 1 tokens of the split from each start, y shifted by one, on the device."""
    rows = torch.from_numpy(read_rows(splits[split], starts, n, meta["vocab_size"]))
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    if device_type == "cuda":
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))
    return x.to(device), y.to(device)


def train_batch(step, micro):
    """Micro-batch `micro` of this process at `step`: a pure function of (seed, step, global
    micro-batch), so a resumed run, and any split of the global batch over processes, sees the
    same data."""
    rng = np.random.default_rng([seed, step, micro * world_size + rank])
    return batch("train", rng.integers(0, len(splits["train"]) - block_size - 1, size=batch_size))


def eval_batches(split, full=False):
    """This process's share of an evaluation's batches: eval_iters batches at fixed, evenly spaced
    offsets, the same for every run; full=True: every target of the val split (windows that tile
    it, the last one shorter), and as many tokens from the start of the train split."""
    if not full:
        starts = np.linspace(0, len(splits[split]) - block_size - 1,
                             eval_iters * batch_size).astype(np.int64)
        rows = batch_size
    else:
        targets = min(len(splits[split]), len(splits["val"])) - 1
        starts = np.arange(targets // block_size) * block_size
        # a CPU is fastest at about a micro-batch (256 x 64 took 1.3x as long as 12 x 64)
        rows = batch_size if device_type == "cpu" else max(batch_size, 2 ** 14 // block_size)
    for k in range(rank * rows, len(starts), world_size * rows):
        yield batch(split, starts[k : k + rows])
    if full and targets % block_size and rank == 0:   # the last, shorter window
        yield batch(split, [len(starts) * block_size], targets % block_size + 1)


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
try:
    gpt_config = GPTConfig(**model_args)
except ValueError as e:   # flags that contradict each other (model.check_config)
    sys.exit(f"error: {e}")
torch.manual_seed(seed)
model = raw_model = build(lambda: GPT(gpt_config), device, weights_dtype)   # or one sentence
optimizers = raw_model.configure_optimizers(
    learning_rate=learning_rate, weight_decay=weight_decay, betas=(beta1, beta2),
    sv_weight_decay=sv_weight_decay, sv_decay=None if sv_decay < 0 else sv_decay,
    optimizer=optimizer, muon_lr=muon_lr, muon_momentum=muon_momentum)
if master:   # a gain silently decayed toward 0 is the classic confound of a scale-vector study
    print(f"model: {model.num_params() / 1e6:.2f}M parameters "
          f"({model.num_active_params() / 1e6:.2f}M active per token)")
    print(f"{'class':<10} {'optim':<6} {'tensors':>7} {'params':>12} {'lr':>8} {'decay':>6}")
    for g in (g for opt in optimizers for g in opt.param_groups):
        print(f"{g['name']:<10} {g['optimizer']:<6} {len(g['params']):>7} "
              f"{sum(p.numel() for p in g['params']):>12,} {g['base_lr'] * g['lr_mult']:>8.1e} "
              f"{g['weight_decay']:>6}")
if ckpt:   # the weights and the moments; this run's config keeps its own lr, decay, betas
    checkpoint.restore(raw_model, optimizers, ckpt, ckpt_path)
wandb_id = (ckpt or {}).get("wandb_id") or os.urandom(4).hex()   # a resume continues its run
ckpt = None   # free memory
if compile:
    model = torch.compile(model)
eval_model = model   # evaluations need no DDP: the processes sum their losses themselves
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
    """Every group's learning rate at step `it`, over its own peak: linear warmup, then the
    schedule, which ends at min_lr / learning_rate at lr_decay_iters."""
    floor = min_lr / learning_rate
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if lr_schedule == "constant":
        return 1.0
    if lr_schedule == "cosine":
        progress = min((it - warmup_iters) / max(lr_decay_iters - warmup_iters, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_start = max(warmup_iters, lr_decay_iters * (1 - wsd_decay_frac))   # wsd: stable, decay
    progress = min(max(it - decay_start, 0) / max(lr_decay_iters - decay_start, 1), 1.0)
    return floor + (1 - floor) * (1 - (progress if wsd_shape == "linear" else math.sqrt(progress)))


# ---- the run folder (a lock, metrics.jsonl, checkpoints), a NaN stop, preemption ---------------
if master:   # a scratch run clears an earlier one (--overwrite=True); a resume trims its metrics
    lock = checkpoint.open_run(out_dir, init_from)   # held until the process exits
    run_log = telemetry.RunLog(out_dir, iter_num if init_from == "resume" else None, wandb=(
        wandb_log and dict(project=wandb_project, id=wandb_id, config=config,
                           name=wandb_run_name or os.path.basename(os.path.normpath(out_dir)))))


def save_checkpoint():
    """Every process calls it: the master writes (never a non-finite model), the others wait."""
    if master:   # no RNG state: nothing draws from one (a batch comes from (seed, step))
        run_log.log(durable=True)   # a resume trims the log to its checkpoint
        print("saved", checkpoint.save(out_dir, {
            "model": raw_model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
            "model_args": model_args, "config": config, "iter_num": iter_num,
            "best_val_loss": best_val_loss, "vocab": vocabulary(meta), "wandb_id": wandb_id},
            keep_checkpoints))
    if ddp:
        dist.barrier()


def check_finite(what, value):   # a NaN or inf loss ends the run: nothing after it is saved
    if not math.isfinite(value):
        sys.exit(f"error: {what} is {value} at step {iter_num}; " + checkpoint.last_good(
            out_dir, "resume from it with --init_from=resume and a lower learning_rate"))


stop = []   # preemption: SIGTERM / SIGINT finish the step, save and exit 0
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda sig, frame: stop.append(sig))


def stop_requested():   # under DDP all agree, every step: torchrun kills 30 s after its SIGTERM
    if not ddp:
        return bool(stop)
    flag = torch.tensor(float(bool(stop)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


# ---- the training loop --------------------------------------------------------------------------
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
peak = mfu_peak_flops or telemetry.peak_flops(
    torch.device(device), torch.bfloat16 if dtype == "bfloat16" else weights_dtype)
start_iter, timed_steps = iter_num, 0
t_run = t0 = time.perf_counter()
while True:
    evaluating = iter_num % eval_interval == 0 or iter_num == max_iters
    # paper 2.2: the maps before the step after an evaluation, for its precond record
    before = telemetry.fed_maps(raw_model) if master and evaluating else None
    # a resumed run's first step was evaluated before its checkpoint was saved: not again
    if evaluating and not (iter_num == start_iter and init_from == "resume"):
        losses = evaluate()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}")
            run_log.log({"kind": "eval", "iter": iter_num, "train_loss": losses["train"],
                         "val_loss": losses["val"], "lr": learning_rate * lr_factor(iter_num),
                         "scale_vectors": telemetry.vector_stats(raw_model),
                         "moe": raw_model.moe_stats()})
        check_finite("validation loss", losses["val"])
        best_val_loss = min(best_val_loss, losses["val"])
        if final_eval and start_iter < iter_num == max_iters:   # before the last checkpoint too
            t_eval = time.perf_counter()
            losses = evaluate(full=True)
            if master:
                took, run = time.perf_counter() - t_eval, time.perf_counter() - t_run
                print(f"whole val split: loss {losses['val']:.4f} (train split, as many tokens: "
                      f"{losses['train']:.4f}), in {took:.1f} s: {100 * took / run:.0f}% of the "
                      "run")
                run_log.log({"kind": "final", "iter": iter_num, "val_loss": losses["val"],
                             "train_loss": losses["train"]})
        if iter_num > start_iter:
            save_checkpoint()
        t0, timed_steps = time.perf_counter(), 0   # evaluation is not training time
    if iter_num >= max_iters:
        break
    if stop_requested():
        if master:
            print(f"stop signal at step {iter_num}: saving and exiting")
        save_checkpoint()   # ends with a barrier: no process leaves while the master writes
        break

    factor = lr_factor(iter_num)
    for group in (g for opt in optimizers for g in opt.param_groups):
        group["lr"] = group["base_lr"] * group["lr_mult"] * factor
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
        run_log.log({"kind": "precond", "iter": iter_num,
                     "maps": telemetry.preconditioning(raw_model, before, sgd)})

    if iter_num % log_interval == 0 or iter_num in (start_iter + 1, max_iters):   # first, last
        if ddp:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        loss_f = step_loss.item()   # waits for the device: only once per log interval
        dt = (time.perf_counter() - t0) / timed_steps
        t0, timed_steps = time.perf_counter(), 0
        check_finite("training loss", loss_f)
        if master:
            mfu = flops_per_iter / dt / peak if peak else None   # only against a known peak
            left = int(dt * (max_iters - iter_num))   # of training; evaluations not counted
            print(f"iter {iter_num}/{max_iters}: loss {loss_f:.4f}, lr {learning_rate * factor:.2e}"
                  f", {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s"
                  + (f", mfu {100 * mfu:.1f}%" if mfu is not None else "")
                  + f", eta {left // 3600}h{left // 60 % 60:02d}m{left % 60:02d}s")
            run_log.log({"kind": "train", "iter": iter_num, "loss": loss_f,
                         "lr": learning_rate * factor, "grad_norm": grad_norm.item(),
                         "ms_per_iter": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                         "mfu": mfu})

if ddp:   # together: a rank that tore gloo down while rank 0 still wrote aborted once (SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
