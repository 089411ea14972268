"""
A short Pre-Norm GPT in the Llama style (RMSNorm, RoPE, SwiGLU, no biases), with a flag for each
scale-vector variant of arXiv:2605.26895, "Negligible in Size, Significant in Effect: On Scale
Vectors in Large Language Models". DESIGN.md gives the definitions and the choices we made.

Norm(x) = x / sqrt(mean(x^2) + eps) has no parameter of its own, and a scale vector g multiplies
it. Every variant is built from three pieces. A ScaleVector is a learnable g that says where it
acts. A ScaledLinear is a linear map fed by Norm(x), with a vector on its input side, its output
side, or both. An OutputNorm is g * Norm(x) where no linear map follows. The tables PLACEMENTS and
REPARAMS say what each value of sv_placement and sv_reparam means.

Read from here to the end of GPT.forward for the model. After it come the optimizer groups and
folding, the config's checks, and the optional Mixture of Experts (n_experts > 0).
"""
import math
from collections import namedtuple
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the operations ----------------------------------------------------------------------------

def fp32(x):
    """x in at least float32: bfloat16 is upcast, float64 stays float64."""
    return x.float() if x.element_size() < 4 else x


def norm(x, eps):
    """Norm(x) over the last dimension, computed in at least float32."""
    return F.rms_norm(fp32(x), (x.size(-1),), eps=eps).to(x.dtype)


def output_norm(y, g, groups, eps):
    """g * Norm(.) over each group of y's last dimension (DNP's output side, paper 3.2), or the
    Norm alone when g is None. `groups` splits y's last dimension as (blocks, groups, group)."""
    out = norm(y.unflatten(-1, groups), eps)   # (..., d) -> (..., blocks, groups per block, group)
    return (out if g is None else (g * out).to(y.dtype)).flatten(-len(groups))


