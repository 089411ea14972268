"""
What train.py logs of the scale vectors at every evaluation, in out_dir/metrics.jsonl (RunLog; and
Weights & Biases when asked): each effective vector's size (vector_stats) and the paper's
mechanism, measured (preconditioning: section 2.2, study/README.md "Preconditioning, measured"). An
Input-Norm vector g adds no function, W (g * z) = W' z with W' = W diag(g), but it changes how W'
trains: a step moves column j of W' by g_j^2 times what the folded model's own step would (SGD),
by g_j times it under AdamW (which normalizes each entry's step), plus what the step of g adds.
"""
import json
import os
from dataclasses import replace

import torch

import checkpoint
from model import GPT, ScaleVector


@torch.no_grad()
def vector_stats(model):
    """{name: [mean, min, max]} of every effective scale vector (after OR / ER), per row/branch."""
    stats = {}
    for name, m in model.named_modules():
        if isinstance(m, ScaleVector):
            g = m().float()
            for i, row in enumerate(g):
                key = name if len(g) == 1 else f"{name}.{m.names[i] if m.names else i}"
                stats[key] = [row.mean().item(), row.min().item(), row.max().item()]
    return stats


def fed_vectors(model):
    """{map: (its module, the ScaleVectors declared on its columns)} for every linear map that a
    vector feeds, as the vectors declare it (GPT.vector_sites): q|k|v, gate|up, the experts, the
    router, the head. These are the maps whose folded weight W diag(g) the vectors precondition
    (paper 2.2), and g is the product of every vector on the map's columns. A model without
    vectors is measured on the maps its vectors would feed."""
    twin = model
    if not model.config.scale_vectors:   # the same model with vectors, on no memory
        with torch.device("meta"):
            twin = GPT(replace(model.config, scale_vectors=True))
    sites, modules = model.vector_sites(), dict(model.named_modules())
    fed = dict.fromkeys(w for s in twin.vector_sites().values() for w, side in s
                        if side == "columns")
    return {w.removesuffix(".weight"): (modules[w.removesuffix(".weight")], [
        modules[v] for v, s in sites.items() if (w, "columns") in s]) for w in fed}


