"""The model: shapes, size, causality, init, the variant tables, and the exact properties of the scale-vector
variants that DESIGN.md lists ("Properties a test can check exactly")."""
import itertools
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import model as model_py
from helpers import TINY, VARIANTS, expected_decay, make, randomize_scale_vectors, tokens
from model import GPT, GPTConfig, Placement, ScaledLinear, ScaleVector


def test_shapes_and_loss():
    model = make()
    idx = tokens()
    logits, loss = model(idx, tokens(seed=5))
    assert logits.shape == (3, 16, TINY["vocab_size"])   # padded rows are not returned
    assert model.wte.weight.shape[0] == 56                # 50 padded to a multiple of 8
    assert loss.dim() == 0 and abs(loss.item() - torch.log(torch.tensor(56.0)).item()) < 0.1   # near-uniform at init
    assert model(idx)[1] is None


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_count_closed_formula(tie):
    c = GPTConfig(**{**TINY, "tie_embeddings": tie})
    d, V, h, L = c.n_embd, c.padded_vocab, c.hidden, c.n_layer
    assert h == 96   # 8/3 * 32 rounded up to a multiple of 32
    per_layer = 4 * d * d + 3 * d * h + 2 * d   # qkv, proj, gate/up, down, g_attn and g_ffn
    expected = V * d * (1 if tie else 2) + L * per_layer + d   # + g_final
    assert make(tie_embeddings=tie).num_params() == expected


def test_unified_extra_parameters_closed_formula():
    c = GPTConfig(**TINY)
    d, h, L = c.n_embd, c.hidden, c.n_layer
    extra = GPT(GPTConfig(**TINY, **VARIANTS["unified"])).num_params() - GPT(c).num_params()
    # HG: g_q, g_k, g_v and g_gate, g_up instead of g_attn, g_ffn; DNP: g_a over q, k, v (3d) and gate, up (2h);
    # OR: one beta per vector row (5 input rows + 5 output rows per layer, 1 for g_final)
    assert extra == L * ((3 * d - d) + (2 * d - d) + 3 * d + 2 * h + 10) + 1


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality(name):
    model = make(**VARIANTS[name])
    randomize_scale_vectors(model)
    a = tokens()
    b = a.clone()
    b[:, 10:] = (b[:, 10:] + 7) % TINY["vocab_size"]   # change only the later tokens
    la, lb = model(a)[0], model(b)[0]
    assert torch.equal(la[:, :10], lb[:, :10])
    assert not torch.allclose(la[:, 10:], lb[:, 10:])


def test_config_errors():
    with pytest.raises(ValueError, match="sv_placement"):
        GPTConfig(sv_placement="post")
    with pytest.raises(ValueError, match="sv_reparam"):
        GPTConfig(sv_reparam="exp")
    with pytest.raises(ValueError, match="sv_hetero=True needs scale_vectors=True"):
        GPTConfig(scale_vectors=False, sv_hetero=True)
    with pytest.raises(ValueError, match="redundant"):
        GPTConfig(qk_norm=True, sv_placement="dnp")


def test_no_scale_vectors_means_no_scale_vector_parameters():
    model = make(scale_vectors=False, qk_norm=True, post_norm=True)   # the norms stay, parameter-free
    assert not any(isinstance(m, ScaleVector) for m in model.modules())
    assert all(p.dim() == 2 for p in model.parameters())
    assert set(model.param_classes().values()) == {"matrix", "embedding"}


@pytest.mark.parametrize("name,same", [("hetero", True), ("dp", True), ("or", True), ("er", True),
                                       ("dnp", False), ("unified", False), ("gemma", False)])
def test_function_at_init_versus_baseline(name, same):
    """All vectors are 1 at init: HG, DP, OR and ER compute the baseline's function; DNP, qk_norm and
    post_norm add normalizations, so they do not."""
    idx = tokens()
    base = make(seed=0)(idx)[0]
    variant = make(seed=0, **VARIANTS[name])(idx)[0]
    assert torch.allclose(base, variant, atol=1e-5) == same


FOLDABLE = [dict(sv_hetero=h, sv_placement=p, sv_reparam=r, tie_embeddings=t)
            for h, p, r, t in itertools.product([False, True], ["pre", "dp"], ["none", "or", "er"], [True, False])]