def swiglu(gate_up):
    """silu(gate) * up (Shazeer 2020), with gate and up side by side in the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def fold(W, g, side):
    """W (..., out, in) with g (rows, width) multiplied in, as W diag(g) ("columns") or diag(g) W
    ("rows"). Each row of g covers an equal block of W's rows (a branch such as q, k or v), and a
    narrow g covers in / width adjacent columns per entry (one entry per head)."""
    Wb = W.reshape(len(g), -1, W.size(-1))   # (..., out, in) -> (rows of g, out per row, in)
    if side == "rows":
        return (Wb * g.unsqueeze(2)).view_as(W)
    return (Wb * g.repeat_interleave(W.size(-1) // g.size(-1), -1).unsqueeze(1)).view_as(W)


# ---- the variants, one table entry each ----------------------------------------------------------

# g_out: the output-side vector, None, "folded" into W's rows, or "after_norm" (a Norm before it)
# norm: whether a Norm follows the map, per head for q, k and v
Placement = namedtuple("Placement", "g_out norm")


# paper 3.2: what meets a linear map fed by an Input-Norm (q, k, v; gate, up)
PLACEMENTS = {
    "pre": Placement(g_out=None, norm=False),            # y = W(g_in * Norm(x))
    "dp": Placement(g_out="folded", norm=False),         # y = (diag(g_out) W diag(g_in)) Norm(x)
    "dnp": Placement(g_out="after_norm", norm=True),     # y = g_out * Norm(W(g_in * Norm(x)))
    # DNP's control (our choice), with g_out fixed at 1
    "dnp_novec": Placement(g_out=None, norm=True),       # y = Norm(W(g_in * Norm(x)))
}


# params: each raw parameter's name, shape and init. The shape is "vector" (d entries per row),
# "direction" (d entries of which only the direction counts) or "scalar" (one per row). The init
# is a number, or a function of norm_eps, chosen so that g is exactly 1.
# g: (raw parameters, norm_eps) -> the effective vectors g, shaped (rows, d)
# g_at_zero: g when every raw parameter is 0, where weight decay pulls them
Reparam = namedtuple("Reparam", "params g g_at_zero")


def or_g(p, eps):
    """OR (paper 3.3): a magnitude beta times a direction Norm(alpha) of unit RMS."""
    return (p["beta"] * norm(p["alpha"], eps)).to(p["alpha"].dtype)


def er_g(p, eps):
    """ER (paper 3.3): exp(beta) * exp(alpha - mean(alpha))."""
    return torch.exp(p["beta"] + p["alpha"] - p["alpha"].mean(-1, keepdim=True))


# paper 3.3: how a scale vector is parameterized
REPARAMS = {
    "none": Reparam(params=dict(g=("vector", 1.0)), g=lambda p, eps: p["g"], g_at_zero=0.0),
    # Norm(1) is 1 / sqrt(1 + eps), so this beta makes g exactly 1
    "or": Reparam(params=dict(alpha=("direction", 1.0),
                              beta=("scalar", lambda eps: math.sqrt(1 + eps))), g=or_g,
                  g_at_zero=0.0),
    "er": Reparam(params=dict(alpha=("direction", 0.0), beta=("scalar", 0.0)), g=er_g,
                  g_at_zero=1.0),
}

# the width of DNP's g_out (DESIGN.md): the map's whole output, or one head's ("head")
DNP_WIDTHS = ("full", "head")

# A vector that cannot fold has a Norm, not a linear map, after it (DNP's g_out, qk_norm,
# post_norm). A vector that can fold names the weights it multiplies instead (ScaleVector).
AFTER_NORM = "after a Norm"


# ---- the three pieces ----------------------------------------------------------------------------

class ScaleVector(nn.Module):
    """`rows` learnable vectors g of length d, parameterized as REPARAMS[cfg.sv_reparam] says, and
    exactly 1 at init as in the paper. `folds_into` says where g acts: AFTER_NORM, or the weights
    it multiplies when folded, as ((path from the vector's holder, "columns" or "rows"), ...)."""

    def __init__(self, rows, d, cfg, folds_into, names=None):
        super().__init__()
        self.folds_into, self.names, self.rows, self.width = folds_into, names, rows, d
        self.reparam, self.eps = REPARAMS[cfg.sv_reparam], cfg.norm_eps
        for name, (shape, init) in self.reparam.params.items():
            value = float(init(self.eps) if callable(init) else init)
            raw = torch.full((rows, 1 if shape == "scalar" else d), value)
            if shape == "direction" and d == 1:   # one entry has no direction to learn
                self.register_buffer(name, raw)
            else:
                self.register_parameter(name, nn.Parameter(raw))

    def forward(self):
        """The effective vectors g, shaped (rows, d)."""
        return self.reparam.g({name: getattr(self, name) for name in self.reparam.params}, self.eps)


class ScaledLinear(nn.Module):
    """A linear map fed by Norm(x): y = g_out * W(g_in * Norm(x)), or g_out * Norm(W(g_in *
    Norm(x))) under DNP, as PLACEMENTS says. The caller computes Norm(x) once for all its maps.
    W has a block of rows per branch (q, k, v or gate, up). Under HG each branch has its own g_in
    (paper 3.1), and g_out always has a row per branch (paper 3.2)."""

    def __init__(self, d_in, d_out, cfg, branches=(), head=0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))   # GPT._init_weights draws it
        self.eps, self.n_blocks = cfg.norm_eps, max(len(branches), 1)
        self.group = head or d_out // self.n_blocks   # DNP normalizes a head, or a whole branch
        sv, names = cfg.scale_vectors, branches or None
        self.placement = p = PLACEMENTS[cfg.sv_placement if sv else "pre"]
        rows_in = self.n_blocks if cfg.sv_hetero else 1
        self.g_in = ScaleVector(rows_in, d_in, cfg, (("weight", "columns"),), names) if sv else None
        width = (head or 1) if cfg.sv_dnp_width == "head" else d_out // self.n_blocks
        where = (("weight", "rows"),) if p.g_out == "folded" else AFTER_NORM
        self.g_out = ScaleVector(self.n_blocks, width, cfg, where, names) if p.g_out else None
        self.g_out_width = min(width, self.group)   # g_out broadcasts over heads or branches

    def forward(self, xn):
        return self.output_side(F.linear(xn, self.effective_weight()))

    def effective_weight(self):
        """W diag(g_in) (paper 2.2), and diag(g_out) W where g_out folds into W's rows (DP)."""
        W = self.weight if self.g_in is None else fold(self.weight, self.g_in(), "columns")
        return fold(W, self.g_out(), "rows") if self.placement.g_out == "folded" else W

    def output_side(self, y):
        """Under DNP, g_out * Norm(.) of each head (q, k, v) or branch (gate, up) of y."""
        if not self.placement.norm:
            return y
        g = None if self.g_out is None else self.g_out().view(self.n_blocks, -1, self.g_out_width)
        return output_norm(y, g, (self.n_blocks, -1, self.group), self.eps)


class OutputNorm(nn.Module):
    """g * Norm(x) where no linear map follows, so g cannot fold (an Output-Norm, paper 2.2). It is
    parameter-free when scale_vectors=False."""

    def __init__(self, d, cfg):
        super().__init__()
        self.eps = cfg.norm_eps
        self.g = ScaleVector(1, d, cfg, AFTER_NORM) if cfg.scale_vectors else None

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), None if self.g is None else self.g().view(-1), self.eps)


# ---- attention, SwiGLU, the block ---------------------------------------------------------------

def rope_table(cfg, T, device, dtype):
    """e^(i t theta_j) for each position t < T and pair j of a head, complex, shaped to broadcast
    over (B, T, q|k, H, hd/2). Built in float64 where the device has it (DESIGN.md)."""
    hd, acc = cfg.n_embd // cfg.n_head, torch.float32 if device.type == "mps" else torch.float64
    freqs = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=acc, device=device) / hd)
    angles = torch.outer(torch.arange(T, dtype=acc, device=device), freqs)   # (T, hd/2)
    rope = torch.polar(torch.ones_like(angles), angles)
    return rope.to(torch.complex128 if dtype == torch.float64 else torch.complex64)[:, None, None]