def fed_g(svs, d, g_of):
    """The product of g_of(sv) over the vectors, an entry over d / width columns (one per head), as
    (1 or blocks, d); None for no vector."""
    out = None
    for sv in svs:
        g = g_of(sv).repeat_interleave(d // sv.width, -1)
        out = g if out is None else out * g
    return out


def sgd_g(sv, lr):
    """sv's g in float64 after a plain SGD step of lr on its raw parameters (lr 0: g as it is)."""
    raw = {n: getattr(sv, n) for n in sv.reparam.params}
    return sv.reparam.g({n: p.double() - lr * p.grad.double() if lr and p.grad is not None
                         else p.double() for n, p in raw.items()}, sv.eps)


def blocks(m, W):
    """W as (branches, rows, in): a ScaledLinear's row block per branch, or one for the head."""
    return W.reshape(getattr(m, "n_blocks", 1), -1, W.size(-1)).float()


@torch.no_grad()
def fed_maps(model):
    """{map: (W as (blocks, rows, d_in), g as (1 or blocks, d_in) or None)}, copies (a plain g is
    the parameter itself, which the step changes in place), for every map of fed_vectors."""
    out = {}
    for name, (m, svs) in fed_vectors(model).items():
        g = fed_g(svs, m.weight.size(-1), lambda sv: sv().float())
        out[name] = (blocks(m, m.weight).clone(), g.clone() if g is not None else None)
    return out


@torch.no_grad()
def sgd_ratios(model, lr):
    """Between backward and the optimizer step: per map and column j, what a plain SGD step of `lr`
    on W and on g's raw parameters would move the folded column W'_j = g_j W_j by, over the folded
    model's own step, lr ||dL/dW_j|| / g_j (the paper: g_j^2, plus what the step of g adds).
    {map: (blocks, d_in)}; a map without a vector or a gradient is left out."""
    out = {}
    for name, (m, svs) in fed_vectors(model).items():
        if not svs or m.weight.grad is None:
            continue
        # in float64: the step is a small difference of large numbers
        W, dW = blocks(m, m.weight).double(), blocks(m, m.weight.grad).double()
        g = fed_g(svs, W.size(-1), lambda sv: sgd_g(sv, 0.0))
        g1 = fed_g(svs, W.size(-1), lambda sv: sgd_g(sv, lr))
        # (W - lr dW) diag(g1) - W diag(g), per column
        moved = (W * (g1 - g).unsqueeze(1) - lr * dW * g1.unsqueeze(1)).norm(dim=1)
        own = lr * dW.norm(dim=1) / g.expand_as(moved)
        out[name] = (moved / own.clamp(min=1e-300)).float()
    return out


@torch.no_grad()
def preconditioning(model, before=None, sgd=None):
    """Per map of fed_maps(model): the spread of g ([std, min, max, 10%, 50%, 90%]) and the
    correlation over columns j of g_j with ||W[:, j]|| and with ||W'[:, j]||, W' = W diag(g). With
    `before` (fed_maps() one optimizer step earlier), log-log fits of the column updates on g_j:
    `update_exp`, the exponent p of ||dW'[:, j]|| ~ g_j^p; `adamw_exp`, that of ||dW'[:, j]|| over
    the folded model's own step ||dW[:, j]|| (prediction: 1, Adam normalizes each entry); and
    `update_cv`, their std / mean. With `sgd` (sgd_ratios() before that step): `sgd_exp`, the
    exponent of its ratio (prediction: 2, the paper's g_j^2)."""
    out = {}
    for name, (W, g) in fed_maps(model).items():
        g = torch.ones(1, W.size(-1), device=W.device) if g is None else g
        g = g.expand(W.size(0), -1)                            # (blocks, d_in)
        col = W.norm(dim=1)                                    # ||W[:, j]|| per block
        q = torch.quantile(g.flatten(), torch.tensor([0.1, 0.5, 0.9], device=g.device))
        stats = {"g": [g.std().item(), g.min().item(), g.max().item(), *q.tolist()]}
        stats["corr_w"], stats["corr_wg"] = corr(g, col), corr(g, col * g)
        if before is not None:
            W0, g0 = before[name]
            g0 = torch.ones_like(g) if g0 is None else g0.expand_as(g)
            dcol = (W * g.unsqueeze(1) - W0 * g0.unsqueeze(1)).norm(dim=1)
            own = (W - W0).norm(dim=1)
            stats["update_cv"] = (dcol.std() / dcol.mean()).item()
            stats["update_exp"] = slope(g0.log(), log(dcol))
            stats["adamw_exp"] = slope(g0.log(), log(dcol) - log(own))
        if sgd is not None and name in sgd:
            stats["sgd_exp"] = slope(g0.log() if before is not None else g.log(), log(sgd[name]))
        out[name] = stats
    return out


def log(x):
    return x.clamp(min=1e-30).log()


def corr(a, b):
    """Pearson's correlation of two tensors' entries; None where either is constant up to float32
    rounding (g at init, columns of one norm)."""
    a, b = a.flatten().double(), b.flatten().double()
    if min(x.std() / x.abs().mean().clamp(min=1e-30) for x in (a, b)) < 1e-6:
        return None
    a, b = a - a.mean(), b - b.mean()
    return ((a @ b) / (a.norm() * b.norm())).item()


def slope(x, y):
    """The least-squares slope of y on x; None where x is constant (spread below 1e-6)."""
    x, y = x.flatten().double(), y.flatten().double()
    if x.std() < 1e-6:
        return None
    x = x - x.mean()
    return ((x @ (y - y.mean())) / (x @ x)).item()


# ---- the run's log: metrics.jsonl, and wandb -------------------------------------------------

class RunLog:
    """out_dir/metrics.jsonl, a JSON record per line, and Weights & Biases when a config is given
    (as in nanoGPT, its files in out_dir, and a resumed run continues its wandb run `wandb_id`).
    resume_at is a resumed run's step, after which what the interrupted run logged is dropped."""

    def __init__(self, out_dir, resume_at=None, wandb_config=None, wandb_id=None):
        path, self.out_dir, self.wandb = os.path.join(out_dir, "metrics.jsonl"), out_dir, None
        if resume_at is not None:
            trim_metrics(path, resume_at)
        self.file = open(path, "a")
        if wandb_config:
            import wandb
            name = wandb_config["wandb_run_name"] or os.path.basename(os.path.normpath(out_dir))
            self.wandb = wandb.init(project=wandb_config["wandb_project"], id=wandb_id, name=name,
                                    config=wandb_config, resume="allow", dir=out_dir)

    def log(self, record=None, durable=False):
        """Append a record; durable=True: fsync, as before a checkpoint (a resume trims to it)."""
        try:
            self.file.write(json.dumps(record) + "\n" if record else "")
            self.file.flush()
            if durable:
                os.fsync(self.file.fileno())
        except OSError as e:   # a full disk: what the last checkpoint is
            raise checkpoint.CheckpointError(f"cannot write {self.file.name} ({e.strerror}); "
                                             f"{checkpoint.last_good(self.out_dir)}") from None
        if self.wandb and record:
            self.wandb.log({f"{record['kind']}/{k}": v for k, v in scalars(record).items()},
                           step=record["iter"])


def scalars(record, prefix=""):
    """A record's numbers, nested keys joined by '/' (what wandb plots)."""
    items = record.items() if isinstance(record, dict) else enumerate(record)
    return {k: v for key, x in items for k, v in (
        scalars(x, f"{prefix}{key}/").items() if isinstance(x, (dict, list)) else
        [(f"{prefix}{key}", x)] if isinstance(x, (int, float)) and not isinstance(x, bool) else [])}


def read_metrics(path):
    """The records of a metrics.jsonl, and how many lines did not parse (torn by a kill)."""
    records, torn = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                torn += 1
    return records, torn


def trim_metrics(path, iter_num):
    """On resume, drop what was logged after the checkpoint and any torn line (atomically)."""
    records, torn = read_metrics(path) if os.path.exists(path) else ([], 0)
    kept = [r for r in records if isinstance(r, dict) and isinstance(r.get("iter"), (int, float))
            and r["iter"] <= iter_num]
    if torn:
        print(f"note: dropped {torn} line(s) of {path} that did not parse (a write cut short)")
    if len(kept) < len(records) + torn:
        text = "".join(json.dumps(r) + "\n" for r in kept)
        checkpoint.atomic_write(path, lambda f: f.write(text.encode()))


def describe(path, state):
    """One line on a checkpoint for sample.py, from the run's log beside it: its step and the
    validation loss its weights had (best_val_loss is the best up to the checkpoint; one saved on a
    stop signal between evaluations says which evaluation came last)."""
    it, best = state["iter_num"], state["best_val_loss"]
    metrics = os.path.join(os.path.dirname(path), "metrics.jsonl")
    evals = [r for r in (read_metrics(metrics)[0] if os.path.isfile(metrics) else [])
             if isinstance(r, dict) and r.get("kind") == "eval" and isinstance(r.get("iter"), int)
             and isinstance(r.get("val_loss"), (int, float)) and r["iter"] <= it]
    if not evals:   # a checkpoint copied without its metrics.jsonl
        return f"{path} (iteration {it}, best val loss {best:.4f} of the evaluations up to it)"
    last = max(evals, key=lambda r: r["iter"])   # by iteration, not by its place in the log
    if last["iter"] == it:
        return f"{path} (iteration {it}, val loss {last['val_loss']:.4f}, best {best:.4f})"
    return (f"{path} (iteration {it}, saved between evaluations: none since step {last['iter']}'s, "
            f"val loss {last['val_loss']:.4f})")


# Peak dense bf16 FLOP/s (no sparsity) of common GPUs, for MFU. Their TF32 peak, which float32 runs
# get (train.py allows TF32 matmuls), is half of it on every GPU of the table (Ampere, Ada, Hopper).
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L4": 121e12,
                  "4090": 165e12}


def peak_flops(device, dtype=torch.bfloat16):
    """Peak FLOP/s of `device` for matmuls in `dtype` (bf16/fp16, or fp32 through TF32), for MFU;
    None where it is not known: a CPU (its peak depends on the cores free and the instructions
    used), a GPU not in the table, or float64."""
    if device.type != "cuda" or dtype == torch.float64:
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)
    if peak is None or dtype in (torch.bfloat16, torch.float16):
        return peak
    return peak / 2
