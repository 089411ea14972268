"""kernels.py's hand-written backward passes (_Norm, _ScaledNorm, _SwiGLU, _CrossEntropy) and
kernels.c (_ScaledNormC, in place for DNP's output side): the same values and gradients as
model.py's plain definitions, exact gradients in float64, bf16 accuracy against a float64
reference, the activation memory DNP saves for backward, and training with kernels=False matching
kernels=True."""
import os
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import kernels
import model
from kernels import _Norm, _ScaledNorm, _SwiGLU, cross_entropy
from helpers import TINY
from model import GPT, GPTConfig


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()


# each kernel beside model.py's plain definition of the same operation, on the same arguments
OPS = {
    "norm": (lambda x, fast: model.norm(x, 1e-6, fast), lambda: (rand(3, 4, 16),)),
    "scaled_norm (DNP)": (lambda y, g, fast: model.scaled_norm(y, g, 1e-6, fast),
                          lambda: (rand(3, 4, 2, 16),
                                   (1 + 0.5 * rand(2, 16, seed=1)).detach().requires_grad_())),
    "scaled_norm, one entry per head": (lambda y, g, fast: model.scaled_norm(y, g, 1e-6, fast),
                                        lambda: (rand(3, 4, 2, 3, 16),
                                                 (1 + 0.5 * rand(2, 1, 16, seed=1))
                                                 .detach().requires_grad_())),
    "scaled_norm, per row (MoE)": (lambda y, g, fast: model.scaled_norm(y, g, 1e-6, fast),
                                   lambda: (rand(3, 4, 2, 16),
                                            (1 + 0.5 * rand(3, 4, 2, 16, seed=1))
                                            .detach().requires_grad_())),
    # y.clone(): a fresh tensor, as the map's output that output_norm overwrites
    "output_norm (DNP's output side)": (
        lambda y, g, fast: model.output_norm(y.clone(), g, (2, -1, 16), 1e-6, fast),
        lambda: (rand(3, 4, 2 * 3 * 16), (1 + 0.5 * rand(2, 1, 16, seed=1)).detach()
                 .requires_grad_())),
    "output_norm, per row (MoE)": (
        lambda y, g, fast: model.output_norm(y.clone(), g, (2, -1, 16), 1e-6, fast),
        lambda: (rand(5, 2 * 16), (1 + 0.5 * rand(5, 2, 1, 16, seed=1)).detach()
                 .requires_grad_())),
    "output_norm, no g (dnp_novec)": (
        lambda y, fast: model.output_norm(y.clone(), None, (3, -1, 8), 1e-6, fast),
        lambda: (rand(3, 4, 3 * 2 * 8),)),
    "swiglu": (lambda x, fast: model.swiglu(x, fast), lambda: (rand(3, 4, 2 * 8),)),
    "cross_entropy": (lambda x, fast: model.cross_entropy(
                          x, torch.tensor([3, -1, 0, 10, 5, -1, 2]), fast),
                      lambda: (rand(7, 11),)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(OPS))
def test_kernel_equals_the_plain_definition(name, dtype):
    """model.py's plain code is the oracle: same values, same gradients for every argument."""
    fn, args = OPS[name]
    results = []
    for fast in (False, True):
        xs = [a.detach().to(dtype).requires_grad_() for a in args()]
        out = fn(*xs, fast)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9),
                                 dtype=dtype))
        results.append([out.detach()] + [x.grad for x in xs])
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-6, rtol=2e-5)
    for plain, fast in zip(*results):
        assert plain.dtype == fast.dtype
        torch.testing.assert_close(fast, plain, **tol)


def train_losses(steps=6, **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY, **kw))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    # one batch, learnt by heart
    idx = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        loss = m(idx, idx.roll(-1, 1))[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kw", [dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or"),
                                dict(n_experts=4, n_shared_experts=1, sv_placement="dnp",
                                     sv_dnp_width="head")],
                         ids=["unified", "moe-dnp-head"])