def apply_rope(x, rope):
    """RoPE: rotate each pair of adjacent channels, read as a complex number, by its position's
    angle. x is (B, T, ..., hd), here q and k together."""
    z = torch.view_as_complex(fp32(x).unflatten(-1, (-1, 2)))   # (B, T, ..., hd/2) complex
    return torch.view_as_real(z * rope).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.n_head, self.hd = cfg.n_embd, cfg.n_head, cfg.n_embd // cfg.n_head
        # q, k and v from one fused map, which g_attn (or HG's g_q, g_k, g_v) feeds
        self.qkv = ScaledLinear(d, 3 * d, cfg, branches=("q", "k", "v"), head=self.hd)
        self.proj = nn.Linear(d, d, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:   # Gemma 3 and Qwen3 share one head-sized vector across the heads
            self.q_norm, self.k_norm = OutputNorm(self.hd, cfg), OutputNorm(self.hd, cfg)

    def forward(self, xn, rope):
        qkv = self.qkv(xn).unflatten(-1, (3, self.n_head, self.hd))   # (B, T, 3, H, hd)
        qk, v = qkv.split((2, 1), dim=2)   # split, whose backward is one concatenation
        if self.qk_norm:
            qk = torch.stack((self.q_norm(qk[:, :, 0]), self.k_norm(qk[:, :, 1])), dim=2)
        q, k = apply_rope(qk, rope).unbind(2)
        # (B, H, T, hd) each
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.squeeze(2).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).flatten(-2))   # (B, H, T, hd) -> (B, T, H * hd)


class SwiGLU(nn.Module):
    def __init__(self, cfg, hidden):
        super().__init__()
        # gate and up from one fused map, which g_ffn (or HG's g_gate, g_up) feeds
        self.gate_up = ScaledLinear(cfg.n_embd, 2 * hidden, cfg, branches=("gate", "up"))
        self.down = nn.Linear(hidden, cfg.n_embd, bias=False)

    def forward(self, xn):
        return self.down(swiglu(self.gate_up(xn)))


class Block(nn.Module):
    def __init__(self, cfg, moe=False):
        super().__init__()
        self.eps = cfg.norm_eps
        self.attn = Attention(cfg)
        self.mlp = MoE(cfg) if moe else SwiGLU(cfg, cfg.hidden)
        # Gemma's post-attention and post-FFN norms, g_post * Norm(branch)
        self.attn_post = OutputNorm(cfg.n_embd, cfg) if cfg.post_norm else nn.Identity()
        self.mlp_post = OutputNorm(cfg.n_embd, cfg) if cfg.post_norm else nn.Identity()

    def forward(self, x, rope):
        # paper 2.1, Pre-Norm: x + attn(g_attn * Norm(x)), then x + mlp(g_ffn * Norm(x)), where each
        # map multiplies its g into its weight (ScaledLinear), so Norm(x) is computed once
        x = x + self.attn_post(self.attn(norm(x, self.eps), rope))
        return x + self.mlp_post(self.mlp(norm(x, self.eps)))


# GPT-2 and nanoGPT start the maps that write into the residual stream at a smaller std, so that
# the stream's variance does not grow with depth
RESIDUAL_WRITERS = ("attn.proj.weight", ".down.weight", "mlp.down")


# ---- the model -----------------------------------------------------------------------------------

