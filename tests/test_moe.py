"""The Mixture-of-Experts FFN (model.MoE): routing, dispatch, balancing, scale vectors, and
training through train.py (alone, with the unified flags, and under DDP with experts that receive
no token)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import (MOE, TINY, VARIANTS, expected_decay, final_state, make,
                     randomize_scale_vectors, records, tokens, train)
import telemetry
from model import GPT, GPTConfig, SwiGLU


def moe_layer(seed=0, **kw):
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(**{**TINY, "n_layer": 1, **MOE, **kw}))
    return gpt, gpt.blocks[0].mlp


def inputs(N=48, d=TINY["n_embd"], seed=3):
    return torch.randn(N, d, generator=torch.Generator().manual_seed(seed))


def expert_fn(moe, e, x):
    """Routed expert e on x, written out from the raw parameters: down(silu(gate) * up), each
    branch W_b (v_b * x), times u_b under DP, u_b * Norm(.) under DNP (rows 2e, 2e + 1 of the
    experts' vectors)."""
    h, ex = moe.down.size(-1), moe.experts
    W = ex.weight[e].view(2, h, -1)
    g_in = (ex.g_in()[2 * e : 2 * e + 2] if ex.g_in is not None
            else moe.g_in().expand(2, -1) if moe.g_in is not None
            else torch.ones(2, x.size(-1)))
    gate, up = (x @ (W[b] * g_in[b]).T for b in (0, 1))
    if ex.g_out is not None:   # DP: g_out scales the outputs (the rows of W); DNP: g_out * Norm(.)
        g_out, nrm = (ex.g_out()[2 * e : 2 * e + 2],
                      (lambda y: F.rms_norm(y, (h,), eps=ex.eps)) if ex.placement.norm
                      else (lambda y: y))
        gate, up = g_out[0] * nrm(gate), g_out[1] * nrm(up)
    return (F.silu(gate) * up) @ moe.down[e].T


@pytest.mark.parametrize("name", ["baseline", "hetero", "dp", "dnp", "er", "unified", "noscale"])
def test_one_expert_top1_equals_the_dense_swiglu(name):
    """1 expert, top-1, no shared expert: the gate is 1 and the layer is a SwiGLU with the same
    weights and scale vectors (DP and DNP per expert included)."""
    gpt, moe = moe_layer(**VARIANTS[name], n_experts=1, n_experts_active=1, n_shared_experts=0,
                         moe_hidden=96)
    randomize_scale_vectors(gpt)
    dense = SwiGLU(gpt.config, 96)
    src = dict(moe.named_parameters())
    with torch.no_grad():
        for n, p in dense.named_parameters():
            if n == "gate_up.weight":
                p.copy_(src["experts.weight"][0])
            elif n == "down.weight":
                p.copy_(src["down"][0])
            else:
                # a scale vector: g_ffn is the MoE's own (moe.g_in), or the expert's under HG;
                # g_out is the expert's
                p.copy_(src[n.replace("gate_up.", "experts.")]
                        if n.startswith("gate_up.g_out") or moe.g_in is None
                        else src[n.replace("gate_up.g_in.", "g_in.")])
    x = inputs().view(4, 12, -1)
    ids, gates, _ = moe.route(x.view(-1, x.size(-1)))
    assert torch.equal(gates, torch.ones_like(gates)) and not ids.any()
    out, ref = moe(x), dense(x)
    assert torch.allclose(out, ref, atol=1e-5 * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("router,variant", [("softmax", "baseline"), ("sigmoid", "unified"),
                                            ("softmax", "dp")])
def test_topk_gates_and_exactly_k_experts_per_token(router, variant):
    gpt, moe = moe_layer(n_experts=8, n_experts_active=3, n_shared_experts=0, moe_router=router,
                         **VARIANTS[variant])
    randomize_scale_vectors(gpt)
    with torch.no_grad():
        moe.expert_bias.copy_(0.3 * torch.randn(8, generator=torch.Generator().manual_seed(4)))
    x = inputs()
    ids, gates, scores = moe.route(x)
    # the k largest of scores + bias are chosen ...
    chosen = (scores + moe.expert_bias).gather(-1, ids)
    rest = (scores + moe.expert_bias).scatter(-1, ids, -float("inf"))
    assert ids.shape == (48, 3) and (chosen.min(-1).values >= rest.max(-1).values).all()
    assert all(len(set(row.tolist())) == 3 for row in ids)
    # the bias did choose
    assert not torch.equal(ids.sort(-1).values, scores.topk(3, dim=-1).indices.sort(-1).values)
    # ... but the gates are the unbiased scores of the chosen experts, renormalized to sum to 1
    assert torch.allclose(gates.sum(-1), torch.ones(48))
    assert torch.allclose(gates,
                          scores.gather(-1, ids) / scores.gather(-1, ids).sum(-1, keepdim=True))
    # every token is the gate-weighted sum of exactly its k experts
    moe.train()
    out = moe(x)
    with torch.no_grad():
        ref = torch.stack([sum(gates[n, j] * expert_fn(moe, int(ids[n, j]), x[n])
                               for j in range(3)) for n in range(48)])
    assert torch.allclose(out, ref, atol=1e-5 * ref.abs().max().item(), rtol=0)
    assert (moe.load.sum() == 48 * 3
            and torch.equal(moe.load, torch.bincount(ids.flatten(), minlength=8).float()))


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_top1_keeps_the_router_score_so_the_router_learns(router):
    gpt, moe = moe_layer(n_experts=4, n_experts_active=1, moe_router=router)
    x = inputs()
    ids, gates, scores = moe.route(x)
    assert torch.equal(gates, scores.gather(-1, ids)) and (gates < 1).all()
    moe(x).pow(2).sum().backward()
    assert moe.router.weight.grad.abs().max() > 0


def grouped_runs():
    try:
        torch._grouped_mm(torch.zeros(8, 16), torch.zeros(2, 16, 8),
                          offs=torch.tensor([3, 8], dtype=torch.int32))
        return True
    except (AttributeError, RuntimeError):
        return False


def loop_and_grouped(moe, x, dev, autocast_dtype=None):
    results = []
    for impl in ("loop", "grouped"):
        moe.impl = impl
        moe.zero_grad()
        with torch.autocast(dev, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = moe(x)
        (out.float() ** 2).sum().backward()
        results.append((out.float(), {n: p.grad.clone() for n, p in moe.named_parameters()}))
    return results


@pytest.mark.skipif(not grouped_runs(), reason="torch._grouped_mm does not run on this CPU build")
@pytest.mark.parametrize("name", ["baseline", "unified", "dp"])
def test_loop_and_grouped_paths_agree(name):
    """torch._grouped_mm also runs on CPU (fp32), so the two dispatch paths are compared here,
    forward and backward, with one expert excluded by the bias (an empty group)."""
    gpt, moe = moe_layer(**VARIANTS[name], n_experts=6)
    randomize_scale_vectors(gpt)
    moe.expert_bias[2] = -10.0   # expert 2 gets no token
    moe.train()
    (out_l, grads_l), (out_g, grads_g) = loop_and_grouped(moe, inputs(), "cpu")
    assert moe.load[2] == 0 and (moe.load[[0, 1, 3, 4, 5]] > 0).all()
    assert torch.allclose(out_l, out_g, atol=1e-5 * out_l.abs().max().item(), rtol=0)
    for n in grads_l:
        assert torch.allclose(grads_l[n], grads_g[n], atol=1e-5 * grads_l[n].abs().max().item(),
                              rtol=0), n
    assert not grads_l["down"][2].any() and grads_l["down"][0].any()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the grouped GEMM of the CUDA path needs a GPU")
def test_loop_and_grouped_paths_agree_on_cuda_in_bf16():
    gpt, moe = moe_layer(**VARIANTS["unified"], n_experts=8, n_embd=64, moe_hidden=64)
    randomize_scale_vectors(gpt)
    moe.cuda().train()
    (out_l, grads_l), (out_g, grads_g) = loop_and_grouped(moe, inputs(N=512, d=64).cuda(), "cuda",
                                                          torch.bfloat16)
    assert torch.allclose(out_l, out_g, atol=2e-2 * out_l.abs().max().item(), rtol=0)
    for n in grads_l:
        assert torch.allclose(grads_l[n], grads_g[n], atol=5e-2 * grads_l[n].abs().max().item(),
                              rtol=0), n


def skewed(balance, rate=0.02):
    """An MoE layer whose router prefers experts 0 and 1 for every token."""
    gpt, moe = moe_layer(n_experts=8, n_experts_active=2, moe_bias_rate=rate, moe_balance=balance)
    g = torch.Generator().manual_seed(0)
    x = inputs(N=1024) + 0.5
    with torch.no_grad():
        moe.router.weight.normal_(0, 0.1, generator=g)
        moe.router.weight[0] += 0.1
        moe.router.weight[1] += 0.05
    gpt.train()
    cvs = []
    for _ in range(8):
        moe(x)
        gpt.update_expert_bias()
        cvs.append(gpt.moe_stats()["blocks.0.mlp"]["cv"])
    return gpt, moe, cvs


def test_the_expert_bias_balances_a_skewed_router():
    gpt, moe, cvs = skewed("bias")
    assert cvs[0] > 1.0 and cvs[-1] < 0.4 * cvs[0], cvs
    assert moe.expert_bias[0] < 0 and moe.expert_bias[2:].mean() > 0
    assert abs(moe.expert_bias.sum()) < 1e-5   # centred: it does not drift
    stats = gpt.moe_stats()["blocks.0.mlp"]
    assert len(stats["load"]) == 8 and abs(sum(stats["load"]) - 1) < 1e-6
    # under the auxiliary loss the bias stays 0, and without training the load stays skewed
    _, moe, cvs = skewed("aux")
    assert not moe.expert_bias.any() and cvs[-1] == cvs[0] > 1.0


def test_update_expert_bias_reduces_the_counts_over_processes():
    gpt = make(**MOE, moe_dense_layers=1)
    gpt.train()
    gpt(tokens())
    calls = []
    # in place, like dist.all_reduce
    gpt.update_expert_bias(reduce=lambda t: calls.append(t.clone()) or t.mul_(2))
    assert len(calls) == 1 and calls[0].sum() == 3 * 16 * 2   # one MoE layer, B * T * k assignments
    assert list(gpt.moe_stats()) == ["blocks.1.mlp"]
    gpt.eval()
    gpt(tokens())   # evaluation is not counted
    assert gpt.blocks[1].mlp.load is None


def test_aux_loss_is_added_in_training_only():
    gpt = make(**MOE, moe_balance="aux", moe_aux_weight=0.5)
    idx, tgt = tokens(), tokens(seed=5)
    gpt.eval()
    ce = gpt(idx, tgt)[1]
    gpt.train()
    loss = gpt(idx, tgt)[1]
    aux = [b.mlp.aux_loss for b in gpt.blocks]
    # E * sum f_i P_i is 1 at a perfect balance, more otherwise
    assert all(a >= 1 - 1e-6 for a in aux)
    assert torch.allclose(loss, ce + 0.5 * sum(aux))


def test_parameter_counts_and_active_parameters():
    c = GPTConfig(**TINY, **MOE, moe_dense_layers=1)
    d, h, E, k = c.n_embd, c.expert_hidden, c.n_experts, c.n_experts_active
    model = GPT(c)
    moe_layer_params = d * E + 3 * d * h * E + 3 * d * h * c.n_shared_experts
    dense = make()
    assert model.num_params() == dense.num_params() + moe_layer_params - 3 * d * c.hidden
    assert model.num_active_params() == model.num_params() - 3 * d * h * (E - k)
    assert dense.num_active_params() == dense.num_params()
    assert (model.flops_per_token()
            < GPT(GPTConfig(**TINY, **{**MOE, "n_experts": 16})).flops_per_token() + 6 * d * 12)
    assert GPTConfig(n_embd=768, n_experts=8, n_experts_active=2,
                     n_shared_experts=1).expert_hidden == 704   # 2048 / 3


def test_config_errors_name_the_field():
    for kw, field in [(dict(n_experts=4, n_experts_active=5), "n_experts_active"),
                      (dict(n_experts=4, moe_router="relu"), "moe_router"),
                      (dict(n_experts=4, moe_balance="drop"), "moe_balance"),
                      (dict(n_experts=4, moe_dense_layers=12), "moe_dense_layers"),
                      (dict(n_experts=-1), "n_experts")]:
        with pytest.raises(ValueError, match=field):
            GPTConfig(**kw)


@pytest.mark.parametrize("policy", ["none", "iwd"])
@pytest.mark.parametrize("kw", [dict(), dict(sv_placement="dp", sv_hetero=True, sv_reparam="or"),
                                VARIANTS["unified"]])
def test_weight_decay_groups_classify_the_moe_vectors(policy, kw):
    model = make(**MOE, **kw)
    classes = model.param_classes()
    # each parameter once; buffers are not parameters
    assert set(classes) == {n for n, _ in model.named_parameters()}
    assert classes["blocks.0.mlp.down"] == "matrix" and "blocks.0.mlp.expert_bias" not in classes
    if not kw.get("sv_hetero"):
        assert classes["blocks.0.mlp.g_in.g"] == "sv_input"
    else:
        assert (classes["blocks.0.mlp.router.g_in.alpha"]
                == classes["blocks.0.mlp.experts.g_in.alpha"] == "sv_input")
        assert (classes["blocks.0.mlp.experts.g_out.alpha"]
                == {"dp": "sv_input", "dnp": "sv_output"}[kw["sv_placement"]])
    names = {id(p): n for n, p in model.named_parameters()}
    for g in model.param_groups(0.1, policy):
        for p in g["params"]:
            assert (g["weight_decay"] > 0) == expected_decay(model, names[id(p)], policy), \
                names[id(p)]


def test_the_vector_stats_name_each_expert_branch():
    stats = telemetry.vector_stats(make(**MOE, **VARIANTS["unified"]))
    assert {"blocks.0.mlp.router.g_in", "blocks.0.mlp.experts.g_in.3.gate",
            "blocks.0.mlp.experts.g_out.0.up", "blocks.0.mlp.shared.gate_up.g_in.up"} <= set(stats)


# ---- train.py end to end ------------------------------------------------------------------------
MOE_ARGS = ["--n_experts=4", "--n_experts_active=2", "--n_shared_experts=1"]
UNIFIED_ARGS = ["--sv_hetero=True", "--sv_placement=dnp", "--sv_reparam=or",
                "--sv_weight_decay=iwd"]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], UNIFIED_ARGS], ids=["moe", "moe-unified"])