def test_training_on_the_plain_code_matches_the_kernels(kw):
    """kernels=False trains on model.py's plain definitions alone; its losses are the kernels'
    (float32)."""
    plain, fast = train_losses(kernels=False, **kw), train_losses(kernels=True, **kw)
    assert fast[-1] < fast[0] - 0.3   # it does train
    assert plain == pytest.approx(fast, rel=1e-5)   # float32 rounding, amplified a little by Adam


def test_the_switch_reaches_every_kernel(monkeypatch):
    """kernels=False calls none of kernels.py; kernels=True calls each of the five."""
    calls, names = [], {"norm", "scaled_norm", "output_norm_", "swiglu", "cross_entropy"}
    for name in names:
        monkeypatch.setattr(
            kernels, name,
            lambda *a, _f=getattr(kernels, name), _n=name: calls.append(_n) or _f(*a))
    for fast in (False, True):
        calls.clear()
        train_losses(steps=1, sv_placement="dnp", sv_reparam="or", kernels=fast)
        assert set(calls) == (names if fast else set())


def test_norm_gradient_is_exact():
    assert torch.autograd.gradcheck(lambda x: _Norm.apply(x, 1e-6), (rand(3, 4, 16),))


@pytest.mark.parametrize("g_shape", [(2, 16), (2, 1, 16), (3, 4, 2, 16)],
                         ids=["shared", "per head", "per-row (MoE)"])
def test_scaled_norm_gradient_is_exact(g_shape):
    g = (1 + 0.5 * rand(*g_shape, seed=1)).detach().requires_grad_()   # some entries negative
    y = rand(3, 4, 2, 16) if len(g_shape) != 3 else rand(3, 4, 2, 3, 16)
    assert torch.autograd.gradcheck(lambda y, g: _ScaledNorm.apply(y, g, 1e-6), (y, g))


def test_swiglu_gradient_is_exact():
    assert torch.autograd.gradcheck(_SwiGLU.apply, (rand(3, 4, 2 * 8),))


def test_scaled_norm_in_bf16_is_as_accurate_as_autograd_in_bf16():
    """The bf16 function recovers Norm(y) from its bf16 output; its error against float64 stays at
    the level of plain autograd on the same bf16 inputs (about 2^-8)."""
    y, g, dout = (rand(8, 64, 4, 128, seed=3), 1 + 0.1 * rand(4, 128, seed=4),
                  rand(8, 64, 4, 128, seed=5))
    g = g.detach()

    def run(fn, dtype):
        yy, gg = y.detach().to(dtype).requires_grad_(), g.clone().requires_grad_()
        out = fn(yy, gg)
        out.backward(dout.to(dtype))
        return [t.double() for t in (out, yy.grad, gg.grad)]

    reference = lambda y, g: F.rms_norm(y, (y.size(-1),), eps=1e-6) * g.to(y.dtype)
    truth = run(reference, torch.float64)
    ours = run(lambda y, g: _ScaledNorm.apply(y, g, 1e-6), torch.bfloat16)
    autograd = run(reference, torch.bfloat16)
    for a, b, t in zip(ours, autograd, truth):
        err_ours, err_autograd = (((a - t).norm() / t.norm()).item(),
                                  ((b - t).norm() / t.norm()).item())
        assert err_ours < 1e-2 and err_ours < 2 * err_autograd


def test_the_rms_statistic_is_float32_for_bf16_inputs():
    """Under autocast the kernels get bf16 activations; the mean of squares is still accumulated and
    kept in float32, as in model.py's plain definition (and Llama's RMSNorm): a statistic rounded to
    bf16 scales a whole row by one rounding error (up to 2^-9). Norm of a bf16 input then equals the
    plain definition bit for bit."""
    x = (3 * torch.randn(64, 8, 4, 32, generator=torch.Generator().manual_seed(0))).bfloat16()
    r = kernels._rms_inverse(x, 1e-6)
    truth = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r.double(), truth, rtol=1e-6, atol=0)
    assert torch.equal(kernels.norm(x, 1e-6), model.norm(x, 1e-6, fast=False))