@dataclass
class GPTConfig:
    block_size: int = 1024       # the context: tokens per sequence
    vocab_size: int = 50257      # the tokenizer's, to which the embedding adds padding rows
    vocab_pad: int = 64          # the embedding's rows, a multiple of this for fast matmuls
    n_layer: int = 12            # blocks
    n_head: int = 12             # attention heads
    n_embd: int = 768            # the width of the residual stream
    mlp_hidden: int = 0          # the SwiGLU's width, or 0 for Llama's 8/3 * n_embd rounded up
                                 # to a multiple of 32 (as many weights as a 4x GELU MLP)
    tie_embeddings: bool = True  # the head is the embedding (its g_final folds into it untied)
    rope_theta: float = 10000.0  # RoPE's base
    norm_eps: float = 1e-6       # the eps of every Norm, OR's too
    # scale vectors: one flag per variant (DESIGN.md)
    scale_vectors: bool = True   # False makes every norm parameter-free (paper, Fig. 1)
    sv_hetero: bool = False      # HG (paper 3.1), one g_in per branch (q, k, v, gate, up)
    sv_placement: str = "pre"    # DP, DNP: vectors on both sides of the maps (paper 3.2)
    sv_reparam: str = "none"     # OR, ER: g as a magnitude times a direction (paper 3.3)
    sv_dnp_width: str = "full"   # DNP's g_out: the map's width, or a head's ("head")
    qk_norm: bool = False        # g_q * Norm(q), g_k * Norm(k) per head (Output-Norm)
    post_norm: bool = False      # x + g_post * Norm(branch) (Output-Norm)
    # a Mixture-of-Experts FFN in place of the dense SwiGLU (class MoE)
    n_experts: int = 0           # routed experts per MoE layer, or 0 for the dense SwiGLU
    n_experts_active: int = 2    # top-k routed experts per token
    n_shared_experts: int = 0    # experts every token goes through
    moe_hidden: int = 0          # each expert's width, or 0 for the dense width over the k + shared
                                 # experts a token sees, rounded up to a multiple of 32
    moe_dense_layers: int = 0    # the first N layers keep the dense SwiGLU
    moe_bias_rate: float = 1e-3  # the step of DeepSeek-V3's balancing bias, or 0 for none

    def __post_init__(self):
        check_config(self)

    @property
    def hidden(self):
        return self.mlp_hidden or 32 * math.ceil(8 * self.n_embd / 3 / 32)

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = cfg = config
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, cfg.n_experts > 0 and i >= cfg.moe_dense_layers)
                                    for i in range(cfg.n_layer))
        self.head = nn.utils.skip_init(nn.Linear, cfg.n_embd, cfg.padded_vocab, bias=False,
                                       device=torch.get_default_device())   # drawn below
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight
        # logits = W_head(g_final * Norm(x)), where g_final could fold into the head's columns
        self.g_final = (ScaleVector(1, cfg.n_embd, cfg, (("head.weight", "columns"),))
                        if cfg.scale_vectors else None)
        self._init_weights()

    def _init_weights(self):
        """N(0, 0.02) for every matrix and the embedding, and a smaller std for the maps that write
        into the residual stream (RESIDUAL_WRITERS). Scale vectors keep their own init."""
        names = {m: n for n, m in self.named_modules()}

        def init(m):
            params = () if isinstance(m, ScaleVector) else m.named_parameters(recurse=False)
            for pname, p in params:
                residual = f"{names[m]}.{pname}".endswith(RESIDUAL_WRITERS)
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if residual else 0.02
                # drawn in float64, then rounded (DESIGN.md, Reproducibility)
                p.copy_(torch.empty_like(p, dtype=torch.float64).normal_(0.0, std))
        with torch.no_grad():
            self.apply(init)

    def forward(self, idx, targets=None):
        """Returns the logits over the tokenizer's vocabulary, and the mean cross-entropy (or
        None without targets)."""
        # RoPE keeps no table of positions, so a sequence of any length runs
        rope = rope_table(self.config, idx.size(1), idx.device, self.wte.weight.dtype)
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, rope)
        x = norm(x, self.config.norm_eps)
        logits = self.head(x * self.g_final() if self.g_final is not None else x)
        # the padded rows take part in the softmax, and learn to stay low
        loss = None if targets is None else F.cross_entropy(
            fp32(logits).flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits[..., : self.config.vocab_size], loss

    # ---- scale vectors: where each acts, decay groups, folding -----------------------------------

    def vector_sites(self):
        """{vector: ((weight, side), ...)} for every ScaleVector, as it declares: the state_dict
        names of the weights it folds into, or () when a Norm follows it."""
        sites = {}
        for name, sv in self.named_modules():
            if not isinstance(sv, ScaleVector):
                continue
            where = sv.folds_into
            if where != AFTER_NORM and not (where and all(
                    len(s) == 2 and s[1] in ("columns", "rows") for s in where)):
                raise ValueError(f"{name}: folds_into must be AFTER_NORM or ((weight, "
                                 f"'columns' or 'rows'), ...), not {where!r}")
            holder = name.rpartition(".")[0]
            sites[name] = () if where == AFTER_NORM else tuple(
                (f"{holder}.{w}" if holder else w, side) for w, side in where)
        return sites

    def param_classes(self):
        """name -> class for every parameter: 'matrix', 'embedding' (the input and an untied
        output embedding), 'sv_input' (a block's vector that folds into a map), 'sv_final'
        (g_final, the Input-Norm vector before the head) or 'sv_output' (after a Norm)."""
        sites, classes, seen = self.vector_sites(), {}, set()
        for mname, m in self.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen:   # a tied head shares the embedding's tensor
                    continue
                seen.add(id(p))
                if isinstance(m, ScaleVector):
                    cls = ("sv_final" if m is self.g_final
                           else "sv_input" if sites[mname] else "sv_output")
                elif m is self.wte or m is self.head:
                    cls = "embedding"
                elif p.dim() >= 2:
                    cls = "matrix"
                else:
                    raise ValueError(
                        f"parameter {mname}.{pname} has no class: add it to GPT.param_classes")
                classes[f"{mname}.{pname}" if mname else pname] = cls
        return classes

    def param_groups(self, weight_decay, sv_weight_decay="none", sv_decay=None, muon=False,
                     lr_mults=None):
        """Optimizer groups, one per class of param_classes() and optimizer. Matrices and
        embeddings are decayed by weight_decay, and the vectors of the classes that
        DECAY_POLICIES[sv_weight_decay] names by sv_decay (None means weight_decay's value).
        With muon=True the 2-D hidden matrices go to Muon, which takes 2-D tensors only, so the
        stacked expert weights stay with AdamW. lr_mults maps a class to a factor of its learning
        rate (1 by default), which train.py's schedule multiplies."""
        decayed = {"matrix", "embedding", *DECAY_POLICIES[sv_weight_decay]}
        classes, params = self.param_classes(), dict(self.named_parameters())
        order = ("matrix", "embedding", "sv_input", "sv_final", "sv_output")
        lr_mults, groups = lr_mults or {}, []
        if set(lr_mults) - set(order):   # a misspelt class would silently train at 1x
            raise ValueError(f"lr_mults: {sorted(set(lr_mults) - set(order))} are not classes of "
                             f"GPT.param_classes ({', '.join(order)})")
        for cls in order:
            members = [n for n, c in classes.items() if c == cls]
            to_muon = [n for n in members if muon and cls == "matrix" and params[n].dim() == 2]
            to_adamw = [n for n in members if n not in to_muon]
            coef = sv_decay if sv_decay is not None and cls.startswith("sv_") else weight_decay
            for opt, ns in (("muon", to_muon), ("adamw", to_adamw)):
                if ns:   # named: the optimizer's state dict keeps the names (checkpoint.nonfinite)
                    groups.append({"params": [(n, params[n]) for n in ns], "name": cls,
                                   "optimizer": opt,
                                   "weight_decay": coef if cls in decayed else 0.0,
                                   "lr_mult": float(lr_mults.get(cls, 1.0))})
        return groups

    def configure_optimizers(self, *, learning_rate, weight_decay, betas, sv_weight_decay="none",
                             sv_decay=None, optimizer="adamw", muon_lr=None, muon_momentum=0.95,
                             lr_mults=None):
        """AdamW over the groups of param_groups(), or with optimizer="muon", Muon for the 2-D
        hidden matrices. Muon's update is scaled to AdamW's RMS, so muon_lr (default
        learning_rate) is on AdamW's scale. train.py's schedule scales each group's base_lr times
        its lr_mult, and a resume keeps both."""
        groups = self.param_groups(weight_decay, sv_weight_decay, sv_decay, optimizer == "muon",
                                   lr_mults)
        muon_lr = muon_lr or learning_rate
        for g in groups:
            g["base_lr"] = muon_lr if g["optimizer"] == "muon" else learning_rate
        fused = self.wte.weight.device.type in ("cuda", "cpu")   # one pass over all tensors
        opts = [torch.optim.AdamW([g for g in groups if g["optimizer"] == "adamw"],
                                  lr=learning_rate, betas=betas, fused=fused)]
        muon = [g for g in groups if g["optimizer"] == "muon"]
        if muon:
            opts.append(torch.optim.Muon(muon, lr=muon_lr, momentum=muon_momentum,
                                         adjust_lr_fn="match_rms_adamw"))
        return opts

    @torch.no_grad()
    def fold_scale_vectors(self):
        """A new GPT without scale vectors that computes the same function, in this model's dtype
        and on its device (paper 2.2: an Input-Norm vector adds no expressivity, since W(g * z) =
        (W diag(g)) z). Each vector folds where it declares (vector_sites). A vector with a Norm
        after it, or DNP's Norm after the maps, cannot fold and is refused."""
        c, sites, mods = self.config, self.vector_sites(), dict(self.named_modules())
        after = [n for n, s in sites.items() if not s]
        if after or c.scale_vectors and PLACEMENTS[c.sv_placement].norm:
            raise ValueError("cannot fold scale vectors: " + (
                f"{after[0]} has a Norm, not a linear map, after it" if after else
                f"sv_placement={c.sv_placement!r} puts a Norm after the maps, which a GPT without "
                "scale vectors has not"))
        state = {k: v.clone() for k, v in self.state_dict().items()
                 if not isinstance(mods[k.rpartition(".")[0]], ScaleVector)}
        for name, weights in sites.items():
            for key, side in weights:
                try:
                    state[key] = fold(state[key], mods[name](), side)
                except (KeyError, RuntimeError):   # no such weight, or g does not fit its shape
                    raise ValueError(f"{name} declares folds_into={mods[name].folds_into!r}, which "
                                     "this model cannot fold: name the weights it multiplies "
                                     "(paths from its holder) and their side (model.ScaleVector)"
                                     ) from None
        # a vector folded into a tied weight makes the head differ from the embedding
        tied = {"wte.weight", "head.weight"} if c.tie_embeddings else set()
        untie = any(key in tied for weights in sites.values() for key, _ in weights)
        off = {f.name: f.default for f in fields(c)
               if f.name in VECTOR_FLAGS and not VECTOR_FLAGS[f.name].adds_norm}
        plain_cfg = replace(c, scale_vectors=False, **off, tie_embeddings=c.tie_embeddings and
                            not untie)
        with torch.device("meta"):   # no memory and no random draws: every weight from `state`
            plain = GPT(plain_cfg)
        for key in sorted(set(state) - set(plain.state_dict()))[:1]:
            raise ValueError(f"fold_scale_vectors does not know how to fold {key}: make it a "
                             "ScaleVector that says where it acts (folds_into)")
        plain.to_empty(device=self.wte.weight.device).to(self.wte.weight.dtype)
        if plain_cfg.tie_embeddings:   # to_empty gives the tied head a tensor of its own
            plain.head.weight = plain.wte.weight
        plain.load_state_dict(state)
        return plain

    # ---- Mixture of Experts: load balancing and telemetry (MoE.update_bias, MoE.stats) ------

    def update_expert_bias(self, reduce=None):
        """Call after each optimizer step: every MoE layer's update_bias. `reduce(t)` sums t over
        the processes in place (dist.all_reduce under DDP), so that they all keep one bias."""
        for m in self.modules():
            if isinstance(m, MoE):
                m.update_bias(reduce)

    def moe_stats(self):
        """{MoE layer: MoE.stats()} at the last update_expert_bias."""
        return {n: m.stats() for n, m in self.named_modules()
                if isinstance(m, MoE) and m.last_load is not None}

    # ---- sizes, speed, sampling ------------------------------------------------------------

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def num_active_params(self):
        """The parameters one token uses. Of an MoE layer's routed experts (their stacked
        weights and their own vectors) a token uses the k it is routed to."""
        c = self.config
        routed = sum(sum(p.numel() for p in (*m.experts.parameters(), m.down))
                     for m in self.modules() if isinstance(m, MoE))
        skipped = routed * (c.n_experts - c.n_experts_active) // max(c.n_experts, 1)
        return self.num_params() - skipped

    def flops_per_token(self):
        """Training FLOPs per token: 6 per weight used in a matmul, plus attention (PaLM,
        appendix B)."""
        c = self.config
        n = self.num_active_params() - (0 if c.tie_embeddings else self.wte.weight.numel())
        return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """The prompt idx (B, T) followed by max_new_tokens sampled ids (generate_tokens)."""
        return torch.cat((idx, *self.generate_tokens(idx, max_new_tokens, temperature, top_k)), 1)

    @torch.no_grad()
    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Yield max_new_tokens sampled ids (B, 1) after the prompt idx (B, T), one at a time, so
        that a caller can print each as it comes. At most block_size tokens are fed back, and
        temperature 0 takes the most likely token each time."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :]
            if temperature == 0:
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits[logits < kth] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            yield idx_next


# train.py's sv_weight_decay: the classes of GPT.param_classes() whose vectors are decayed (by
# sv_decay); matrices and embeddings always are
DECAY_POLICIES = {
    "none": (),
    # paper 2.2: only the Input-Norm vectors, which fold (g_final before the head is one)
    "iwd": ("sv_input", "sv_final"),
    # IWD's control (our choice): the blocks' Input-Norms but not g_final, the one vector that
    # still acts on the function under DNP (DESIGN.md)
    "iwd_blocks": ("sv_input",),
    "all": ("sv_input", "sv_final", "sv_output"),
    # our control for the other half of the claim: only the vectors after a Norm, which cannot
    # fold (qk_norm, post_norm, DNP's g_out)
    "owd": ("sv_output",),
}


# ---- the config's checks -------------------------------------------------------------------------

# values: the values a flag takes, as a tuple or as the table whose keys they are
# adds_norm: it adds a Norm too, which stays (parameter-free) without vectors
# moe_only: it acts in the MoE FFN only, so a dense model refuses it
VectorFlag = namedtuple("VectorFlag", "values adds_norm moe_only", defaults=(False, False))


# The GPTConfig flags that add or shape scale vectors. GPTConfig refuses all but their default
# under scale_vectors=False, fold_scale_vectors resets them, and the generic tests build their
# models from this table. A new location is one entry.
VECTOR_FLAGS = dict(sv_hetero=VectorFlag((False, True)), sv_placement=VectorFlag(PLACEMENTS),
                    sv_reparam=VectorFlag(REPARAMS), sv_dnp_width=VectorFlag(DNP_WIDTHS),
                    qk_norm=VectorFlag((False, True), adds_norm=True),
                    post_norm=VectorFlag((False, True), adds_norm=True))


def check_config(c):
    """Every value and combination a GPT cannot build, or in which a flag would do nothing, as a
    ValueError of one sentence. train.py checks each key's range first (config/defaults.py)."""
    def check(ok, msg):
        if not ok:
            raise ValueError(f"GPTConfig: {msg}")
    for flag, table in (("sv_placement", PLACEMENTS), ("sv_reparam", REPARAMS),
                        ("sv_dnp_width", DNP_WIDTHS)):
        value = getattr(c, flag)
        check(value in table, f"{flag} must be one of {', '.join(map(repr, table))}, not {value!r}")
    p = PLACEMENTS[c.sv_placement]   # paper 2.2: a vector after a Norm cannot fold, one after W can
    check(p.g_out in (None, "folded", "after_norm")
          and (p.g_out == "after_norm") == (p.norm and p.g_out is not None),
          f"PLACEMENTS[{c.sv_placement!r}] = {p} is not built by ScaledLinear: g_out is None, "
          "'folded' (no Norm after the map) or 'after_norm' (norm=True)")
    check(c.sv_dnp_width == "full" or p.g_out == "after_norm",
          f"sv_dnp_width={c.sv_dnp_width!r} sets the width of DNP's g_out, which "
          f"sv_placement={c.sv_placement!r} does not have: it needs sv_placement='dnp'")
    for flag, spec in VECTOR_FLAGS.items():
        value, default = getattr(c, flag), next(f.default for f in fields(c) if f.name == flag)
        check(c.scale_vectors or spec.adds_norm or value == default,
              f"{flag}={value!r} needs scale_vectors=True (there is no vector to vary)")
        check(c.n_experts or not spec.moe_only or value == default,
              f"{flag}={value!r} acts in the MoE FFN only: it needs n_experts > 0")
    check(not (c.qk_norm and p.norm), f"qk_norm=True with sv_placement={c.sv_placement!r} is "
          "redundant: DNP already puts a norm and a vector on q and k")
    check(c.n_embd % c.n_head == 0 and (c.n_embd // c.n_head) % 2 == 0,
          "n_embd must be a multiple of n_head with an even head size (RoPE rotates pairs)")
    check(c.n_experts >= 0, f"n_experts must be >= 0 (0: dense), not {c.n_experts}")
    if c.n_experts:
        check(1 <= c.n_experts_active <= c.n_experts, f"n_experts_active must be between 1 and "
              f"n_experts={c.n_experts}, not {c.n_experts_active}")
        check(c.n_shared_experts >= 0, f"n_shared_experts must be >= 0, not {c.n_shared_experts}")
        check(c.moe_hidden >= 0, f"moe_hidden must be >= 0 (0: automatic), not {c.moe_hidden}")
        check(0 <= c.moe_dense_layers < c.n_layer, f"moe_dense_layers must be between 0 and "
              f"n_layer-1={c.n_layer - 1} (some layer must be MoE), not {c.moe_dense_layers}")
        check(c.moe_bias_rate >= 0, f"moe_bias_rate must be >= 0, not {c.moe_bias_rate}")


# ---- Mixture of Experts (optional: n_experts > 0) ------------------------------------------------

def expert_hidden(cfg):
    """Each routed expert's SwiGLU width: moe_hidden, or the dense FFN's width over the experts a
    token goes through, rounded up to a multiple of 32."""
    active = cfg.n_experts_active + cfg.n_shared_experts
    return cfg.moe_hidden or 32 * math.ceil(cfg.hidden / active / 32)


class ExpertsLinear(ScaledLinear):
    """The gate|up maps of an MoE layer's E routed experts, stacked in one (E, 2h, d) weight. Its
    vectors have a row per expert and branch wherever a dense map has one per branch (HG's g_in,
    DP's and DNP's g_out). MoE.run_experts applies it expert by expert."""

    def __init__(self, d, h, cfg, E):
        super().__init__(d, 2 * h, cfg, branches=("gate", "up"))
        self.E, self.n_blocks = E, 2 * E
        self.weight = nn.Parameter(torch.empty(E, 2 * h, d))   # GPT._init_weights draws it
        names = tuple(f"{e}.{b}" for e in range(E) for b in ("gate", "up"))   # "3.gate"
        for side in ("g_in", "g_out"):
            sv = getattr(self, side)
            if sv is not None and sv.rows == 2:
                setattr(self, side, ScaleVector(2 * E, sv.width, cfg, sv.folds_into, names))

    def output_side(self, y, expert):
        """DNP per expert: y's rows belong to the experts `expert` (an index, or one per row)."""
        if not self.placement.norm:
            return y
        g = None   # g_out (2E, width) -> (E, 2, groups, group), then the rows of y's experts
        if self.g_out is not None:
            g = self.g_out().view(self.E, 2, -1, self.g_out_width)[expert]
        return output_norm(y, g, (2, -1, self.group), self.eps)


class MoE(nn.Module):
    """Mixture-of-Experts FFN. Each token goes through the top-k of E routed SwiGLU experts,
    weighted by their softmax scores renormalized to sum to 1 (when k > 1), and through the shared
    experts.
    No token is dropped, and the router computes in at least float32. DeepSeek-V3's expert bias
    balances the load without an auxiliary loss (update_bias). One Input-Norm vector g_ffn feeds
    the router and every expert, and under HG each map has its own instead (DESIGN.md). The
    experts' weights are stacked, so an expert that gets no token still takes part in autograd and
    DDP needs no find_unused_parameters."""

    def __init__(self, cfg):
        super().__init__()
        d, E, h, shared = cfg.n_embd, cfg.n_experts, expert_hidden(cfg), cfg.n_shared_experts
        self.E, self.k, self.bias_rate = E, cfg.n_experts_active, cfg.moe_bias_rate
        maps = ("router", "experts", "shared.gate_up")[:3 if shared else 2]
        self.g_in = (ScaleVector(1, d, cfg, tuple((f"{m}.weight", "columns") for m in maps))
                     if cfg.scale_vectors and not cfg.sv_hetero else None)
        # the router's logits take no output-side vector
        self.router = ScaledLinear(d, E, replace(cfg, sv_placement="pre", sv_dnp_width="full"))
        self.experts = ExpertsLinear(d, h, cfg, E)
        self.down = nn.Parameter(torch.empty(E, d, h))   # (E, d, h), GPT._init_weights draws it
        self.shared = SwiGLU(cfg, shared * h) if shared else None
        if self.g_in is not None:   # g_ffn stands in for each map's own input-side vector
            for m in (self.router, self.experts, *([self.shared.gate_up] if shared else [])):
                m.g_in = None
        self.register_buffer("expert_bias", torch.zeros(E))   # checkpointed with the weights
        # assignments per expert since the last update, not a buffer, which DDP would broadcast
        self.load, self.last_load = None, None
        self.impl = None   # "loop" or "grouped" (torch._grouped_mm); None picks by device and dtype

    def route(self, x):
        """x (N, d) -> expert ids (N, k), their gates (N, k), which sum to 1 when k > 1, and the
        scores (N, E), all in at least float32."""
        with torch.autocast(x.device.type, enabled=False):
            acc = torch.promote_types(x.dtype, torch.float32)   # float32, or float64
            logits = F.linear(x.to(acc), self.router.effective_weight().to(acc))
        scores = logits.softmax(-1)
        # the bias chooses the experts but does not weight them
        ids = torch.topk(scores + self.expert_bias.float(), self.k, dim=-1).indices
        # top-1 keeps its score, as in Switch, since a gate fixed at 1 would not train the router
        gates = scores.gather(-1, ids)
        return ids, gates / gates.sum(-1, keepdim=True) if self.k > 1 else gates, scores

    def forward(self, xn):
        x = xn.reshape(-1, xn.size(-1))                # (B, T, d) -> (N, d)
        if self.g_in is not None:
            x = x * self.g_in().view(-1)               # g_ffn, shared by the router and experts
        N, k, E = x.size(0), self.k, self.E
        ids, gates, _ = self.route(x)
        flat = ids.flatten()                           # N * k assignments, token-major
        order = flat.argsort(stable=True)              # sorted by expert
        # tokens per expert (bincount, static shape)
        counts = flat.new_zeros(E).scatter_add_(0, flat, torch.ones_like(flat))
        xs, expert = x[order // k], flat[order]        # (N * k, d) in expert order, their experts
        y = self.run_experts(xs, expert, counts, self.experts.effective_weight())  # (N * k, d)
        y = torch.empty_like(y).index_copy_(0, order, y).view(N, k, -1)   # token order: (N, k, d)
        out = (y * gates.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        if self.training:   # counted in each training forward, applied after the optimizer step
            self.load = counts.float() if self.load is None else self.load + counts
        return out.view(xn.shape).type_as(xn)

    def run_experts(self, xs, expert, counts, W):
        """Each expert's SwiGLU on its rows of xs, which are sorted by expert (`expert` gives each
        row's). W is the experts' stacked gate|up weight, (E, 2h, d)."""
        dev = xs.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else xs.dtype
        impl = self.impl or ("grouped" if xs.is_cuda and dt == torch.bfloat16
                             and hasattr(torch, "_grouped_mm") else "loop")
        if impl == "grouped":   # one grouped GEMM per projection, a group per expert
            offs = counts.cumsum(0).int()
            mm = lambda a, w: torch._grouped_mm(a.to(dt), w.to(dt).transpose(-2, -1), offs=offs)
            return mm(swiglu(self.experts.output_side(mm(xs, W), expert)), self.down)
        y = []                  # an expert with no token runs on an empty slice
        parts = zip(xs.split(counts.tolist()), W.unbind(), self.down.unbind())
        for e, (xe, We, De) in enumerate(parts):
            y.append(F.linear(swiglu(self.experts.output_side(F.linear(xe, We), e)), De))
        return torch.cat(y)

    # ---- load balancing ----------------------------------------------------------------------

    @torch.no_grad()
    def update_bias(self, reduce=None):
        """DeepSeek-V3 (arXiv:2412.19437, 2.1.2): an expert that got more assignments than the mean
        since the last call is made less likely to be chosen, by bias_rate; records the load for
        stats(). `reduce(t)` sums t over processes in place."""
        if self.load is None:
            return
        load, self.load = self.load, None
        if reduce is not None:
            reduce(load)
        self.last_load = load / load.sum().clamp(min=1)
        step = torch.sign(load.mean() - load)
        self.expert_bias += self.bias_rate * (step - step.mean())   # centred: no drift

    def stats(self):
        """{"load": fraction of the assignments per expert, "cv": std / mean of it} at the last
        update_bias; cv 0 is a perfect balance."""
        load = self.last_load
        return {"load": load.tolist(), "cv": (load.std(unbiased=False) / load.mean()).item()}
