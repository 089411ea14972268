"""
A short Pre-Norm GPT in the Llama style (RMSNorm, RoPE, SwiGLU, no biases) with a flag for each
scale-vector variant of arXiv:2605.26895, "Negligible in Size, Significant in Effect: On Scale
Vectors in Large Language Models" (DESIGN.md: the definitions and the choices made).

Norm(x) = x / sqrt(mean(x^2) + eps) has no parameter; a scale vector g multiplies it. Every variant
is made of three pieces: ScaleVector (a learnable g, plain or reparameterized, that declares where
it acts), ScaledLinear (a linear map fed by Norm(x): g_out * W(g_in * Norm(x)), or DNP's
g_out * Norm(W(g_in * Norm(x)))) and OutputNorm (g * Norm(x) where no linear map follows). The
tables PLACEMENTS and REPARAMS say what each value of sv_placement and sv_reparam means.

First reading: from here to the end of GPT.forward. Then GPT's decay groups and folding, GPTConfig
and its checks, and the optional Mixture of Experts (n_experts > 0).
"""
import math
from dataclasses import dataclass, fields, replace
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the operations: plain PyTorch, what runs everywhere (speed: torch.compile) ----------------

def norm(x, eps):
    """Norm(x) = x / sqrt(mean(x^2) + eps) over the last dimension, in at least float32: F.rms_norm
    (bit for bit the four ops spelled out, on every CPU kind, and 10% faster in eager)."""
    xf = x.float() if x.element_size() < 4 else x
    return F.rms_norm(xf, (x.size(-1),), eps=eps).to(x.dtype)


def output_norm(y, g, groups, eps):
    """DNP's output side (paper 3.2): g * Norm(.) of each group of y's last dimension, y (..., d)
    split as `groups` (blocks, groups per block, group); g None: the Norm alone (dnp_novec)."""
    yg = y.unflatten(-1, groups)   # (..., d) -> (..., blocks, groups per block, group)
    out = norm(yg, eps) if g is None else (g * norm(yg, eps)).to(y.dtype)
    return out.flatten(-len(groups))