def test_scaled_norm_with_a_zero_entry_stays_finite():
    g = torch.ones(2, 16, dtype=torch.float64)
    g[0, 3] = 0.0
    g.requires_grad_()
    y = rand(3, 2, 16)
    _ScaledNorm.apply(y, g, 1e-6).pow(2).sum().backward()
    assert torch.isfinite(y.grad).all() and torch.isfinite(g.grad).all()


def needs_c():
    """kernels.c built here; a skip only where there is no C compiler at all."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: DNP's Norm runs on kernels.py's PyTorch ops here")
    assert kernels.c_library() is not None, "kernels.c did not build: see the warning"


# (y, g) shapes as the model passes them (q|k|v per head, gate|up per branch, a one-entry g per
# branch, a g per row as MoE's), at head sizes kernels.c specializes (32, 64, 128) and others; the
# last three are large enough for its threads (kernels.c's PARALLEL, 16384 floats), in 16 chunks
# of tokens, in fewer than 16, and as one period (a g row per row of y)
C_SHAPES = [((40, 3, 4, 32), (3, 4, 32)), ((5, 3, 2, 64), (3, 1, 64)), ((6, 2, 1, 352), (2, 1, 1)),
            ((7, 2, 1, 131), (2, 1, 131)), ((9, 3, 128), (9, 3, 128)), ((3, 4, 2, 16), (2, 16)),
            ((200, 3, 4, 32), (3, 4, 32)), ((11, 2, 1, 900), (2, 1, 900)),
            ((300, 1, 64), (300, 1, 64))]


@pytest.mark.parametrize("y_shape, g_shape", C_SHAPES, ids=str)
def test_the_c_kernel_equals_the_pytorch_kernel(y_shape, g_shape):
    """kernels.c's one pass each way and _ScaledNorm's PyTorch ops: the same values and gradients
    in float32, at the tolerance the kernels keep against the plain definition; scaled_norm takes
    the C path for float32 on a CPU."""
    needs_c()
    y, g = rand(*y_shape, dtype=torch.float32), (1 + 0.5 * rand(*g_shape, seed=1)).float()
    dout = rand(*y_shape, seed=2, dtype=torch.float32).detach()
    results = []
    for fn in (kernels.scaled_norm, _ScaledNorm.apply):
        yy, gg = y.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
        out = fn(yy, gg, 1e-6)
        out.backward(dout)
        results.append((type(out.grad_fn).__name__, out, yy.grad, gg.grad))
    (c_name, *c), (_, *pytorch) = results
    assert c_name == "_ScaledNormCBackward"
    for a, b in zip(c, pytorch):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("y_shape, g_shape", C_SHAPES[-3:], ids=str)
def test_the_c_kernel_gives_the_same_bits_on_any_number_of_threads(y_shape, g_shape):
    """kernels.c splits the rows the same way on any number of threads and adds dg's partial sums
    in a fixed order: one thread and three give the same bits (so a run does not depend on the
    machine's core count)."""
    needs_c()
    y, g = rand(*y_shape, dtype=torch.float32), (1 + 0.5 * rand(*g_shape, seed=1)).float()
    dout = rand(*y_shape, seed=2, dtype=torch.float32).detach()
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            yy, gg = y.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
            out = kernels.scaled_norm(yy, gg, 1e-6)
            out.backward(dout)
            results.append((out, yy.grad, gg.grad))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_without_openmp_the_c_kernel_runs_on_one_thread(monkeypatch, tmp_path):
    """A compiler without OpenMP (Apple's clang): kernels.c is built with -fopenmp-simd alone, with
    no warning, and computes the same values."""
    needs_c()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    flags = kernels.c_flags
    monkeypatch.setattr(kernels, "c_flags", lambda threads=True: flags(threads) + (
        ["-fno-such-openmp-flag"] if threads else []))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = kernels.c_library.__wrapped__()
    assert lib is not None and len(list((tmp_path / "scale_vectors").glob("*.so"))) == 1
    y, g = rand(200, 3, 4, 32, dtype=torch.float32), rand(3, 4, 32, seed=1, dtype=torch.float32)
    monkeypatch.setattr(kernels, "c_library", lambda: lib)
    torch.testing.assert_close(kernels.scaled_norm(y, g, 1e-6), _ScaledNorm.apply(y, g, 1e-6),
                               atol=2e-6, rtol=2e-5)


def test_the_output_norm_overwrites_the_map_output_only_where_autograd_allows_it():
    """kernels.c writes DNP's g * Norm over the linear map's output (no second buffer); a tensor
    that autograd keeps for a backward (exp keeps its result) cannot be overwritten unnoticed: the
    backward refuses."""
    needs_c()
    y = rand(6, 2 * 32, dtype=torch.float32).clone()
    out = kernels.output_norm_(y, torch.ones(2, 1, 32), (2, -1, 32), 1e-6)
    assert out.data_ptr() == y.data_ptr() and type(out.grad_fn).__name__ == "_ScaledNormCBackward"
    kept = rand(6, 2 * 32, dtype=torch.float32).exp()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kernels.output_norm_(kept, None, (2, -1, 32), 1e-6).sum().backward()


@pytest.mark.parametrize("shape", [(40, 3, 4, 32), (7, 2, 131)], ids=str)
def test_norm_in_c_equals_the_pytorch_kernel(shape):
    """Norm(x) runs kernels.c with g = 1 (the arithmetic DNP's control shares with DNP)."""
    needs_c()
    x, dy = rand(*shape, dtype=torch.float32), rand(*shape, seed=2, dtype=torch.float32).detach()
    results = []
    for fn in (kernels.norm, _Norm.apply):
        xx = x.detach().clone().requires_grad_()
        out = fn(xx, 1e-6)
        out.backward(dy)
        results.append((type(out.grad_fn).__name__, out, xx.grad))
    (c_name, *c), (_, *pytorch) = results
    assert c_name == "_ScaledNormCBackward"
    for a, b in zip(c, pytorch):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-5)


