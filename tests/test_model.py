"""The model's shapes, sizes, init, single variants' formulas, telemetry (all: variant tables);
DESIGN.md's claims that code can check."""
import hashlib
import inspect
import math

import pytest
import torch
import torch.nn as nn

import model as model_py
import telemetry
from helpers import MOE, TINY, VARIANTS, make, randomize_scale_vectors, tokens
from model import GPT, GPTConfig, Placement, ScaledLinear, ScaleVector


def test_shapes_loss_a_dtype_cast_and_generation():
    model, idx = make(), tokens()
    logits, loss = model(idx, tokens(seed=5))
    assert logits.shape == (3, 16, TINY["vocab_size"])   # padded rows are not returned
    assert model.wte.weight.shape[0] == 56                # 50 padded to a multiple of 8
    assert loss.dim() == 0 and abs(loss.item() - math.log(56)) < 0.1   # near-uniform at init
    assert model(idx)[1] is None
    # model.to(dtype) once cast a complex RoPE buffer to a real one (logits moved by 5e-4)
    torch.testing.assert_close(make().double()(idx)[0], logits.double(), atol=1e-6, rtol=0)
    model, prompt = model.eval(), tokens(B=2, T=4)   # generate crops to the block ...
    out = model.generate(prompt, max_new_tokens=20, top_k=5)   # longer than block_size
    assert out.shape == (2, 24) and int(out.max()) < TINY["vocab_size"]
    out = model.generate(prompt, max_new_tokens=3, temperature=0)   # ... and is greedy at 0
    for t in range(4, 7):   # each new token is the argmax of the logits of the sequence before it
        assert torch.equal(out[:, t], model(out[:, :t])[0][:, -1].argmax(-1))


