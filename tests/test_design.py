"""Statements DESIGN.md makes about the model that are not a variant's formula: where weight decay
can act inside the unified strategy, and how far DNP's Norm reaches over the shared experts."""
import pytest
import torch

from helpers import MOE, VARIANTS, make, randomize_scale_vectors, tokens
from model import ScaledLinear


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


def test_dnp_norm_spans_all_shared_experts_together():
    """DESIGN.md, Mixture of Experts: two shared experts are one SwiGLU, one Norm per branch."""
    model = make(sv_placement="dnp", **{**MOE, "n_shared_experts": 2})
    randomize_scale_vectors(model)
    shared = model.blocks[0].mlp.shared.gate_up
    h2 = 2 * MOE["moe_hidden"]                       # two shared experts' units per branch
    xn = torch.randn(3, 32, generator=torch.Generator().manual_seed(5))
    W = shared.effective_weight(torch.ones(1, 32)).view(2, h2, 32)   # (gate|up, 2h, d)
    g_out, eps = shared.g_out().view(2, h2), model.config.norm_eps
    for b in range(2):
        y = xn @ W[b].T                              # (3, 2h): both experts' units of one branch
        expected = g_out[b] * y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
        torch.testing.assert_close(shared(xn, torch.ones(1, 32))[:, b * h2:(b + 1) * h2], expected)
