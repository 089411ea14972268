"""DESIGN.md: where weight decay can act in the unified strategy (shared experts: test_model)."""
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

