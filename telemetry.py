"""
What train.py logs of the scale vectors at every evaluation: each effective vector's size
(vector_stats) and the paper's mechanism, measured (preconditioning: section 2.2, DESIGN.md
"Preconditioning, measured"). An Input-Norm vector g adds no function, W (g * z) = W' z with the
folded map W' = W diag(g), but it changes how W' trains: one step moves its column j by a factor
that grows with g_j (g_j^2 for SGD, about g_j under AdamW).
"""
import torch

from model import MoE, ScaledLinear, ScaleVector


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


@torch.no_grad()
def fed_maps(model):
    """{map: (W as (blocks, rows, d_in), g as (1 or blocks, d_in) or None)}, copies, for every
    linear map fed by Norm(x) (qkv, gate|up, the experts, the router, the head), g the Input-Norm
    vector that meets its input (None without scale vectors): the maps whose folded weight
    W diag(g) the vector preconditions."""
    shared = {f"{n}.{s}": m.g_in for n, m in model.named_modules()   # an MoE's g_ffn
              if isinstance(m, MoE) and m.g_in is not None
              for s in ("router", "experts", "shared.gate_up")}
    shared["head"] = model.g_final
    maps = {}
    for name, m in model.named_modules():
        if isinstance(m, ScaledLinear):
            sv = m.g_in or shared.get(name)
            maps[name] = (m.weight.reshape(m.n_blocks, -1, m.weight.size(-1)).float().clone(),
                          sv().float() if sv is not None else None)
    return maps


@torch.no_grad()
def preconditioning(model, before=None):
    """Per map of fed_maps(model): the spread of g ([std, min, max, 10%, 50%, 90%]); the
    correlation over columns j of g_j with ||W[:, j]|| and with ||W'[:, j]||, W' = W diag(g); with
    `before` (fed_maps() one optimizer step earlier): `update_exp`, the exponent p of
    ||dW'[:, j]|| ~ g_j^p (a log-log fit), `update_corr` the correlation of log g_j with
    log ||dW'[:, j]||, and `update_cv` the spread of the column updates (std / mean)."""
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
            log_d = dcol.clamp(min=1e-30).log()
            stats["update_cv"] = (dcol.std() / dcol.mean()).item()
            stats["update_exp"] = slope(g.log(), log_d)
            stats["update_corr"] = corr(g.log(), log_d)
        out[name] = stats
    return out


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
