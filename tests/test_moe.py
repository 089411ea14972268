"""The Mixture-of-Experts FFN (model.MoE): routing, dispatch, balancing, vectors, train.py runs."""
import pytest
import torch
import torch.nn.functional as F

from helpers import (MOE, TINY, TORCHRUN, VARIANTS, final_state, make, randomize_scale_vectors,
                     records, tokens, train)
from model import SwiGLU


def moe_layer(seed=0, **kw):
    gpt = make(seed, **{"n_layer": 1, **MOE, **kw})
    return gpt, gpt.blocks[0].mlp


def inputs(N=48, d=TINY["n_embd"], seed=3):
    return torch.randn(N, d, generator=torch.Generator().manual_seed(seed))


def close(a, b, rel=1e-5):   # float32 sums in another order: 1e-5 of the largest entry
    return torch.allclose(a, b, atol=rel * b.abs().max().item(), rtol=0)


def expert_fn(moe, e, x):
    """Expert e by hand: down(silu(gate) up), branch b = u_b [Norm](W_b (v_b x)) (rows 2e, 2e+1)."""
    h, ex = moe.down.size(-1), moe.experts
    W = ex.weight[e].view(2, h, -1)
    g_in = (ex.g_in()[2 * e : 2 * e + 2] if ex.g_in is not None
            else moe.g_in().expand(2, -1) if moe.g_in is not None else torch.ones(2, x.size(-1)))
    gate, up = (x @ (W[b] * g_in[b]).T for b in (0, 1))
    if ex.g_out is not None:   # DP: g_out scales the outputs (the rows of W); DNP: g_out * Norm(.)
        nrm = (lambda y: F.rms_norm(y, (h,), eps=ex.eps)) if ex.placement.norm else (lambda y: y)
        gate, up = (u * nrm(y) for u, y in zip(ex.g_out()[2 * e : 2 * e + 2], (gate, up)))
    return (F.silu(gate) * up) @ moe.down[e].T


@pytest.mark.parametrize("name", ["baseline", "hetero", "dp", "dnp", "er", "unified", "noscale"])
def test_one_expert_top1_equals_the_dense_swiglu(name):
    """1 expert, top-1, no shared expert: a gate of 1, a SwiGLU of the same weights and vectors."""
    gpt, moe = moe_layer(**VARIANTS[name], n_experts=1, n_experts_active=1, n_shared_experts=0,
                         moe_hidden=96)
    randomize_scale_vectors(gpt)
    dense, src = SwiGLU(gpt.config, 96), dict(moe.named_parameters())
    with torch.no_grad():   # g_out is the expert's; g_ffn the MoE's own or, under HG, the expert's
        for n, p in dense.named_parameters():
            p.copy_(src["experts.weight"][0] if n == "gate_up.weight" else src["down"][0]
                    if n == "down.weight" else src[n.replace("gate_up.", "experts.")]
                    if n.startswith("gate_up.g_out") or moe.g_in is None
                    else src[n.replace("gate_up.g_in.", "g_in.")])
    x = inputs().view(4, 12, -1)
    ids, gates, _ = moe.route(x.view(-1, x.size(-1)))
    assert torch.equal(gates, torch.ones_like(gates)) and not ids.any()
    assert close(moe(x), dense(x))


@pytest.mark.parametrize("variant", ["baseline", "unified", "dp"])
def test_topk_gates_and_exactly_k_experts_per_token_and_top1_gates_learn(variant):
    gpt, moe = moe_layer(n_experts=8, n_experts_active=3, n_shared_experts=0, **VARIANTS[variant])
    randomize_scale_vectors(gpt)
    moe.expert_bias.copy_(0.3 * torch.randn(8, generator=torch.Generator().manual_seed(4)))
    x = inputs()   # the router sees the layer's input times g_ffn, as each expert does
    ids, gates, scores = moe.route(x * moe.g_in().view(-1) if moe.g_in is not None else x)
    biased = scores + moe.expert_bias   # the k largest of scores + bias are chosen ...
    chosen, rest = biased.gather(-1, ids), biased.scatter(-1, ids, -float("inf"))
    assert ids.shape == (48, 3) and (chosen.min(-1).values >= rest.max(-1).values).all()
    assert all(len(set(row.tolist())) == 3 for row in ids)
    assert not torch.equal(ids.sort(-1).values, scores.topk(3)[1].sort(-1).values)   # bias chose
    # ... but the gates are the unbiased scores of the chosen experts, renormalized to sum to 1
    assert torch.allclose(gates, scores.gather(-1, ids) / scores.gather(-1, ids).sum(-1, True))
    ref = torch.stack([sum(gates[n, j] * expert_fn(moe, int(ids[n, j]), x[n]) for j in range(3))
                       for n in range(48)])   # each token: the gate-weighted sum of its k experts
    assert close(moe.train()(x), ref)
    assert torch.equal(moe.load, torch.bincount(ids.flatten(), minlength=8).float())   # 48 x 3
    # top-1 keeps the router's score as the gate (not 1), so the router learns
    gpt, moe = moe_layer(n_experts=4, n_experts_active=1)
    ids, gates, scores = moe.route(x)
    assert torch.equal(gates, scores.gather(-1, ids)) and (gates < 1).all()
    moe(x).pow(2).sum().backward()
    assert moe.router.weight.grad.abs().max() > 0


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", id="on_cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA's grouped GEMM needs a GPU"))])   # -k on_cuda
def test_loop_and_grouped_paths_agree_with_an_empty_group(dev):
    """Every entry's paths agree in test_variant_tables; here an expert the bias leaves no token,
    and CUDA's grouped GEMM in bf16 at a GPU's size."""
    # fp32: sums in another order (1e-5); bf16 (8-bit mantissa): 2e-2 of an output, 5e-2 of a grad
    size, x, out_rel, grad_rel, dtype = (
        (dict(n_experts=6), inputs(), 1e-5, 1e-5, None) if dev == "cpu" else
        (dict(n_experts=8, n_embd=64, moe_hidden=64), inputs(N=512, d=64), 2e-2, 5e-2,
         torch.bfloat16))
    gpt, moe = moe_layer(**VARIANTS["unified"], **size)
    randomize_scale_vectors(gpt)
    moe.to(dev).train().expert_bias[2] = -10.0   # expert 2 gets no token
    results = []
    for impl in ("loop", "grouped"):
        moe.impl = impl
        moe.zero_grad()
        with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
            out = moe(x.to(dev))
        (out.float() ** 2).sum().backward()
        results.append((out.float(), {n: p.grad.clone() for n, p in moe.named_parameters()}))
    (out_l, grads), (out_g, grads_g) = results
    assert close(out_g, out_l, out_rel)
    assert not [n for n in grads if not close(grads_g[n], grads[n], grad_rel)]
    assert moe.load[2] == 0 and (moe.load[[0, 1, 3, 4, 5]] > 0).all()
    assert not grads["down"][2].any() and grads["down"][0].any()