def swiglu(gate_up):
    """silu(gate) * up (Shazeer 2020), from gate|up concatenated on the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def cross_entropy(logits, targets):
    """Mean cross-entropy of logits (N, V) over the targets (N,) not -1, in at least float32."""
    logits = logits.float() if logits.element_size() < 4 else logits
    return F.cross_entropy(logits, targets, ignore_index=-1)


def fold(W, g, side):
    """W (..., out, in) with g (rows, width) folded in: "columns", W diag(g), or "rows", diag(g) W.
    A row of g per equal block of W's rows (HG: q, k, v); on the columns an entry of g covers
    in / width adjacent columns (e.g. one per head)."""
    Wb = W.reshape(len(g), -1, W.size(-1))   # (..., out, in) -> (rows of g, out per row, in)
    if side == "rows":
        return (Wb * g.unsqueeze(2)).view_as(W)
    if g.size(-1) != W.size(-1):
        g = g.repeat_interleave(W.size(-1) // g.size(-1), -1)
    return (Wb * g.unsqueeze(1)).view_as(W)


# ---- the variants, one table entry each ----------------------------------------------------------

class Placement(NamedTuple):
    # what the output-side vector g_out is: None (there is none), "folded" (it multiplies W's rows
    # and folds into them, DP) or "after_norm" (a Norm stands between W and it, DNP: it cannot fold)
    g_out: Optional[str]
    norm: bool   # a Norm follows the map: y = g_out * Norm(W(...)), per head for q, k, v


# paper 3.2: what meets a linear map fed by an Input-Norm (q, k, v; gate, up)
PLACEMENTS = {
    "pre": Placement(g_out=None, norm=False),            # y = W(g_in * Norm(x))
    "dp": Placement(g_out="folded", norm=False),         # y = (diag(g_out) W diag(g_in)) Norm(x)
    "dnp": Placement(g_out="after_norm", norm=True),     # y = g_out * Norm(W(g_in * Norm(x)))
    # DNP's control (our choice): its Norm after the map, g_out fixed at 1
    "dnp_novec": Placement(g_out=None, norm=True),       # y = Norm(W(g_in * Norm(x)))
}


class Reparam(NamedTuple):
    # raw parameter name -> (shape, init). shape: "vector" (d entries per row), "direction" (d
    # entries per row, of which only the direction counts: a fixed buffer when d == 1, where there
    # is no direction to learn), "scalar" (one per row). init: a number, or a function of norm_eps,
    # that makes g exactly 1 (tests/test_variant_tables.py checks it)
    params: dict
    # (raw parameters {name: (rows, d or 1)}, norm_eps) -> the effective vectors g, (rows, d)
    g: callable
    # g where weight decay leads: AdamW pulls every raw parameter toward 0, so this is g at raw 0
    # (tests/test_variant_tables.py checks it); a policy that decays vectors needs 0 here
    g_at_zero: float


def or_g(p, eps):
    """OR (paper 3.3): a magnitude beta times a unit-RMS direction Norm(alpha)."""
    return (p["beta"] * norm(p["alpha"], eps)).to(p["alpha"].dtype)


def er_g(p, eps):
    """ER (paper 3.3): exp(beta) * exp(alpha - mean(alpha))."""
    return torch.exp(p["beta"] + p["alpha"] - p["alpha"].mean(-1, keepdim=True))


# paper 3.3: how a scale vector is parameterized
REPARAMS = {
    "none": Reparam(params=dict(g=("vector", 1.0)), g=lambda p, eps: p["g"], g_at_zero=0.0),
    # beta = sqrt(1 + eps): Norm(alpha) = 1 / sqrt(1 + eps) for alpha = 1, so g is exactly 1
    "or": Reparam(params=dict(alpha=("direction", 1.0),
                              beta=("scalar", lambda eps: math.sqrt(1 + eps))), g=or_g,
                  g_at_zero=0.0),
    "er": Reparam(params=dict(alpha=("direction", 0.0), beta=("scalar", 0.0)), g=er_g,
                  g_at_zero=1.0),
}

# width of DNP's g_out (DESIGN.md): "full", the map's output width; "head", one head-sized vector
# per branch q, k, v shared by the heads, one scalar per branch gate, up
DNP_WIDTHS = ("full", "head")

# Where a vector acts (ScaleVector's folds_into, read for folding, decay and export): the weights g
# multiplies when folded (paper 2.2: W (g * z) = (W diag(g)) z), as ((weight's path from the
# vector's holder, side), ...), side "columns", W diag(g) (g on the map's input), or "rows",
# diag(g) W (DP's g_out); or AFTER_NORM: a Norm stands between g and any linear map, so it cannot
# fold (DNP's g_out, qk_norm, post_norm).
AFTER_NORM = "after a Norm"


# ---- the three pieces ----------------------------------------------------------------------------

class ScaleVector(nn.Module):
    """`rows` learnable vectors g of length d, parameterized as REPARAMS[cfg.sv_reparam] says, g = 1
    at init (the paper's init); folds_into: where g acts (above); experts: the routed experts its
    rows are split over (MoE; 0: none)."""

    def __init__(self, rows, d, cfg, folds_into, names=None, experts=0):
        super().__init__()
        self.folds_into, self.names, self.rows, self.width = folds_into, names, rows, d
        self.reparam, self.eps, self.experts = cfg.sv_reparam, cfg.norm_eps, experts
        for name, (shape, init) in REPARAMS[self.reparam].params.items():
            value = float(init(self.eps) if callable(init) else init)
            raw = torch.full((rows, 1 if shape == "scalar" else d), value)
            if shape == "direction" and d == 1:   # no direction: a trained one would be inert
                self.register_buffer(name, raw)
            else:
                self.register_parameter(name, nn.Parameter(raw))

    def forward(self):
        """The effective vectors g, shape (rows, d)."""
        raw = {name: getattr(self, name) for name in REPARAMS[self.reparam].params}
        return REPARAMS[self.reparam].g(raw, self.eps)


class ScaledLinear(nn.Module):
    """y = g_out * W(g_in * Norm(x)), or g_out * Norm(W(g_in * Norm(x))) under DNP, as PLACEMENTS
    says; the caller passes Norm(x), computed once for all the maps it feeds. The weight has one
    equal row block per name of `branches` (q, k, v or gate, up; one block if none), stacked
    `experts` times for an MoE (whose caller names the branches of every expert).
      g_in:  input side: one shared row, or one row per block under HG (paper 3.1); own_g_in=False:
             the caller passes it (MoE's g_ffn, the head's g_final);
      g_out: output side, one row per block (paper 3.2); dual=False: none. DP folds it into W's
             rows; DNP applies g_out * Norm(.) per group of outputs: per `head` outputs (q, k, v),
             or per branch (head=0)."""

    def __init__(self, d_in, d_out, cfg, branches=(), head=0, experts=0, dual=True, own_g_in=True):
        super().__init__()
        lead = (experts,) if experts else ()   # an MoE's experts, stacked: (E, out, in)
        self.weight = nn.Parameter(torch.empty(*lead, d_out, d_in))   # GPT._init_weights draws it
        self.experts, self.n_blocks, self.eps = experts, max(len(branches), 1), cfg.norm_eps
        self.n_split = self.n_blocks // max(experts, 1)   # row blocks of one expert's weight
        names, sv = branches or None, cfg.scale_vectors
        rows_in = self.n_blocks if cfg.sv_hetero else 1
        self.g_in = (ScaleVector(rows_in, d_in, cfg, (("weight", "columns"),), names,
                                 experts if cfg.sv_hetero else 0)
                     if sv and own_g_in else None)
        self.placement = PLACEMENTS[cfg.sv_placement if sv and dual else "pre"]
        # DNP's Norm acts on groups of outputs, (blocks, groups per block, group): a head (q, k, v)
        # or a whole branch (gate, up). g_out's row of a block broadcasts over them, shaped
        #   full width (and DP):           (groups, group)  one entry per output
        #   sv_dnp_width="head", q, k, v:  (1, head)        one head-sized vector for its heads
        #   sv_dnp_width="head", gate, up: (1, 1)           one scalar per branch
        self.group = head or d_out // self.n_split
        full = cfg.sv_dnp_width == "full" or not self.placement.norm
        width = d_out // self.n_split if full else head or 1
        self.g_out_shape = (width // self.group, self.group) if full else (1, width)
        kind = self.placement.g_out
        acts = (("weight", "rows"),) if kind == "folded" else AFTER_NORM
        self.g_out = ScaleVector(self.n_blocks, width, cfg, acts, names, experts) if kind else None

    def effective_weight(self, g_in=None):
        """W * (g_out g_in^T): g_in in W's columns (paper 2.2; HG, 3.1: a row per branch), g_out in
        its rows where it folds (DP, 3.2). `g_in` is passed in when the Input-Norm vector is shared
        by several maps (MoE's g_ffn)."""
        W, g_in = self.weight, self.g_in() if self.g_in is not None else g_in
        W = W if g_in is None else fold(W, g_in, "columns")
        return fold(W, self.g_out(), "rows") if self.placement.g_out == "folded" else W

    def forward(self, xn, g_in=None):
        return self.output_side(F.linear(xn, self.effective_weight(g_in)), self.g_out_groups())

    def g_out_groups(self):
        """DNP's g_out as (blocks, *g_out_shape), to broadcast over the groups of the outputs; None
        where there is none after a Norm (dnp_novec: the Norm alone)."""
        if self.g_out is None or not self.placement.norm:
            return None
        return self.g_out().view(self.n_blocks, *self.g_out_shape)

    def output_side(self, y, g):
        """What the placement does after the map: g * Norm(.) per group of y's outputs under DNP
        (paper 3.2), g from g_out_groups (an expert's rows of it in MoE); nothing otherwise (DP's
        g_out is already in the weight)."""
        if not self.placement.norm:
            return y
        return output_norm(y, g, (self.n_split, -1, self.group), self.eps)


class OutputNorm(nn.Module):
    """g * Norm(x) where no linear map follows, so g cannot fold (an Output-Norm, paper 2.2).
    Parameter-free when scale_vectors=False."""

    def __init__(self, d, cfg):
        super().__init__()
        self.eps = cfg.norm_eps
        self.g = ScaleVector(1, d, cfg, AFTER_NORM) if cfg.scale_vectors else None

    def forward(self, x):
        g = self.g().view(-1) if self.g is not None else None
        return F.rms_norm(x, (x.size(-1),), g, self.eps)


# ---- attention, SwiGLU, the block ---------------------------------------------------------------

def rope_table(cfg, T, device, dtype):
    """e^(i t theta_j) for position t < T and pair j of a head, shaped to broadcast over
    (B, T, q|k, H, hd/2), complex in the model's dtype. Computed in float64 (but on MPS, which has
    none), so every CPU gets the same table: float32 sin and cos round differently with the
    vector width. Per forward (T * hd/2 numbers), not a buffer that model.to(dtype) would cast."""
    hd, acc = cfg.n_embd // cfg.n_head, torch.float32 if device.type == "mps" else torch.float64
    freqs = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=acc, device=device) / hd)
    angles = torch.outer(torch.arange(T, dtype=acc, device=device), freqs)   # (T, hd/2)
    rope = torch.polar(torch.ones_like(angles), angles)
    return rope.to(torch.complex128 if dtype == torch.float64 else torch.complex64)[:, None, None]