def test_the_c_kernel_with_a_zero_entry_stays_finite():
    needs_c()
    g = torch.ones(2, 16)
    g[0, 3] = 0.0
    y, g = rand(3, 2, 16, dtype=torch.float32), g.requires_grad_()
    kernels.scaled_norm(y, g, 1e-6).pow(2).sum().backward()
    assert torch.isfinite(y.grad).all() and torch.isfinite(g.grad).all()


def test_without_a_c_compiler_dnp_runs_on_pytorch_ops(monkeypatch, tmp_path):
    """No compiler: one warning, and scaled_norm takes _ScaledNorm's PyTorch ops."""
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.warns(UserWarning, match="no C compiler 'no-such-compiler'"):
        assert kernels.c_library.__wrapped__() is None
    monkeypatch.setattr(kernels, "c_library", lambda: None)
    out = kernels.scaled_norm(rand(3, 2, 16, dtype=torch.float32), torch.ones(2, 16), 1e-6)
    assert type(out.grad_fn).__name__ == "_ScaledNormBackward"


def test_the_c_library_is_built_once_per_source(monkeypatch, tmp_path):
    """Built into $XDG_CACHE_HOME/scale_vectors under a hash of the source and the flags, then
    loaded from there; an edited kernels.c is a new file."""
    needs_c()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kernels.c_library.__wrapped__()
    kernels.c_library.__wrapped__()
    assert len(list((tmp_path / "scale_vectors").glob("*.so"))) == 1
    edited = tmp_path / "kernels.c"
    edited.write_text(open(kernels.C_SOURCE).read() + "\n/* edited */\n")
    monkeypatch.setattr(kernels, "C_SOURCE", str(edited))
    assert kernels.c_library.__wrapped__() is not None
    assert len(list((tmp_path / "scale_vectors").glob("*.so"))) == 2