@pytest.mark.parametrize("kw", FOLDABLE, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_folding_reproduces_logits_and_loss(kw):
    """Paper 2.2: an Input-Norm vector adds no expressivity; fold_scale_vectors makes that executable."""
    model = make(**kw)
    randomize_scale_vectors(model)
    plain = model.fold_scale_vectors()
    assert plain.config.scale_vectors is False and not plain.config.tie_embeddings
    assert not any(isinstance(m, ScaleVector) for m in plain.modules())
    idx = tokens()
    logits, loss = model(idx, idx)
    plain_logits, plain_loss = plain(idx, idx)
    assert not torch.allclose(logits, make(**kw)(idx)[0], atol=1e-3)   # the vectors did change the function
    assert torch.allclose(logits, plain_logits, atol=2e-5, rtol=1e-4)
    assert abs(loss.item() - plain_loss.item()) < 1e-5


@pytest.mark.parametrize("name", ["dnp", "gemma", "unified"])
def test_folding_refuses_output_norm_vectors(name):
    with pytest.raises(ValueError, match="cannot fold"):
        make(**VARIANTS[name]).fold_scale_vectors()


@pytest.mark.parametrize("policy", ["none", "all", "iwd"])
@pytest.mark.parametrize("kw", [dict(qk_norm=True, post_norm=True, sv_reparam="or"), dict(sv_placement="dp", sv_hetero=True),
                                dict(sv_placement="dnp", post_norm=True, sv_reparam="er"), VARIANTS["unified"]])
def test_weight_decay_groups_follow_the_rules(policy, kw):
    model = make(**kw)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = model.param_groups(0.1, policy)
    seen = [names[id(p)] for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(names.values())   # each parameter exactly once
    for g in groups:
        for p in g["params"]:
            assert (g["weight_decay"] > 0) == expected_decay(names[id(p)], kw.get("sv_placement", "pre"), policy), names[id(p)]


def effective_update(lr=0.5, **kw):
    """How one SGD step moves each effective weight W * (u v^T)."""
    model = make(seed=0, **kw)
    before = {n: m.effective_weight().detach().clone() for n, m in model.named_modules() if isinstance(m, ScaledLinear)}
    idx = tokens()
    model(idx, tokens(seed=5))[1].backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
        return {n: m.effective_weight() - before[n] for n, m in model.named_modules() if isinstance(m, ScaledLinear)}


@pytest.mark.parametrize("name", ["hetero", "dp", "or", "er", "noscale"])
def test_each_variant_changes_the_update_of_the_linear_maps(name):
    """Same function at init, yet a different preconditioner (paper 2.2, 3): the effective weights
    W * (u v^T) move differently from the baseline's in one SGD step, so no flag is silently inert."""
    base, again, variant = effective_update(), effective_update(), effective_update(**VARIANTS[name])
    for k in ("blocks.0.attn.qkv", "blocks.0.mlp.gate_up"):
        assert torch.equal(base[k], again[k])   # deterministic: a difference is the variant's doing
        assert (base[k] - variant[k]).abs().max() > 1e-3 * base[k].abs().max(), k


def test_scale_vector_preconditions_columns():
    """Paper 2.2: with W_eff = W diag(g), one gradient step moves column j of W_eff by
    -lr * (g_j^2 I + w_j w_j^T) grad_j to first order in lr (here g = 1)."""
    torch.manual_seed(0)
    cfg = GPTConfig(**TINY)
    lin = ScaledLinear(8, 6, cfg)
    torch.nn.init.normal_(lin.weight)
    W = lin.weight.detach().clone()
    z = torch.randn(5, 8)
    target = torch.randn(5, 6)
    W_eff = lin.effective_weight()
    W_eff.retain_grad()
    ((torch.nn.functional.linear(z, W_eff) - target) ** 2).sum().backward()
    G = W_eff.grad   # the gradient with respect to the effective weight
    lr = 1e-4
    with torch.no_grad():
        for p in lin.parameters():
            p -= lr * p.grad
        delta = (lin.effective_weight() - W_eff) / -lr
    predicted = torch.stack([(torch.eye(6) + torch.outer(W[:, j], W[:, j])) @ G[:, j] for j in range(8)], dim=1)
    assert torch.allclose(delta, predicted, rtol=1e-2, atol=1e-2 * G.abs().max().item())
    assert not torch.allclose(delta, G, rtol=1e-2, atol=1e-2 * G.abs().max().item())   # not plain SGD


def test_variants_share_the_initial_weights_of_the_baseline():
    """A seed fixes every weight the variants share, so variants are compared like with like."""
    base = make(seed=3).state_dict()
    for name, kw in VARIANTS.items():
        model = make(seed=3, **kw)
        variant = model.state_dict()
        for k, cls in model.param_classes().items():
            if cls in ("matrix", "embedding"):
                assert torch.equal(base[k], variant[k]), (name, k)


def test_scale_vector_stats_names_each_branch():
    stats = make(**VARIANTS["unified"]).scale_vector_stats()
    assert {"blocks.0.attn.qkv.g_in.q", "blocks.0.attn.qkv.g_in.k", "blocks.0.attn.qkv.g_in.v",
            "blocks.1.mlp.gate_up.g_out.up", "g_final"} <= set(stats)
    assert all(abs(mean - 1) < 1e-5 and abs(lo - 1) < 1e-5 and abs(hi - 1) < 1e-5 for mean, lo, hi in stats.values())


def test_generate_extends_the_prompt_with_valid_ids():
    model = make()
    out = model.generate(tokens(B=2, T=4), max_new_tokens=20, top_k=5)   # longer than block_size: cropped
    assert out.shape == (2, 24) and int(out.max()) < TINY["vocab_size"]