def apply_rope(x, rope):
    """RoPE: rotate each pair of adjacent channels (a complex number) by a position-dependent
    angle. x: (B, T, ..., hd), here q and k together; one complex multiply is the cheapest form on
    a CPU."""
    xf = x.float() if x.element_size() < 4 else x   # float64 stays float64
    z = torch.view_as_complex(xf.unflatten(-1, (-1, 2)))   # (B, T, ..., hd/2) complex
    return torch.view_as_real(z * rope).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.hd = cfg.n_head, cfg.n_embd // cfg.n_head
        d = cfg.n_embd
        # fused q, k, v; g_attn (or g_q, g_k, g_v under HG) folded into the weight; DNP per head
        self.qkv = ScaledLinear(d, 3 * d, cfg, branches=("q", "k", "v"), head=self.hd)
        # writes into the residual stream: GPT._init_weights scales its init
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
        # (B, H, T, hd) each
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.squeeze(2).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, cfg, hidden, own_g_in=True):
        super().__init__()
        # fused gate and up; g_ffn (or g_gate, g_up under HG) folded in; DNP normalizes each branch
        self.gate_up = ScaledLinear(cfg.n_embd, 2 * hidden, cfg, branches=("gate", "up"),
                                    own_g_in=own_g_in)
        self.down = nn.Linear(hidden, cfg.n_embd, bias=False)   # writes into the residual stream

    def forward(self, xn, g_in=None):
        return self.down(swiglu(self.gate_up(xn, g_in)))


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
        # paper 2.1, Pre-Norm: x + attn(g_attn * Norm(x)), then x + mlp(g_ffn * Norm(x)). g_attn is
        # attn.qkv.g_in, g_ffn mlp.gate_up.g_in: each map computes W diag(g) Norm(x) (ScaledLinear),
        # so Norm(x) is computed once for q, k and v
        h = self.attn(norm(x, self.eps), rope)
        x = x + (self.attn_post(h) if self.post_norm else h)
        h = self.mlp(norm(x, self.eps))
        return x + (self.mlp_post(h) if self.post_norm else h)