def test_an_moe_model_trains(workdir, flags):
    out = f"out_moe{len(flags)}"
    train(workdir, f"--out_dir={out}", "--max_iters=40", "--eval_interval=40", *MOE_ARGS, *flags)
    evals = records(workdir, out, "eval")
    assert [r["iter"] for r in evals] == [0, 40]
    assert evals[1]["val_loss"] < evals[0]["val_loss"] - 0.3, evals


@pytest.mark.slow
def test_ddp_with_experts_that_get_no_token(workdir):
    """16 tokens per process and micro-step, 32 experts, top-1: at least half the experts get no
    token in every layer and step. DDP must neither fail nor hang, and two processes match one with
    accumulation."""
    common = ["--max_iters=3", "--eval_interval=3", "--gradient_accumulation_steps=2",
              "--batch_size=1", "--n_experts=32", "--n_experts_active=1", "--n_shared_experts=1"]
    train(workdir, "--out_dir=out_moe_single", *common)
    p = train(workdir, "--out_dir=out_moe_ddp", *common,
              launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2"))
    assert p.returncode == 0 and final_state(workdir, "out_moe_ddp")["iter_num"] == 3
    single, ddp = (final_state(workdir, "out_moe_single")["model"],
                   final_state(workdir, "out_moe_ddp")["model"])
    for k in single:
        assert torch.allclose(single[k], ddp[k], atol=1e-5, rtol=0), k