def test_balancing_by_the_expert_bias_over_processes_in_training_only():
    for rate in (0.02, 0.0):   # a router that prefers experts 0 and 1 for every token, 8 steps
        gpt, moe = moe_layer(n_experts=8, n_experts_active=2, moe_bias_rate=rate)
        with torch.no_grad():
            moe.router.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
            moe.router.weight[:2] += torch.tensor([[0.1], [0.05]])
        cvs = []
        for _ in range(8):
            moe.train()(inputs(N=1024) + 0.5)
            gpt.update_expert_bias()
            cvs.append(gpt.moe_stats()["blocks.0.mlp"]["cv"])
        if not rate:   # without the bias the load stays skewed
            assert not moe.expert_bias.any() and cvs[-1] == cvs[0] > 1.0
            continue
        assert cvs[0] > 1.0 and cvs[-1] < 0.4 * cvs[0], cvs
        assert moe.expert_bias[0] < 0 and moe.expert_bias[2:].mean() > 0
        assert abs(moe.expert_bias.sum()) < 1e-5   # centred: it does not drift
        load = gpt.moe_stats()["blocks.0.mlp"]["load"]
        assert len(load) == 8 and abs(sum(load) - 1) < 1e-6
    # update_expert_bias reduces the counts over processes
    gpt = make(**MOE, moe_dense_layers=1).train()
    gpt(tokens())
    calls = []   # reduce in place, like dist.all_reduce
    gpt.update_expert_bias(reduce=lambda t: calls.append(t.clone()) or t.mul_(2))
    assert len(calls) == 1 and calls[0].sum() == 3 * 16 * 2   # one MoE layer; B * T * k choices
    assert list(gpt.moe_stats()) == ["blocks.1.mlp"]
    gpt.eval()(tokens())   # evaluation is not counted
    assert gpt.blocks[1].mlp.load is None


@pytest.mark.slow
def test_an_moe_model_of_the_unified_strategy_trains(workdir):
    train(workdir, "--out_dir=out_moe", "--max_iters=40", "--eval_interval=40", "--n_experts=4",
          "--n_experts_active=2", "--n_shared_experts=1", "--sv_hetero=True",
          "--sv_placement=dnp", "--sv_reparam=or", "--sv_weight_decay=iwd")
    first, last = records(workdir, "out_moe", "eval")
    assert (first["iter"], last["iter"]) == (0, 40) and last["val_loss"] < first["val_loss"] - 0.3


@pytest.mark.slow
def test_ddp_with_experts_that_get_no_token(workdir):
    """32 experts, top-1, 16 tokens a micro-step: DDP neither fails nor hangs, and matches 1."""
    common = ["--max_iters=3", "--eval_interval=3", "--gradient_accumulation_steps=2",
              "--batch_size=1", "--n_experts=32", "--n_experts_active=1", "--n_shared_experts=1"]
    train(workdir, "--out_dir=out_moe_single", *common)
    train(workdir, "--out_dir=out_moe_ddp", *common, launcher=TORCHRUN)   # exit status 0
    single, ddp = (final_state(workdir, f"out_moe_{run}") for run in ("single", "ddp"))
    assert ddp["iter_num"] == 3
    for k in single["model"]:
        assert torch.allclose(single["model"][k], ddp["model"][k], atol=1e-5, rtol=0), k
