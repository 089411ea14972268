"""
A short Pre-Norm GPT in the Llama style (RMSNorm, RoPE, SwiGLU, no biases) with a
flag for each scale-vector variant of arXiv:2605.26895, "Negligible in Size,
Significant in Effect: On Scale Vectors in Large Language Models".
The definitions live in ../shared/design/scale_vectors.md ("design" below).

Notation: Norm(x) = x / sqrt(mean(x^2) + eps) has no parameter; a scale vector g
multiplies it: g * Norm(x). Every variant is made of three pieces:
  ScaleVector   a learnable vector, plain or reparameterized (OR / ER), of kind
                "input" (it can fold into an adjacent linear map) or "output";
  ScaledLinear  a linear map fed by Norm(x): y = u * W(v * Norm(x)), computed as
                (W * u v^T) Norm(x) once per step instead of per token;
  OutputNorm    g * Norm(x) where no linear map follows (qk_norm, post_norm).
An optional Mixture-of-Experts FFN (MoE) is built from the same pieces.
"""
import math
import time
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257      # the tokenizer's; the embedding is padded to a multiple of vocab_pad
    vocab_pad: int = 64          # rows rounded up for fast matmuls; padded ids are never sampled
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_hidden: int = 0          # 0: 8/3 * n_embd rounded up to a multiple of 32 (Llama: as many weights as a 4x GELU MLP)
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # scale vectors: one flag per variant (design page)
    scale_vectors: bool = True   # False: every norm is parameter-free (paper Fig. 1 ablation)
    sv_hetero: bool = False      # HG, paper 3.1: one vector per branch (q, k, v; gate, up)
    sv_placement: str = "pre"    # "pre" | "dp" | "dnp", paper 3.2
    sv_reparam: str = "none"     # "none" | "or" | "er", paper 3.3
    qk_norm: bool = False        # g_q * Norm(q), g_k * Norm(k) per head (Output-Norm)
    post_norm: bool = False      # x + g_post * Norm(branch) (Output-Norm)
    # Mixture-of-Experts FFN in place of the dense SwiGLU (class MoE); n_experts=0: dense
    n_experts: int = 0           # routed experts per MoE layer
    n_experts_active: int = 2    # top-k routed experts per token
    n_shared_experts: int = 0    # experts every token goes through
    moe_hidden: int = 0          # each expert's SwiGLU width; 0: hidden / (k + shared), rounded up to 32 (dense's active size)
    moe_dense_layers: int = 0    # the first N layers keep the dense SwiGLU (1: "all but the first")
    moe_router: str = "softmax"  # "softmax" | "sigmoid" scores; k > 1 gates are renormalized to sum to 1
    moe_balance: str = "bias"    # "bias": DeepSeek-V3's expert bias (GPT.update_expert_bias) | "aux": Switch's loss
    moe_bias_rate: float = 1e-3  # expert-bias step per update
    moe_aux_weight: float = 0.01  # weight of the auxiliary loss (moe_balance="aux")

    def __post_init__(self):
        def check(ok, msg):
            if not ok:
                raise ValueError(f"GPTConfig: {msg}")
        check(self.sv_placement in ("pre", "dp", "dnp"), f"sv_placement must be 'pre', 'dp' or 'dnp', not {self.sv_placement!r}")
        check(self.sv_reparam in ("none", "or", "er"), f"sv_reparam must be 'none', 'or' or 'er', not {self.sv_reparam!r}")
        if not self.scale_vectors:
            for flag, off in (("sv_hetero", False), ("sv_placement", "pre"), ("sv_reparam", "none")):
                check(getattr(self, flag) == off, f"{flag}={getattr(self, flag)!r} needs scale_vectors=True (there is no vector to vary)")
        check(not (self.qk_norm and self.sv_placement == "dnp"),
              "qk_norm=True with sv_placement='dnp' is redundant: DNP already puts a norm and a vector on q and k")
        check(self.n_embd % self.n_head == 0 and (self.n_embd // self.n_head) % 2 == 0,
              "n_embd must be a multiple of n_head with an even head size (RoPE rotates pairs)")
        check(self.n_experts >= 0, f"n_experts must be >= 0 (0: dense), not {self.n_experts}")
        if self.n_experts:
            check(1 <= self.n_experts_active <= self.n_experts,
                  f"n_experts_active must be between 1 and n_experts={self.n_experts}, not {self.n_experts_active}")
            check(self.n_shared_experts >= 0, f"n_shared_experts must be >= 0, not {self.n_shared_experts}")
            check(self.moe_hidden >= 0, f"moe_hidden must be >= 0 (0: automatic), not {self.moe_hidden}")
            check(0 <= self.moe_dense_layers < self.n_layer,
                  f"moe_dense_layers must be between 0 and n_layer-1={self.n_layer - 1} (some layer must be MoE), not {self.moe_dense_layers}")
            check(self.moe_router in ("softmax", "sigmoid"), f"moe_router must be 'softmax' or 'sigmoid', not {self.moe_router!r}")
            check(self.moe_balance in ("bias", "aux"), f"moe_balance must be 'bias' or 'aux', not {self.moe_balance!r}")
            check(self.moe_bias_rate >= 0 and self.moe_aux_weight >= 0, "moe_bias_rate and moe_aux_weight must be >= 0")

    @property
    def hidden(self):
        return self.mlp_hidden or 32 * math.ceil(8 * self.n_embd / 3 / 32)

    @property
    def expert_hidden(self):
        return self.moe_hidden or 32 * math.ceil(self.hidden / (self.n_experts_active + self.n_shared_experts) / 32)

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)