def saved_bytes(model, idx):
    """Bytes of the distinct storages autograd keeps for the backward of one forward pass."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return sum(storages.values())


def test_dnp_keeps_no_extra_activations():
    """Paper 3.2, DNP: g_out * Norm(W x) on q, k, v and on gate, up. Compared with the baseline,
    autograd keeps only one float r per token and group (a head, or a branch) and the vectors
    g_out: never a copy of W x."""
    cfg = TINY
    B, T = 4, 16
    idx = torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))
    base, dnp = (GPT(GPTConfig(**cfg, sv_placement=p)) for p in ("pre", "dnp"))
    c = dnp.config
    # float32 r per (token, head) of q, k, v and per (token, branch)
    r_bytes = 4 * B * T * (3 * c.n_head + 2)
    g_bytes = 4 * (3 * c.n_embd + 2 * c.hidden)  # the vectors g_out of qkv and gate_up
    assert saved_bytes(dnp, idx) - saved_bytes(base, idx) == c.n_layer * (r_bytes + g_bytes)


@pytest.mark.parametrize("kw", [{}, dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or")],
                         ids=["baseline", "unified"])
def test_model_compiles_without_graph_breaks(kw):
    """compile=True must compile the whole model, hand-written backward passes included (a graph
    break silently falls back to eager); aot_eager traces forward and backward as inductor would,
    in seconds."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **kw))
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for m in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
        model.zero_grad()
        loss = m(idx, idx)[1]
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(losses[1], losses[0])
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("rows", [3, 1000], ids=["chunked", "one chunk"])
def test_cross_entropy_equals_torch_and_its_gradient_is_exact(rows):
    logits, targets = rand(7, 11), torch.tensor([3, -1, 0, 10, 5, -1, 2])
    torch.testing.assert_close(cross_entropy(logits, targets, rows),
                               F.cross_entropy(logits, targets, ignore_index=-1))
    assert torch.autograd.gradcheck(lambda x: cross_entropy(x, targets, rows), (logits,))



FAULTS = """
import resource, sys, torch, kernels
from model import GPT, GPTConfig
if sys.argv[1] == "retain":
    assert kernels.retain_freed_memory()
torch.manual_seed(0)
# the CPU recipe's unified, on model.py's plain ops: the most temporaries (kernels.c leaves fewer)
cfg = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, vocab_pad=1,
                sv_hetero=True, sv_placement="dnp", sv_reparam="or", kernels=False)
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters())
x = torch.randint(0, 65, (12, 64))
def step():
    model(x, x)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
before = faults()
for _ in range(5):
    step()
print((faults() - before) / 5)
"""


@pytest.mark.slow   # two subprocesses: the allocator's setting is process-wide
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt")
def test_retain_freed_memory_ends_the_page_faults_of_repeated_steps():
    """Training steps of the CPU recipe's unified model: by default glibc returns the freed
    activation buffers to the OS and each step faults their pages in again (4,611 per step when
    measured for BENCHMARKS.md, before kernels.c); with retain_freed_memory() the next step
    reuses them."""
    import subprocess
    import sys
    from conftest import ROOT
    per_step = {mode: float(subprocess.run([sys.executable, "-c", FAULTS, mode], cwd=ROOT,
                                           capture_output=True, text=True, check=True).stdout)
                for mode in ("default", "retain")}
    # measured under load: default 4,500-6,900 per step, retained 190-200 (with kernels.c: 920
    # and 142; before it, 2,900-4,900 and 2-270)
    assert per_step["default"] > 1000 and per_step["retain"] < per_step["default"] / 5, per_step
