"""
What train.py logs of the scale vectors at every evaluation: each effective vector's size
(vector_stats) and the paper's mechanism, measured (preconditioning: section 2.2, DESIGN.md
"Preconditioning, measured"). An Input-Norm vector g adds no function, W (g * z) = W' z with the
folded map W' = W diag(g), but it changes how W' trains: one step moves column j of W' by
g_j^2 times what the folded model's own step would (SGD), by g_j times it under AdamW (which
normalizes each entry's step), plus what the step of g itself adds.
"""
import torch

from model import REPARAMS, MoE, ScaledLinear, ScaleVector


@torch.no_grad()
def vector_stats(model):
    """{name: [mean, min, max]} of every effective scale vector (after OR / ER), one entry per
    row/branch."""
    stats = {}
    for name, m in model.named_modules():
        if isinstance(m, ScaleVector):
            g = m().float()
            for i, row in enumerate(g):
                if len(g) == 1:
                    key = name
                else:
                    key = f"{name}.{m.names[i]}" if m.names else f"{name}.{i}"
                stats[key] = [row.mean().item(), row.min().item(), row.max().item()]
    return stats


def fed_vectors(model):
    """{map: (its ScaledLinear, the ScaleVector that meets its input or None)} for every linear map
    fed by Norm(x) (qkv, gate|up, the experts, the router, the head): the maps whose folded weight
    W diag(g) the vector preconditions."""
    shared = {f"{n}.{s}": m.g_in for n, m in model.named_modules()   # an MoE's g_ffn
              if isinstance(m, MoE) and m.g_in is not None
              for s in ("router", "experts", "shared.gate_up")}
    shared["head"] = model.g_final
    return {name: (m, m.g_in or shared.get(name)) for name, m in model.named_modules()
            if isinstance(m, ScaledLinear)}


def blocks(m, W):
    return W.reshape(m.n_blocks, -1, W.size(-1)).float()   # (out, in) -> (blocks, rows, in)


@torch.no_grad()
def fed_maps(model):
    """{map: (W as (blocks, rows, d_in), g as (1 or blocks, d_in) or None)}, copies (a plain g is
    the parameter itself, which the step changes in place), for every map of fed_vectors."""
    return {name: (blocks(m, m.weight).clone(), sv().float().clone() if sv is not None else None)
            for name, (m, sv) in fed_vectors(model).items()}


@torch.no_grad()
def sgd_ratios(model, lr):
    """Called between backward and the optimizer step: per map, per column j, what a plain SGD step
    of `lr` on W and on g's raw parameters would move the folded column W'_j = g_j W_j by, over
    what the folded model's own SGD step would, lr ||dL/dW'_j|| = lr ||dL/dW_j|| / g_j; the paper's
    law says g_j^2 (the step of g adds the rest). {map: (blocks, d_in)}; a map without a vector or
    a gradient is left out."""
    out = {}
    for name, (m, sv) in fed_vectors(model).items():
        if sv is None or m.weight.grad is None:
            continue
        # in float64: the step is a small difference of large numbers
        W, dW = blocks(m, m.weight).double(), blocks(m, m.weight.grad).double()
        raw = {n: getattr(sv, n) for n in REPARAMS[sv.reparam].params}
        stepped = {n: p.double() - lr * p.grad.double() if p.grad is not None else p.double()
                   for n, p in raw.items()}
        g = REPARAMS[sv.reparam].g({n: p.double() for n, p in raw.items()}, sv.eps)
        g1 = REPARAMS[sv.reparam].g(stepped, sv.eps)
        # (W - lr dW) diag(g1) - W diag(g), per column
        moved = (W * (g1 - g).unsqueeze(1) - lr * dW * g1.unsqueeze(1)).norm(dim=1)
        own = lr * dW.norm(dim=1) / g.expand_as(moved)
        out[name] = (moved / own.clamp(min=1e-300)).float()
    return out


@torch.no_grad()
def preconditioning(model, before=None, sgd=None):
    """Per map of fed_maps(model): the spread of g ([std, min, max, 10%, 50%, 90%]); the
    correlation over columns j of g_j with ||W[:, j]|| and with ||W'[:, j]||, W' = W diag(g). With
    `before` (fed_maps() one optimizer step earlier): `update_exp`, the exponent p of
    ||dW'[:, j]|| ~ g_j^p (a log-log fit); `adamw_exp`, the same exponent of ||dW'[:, j]|| over the
    folded model's own step, ||dW[:, j]|| (Adam normalizes each entry, so a column's scale does not
    change its step; prediction: 1); and `update_cv`, the spread of the column updates
    (std / mean). With `sgd` (sgd_ratios() before that step): `sgd_exp`, the exponent of its ratio
    (prediction: 2, the paper's g_j^2)."""
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