def _rms_inverse(x, eps):
    """r = 1 / sqrt(mean(x^2) + eps) over the last dimension, shape (..., 1), in float32 (float64 for float64).
    vector_norm reads x once and accumulates in float32; x.pow(2).mean() is many times slower on a CPU in bf16."""
    ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True).to(torch.promote_types(x.dtype, torch.float32)).square() / x.size(-1)
    return torch.rsqrt(ms + eps)


def _mean(x):
    """mean over the last dimension, kept: sum / d (a bf16 mean() on a CPU is several times slower than sum())."""
    return x.sum(-1, keepdim=True) / x.size(-1)


class _Norm(torch.autograd.Function):
    """y = x / sqrt(mean(x^2) + eps), with the backward written out: dx = r * (dy - y * mean(dy * y)),
    r = 1 / sqrt(mean(x^2) + eps). Twice as fast as F.rms_norm's backward on a CPU (a chain of small ops)."""

    @staticmethod
    def forward(ctx, x, eps):
        r = _rms_inverse(x, eps)
        y = (x * r).to(x.dtype)
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, r = ctx.saved_tensors
        return torch.addcmul(dy, y, _mean(dy * y), value=-1).mul_(r).to(dy.dtype), None


def norm(x, eps):
    """Norm(x): RMS normalization over the last dimension, no parameter."""
    return _Norm.apply(x, eps)