# GPT-2 / nanoGPT: the maps that write into the residual stream, attention's output projection and
# the FFN's down projection (the experts' stacked ones too), start at std 0.02 / sqrt(2 * n_layer),
# so that the stream's variance does not grow with depth; every other matrix and the embedding at
# 0.02
RESIDUAL_WRITERS = ("attn.proj.weight", ".down.weight", "mlp.down")


# ---- the model -----------------------------------------------------------------------------------

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = cfg = config
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, cfg.n_experts > 0 and i >= cfg.moe_dense_layers)
                                    for i in range(cfg.n_layer))
        # logits = W_head(g_final * Norm(x)): g_final folds into the head's columns, but the head
        # has more rows (the vocabulary) than a micro-batch has tokens, so it scales the activations
        self.head = ScaledLinear(cfg.n_embd, cfg.padded_vocab, cfg, dual=False, own_g_in=False)
        self.g_final = (ScaleVector(1, cfg.n_embd, cfg, (("head.weight", "columns"),))
                        if cfg.scale_vectors else None)
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self):
        """N(0, std) for every matrix and the embedding, std by the parameter's role
        (RESIDUAL_WRITERS); scale vectors keep their own init. Modules in the order of
        nn.Module.apply, so a seed gives the same weights as it always has (a tied head draws the
        embedding again). Drawn in float64, then rounded: float32 draws round differently with the
        CPU's vector width, float64 ones do not, so a seed gives the same weights on every CPU."""
        names = {m: n for n, m in self.named_modules()}

        def init(m):
            if isinstance(m, ScaleVector):
                return
            for pname, p in m.named_parameters(recurse=False):
                name = f"{names[m]}.{pname}"
                if p.dim() < 2:
                    raise ValueError(
                        f"{name} has no init rule: put a scale vector in a ScaleVector, "
                        "or give it one in GPT._init_weights")
                residual = name.endswith(RESIDUAL_WRITERS)
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if residual else 0.02
                p.copy_(torch.empty_like(p, dtype=torch.float64).normal_(0.0, std))
        with torch.no_grad():
            self.apply(init)

    def forward(self, idx, targets=None):
        """Returns (logits over the tokenizer's vocabulary, mean cross-entropy or None)."""
        c, T = self.config, idx.size(1)
        if T > c.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={c.block_size}")
        rope = rope_table(c, T, idx.device, self.wte.weight.dtype)
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, rope)
        x = norm(x, c.norm_eps)
        logits = self.head(x * self.g_final() if self.g_final is not None else x)
        loss = None
        if targets is not None:   # padded rows take part in the softmax and learn to stay low
            loss = cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits[..., : c.vocab_size], loss

    # ---- scale vectors: where each acts, decay groups, folding -----------------------------------

    def vector_sites(self):
        """{vector: ((weight, side), ...)} of every ScaleVector, as it declares (folds_into): the
        state_dict names of the weights it folds into; () after a Norm."""
        sites = {}
        for name, sv in self.named_modules():
            if isinstance(sv, ScaleVector):
                if sv.folds_into != AFTER_NORM and not (sv.folds_into and all(
                        len(s) == 2 and s[1] in ("columns", "rows") for s in sv.folds_into)):
                    raise ValueError(f"{name}: folds_into must be AFTER_NORM or ((weight, "
                                     f"'columns' or 'rows'), ...), not {sv.folds_into!r}")
                holder = name.rpartition(".")[0]
                sites[name] = () if sv.folds_into == AFTER_NORM else tuple(
                    (".".join(filter(None, (holder, w))), side) for w, side in sv.folds_into or ())
        return sites

    def param_classes(self):
        """name -> class for every parameter, each in exactly one class: 'matrix', 'embedding'
        (input, untied output), 'sv_input' (a vector of a block that folds, as it declares: an
        Input-Norm vector or DP's g_out), 'sv_final' (g_final, the Input-Norm vector before the
        head) or 'sv_output' (after a Norm, it cannot fold)."""
        sites, classes, seen = self.vector_sites(), {}, set()
        for mname, m in self.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen:   # a tied head shares the embedding's tensor
                    continue
                seen.add(id(p))
                if isinstance(m, ScaleVector):
                    cls = ("sv_final" if m is self.g_final
                           else "sv_input" if sites[mname] else "sv_output")
                elif m is self.wte or m is self.head:   # the input and output embeddings
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
        """Optimizer groups, one per class of param_classes() (and optimizer): matrices and
        embeddings decayed by weight_decay, scale vectors as DECAY_POLICIES[sv_weight_decay] says
        (paper 2.2), by sv_decay (None: weight_decay). AdamW's decoupled decay pulls each raw
        parameter toward 0 (DESIGN.md: what that does to OR's and ER's g). muon=True: the 2-D
        hidden matrices go to Muon (torch.optim.Muon takes 2-D tensors only, so the stacked
        (E, out, in) expert weights stay on AdamW). lr_mult: the class's factor of the learning
        rate, lr_mults {class: factor} (default 1), which train.py's schedule multiplies."""
        decayed = {"matrix", "embedding", *DECAY_POLICIES[sv_weight_decay]}
        classes, params = self.param_classes(), dict(self.named_parameters())
        order = ("matrix", "embedding", "sv_input", "sv_final", "sv_output")
        lr_mults, groups = lr_mults or {}, []
        if set(lr_mults) - set(order):   # a misspelt class would silently train at 1x
            raise ValueError(f"lr_mults: {sorted(set(lr_mults) - set(order))} are not classes of "
                             f"GPT.param_classes ({', '.join(order)})")
        for cls in order:
            members = [params[n] for n, c in classes.items() if c == cls]
            to_muon = [p for p in members if muon and cls == "matrix" and p.dim() == 2]
            to_adamw = [p for p in members if all(p is not q for q in to_muon)]
            coef = sv_decay if sv_decay is not None and cls.startswith("sv_") else weight_decay
            for opt, ps in (("muon", to_muon), ("adamw", to_adamw)):
                if ps:
                    groups.append({"params": ps, "name": cls, "optimizer": opt,
                                   "weight_decay": coef if cls in decayed else 0.0,
                                   "lr_mult": float(lr_mults.get(cls, 1.0))})
        return groups

    def configure_optimizers(self, *, learning_rate, weight_decay, betas, sv_weight_decay="none",
                             sv_decay=None, optimizer="adamw", muon_lr=None, muon_momentum=0.95,
                             lr_mults=None):
        """AdamW over the groups of param_groups(); optimizer="muon": Muon takes the 2-D hidden
        matrices instead (its update scaled to AdamW's RMS, so muon_lr, default learning_rate, is
        on AdamW's scale). Each group's base_lr times its lr_mult is what train.py's schedule
        scales; a resume keeps both (checkpoint.restore keeps the run's own group settings)."""
        groups = self.param_groups(weight_decay, sv_weight_decay, sv_decay, optimizer == "muon",
                                   lr_mults)
        muon_lr = muon_lr or learning_rate
        for g in groups:
            g["base_lr"] = muon_lr if g["optimizer"] == "muon" else learning_rate
        # the fused kernel: one pass over all tensors (on a CPU, 3-4x faster than the loop)
        fused = self.wte.weight.device.type in ("cuda", "cpu")
        opts = [torch.optim.AdamW([g for g in groups if g["optimizer"] == "adamw"],
                                  lr=learning_rate, betas=betas, fused=fused)]
        muon = [g for g in groups if g["optimizer"] == "muon"]
        if muon:
            opts.append(torch.optim.Muon(muon, lr=muon_lr, momentum=muon_momentum,
                                         adjust_lr_fn="match_rms_adamw"))
        return opts

    @torch.no_grad()
    def fold_scale_vectors(self):
        """A new, equivalent GPT with scale_vectors=False, in this model's dtype and on its device
        (paper 2.2: W(g * z) = (W diag(g)) z, so an Input-Norm vector adds no expressivity): each
        vector folds where it declares (vector_sites). Refused for a vector after a Norm
        (Output-Norms add expressivity) and for DNP's Norm after the maps."""
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
        # g_final folds into the head, so a tied head must be untied
        off = {f.name: f.default for f in fields(c)
               if f.name in VECTOR_FLAGS and not VECTOR_FLAGS[f.name].adds_norm}
        plain_cfg = replace(c, scale_vectors=False, **off,
                            tie_embeddings=c.tie_embeddings and not c.scale_vectors)
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
        processes in place (dist.all_reduce under DDP), so that every process keeps the same
        bias."""
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
        """Parameters one token uses: of each tensor split over the E routed experts of an MoE
        layer (the stacked expert weights, and every vector that declares it is per expert), the k
        experts it is routed to."""
        c, routed = self.config, 0
        for m in self.modules():
            if isinstance(m, MoE):
                routed += m.down.numel()
            if isinstance(m, ScaledLinear) and m.experts or isinstance(m, ScaleVector) and \
                    m.experts:
                routed += sum(p.numel() for p in m.parameters(recurse=False))
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
        that a caller can print each as it comes (sample.py); at most block_size tokens are fed
        back; temperature 0: greedy, the most likely token each time."""
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