def test_parameter_counts_closed_formulas_dense_and_moe_and_the_flops(monkeypatch):
    c = GPTConfig(**TINY)
    d, V, h, L, hd = c.n_embd, c.padded_vocab, c.hidden, c.n_layer, c.n_embd // c.n_head
    assert h == 96   # 8/3 * 32 rounded up to a multiple of 32
    per_layer = 4 * d * d + 3 * d * h + 2 * d   # qkv, proj, gate/up, down, g_attn and g_ffn
    for tie in (True, False):   # tied: one V x d matrix, not two; + d: g_final
        assert make(tie_embeddings=tie).num_params() == V * d * (2 - tie) + L * per_layer + d
    extra = lambda base={}, **kw: make(**base, **kw).num_params() - make(**base).num_params()
    # HG: g_q, g_k, g_v and g_gate, g_up instead of g_attn, g_ffn; DNP: g_out over q, k, v (3d) and
    # gate, up (2h); OR: one beta per vector row (5 input + 5 output rows per layer, 1 for g_final)
    assert extra(**VARIANTS["unified"]) == L * ((3 * d - d) + (2 * d - d) + 3 * d + 2 * h + 10) + 1
    # DNP "head": g_out of 3 * head_dim (q, k, v) and 2 (gate, up; per expert and shared expert)
    assert extra(sv_placement="dnp", sv_dnp_width="head") == L * (3 * hd + 2)
    assert extra(MOE, sv_placement="dnp", sv_dnp_width="head") == L * (3 * hd + 2 * 4 + 2 * 1)
    # an MoE layer: router, E experts, the shared one instead of the dense SwiGLU; a token sees k
    moe, dense = make(**MOE, moe_dense_layers=1), make()
    he, E, k, s = (model_py.expert_hidden(moe.config), *(getattr(moe.config, a) for a in (
        "n_experts", "n_experts_active", "n_shared_experts")))
    layer = d * E + 3 * d * he * E + 3 * d * he * s
    assert moe.num_params() == dense.num_params() + layer - 3 * d * h
    assert moe.num_active_params() == moe.num_params() - 3 * d * he * (E - k)
    assert dense.num_active_params() == dense.num_params()
    assert (moe.flops_per_token()
            < GPT(GPTConfig(**TINY, **{**MOE, "n_experts": 16})).flops_per_token() + 6 * d * 12)
    assert model_py.expert_hidden(GPTConfig(n_embd=768, n_experts=8, n_experts_active=2,
                                            n_shared_experts=1)) == 704   # 2048 / 3
    # the peak for MFU: fp32 uses TF32 (half of bf16's); an unknown GPU has none (a CPU: test_bench)
    peak, gpu = telemetry.peak_flops, torch.device("cuda")
    for name, bf16 in (("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA Z9000", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        assert (peak(gpu, torch.bfloat16), peak(gpu, torch.float32)) == (bf16, bf16 and bf16 / 2)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality(name):
    model = make(**VARIANTS[name])
    randomize_scale_vectors(model)
    a = tokens()
    b = torch.cat([a[:, :10], (a[:, 10:] + 7) % TINY["vocab_size"]], 1)   # later tokens differ
    la, lb = model(a)[0], model(b)[0]
    assert torch.equal(la[:, :10], lb[:, :10]) and not torch.allclose(la[:, 10:], lb[:, 10:])


def test_config_errors_name_the_field(monkeypatch):
    head = "sv_dnp_width='head' .* needs sv_placement='dnp'"
    moe = [dict(n_experts=4, n_experts_active=5), dict(n_experts=4, moe_bias_rate=-1.0),
           dict(n_experts=4, moe_dense_layers=12), dict(n_experts=-1)]
    cases = [(dict(scale_vectors=False, sv_hetero=True), "sv_hetero=True needs scale_vectors=True"),
             (dict(qk_norm=True, sv_placement="dnp"), "redundant"),
             # the width, through the placement table: dnp_novec has DNP's Norm only
             *[(dict(sv_dnp_width="head", sv_placement=p), head) for p in ("dp", "dnp_novec")],
             (dict(sv_dnp_width="quarter", sv_placement="dnp"),   # a table's choices, listed
              "sv_dnp_width must be one of 'full', 'head'")]
    for kw, match in cases + [(kw, list(kw)[-1]) for kw in moe]:   # MoE: names the field set last
        with pytest.raises(ValueError, match=match):
            GPTConfig(**kw)
    # a fork's table entry with a piece ScaledLinear does not build (before the table, an
    # output-side vector with no Norm after it was built, never applied, and trained inert)
    for entry in (Placement("output", norm=False), Placement("input", norm=True),
                  Placement("sideways", norm=False)):
        monkeypatch.setitem(model_py.PLACEMENTS, "xp", entry)
        with pytest.raises(ValueError, match=r"PLACEMENTS\['xp'\]"):
            GPTConfig(**TINY, sv_placement="xp")


def test_scale_vector_preconditions_columns():
    """Paper 2.2: a step moves column j of W diag(g) by -lr (g_j^2 I + w_j w_j^T) grad_j."""
    torch.manual_seed(0)
    lin = ScaledLinear(8, 6, GPTConfig(**TINY))
    torch.nn.init.normal_(lin.weight)
    W, z, target = lin.weight.detach().clone(), torch.randn(5, 8), torch.randn(5, 6)
    (W_eff := lin.effective_weight()).retain_grad()
    ((torch.nn.functional.linear(z, W_eff) - target) ** 2).sum().backward()
    G, lr = W_eff.grad, 1e-4   # the gradient with respect to the effective weight
    with torch.no_grad():
        for p in lin.parameters():
            p -= lr * p.grad
        delta = (lin.effective_weight() - W_eff) / -lr
    predicted = G + W * (W * G).sum(0)   # column j: (I + w_j w_j^T) grad_j
    # the first-order law holds within 1e-2 at lr = 1e-4; plain SGD (delta = G) does not
    tol = dict(rtol=1e-2, atol=1e-2 * G.abs().max().item())
    assert torch.allclose(delta, predicted, **tol) and not torch.allclose(delta, G, **tol)


def test_the_initial_weights_are_pinned_and_follow_the_role():
    """Seed 0's weights, bit for bit on every CPU (drawn in float64, then rounded: one hash under
    ATEN_CPU_CAPABILITY=default, avx2, avx512); residual writers' std 0.02 / sqrt(2 n_layer)."""
    sd = make(seed=0).state_dict()   # the head tied: its bytes hashed twice
    every_bit = hashlib.sha256(b"".join(v.numpy().tobytes() for v in sd.values())).hexdigest()
    assert every_bit == "05d00fa64b631f3f4870762c719fb862cf479258046c94ded71ec8b61e3aa5b9"
    # 10% of the dense model's std: over 1k draws, many sigmas; 15% of the MoE's (its router: 128)
    for model, tol in ((make(), 0.1), (make(n_experts=4, n_shared_experts=1, n_layer=8), 0.15)):
        classes, residual = model.param_classes(), 0.02 / math.sqrt(2 * model.config.n_layer)
        for n, p in model.named_parameters():
            if classes[n] in ("matrix", "embedding"):
                writer = n.endswith(("attn.proj.weight", "mlp.down", "down.weight"))
                want = residual if writer else 0.02
                assert abs(p.std().item() - want) < tol * want, (n, p.std().item())
    # a fork's gain outside a ScaleVector (decay and folding would not know it) has no class
    model = make()
    model.blocks[0].attn.register_parameter("gain", nn.Parameter(torch.ones(32)))
    with pytest.raises(ValueError, match="blocks.0.attn.gain has no class"):
        model.param_classes()


@pytest.mark.parametrize("width", ["full", "head"])
def test_dense_dnp_is_the_formula_per_head_and_per_branch(width):
    """q, k, v = g_out Norm_per_head(W (g_in Norm(x))), gate, up = g_out Norm(W (g_in Norm(x))), by
    hand (HG: a g_in per branch); "head": g_out repeated (hd per head, a number for gate, up).
    DESIGN.md, Mixture of Experts: two shared experts are one SwiGLU, one Norm over both's units."""
    model = make(sv_placement="dnp", sv_hetero=True, sv_dnp_width=width,
                 **{**MOE, "n_shared_experts": 2}, moe_dense_layers=1)
    randomize_scale_vectors(model)
    rms = lambda z: z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)   # norm_eps
    d, H, hd, h = 32, 2, 16, model.config.hidden
    xn = rms(torch.randn(2, 5, d, generator=torch.Generator().manual_seed(7)))
    assert model.blocks[0].attn.qkv.g_out.g.shape == ((3, d) if width == "full" else (3, hd))
    assert model.blocks[0].mlp.gate_up.g_out.g.shape == ((2, h) if width == "full" else (2, 1))
    for name, heads in (("blocks.0.attn.qkv", H), ("blocks.0.mlp.gate_up", 1),   # per head;
                        ("blocks.1.mlp.shared.gate_up", 1)):   # per branch: gate, up
        lin = model.get_submodule(name)
        n = lin.g_out.g.size(0)
        W, w = lin.weight.view(n, -1, d), lin.weight.size(0) // n   # a branch's rows, its width
        for b in range(n):
            y = ((xn * lin.g_in.g[b]) @ W[b].T).unflatten(-1, (heads, -1))
            g_out = lin.g_out.g[b].repeat(w // lin.g_out.g[b].numel())
            torch.testing.assert_close(lin(xn)[..., b * w:(b + 1) * w], g_out * rms(y).flatten(-2),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_dnp_novec_is_dnp_with_its_output_vector_frozen_at_one(moe):
    """The DNP control (DNP's Norm after the map, no g_out) is DNP with g_out fixed at 1."""
    kw = dict(sv_hetero=True, **(MOE if moe else {}))
    dnp, ctrl = make(sv_placement="dnp", **kw), make(sv_placement="dnp_novec", **kw)
    assert not [n for n, _ in ctrl.named_parameters() if ".g_out." in n]
    randomize_scale_vectors(ctrl)
    missing = dnp.load_state_dict(ctrl.state_dict(), strict=False).missing_keys
    assert missing and all(".g_out." in k for k in missing), missing   # only g_out, at its init
    for m in (dnp, ctrl):
        m(tokens(), tokens(seed=2))[1].backward()
    torch.testing.assert_close(dnp(tokens())[0], ctrl(tokens())[0], atol=0, rtol=0)
    for n, p in ctrl.named_parameters():
        torch.testing.assert_close(dnp.get_parameter(n).grad, p.grad, atol=0, rtol=0, msg=n)


def logits_and_matrix_grads(model):
    logits, loss = model(tokens(), tokens(seed=2))
    model.zero_grad()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.ndim > 1}


@pytest.mark.parametrize("moe", [False, True])
def test_under_dnp_the_input_norm_vectors_are_scale_invariant_but_g_final_is_not(moe):
    """DESIGN.md, "Where IWD can act inside the unified strategy": Norm(W(c g x)) = Norm(W(g x));
    the head sees g_final with no Norm after it."""
    model = make(**VARIANTS["unified"], **(MOE if moe else {}), norm_eps=1e-30).double()
    randomize_scale_vectors(model)
    logits, grads = logits_and_matrix_grads(model)
    # HG: a g_in per map (a layer's qkv, gate_up; MoE: qkv, experts, shared); the router: no DNP
    betas = [m.g_in.beta for m in model.modules()
             if isinstance(m, ScaledLinear) and m.placement.norm and m.g_in is not None]
    assert len(betas) == (3 if moe else 2) * model.config.n_layer, len(betas)
    with torch.no_grad():
        for p in betas:
            p.mul_(3.0)   # what weight decay does to the vector's magnitude, exaggerated
    logits2, grads2 = logits_and_matrix_grads(model)
    torch.testing.assert_close(logits2, logits, rtol=1e-10, atol=1e-10)
    for n in grads:
        torch.testing.assert_close(grads2[n], grads[n], rtol=1e-9, atol=1e-12, msg=n)
    with torch.no_grad():
        model.g_final.beta.mul_(3.0)
    assert (model(tokens())[0] - logits).abs().max() > 1e-2


def test_folding_keeps_dtype_and_device_draws_no_random_number_and_refuses_what_it_cannot():
    model = make(sv_hetero=True, sv_placement="dp", sv_reparam="or").double()
    randomize_scale_vectors(model)
    rng = torch.get_rng_state()
    plain = model.fold_scale_vectors()
    assert torch.equal(torch.get_rng_state(), rng)
    assert {(p.dtype, p.device) for p in plain.state_dict().values()
            if p.is_floating_point()} == {(torch.float64, model.wte.weight.device)}
    torch.testing.assert_close(plain(tokens())[0], model(tokens())[0], atol=1e-12, rtol=1e-10)
    # a fork's new parameter is neither copied silently nor dropped: folding says where to add it
    model = make()
    model.blocks[0].mlp.register_parameter("extra", nn.Parameter(torch.ones(3, 3)))
    with pytest.raises(ValueError, match="does not know how to fold blocks.0.mlp.extra"):
        model.fold_scale_vectors()


def spread_qkv_vector(frozen_g=False):   # g_attn 0.5 ... 2, W's columns of norm 1: ||W'_j|| = g_j
    model = make()
    qkv = model.blocks[0].attn.qkv
    with torch.no_grad():
        qkv.g_in.g.copy_(torch.linspace(0.5, 2.0, qkv.weight.size(1)))
        blocks = qkv.weight.view(3, -1, qkv.weight.size(1))   # (q|k|v, rows, d_in)
        blocks.div_(blocks.norm(dim=1, keepdim=True))
    for sv in filter(lambda m: isinstance(m, ScaleVector), model.modules()):
        sv.requires_grad_(not frozen_g)
    return model, qkv


def test_the_telemetry_names_each_vector_and_reads_constructed_maps_exactly():
    """A record per branch and expert, none to correlate without vectors; study/README.md
    "Preconditioning, measured" on columns of one norm and g spread: exponents exact; fed_maps
    copies g, or W diag(dg) would leave the step. AdamW's first step moves W by +-lr: g fixed, the
    folded column by lr g_j (exponents 1, 1), SGD's by g_j^2 (2); g trained: 10x 1e-4 off."""
    stats = telemetry.vector_stats(make(**VARIANTS["unified"], **MOE, moe_dense_layers=1))
    assert {"blocks.0.attn.qkv.g_in.q", "blocks.0.attn.qkv.g_in.k", "blocks.0.attn.qkv.g_in.v",
            "blocks.0.mlp.gate_up.g_out.up", "g_final", "blocks.1.mlp.router.g_in",
            "blocks.1.mlp.experts.g_in.3.gate", "blocks.1.mlp.experts.g_out.0.up",
            "blocks.1.mlp.shared.gate_up.g_in.up"} <= set(stats)
    assert all(abs(x - 1) < 1e-5 for mean_lo_hi in stats.values() for x in mean_lo_hi)
    model = make(scale_vectors=False, qk_norm=True, post_norm=True)   # the norms stay, param-free
    assert all(p.dim() == 2 for p in model.parameters())   # no vector (a ScaleVector holds one)
    stats = telemetry.preconditioning(model, telemetry.fed_maps(model))
    assert set(stats) == {f"blocks.{i}.{m}" for i in range(2)
                          for m in ("attn.qkv", "mlp.gate_up")} | {"head"}
    assert all(s[k] is None for s in stats.values() for k in ("corr_w", "update_exp", "adamw_exp"))
    model, qkv = spread_qkv_vector()
    g, before = qkv.g_in.g.detach().clone().view(-1), telemetry.fed_maps(model)
    stats = telemetry.preconditioning(model)["blocks.0.attn.qkv"]
    assert stats["corr_w"] is None and stats["corr_wg"] == pytest.approx(1.0, abs=1e-9)
    assert stats["g"][1:3] == pytest.approx([0.5, 2.0])
    unit = torch.randn(96, 32, generator=torch.Generator().manual_seed(0)).view(3, -1, 32)
    with torch.no_grad():
        qkv.weight.add_((1e-3 * g * unit / unit.norm(dim=1, keepdim=True)).view_as(qkv.weight))
    stats = telemetry.preconditioning(model, before)["blocks.0.attn.qkv"]
    assert (stats["update_exp"], stats["adamw_exp"]) == pytest.approx((2.0, 1.0), abs=1e-4)
    with torch.no_grad():
        qkv.g_in.g.mul_(1.5)   # in place, as a step does: the record `before` keeps its value
    now, old = telemetry.fed_maps(model)["blocks.0.attn.qkv"][1], before["blocks.0.attn.qkv"][1]
    assert torch.equal(now, 1.5 * old) and not torch.equal(now, old)
    for frozen_g in (True, False):   # a first AdamW step
        model, _ = spread_qkv_vector(frozen_g)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                weight_decay=0.0, eps=1e-30)
        model(tokens(), tokens(seed=5))[1].backward()
        before, sgd = telemetry.fed_maps(model), telemetry.sgd_ratios(model, 1e-3)
        opt.step()
        s = telemetry.preconditioning(model, before, sgd)["blocks.0.attn.qkv"]
        exps = (s["update_exp"], s["adamw_exp"], s["sgd_exp"])
        assert (exps == pytest.approx((1.0, 1.0, 2.0), abs=1e-4) if frozen_g else abs(
            s["adamw_exp"] - 1.0) > 1e-3 and abs(s["sgd_exp"] - 2.0) > 1e-3), (frozen_g, s)


def test_the_first_reading_is_contiguous():
    """model.py's first reading (named by content) ends with GPT.forward: the tables, the modules
    and the config's fields; the config's checks and the MoE come after."""
    lines, start = inspect.getsourcelines(model_py.GPT.forward)
    end = start + len(lines) - 1
    first = (model_py.ScaleVector, model_py.ScaledLinear, model_py.OutputNorm,
             model_py.Attention, model_py.SwiGLU, model_py.Block, model_py.GPTConfig)
    later = (model_py.GPT.param_groups, model_py.GPT.fold_scale_vectors, model_py.check_config,
             model_py.ExpertsLinear, model_py.MoE)
    assert all(inspect.getsourcelines(o)[1] < end for o in first)
    assert all(inspect.getsourcelines(o)[1] > end for o in later)
    assert "to the end of GPT.forward" in " ".join(model_py.__doc__.split())