class _ScaledNorm(torch.autograd.Function):
    """out = u * Norm(y) over the last dimension (DNP's g_a, paper 3.2), u broadcast over y's leading dims.
    It keeps only its output, which the next operation keeps anyway (attention keeps v, a view of the
    same qkv tensor; SwiGLU keeps gate|up), and recovers Norm(y) = out / u in the backward, as In-Place
    ABN does (Rota Bulo et al., 2018): so DNP costs no activation memory. (An entry of u that is exactly
    0 would lose its gradient; a trained u never lands on exactly 0.) The small factors r and u are cast
    to y's dtype so that every full-size operation runs in it (bf16 under autocast: half the traffic)."""

    @staticmethod
    def forward(ctx, y, u, eps):
        ctx.u_dtype = u.dtype
        r, u = _rms_inverse(y, eps).to(y.dtype), u.to(y.dtype)
        out = (y * r).mul_(u)
        ctx.save_for_backward(out, u, r)
        return out

    @staticmethod
    def backward(ctx, dout):
        # with n = Norm(y) = out / u and dn = dout * u:  du = sum(dout * n),  dy = r * (dn - n * mean(dn * n)),
        # written with out instead of n (one full-size pass fewer each):  dout * n = (dout * out) / u
        out, u, r = ctx.saved_tensors
        inv_u = 1 / torch.where(u == 0, 1, u)
        d = dout * out
        du = (d.sum_to_size(u.shape) * inv_u).to(ctx.u_dtype)
        m = _mean(d)                                                  # mean(dn * n) = mean(dout * out)
        return torch.mul(dout, u).addcmul_(out, m * inv_u, value=-1).mul_(r), du, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up from the fused projection gate|up. It keeps only gate|up for the backward; autograd
    would keep gate, silu(gate) and up."""

    @staticmethod
    def forward(ctx, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        ctx.save_for_backward(gate_up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors[0].chunk(2, dim=-1)
        return torch.cat((torch.ops.aten.silu_backward(dh * up, gate), dh * F.silu(gate)), dim=-1)


def swiglu(gate_up):
    """silu(gate) * up, the SwiGLU product (Shazeer 2020), from gate|up concatenated on the last dimension."""
    return _SwiGLU.apply(gate_up)


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits (N, V) against targets (N,), ignoring -1, in float32 one chunk of rows
    at a time. It keeps only the logits and one log-sum-exp per row for the backward, where F.cross_entropy
    on logits.float() keeps two float32 copies of them (0.4 GB each for 2048 tokens of a 50k vocabulary)."""

    @staticmethod
    def forward(ctx, logits, targets, rows):
        valid, t = targets >= 0, targets.clamp(min=0).unsqueeze(1)
        ctx.rows, ctx.acc = rows, torch.promote_types(logits.dtype, torch.float32)
        lse = torch.cat([torch.logsumexp(chunk.to(ctx.acc), dim=-1) for chunk in logits.split(rows)])
        ctx.save_for_backward(logits, t, lse, valid)
        return ((lse - logits.gather(1, t).squeeze(1).to(ctx.acc)) * valid).sum() / valid.sum()

    @staticmethod
    def backward(ctx, g):
        logits, t, lse, valid = ctx.saved_tensors
        scale = valid * g / valid.sum()   # d loss / d logits = (softmax - one_hot(target)) * scale, row by row
        grad = torch.empty_like(logits)
        for s in range(0, len(logits), ctx.rows):
            rows = slice(s, s + ctx.rows)
            p = (logits[rows].to(ctx.acc) - lse[rows, None]).exp_()
            p.scatter_add_(1, t[rows], torch.full(t[rows].shape, -1.0, dtype=p.dtype, device=p.device))
            grad[rows] = p.mul_(scale[rows, None])
        return grad, None, None