# train.py's sv_weight_decay: the classes of GPT.param_classes() whose vectors get decayed, by
# train.py's sv_decay (default: weight_decay's value); matrices and embeddings always are
DECAY_POLICIES = {
    "none": (),
    # paper 2.2: only the Input-Norm ones, which fold (g_final, before the head, is one)
    "iwd": ("sv_input", "sv_final"),
    # IWD's control (our choice): the blocks' Input-Norms, not g_final, the one vector that still
    # acts on the function under DNP (DESIGN.md)
    "iwd_blocks": ("sv_input",),
    "all": ("sv_input", "sv_final", "sv_output"),
    # the other half of the paper's claim (our control): only the vectors after a Norm, which
    # cannot fold (qk_norm, post_norm, DNP's g_out)
    "owd": ("sv_output",),
}


# ---- the config and its checks ------------------------------------------------------------------

class VectorFlag(NamedTuple):
    values: object            # the values it takes: a tuple, or the table whose keys they are
    adds_norm: bool = False   # it adds a Norm too, which stays (parameter-free) without vectors
    moe_only: bool = False    # it acts in the MoE FFN only: a dense model refuses it


# The GPTConfig flags that put or shape scale vectors: GPTConfig refuses all but their default under
# scale_vectors=False (a moe_only one, without n_experts > 0 too), fold_scale_vectors resets them,
# the generic tests build their models from them (a moe_only one on an MoE). A new location is one
# entry.
VECTOR_FLAGS = dict(sv_hetero=VectorFlag((False, True)), sv_placement=VectorFlag(PLACEMENTS),
                    sv_reparam=VectorFlag(REPARAMS), sv_dnp_width=VectorFlag(DNP_WIDTHS),
                    qk_norm=VectorFlag((False, True), adds_norm=True),
                    post_norm=VectorFlag((False, True), adds_norm=True))


@dataclass
class GPTConfig:
    block_size: int = 1024       # the context: tokens per sequence
    vocab_size: int = 50257      # the tokenizer's; the embedding is padded to vocab_pad
    vocab_pad: int = 64          # rows rounded up for fast matmuls; padded ids are never sampled
    n_layer: int = 12            # blocks
    n_head: int = 12             # attention heads
    n_embd: int = 768            # the width of the residual stream
    mlp_hidden: int = 0          # 0: 8/3 * n_embd rounded up to a multiple of 32 (Llama: as
                                 # many weights as a 4x GELU MLP)
    tie_embeddings: bool = True  # the head is the embedding (its g_final folds into it untied)
    rope_theta: float = 10000.0  # RoPE's base
    norm_eps: float = 1e-6       # the eps of every Norm, OR's too
    # scale vectors: one flag per variant (DESIGN.md)
    scale_vectors: bool = True   # False: every norm is parameter-free (paper Fig. 1 ablation)
    sv_hetero: bool = False      # HG, paper 3.1: one g_in per branch (q, k, v; gate, up)
    sv_placement: str = "pre"    # DP, DNP: vectors on both sides of the maps (paper 3.2)
    sv_reparam: str = "none"     # OR, ER: g as a magnitude times a direction (paper 3.3)
    sv_dnp_width: str = "full"   # DNP's g_out: the map's width, or a head's ("head")
    qk_norm: bool = False        # g_q * Norm(q), g_k * Norm(k) per head (Output-Norm)
    post_norm: bool = False      # x + g_post * Norm(branch) (Output-Norm)
    # Mixture-of-Experts FFN in place of the dense SwiGLU (class MoE); n_experts=0: dense
    n_experts: int = 0           # routed experts per MoE layer
    n_experts_active: int = 2    # top-k routed experts per token
    n_shared_experts: int = 0    # experts every token goes through
    moe_hidden: int = 0          # each expert's SwiGLU width; 0: hidden / (k + shared), rounded
                                 # up to 32 (the dense FFN's active size)
    moe_dense_layers: int = 0    # the first N layers keep the dense SwiGLU (1: "all but the first")
    moe_bias_rate: float = 1e-3  # DeepSeek-V3's balancing: the expert bias's step (0: none)

    def __post_init__(self):
        check_config(self)

    @property
    def hidden(self):
        return self.mlp_hidden or 32 * math.ceil(8 * self.n_embd / 3 / 32)

    @property
    def expert_hidden(self):
        active = self.n_experts_active + self.n_shared_experts
        return self.moe_hidden or 32 * math.ceil(self.hidden / active / 32)

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)