def cross_entropy(logits, targets, rows=None):
    """Mean cross-entropy over the targets that are not -1. Chunks of 2M logits on a CPU: malloc reuses
    blocks that small, while a fresh large one is page-faulted in on every step (3x slower at 124M);
    elsewhere chunks of 64M, for few kernel launches."""
    rows = rows or max(1, (2**21 if logits.device.type == "cpu" else 2**26) // logits.size(-1))
    return _CrossEntropy.apply(logits, targets, rows)


class ScaleVector(nn.Module):
    """`rows` learnable vectors of length d, each 1 at init (paper: "scale vectors initialised to 1").
    kind "input": it folds into an adjacent linear map (decayed under IWD); "output": it cannot."""

    def __init__(self, rows, d, kind, reparam, names=None):
        super().__init__()
        self.kind, self.reparam, self.names = kind, reparam, names
        if reparam == "none":
            self.g = nn.Parameter(torch.ones(rows, d))
        elif reparam == "or":   # paper 3.3, OR: g = beta * Norm(alpha); beta = 1, alpha = 1 at init
            self.alpha = nn.Parameter(torch.ones(rows, d))
            self.beta = nn.Parameter(torch.ones(rows, 1))
        else:                   # paper 3.3, ER: g = exp(beta) * exp(alpha - mean(alpha)); both 0 at init
            self.alpha = nn.Parameter(torch.zeros(rows, d))
            self.beta = nn.Parameter(torch.zeros(rows, 1))

    def forward(self):
        """The effective vectors g, shape (rows, d)."""
        if self.reparam == "or":
            return self.beta * F.rms_norm(self.alpha, (self.alpha.size(-1),))
        if self.reparam == "er":
            return torch.exp(self.beta + self.alpha - self.alpha.mean(-1, keepdim=True))
        return self.g


class ScaledLinear(nn.Module):
    """A (possibly fused) linear map fed by Norm(x), with the scale vectors that meet it.
    The weight has `n_split` equal row blocks (q, k, v or gate, up), times `n_expert` for MoE.
      v: input side (the Input-Norm vector): one shared row, or one row per block under HG;
      u: output side, one row per block: DP folds it into W's rows, DNP applies u * Norm(.).
    Design, unified view: W -> diag(u) W diag(v) = W * (u v^T), computed once per step."""

    def __init__(self, d_in, d_out, cfg, n_split=1, names=None, dual=True, own_v=True, n_expert=0, group=0):
        super().__init__()
        lead = (n_expert,) if n_expert else ()
        self.weight = nn.Parameter(torch.empty(*lead, d_out, d_in))   # initialized by GPT._init_weights
        self.n_blocks, self.eps = max(n_expert, 1) * n_split, cfg.norm_eps
        names = names if n_split > 1 else None
        if n_expert and names:   # one row per expert and branch: "3.gate"
            names = tuple(f"{e}.{n}" for e in range(n_expert) for n in names)
        self.n_expert = n_expert
        sv = cfg.scale_vectors
        rows_v = self.n_blocks if cfg.sv_hetero else 1   # paper 3.1, HG: a vector per branch
        self.v = ScaleVector(rows_v, d_in, "input", cfg.sv_reparam, names) if sv and own_v else None
        self.placement = cfg.sv_placement if sv and dual else "pre"
        # paper 3.2: DP's u folds into the rows of W (an input kind); DNP's u sits after a Norm (an output kind)
        kind = "input" if self.placement == "dp" else "output"
        self.u = ScaleVector(self.n_blocks, d_out // n_split, kind, cfg.sv_reparam, names) if self.placement != "pre" else None
        self.group = group or d_out // n_split   # DNP normalizes groups of this size (a head, or a branch)

    def effective_weight(self, v=None):
        """W * (u v^T). `v` is passed in when the Input-Norm vector is shared by several maps (MoE)."""
        W = self.weight
        v = self.v() if self.v is not None else v
        u = self.u() if self.placement == "dp" else None
        if u is None and (v is None or len(v) == 1):
            return W if v is None else W * v               # one shared vector: W diag(g), paper 2.2
        Wb = W.reshape(self.n_blocks, -1, W.size(-1))      # (blocks, rows, d_in): a block per branch
        if v is not None:
            Wb = Wb * v.unsqueeze(1)                       # paper 3.1, HG: W_i diag(g_i) for branch i
        if u is not None:
            Wb = Wb * u.unsqueeze(2)                       # paper 3.2, DP: diag(g_a) W diag(g_b)
        return Wb.view_as(W)

    def forward(self, z, v=None):
        return self.dnp(F.linear(z, self.effective_weight(v)))

    def dnp(self, y, expert=None):
        """Paper 3.2, DNP: g_a * Norm(W(g_b * Norm(x))) per group of outputs; nothing otherwise.
        MoE: y comes from `expert` (an index, or one per row of y), whose rows of g_a apply."""
        if self.placement != "dnp":
            return y
        u = self.u().view(self.n_expert or 1, -1, self.group)[0 if expert is None else expert]
        return _ScaledNorm.apply(y.unflatten(-1, (-1, self.group)), u, self.eps).flatten(-2)


class OutputNorm(nn.Module):
    """g * Norm(x) where no linear map follows, so g cannot fold (an Output-Norm, paper 2.2).
    Parameter-free when scale_vectors=False."""

    def __init__(self, d, cfg):
        super().__init__()
        self.eps = cfg.norm_eps
        self.g = ScaleVector(1, d, "output", cfg.sv_reparam) if cfg.scale_vectors else None

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.g().view(-1) if self.g is not None else None, self.eps)


def rope_table(cfg):
    """e^(i t theta_j) for position t and pair j of a head, shaped to broadcast over (B, T, q|k, H, hd/2)."""
    hd = cfg.n_embd // cfg.n_head
    freqs = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    angles = torch.outer(torch.arange(cfg.block_size, dtype=torch.float32), freqs)   # (T, hd/2)
    return torch.polar(torch.ones_like(angles), angles)[:, None, None, :]


def apply_rope(x, rope):
    """RoPE: rotate each pair of adjacent channels (a complex number) by a position-dependent angle.
    x: (B, T, ..., hd), here q and k together; one complex multiply is the cheapest form on a CPU."""
    z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(z * rope[: x.size(1)]).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.hd = cfg.n_head, cfg.n_embd // cfg.n_head
        d = cfg.n_embd
        # fused q, k, v; g_attn (or g_q, g_k, g_v under HG) is folded into the weight; DNP normalizes per head
        self.qkv = ScaledLinear(d, 3 * d, cfg, n_split=3, names=("q", "k", "v"), group=self.hd)
        self.proj = nn.Linear(d, d, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:   # Gemma 3 / Qwen3: one head-sized vector shared by the heads
            self.q_norm, self.k_norm = OutputNorm(self.hd, cfg), OutputNorm(self.hd, cfg)

    def forward(self, xn, rope):
        B, T, C = xn.shape
        qkv = self.qkv(xn).view(B, T, 3, self.n_head, self.hd)
        qk, v = qkv.split((2, 1), dim=2)   # split, not slicing: its backward is one concatenation
        if self.qk_norm:
            qk = torch.stack((self.q_norm(qk[:, :, 0]), self.k_norm(qk[:, :, 1])), dim=2)
        q, k = apply_rope(qk, rope).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.squeeze(2).transpose(1, 2), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, cfg, hidden, own_v=True):
        super().__init__()
        # fused gate and up; g_ffn (or g_gate, g_up under HG) folded in; DNP normalizes each branch
        self.gate_up = ScaledLinear(cfg.n_embd, 2 * hidden, cfg, n_split=2, names=("gate", "up"), own_v=own_v)
        self.down = nn.Linear(hidden, cfg.n_embd, bias=False)

    def forward(self, xn, v=None):
        return self.down(swiglu(self.gate_up(xn, v)))


class MoE(nn.Module):
    """Mixture-of-Experts FFN: each token goes through the top-k of E routed SwiGLU experts, weighted by
    gates renormalized to sum to 1 (k > 1), plus the shared experts; no token is dropped. Router in fp32.
    Balance: DeepSeek-V3's expert bias (it changes which experts are chosen, not the gates; updated by
    GPT.update_expert_bias) or the Switch Transformer's auxiliary loss (self.aux_loss, added by GPT).
    Scale vectors: one Input-Norm vector g_ffn shared by router and experts; under HG the router and
    every expert's gate and up own theirs (design page); DP and DNP apply per expert.
    The experts' weights are stacked (E, ...) tensors, so an expert that gets no token still takes part
    in autograd (a zero gradient) and DDP needs no find_unused_parameters."""

    def __init__(self, cfg):
        super().__init__()
        d, E, h, hg = cfg.n_embd, cfg.n_experts, cfg.expert_hidden, cfg.sv_hetero
        self.E, self.k, self.router_fn, self.balance = E, cfg.n_experts_active, cfg.moe_router, cfg.moe_balance
        self.v = ScaleVector(1, d, "input", cfg.sv_reparam) if cfg.scale_vectors and not hg else None
        self.router = ScaledLinear(d, E, cfg, dual=False, own_v=hg)
        self.experts = ScaledLinear(d, 2 * h, cfg, n_split=2, names=("gate", "up"), n_expert=E, own_v=hg)
        self.down = nn.Parameter(torch.empty(E, d, h))   # (E, d, h), initialized by GPT._init_weights
        self.shared = SwiGLU(cfg, cfg.n_shared_experts * h, own_v=hg) if cfg.n_shared_experts else None
        self.register_buffer("expert_bias", torch.zeros(E))   # checkpointed with the weights
        # assignments per expert since the last update: not a buffer, DDP would overwrite it with rank 0's
        self.load, self.last_load, self.aux_loss = None, None, None
        self.impl = None   # "loop" | "grouped" (torch._grouped_mm); None: grouped on CUDA in bf16, else loop

    def route(self, x):
        """x (N, d) -> expert ids (N, k), gates (N, k) that sum to 1 (k > 1), scores (N, E); all in fp32."""
        with torch.autocast(x.device.type, enabled=False):
            W = self.router.effective_weight(self.v() if self.v is not None else None)
            logits = F.linear(x.float(), W.float())
        scores = logits.softmax(-1) if self.router_fn == "softmax" else logits.sigmoid()
        ids = torch.topk(scores + self.expert_bias.float(), self.k, dim=-1).indices   # the bias only chooses
        gates = scores.gather(-1, ids)   # top-1 keeps its score (Switch): a gate fixed to 1 would not train the router
        return ids, gates / gates.sum(-1, keepdim=True) if self.k > 1 else gates, scores

    def forward(self, xn):
        x = xn.reshape(-1, xn.size(-1))
        N, k, E = x.size(0), self.k, self.E
        ids, gates, scores = self.route(x)
        v = self.v() if self.v is not None else None
        flat = ids.flatten()                           # N * k assignments, token-major
        order = flat.argsort(stable=True)              # sorted by expert
        counts = flat.new_zeros(E).scatter_add_(0, flat, torch.ones_like(flat))   # tokens per expert (bincount, static shape)
        xs, expert = x[order // k], flat[order]        # rows in expert order, and their experts
        W = self.experts.effective_weight(v)           # (E, 2h, d): W * (u v^T) per expert
        dev = x.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        impl = self.impl or ("grouped" if x.is_cuda and dt == torch.bfloat16 and hasattr(torch, "_grouped_mm") else "loop")
        if impl == "grouped":   # one grouped GEMM per projection; the groups are the experts' rows
            offs = counts.cumsum(0).int()
            mm = lambda a, w: torch._grouped_mm(a.to(dt), w.to(dt).transpose(-2, -1), offs=offs)
            y = mm(swiglu(self.experts.dnp(mm(xs, W), expert)), self.down)
        else:                   # an expert with no token runs on an empty slice
            y = []
            for e, (xe, We, De) in enumerate(zip(xs.split(counts.tolist()), W.unbind(), self.down.unbind())):
                y.append(F.linear(swiglu(self.experts.dnp(F.linear(xe, We), e)), De))
            y = torch.cat(y)
        y = torch.empty_like(y).index_copy_(0, order, y).view(N, k, -1)   # back to token order
        out = (y * gates.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x, v)
        if self.training:
            self.load = counts.float() if self.load is None else self.load + counts
            if self.balance == "aux":   # Switch: E * sum_i f_i P_i, f: fraction of assignments, P: mean probability
                P = (scores / scores.sum(-1, keepdim=True)).mean(0)
                self.aux_loss = E * (counts.float() / (N * k) * P).sum()
        return out.view(xn.shape).type_as(xn)


class Block(nn.Module):
    def __init__(self, cfg, moe=False):
        super().__init__()
        self.eps = cfg.norm_eps
        self.attn = Attention(cfg)
        self.mlp = MoE(cfg) if moe else SwiGLU(cfg, cfg.hidden)
        self.post_norm = cfg.post_norm
        if cfg.post_norm:   # Gemma's post-attention and post-FFN norms
            self.attn_post, self.mlp_post = OutputNorm(cfg.n_embd, cfg), OutputNorm(cfg.n_embd, cfg)

    def forward(self, x, rope):
        # Pre-Norm: x + Branch(g * Norm(x)); Norm(x) is computed once, g lives in the branch's weights
        h = self.attn(norm(x, self.eps), rope)
        x = x + (self.attn_post(h) if self.post_norm else h)
        h = self.mlp(norm(x, self.eps))
        return x + (self.mlp_post(h) if self.post_norm else h)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = cfg = config
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, cfg.n_experts > 0 and i >= cfg.moe_dense_layers) for i in range(cfg.n_layer))
        # logits = W_head(g_final * Norm(x)): g_final is an Input-Norm vector, but the head has far more rows
        # (the vocabulary) than a micro-batch has tokens, so scaling the activations is the cheaper place for it
        self.head = ScaledLinear(cfg.n_embd, cfg.padded_vocab, cfg, dual=False, own_v=False)
        self.g_final = ScaleVector(1, cfg.n_embd, "input", cfg.sv_reparam) if cfg.scale_vectors else None
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight
        self.register_buffer("rope", rope_table(cfg), persistent=False)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # GPT-2 / nanoGPT: N(0, 0.02); the two maps that write into the residual stream get
        # 0.02 / sqrt(2 * n_layer) so the stream's variance does not grow with depth
        std = 0.02
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.config.n_layer)
        if isinstance(module, (nn.Linear, nn.Embedding, ScaledLinear)):   # nn.Linear: proj and down only
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, MoE):   # the experts' down projections write into the residual stream
            torch.nn.init.normal_(module.down, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx, targets=None):
        """Returns (logits over the tokenizer's vocabulary, mean cross-entropy or None)."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, self.rope)
        x = norm(x, self.config.norm_eps)
        logits = self.head(x * self.g_final() if self.g_final is not None else x)
        loss = None
        if targets is not None:   # padded rows take part in the softmax and learn to stay low
            loss = cross_entropy(logits.flatten(0, 1), targets.flatten())
            if self.training and self.config.n_experts and self.config.moe_balance == "aux":
                loss = loss + self.config.moe_aux_weight * sum(m.aux_loss for m in self.modules() if isinstance(m, MoE))
        return logits[..., : self.config.vocab_size], loss

    # ---- scale vectors: classification, telemetry, folding -------------------------------

    def param_classes(self):
        """name -> class for every parameter, each in exactly one class: 'matrix', 'embedding' (input, untied output),
        'sv_input' (foldable: an Input-Norm vector or DP's u) or 'sv_output' (cannot fold)."""
        classes, seen = {}, set()
        for mname, m in self.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen:   # a tied head shares the embedding's tensor
                    continue
                seen.add(id(p))
                if isinstance(m, ScaleVector):
                    cls = "sv_" + m.kind
                elif m is self.wte or m is self.head:   # the input and output embeddings
                    cls = "embedding"
                elif p.dim() >= 2:
                    cls = "matrix"
                else:
                    raise ValueError(f"parameter {mname}.{pname} has no class: add it to GPT.param_classes")
                classes[f"{mname}.{pname}" if mname else pname] = cls
        return classes

    def param_groups(self, weight_decay, sv_weight_decay="none", muon=False):
        """Optimizer groups, one per class of param_classes() (and optimizer). Matrices and embeddings are
        decayed; scale vectors by sv_weight_decay: "none", "all", or "iwd" (paper 2.2: only the Input-Norm
        ones). muon=True: the 2-D hidden matrices go to Muon (torch.optim.Muon takes 2-D tensors only, so
        the stacked (E, out, in) weights of MoE experts stay on AdamW), everything else to AdamW."""
        decayed = {"matrix", "embedding"} | {"none": set(), "iwd": {"sv_input"}, "all": {"sv_input", "sv_output"}}[sv_weight_decay]
        classes, params = self.param_classes(), dict(self.named_parameters())
        groups = []
        for cls in ("matrix", "embedding", "sv_input", "sv_output"):
            members = [params[n] for n, c in classes.items() if c == cls]
            to_muon = [p for p in members if muon and cls == "matrix" and p.dim() == 2]
            for opt, ps in (("muon", to_muon), ("adamw", [p for p in members if not any(p is q for q in to_muon)])):
                if ps:
                    groups.append({"params": ps, "name": cls, "optimizer": opt, "weight_decay": weight_decay if cls in decayed else 0.0})
        grouped = [id(p) for g in groups for p in g["params"]]   # every parameter in exactly one group
        if len(grouped) != len(set(grouped)) or set(grouped) != {id(p) for p in self.parameters()}:
            raise RuntimeError("optimizer groups do not cover every parameter exactly once: fix GPT.param_classes")
        return groups

    @torch.no_grad()
    def scale_vector_stats(self):
        """{name: [mean, min, max]} of every effective scale vector (after OR / ER), one entry per row/branch."""
        stats = {}
        for name, m in self.named_modules():
            if isinstance(m, ScaleVector):
                g = m().float()
                for i, row in enumerate(g):
                    key = f"{name}.{m.names[i]}" if m.names and len(g) > 1 else (name if len(g) == 1 else f"{name}.{i}")
                    stats[key] = [row.mean().item(), row.min().item(), row.max().item()]
        return stats

    @torch.no_grad()
    def fold_scale_vectors(self):
        """A new, equivalent GPT with scale_vectors=False (paper 2.2: W(g * z) = (W diag(g)) z, so an
        Input-Norm vector adds no expressivity). Only Output-Norm vectors cannot fold."""
        c = self.config
        blockers = [why for on, why in ((c.qk_norm, "qk_norm"), (c.post_norm, "post_norm"),
                                        (c.sv_placement == "dnp", "sv_placement='dnp'")) if on]
        if c.scale_vectors and blockers:
            raise ValueError(f"cannot fold scale vectors with {', '.join(blockers)}: a Norm, not a linear map, "
                             "follows those vectors (Output-Norms add expressivity)")
        # g_final folds into the head, so a tied head must be untied
        plain_cfg = replace(c, scale_vectors=False, sv_hetero=False, sv_placement="pre", sv_reparam="none",
                            tie_embeddings=c.tie_embeddings and not c.scale_vectors)
        plain = GPT(plain_cfg).to(self.wte.weight.device)
        mods = dict(self.named_modules())
        shared_v = {f"{n}.{s}": m.v() for n, m in mods.items() if isinstance(m, MoE) and m.v is not None
                    for s in ("router", "experts", "shared.gate_up")}   # an MoE's g_ffn meets these maps
        if self.g_final is not None:
            shared_v["head"] = self.g_final()
        state = {}
        for key in plain.state_dict():
            mname, _, pname = key.rpartition(".")
            m = mods[mname]
            state[key] = (m.effective_weight(shared_v.get(mname)) if isinstance(m, ScaledLinear) else getattr(m, pname)).clone()
        plain.load_state_dict(state)
        return plain

    # ---- Mixture of Experts: load balancing and telemetry -----------------------------------

    @torch.no_grad()
    def update_expert_bias(self, reduce=None):
        """Call after each optimizer step. DeepSeek-V3 (arXiv:2412.19437, 2.1.2): an expert that got more
        assignments than the mean since the last call is made less likely to be chosen, by moe_bias_rate
        (moe_balance="bias"); records the load for moe_stats() in either mode. `reduce(t)` sums t over
        processes in place (dist.all_reduce under DDP), so that every process keeps the same bias."""
        for m in self.modules():
            if isinstance(m, MoE) and m.load is not None:
                load, m.load = m.load, None
                if reduce is not None:
                    reduce(load)
                m.last_load = load / load.sum().clamp(min=1)
                if self.config.moe_balance == "bias":
                    step = torch.sign(load.mean() - load)
                    m.expert_bias += self.config.moe_bias_rate * (step - step.mean())   # centred: no drift

    def moe_stats(self):
        """{MoE layer: {"load": fraction of the assignments per expert, "cv": std / mean of it}}, at the last
        update_expert_bias; cv 0 is a perfect balance."""
        return {n: {"load": m.last_load.tolist(), "cv": (m.last_load.std(unbiased=False) / m.last_load.mean()).item()}
                for n, m in self.named_modules() if isinstance(m, MoE) and m.last_load is not None}

    # ---- sizes, speed, sampling ------------------------------------------------------------

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def num_active_params(self):
        """Parameters one token uses: all but the E - k routed experts it skips in each MoE layer."""
        c = self.config
        experts = sum(p.numel() for m in self.modules() if isinstance(m, MoE) for p in (*m.experts.parameters(), m.down))
        return self.num_params() - experts * (c.n_experts - c.n_experts_active) // max(c.n_experts, 1)

    def flops_per_token(self):
        """Training FLOPs per token: 6 per weight used in a matmul, plus attention (PaLM, appendix B)."""
        c = self.config
        n = self.num_active_params() - (0 if c.tie_embeddings else self.wte.weight.numel())
        return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after the prompt idx (B, T), feeding back at most block_size tokens."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :] / max(temperature, 1e-6)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits[logits < kth] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def default_device():
    """cuda, then mps, then cpu: what train.py, sample.py and bench.py use unless told otherwise."""
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


# Peak dense bf16 FLOP/s (no sparsity) of common GPUs, for MFU; fp32 runs use the TF32 figure.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L4": 121e12, "4090": 165e12}


def peak_flops(device, dtype=torch.bfloat16):
    """Peak FLOP/s of `device` for MFU: a table for GPUs, a short matmul probe on CPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), 312e12)
    a = torch.randn(1024, 1024, dtype=dtype, device=device)
    a @ a
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        a @ a
        n += 1
    return n * 2 * 1024 ** 3 / (time.perf_counter() - t0)