def check_config(c):
    """Every value and combination a GPT cannot build, or where a flag would do nothing, as a
    ValueError of one sentence (train.py checks each key's range before: config/defaults.py)."""
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

class MoE(nn.Module):
    """Mixture-of-Experts FFN: each token goes through the top-k of E routed SwiGLU experts,
    weighted by their softmax scores renormalized to sum to 1 (k > 1), plus the shared experts; no
    token is dropped. Router in at least fp32. Balance: DeepSeek-V3's expert bias, which changes
    which experts are chosen, not the gates (update_bias; no auxiliary loss). Scale vectors: one
    Input-Norm vector g_ffn (self.g_in) shared by router and experts; under HG the router and
    every expert's gate and up own theirs (DESIGN.md); DP and DNP apply per expert. The experts'
    weights are stacked (E, ...) tensors, so an expert that gets no token still takes part in
    autograd (a zero gradient) and DDP needs no find_unused_parameters."""

    def __init__(self, cfg):
        super().__init__()
        d, E, h, hg = cfg.n_embd, cfg.n_experts, cfg.expert_hidden, cfg.sv_hetero
        self.E, self.k, self.bias_rate = E, cfg.n_experts_active, cfg.moe_bias_rate
        maps = ("router", "experts", "shared.gate_up")[:3 if cfg.n_shared_experts else 2]
        self.g_in = (ScaleVector(1, d, cfg, tuple((f"{m}.weight", "columns") for m in maps))
                     if cfg.scale_vectors and not hg else None)
        self.router = ScaledLinear(d, E, cfg, dual=False, own_g_in=hg)
        per_expert = tuple(f"{e}.{b}" for e in range(E) for b in ("gate", "up"))   # "3.gate"
        self.experts = ScaledLinear(d, 2 * h, cfg, branches=per_expert, experts=E, own_g_in=hg)
        # (E, d, h); writes into the residual stream (GPT._init_weights)
        self.down = nn.Parameter(torch.empty(E, d, h))
        shared = cfg.n_shared_experts
        self.shared = SwiGLU(cfg, shared * h, own_g_in=hg) if shared else None
        self.register_buffer("expert_bias", torch.zeros(E))   # checkpointed with the weights
        # assignments per expert since the last update: not a buffer, DDP would overwrite it with
        # rank 0's
        self.load, self.last_load = None, None
        # "loop" | "grouped" (torch._grouped_mm); None: grouped on CUDA in bf16, else loop
        self.impl = None

    def route(self, x):
        """x (N, d) -> expert ids (N, k), gates (N, k) that sum to 1 (k > 1), scores (N, E); all in
        at least fp32."""
        with torch.autocast(x.device.type, enabled=False):
            W = self.router.effective_weight(self.g_in() if self.g_in is not None else None)
            acc = torch.promote_types(x.dtype, torch.float32)   # float32, or float64
            logits = F.linear(x.to(acc), W.to(acc))
        scores = logits.softmax(-1)
        # the bias only chooses
        ids = torch.topk(scores + self.expert_bias.float(), self.k, dim=-1).indices
        # top-1 keeps its score (Switch): a gate fixed to 1 would not train the router
        gates = scores.gather(-1, ids)
        return ids, gates / gates.sum(-1, keepdim=True) if self.k > 1 else gates, scores

    def forward(self, xn):
        x = xn.reshape(-1, xn.size(-1))                # (B, T, d) -> (N, d)
        N, k, E = x.size(0), self.k, self.E
        ids, gates, _ = self.route(x)
        g_in = self.g_in() if self.g_in is not None else None
        flat = ids.flatten()                           # N * k assignments, token-major
        order = flat.argsort(stable=True)              # sorted by expert
        # tokens per expert (bincount, static shape)
        counts = flat.new_zeros(E).scatter_add_(0, flat, torch.ones_like(flat))
        xs, expert = x[order // k], flat[order]        # (N * k, d) in expert order, their experts
        W = self.experts.effective_weight(g_in)        # (E, 2h, d): W * (g_out g_in^T) per expert
        y = self.run_experts(xs, expert, counts, W)    # (N * k, d) in expert order
        y = torch.empty_like(y).index_copy_(0, order, y).view(N, k, -1)   # token order: (N, k, d)
        out = (y * gates.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x, g_in)
        if self.training:   # counted in each training forward, applied after the optimizer step
            self.load = counts.float() if self.load is None else self.load + counts
        return out.view(xn.shape).type_as(xn)

    def run_experts(self, xs, expert, counts, W):
        """Each expert's SwiGLU on its rows of xs, sorted by expert (`expert`: each row's);
        DNP's g_out rows of an expert apply to its outputs."""
        dev = xs.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else xs.dtype
        impl = self.impl or ("grouped" if xs.is_cuda and dt == torch.bfloat16
                             and hasattr(torch, "_grouped_mm") else "loop")
        g = self.experts.g_out_groups()   # (E * branches, ...) -> (E, branches, ...)
        g = g.unflatten(0, (self.E, -1)) if g is not None else None
        if impl == "grouped":   # one grouped GEMM per projection; the groups are the experts' rows
            offs = counts.cumsum(0).int()
            mm = lambda a, w: torch._grouped_mm(a.to(dt), w.to(dt).transpose(-2, -1), offs=offs)
            h = self.experts.output_side(mm(xs, W), g[expert] if g is not None else None)
            return mm(swiglu(h), self.down)
        y = []                  # an expert with no token runs on an empty slice
        parts = zip(xs.split(counts.tolist()), W.unbind(), self.down.unbind())
        for e, (xe, We, De) in enumerate(parts):
            h = self.experts.output_side(F.linear(xe, We), g[e] if g is not None else None)
            y.append(F.linear(swiglu(h), De))
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
