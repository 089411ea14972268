"""What holds for every variant, walked from model.py's tables and VECTOR_FLAGS: every ScaleVector
is checked by what it declares (folds_into), never by its name, so a new entry, flag or location
gets every test with no test edit; a failure names the entry and the vector."""
import ast
import copy
import itertools
import os
import re
import runpy
import signal
import sys
from dataclasses import dataclass, fields

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import model as model_py
import telemetry
from config import defaults as config_defaults
from helpers import (MOE, ROOT, TINY, TINY_MODEL, accepted, declared_class, defaults, entries,
                     flag_values, make, models, randomize_scale_vectors, tokens, vectors)
from model import AFTER_NORM, ScaleVector
from config.variants import VARIANTS, model_keys, named_flags, variant_of
from config.defaults import DEFAULTS, train_config

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest's


def factor(W, g, side):
    """W * factor folds g into W's columns (W diag(g)) or rows (diag(g) W), written here: row
    block b of W (one per row of g) times g[b]; a column entry spans in / width columns."""
    blocks = torch.ones_like(W).reshape(g.size(0), -1, W.size(-1))
    if side == "columns":
        return (blocks * g.repeat_interleave(W.size(-1) // g.size(1), 1)[:, None]).reshape(W.shape)
    return (blocks * g[:, :, None]).reshape(W.shape)


def moved(model, names):
    out = copy.deepcopy(model)
    randomize_scale_vectors(out, names=names)
    return out


def folded(model, factors):
    """A copy of `model`, its weights {path: factor} multiplied (new tensors: tied heads untie)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for key, f in factors.items():
            holder, _, pname = key.rpartition(".")
            setattr(out.get_submodule(holder), pname, nn.Parameter(out.get_parameter(key) * f))
    return out


def declared_weights(name, sv):
    """The (state_dict path, side) of each weight the vector declares it folds into, if any."""
    holder = name.rpartition(".")[0]
    return [(".".join(filter(None, (holder, w))), side)
            for w, side in (() if sv.folds_into == AFTER_NORM else sv.folds_into)]


def factors(model, names, source=None):
    """{weight: the product of the factors of the vectors `names` that declare it}, each vector's g
    read from `source` (a moved copy) or `model`."""
    out = {}
    for n in names:
        g = (source or model).get_submodule(n)().detach()
        for key, side in declared_weights(n, model.get_submodule(n)):
            out[key] = out.get(key, 1.0) * factor(model.get_parameter(key), g, side)
    return out


def close(a, b):   # float32 logits of order 1 (a moved vector moves them by more than 1e-2)
    return torch.allclose(a, b, atol=2e-5, rtol=1e-4)


def gap(a, b):
    """max |a - b|, for a message that says by how much."""
    return f"{(a.detach().double() - b.detach().double()).abs().max().item():.3g}"


def untied(model):
    """A copy of `model` where each use of a shared weight (a tied head) has a tensor of its own."""
    shared = set(dict(model.named_parameters(remove_duplicate=False))) - set(
        dict(model.named_parameters()))
    return folded(model, dict.fromkeys(shared, 1.0))


def tied_to(model, key):
    """The other names of the tensor at `key` (a tied head's weight and the embedding's)."""
    return [k for k, p in model.named_parameters(remove_duplicate=False)
            if p is model.get_parameter(key) and k != key]


def unregistered(model):
    """What a module holds outside its registered modules and parameters (a ScaleVector in a plain
    list), which the optimizer, checkpoints and every test miss: a message with the fix, or []."""
    out = []
    for mname, m in model.named_modules():
        for attr, value in vars(m).items():
            held = value.values() if isinstance(value, dict) else value if isinstance(
                value, (list, tuple)) else [value]
            if not attr.startswith("_") and any(isinstance(v, (nn.Module, nn.Parameter))
                                                for v in held):
                out.append(".".join(filter(None, (mname, attr))))
    return out and (f"{out} is held outside the registered modules: register it as a submodule (a "
                    "module attribute, nn.ModuleList)")


# ---- the checks ---------------------------------------------------------------------------------

def check_the_init(reparam, placement):
    """Paper: "scale vectors initialised to 1", exactly: a model computes bit for bit what plain
    vectors compute and, where no Norm is added, what the model without vector flags computes; the
    weights the variants share are the baseline's draws; every vector trains."""
    idx = tokens()
    for label, kw in models(reparam, placement):
        model = make(**kw)
        base = make(**{k: v for k, v in kw.items() if k not in model_py.VECTOR_FLAGS})
        assert not unregistered(model), f"{label}: {unregistered(model)}"
        for name, sv in vectors(model).items():
            one = torch.ones_like(sv())
            assert torch.equal(sv(), one), (
                f"{label}: {name} is not 1 at init (max |g - 1| = {gap(sv(), one)}): its init must "
                "make g exactly 1 (REPARAMS' init, or what the vector sets)")
        ref, own = base.state_dict(), model.state_dict()
        for k in (k for k, c in model.param_classes().items() if not c.startswith("sv_")):
            assert torch.equal(ref[k], own[k]), (
                f"{label}: {k} is not the baseline's at init (by {gap(ref[k], own[k])}): a "
                "vector flag must leave the shared weights' draws as they were "
                "(GPT._init_weights draws them in module order; a ScaleVector draws nothing)")
        logits, plain = model(idx)[0], make(**{**kw, "sv_reparam": "none"})(idx)[0]
        assert torch.equal(logits, plain), (
            f"{label}: the logits at init differ from sv_reparam='none''s by {gap(logits, plain)}: "
            f"REPARAMS[{reparam!r}] must make g exactly 1 at init")
        if not model_py.PLACEMENTS[placement].norm and all(
                sv.folds_into != AFTER_NORM for sv in vectors(model).values()):
            assert torch.equal(logits, base(idx)[0]), (
                f"{label}: the logits at init are not the baseline's (by "
                f"{gap(logits, base(idx)[0])}), though every vector folds: a vector must be 1 at "
                "init, and one with a Norm after it must declare AFTER_NORM")
        every_vector_trains(model, label)


def every_vector_trains(model, label):
    """Every trained parameter of every scale vector moves the loss at init."""
    model(tokens(), tokens(seed=5))[1].backward()
    for name, sv in vectors(model).items():
        for pname, p in sv.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, (
                f"{label}: {name}.{pname} gets no gradient (an inert vector): apply it in the "
                "forward pass, or let GPTConfig refuse the flags that build it")


def check_folding(reparam, placement):
    """Paper 2.2, by the declarations: a vector that says it folds moves the logits and, folded into
    the weights it names (by `factor`, not model.py), gives them back; one after a Norm folds into
    no weight (tried for reparam 'none'). Telemetry reads the same g; fold_scale_vectors reproduces
    the logits, or refuses exactly where a vector or the placement has a Norm after it."""
    idx = tokens(B=2, T=8)
    for label, kw in models(reparam, placement):
        model = make(**kw)
        model.vector_sites()   # a declaration the model cannot use: refused, naming the vector
        svs = vectors(model)
        folds = [n for n, sv in svs.items() if sv.folds_into != AFTER_NORM]
        for names in [folds] + [[n] for n in folds]:   # all at once; then one by one, to name it
            moving = moved(model, names)
            logits = moving(idx)[0]
            assert not close(logits, model(idx)[0]), (
                f"{label}: moving {' '.join(names)} away from 1 changes no logit (inert): apply g "
                "in the forward pass, or let GPTConfig refuse the flags that build it")
            if close(back := folded(model, factors(model, names, moving))(idx)[0], logits):
                if names is folds:
                    break   # all of them fold where they declare
            elif len(names) == 1:
                raise AssertionError(
                    f"{label}: {names[0]} does not fold where it declares "
                    f"({svs[names[0]].folds_into!r}): there, the logits differ by "
                    f"{gap(back, logits)}; {declare(model, names[0], idx)}")
        else:
            assert not folds, (f"{label}: the vectors fold one by one as declared, not together: "
                               "two of them declare the same factor of one weight")
        after = [n for n, sv in svs.items() if sv.folds_into == AFTER_NORM]
        if after and reparam == "none":
            check_none_folds(label, model, after, idx)
        moving = moved(model, list(svs))
        check_telemetry(label, moving)
        if after or model_py.PLACEMENTS[placement].norm:
            try:
                said = moving.fold_scale_vectors() and "nothing: it folded"
            except ValueError as e:
                said = str(e)
            assert "cannot fold" in said and (not after or after[0] in said), (
                f"{label}: GPT.fold_scale_vectors must refuse a Norm after a vector or the maps, "
                f"saying it cannot fold and naming {after[:1] or f'the placement ({placement})'}; "
                f"it said {said!r}")
            continue
        plain = moving.fold_scale_vectors()
        assert not vectors(plain), (f"{label}: the folded model keeps {list(vectors(plain))}: "
                                    "fold_scale_vectors must turn their flags off (VECTOR_FLAGS)")
        if not close(plain(idx)[0], moving(idx)[0]):
            raise AssertionError(f"{label}: the folded model does not reproduce the logits "
                                 f"(by {gap(plain(idx)[0], moving(idx)[0])}): "
                                 + wrong_fold(moving, plain, idx))


def declare(model, n, idx, where=None):
    """Where vector n folds (`where`, or found by trying every weight and side) and what it should
    declare: a message's fix."""
    where = where or where_it_folds(model, n, idx)
    if where is None:
        return ("it folds into no single weight of the model: declare every weight it multiplies "
                "(folds_into), or AFTER_NORM if a Norm follows it")
    key, side = where
    holder = n.rpartition(".")[0]
    tied = f" (which the tied {tied_to(model, key)[0]} shares)" if tied_to(model, key) else ""
    if holder and not key.startswith(holder + "."):
        return f"it folds into {key}'s {side}{tied}, outside its holder: declare it where both are"
    path = key[len(holder) + 1:] if holder else key
    return f"it folds into {key}'s {side}{tied}: declare folds_into=(({path!r}, {side!r}),)"


def fits(W, g, side):
    rows = W[..., 0].numel()   # g fits W's rows, or its columns
    return rows == g.numel() if side == "rows" else (
        rows % g.size(0) == 0 and W.size(-1) % g.size(1) == 0)


def where_it_folds(model, n, idx):
    """The (weight, side) that vector n, moved alone, folds into, each use of a tied weight apart;
    None if none does. Every weight and side its shape fits is tried (only where a check fails)."""
    model = untied(model)
    moving = moved(model, [n])
    g, want = moving.get_submodule(n)().detach(), moving(idx)[0]
    for key, W in model.named_parameters():
        if W.dim() > 1 and not declared_class(model, key).startswith("sv_"):
            for side in ("columns", "rows"):
                if fits(W, g, side) and close(
                        folded(model, {key: factor(W, g, side)})(idx)[0], want):
                    return key, side
    return None


def wrong_fold(model, plain, idx):
    """Which weight fold_scale_vectors got wrong, against this file's own fold of every vector
    where it declares (a message)."""
    want = folded(untied(model), factors(model, vectors(model))).state_dict()
    for key, W in plain.state_dict().items():
        if key in want and not torch.allclose(W, want[key], rtol=1e-5, atol=1e-7):
            on = [n for n, sv in vectors(model).items()
                  if key in dict(declared_weights(n, sv))]
            return (f"{key} is {gap(W, want[key])} away from that weight with {on or 'no vector'} "
                    "folded in: fold_scale_vectors must fold each vector where it declares "
                    "(GPT.vector_sites)")
    return ("every folded weight is right, so the model without vectors computes another function: "
            "fold_scale_vectors must turn off each flag that only puts vectors (VECTOR_FLAGS)")


def check_telemetry(label, model):
    """telemetry.py on `model`, its vectors moved: a map's g is the product of the vectors declared
    on its columns, and each vector's size is [mean, min, max] of its g per row."""
    svs = vectors(model)
    for name, (W, g) in telemetry.fed_maps(model).items():
        want, g = torch.ones_like(W[:, 0]), torch.ones_like(W[:1, 0]) if g is None else g
        on = [n for n, sv in svs.items()
              if (f"{name}.weight", "columns") in declared_weights(n, sv)]
        for n in on:
            want = want * svs[n]().detach().repeat_interleave(W.size(-1) // svs[n].width, 1)
        assert torch.allclose(g.expand_as(want), want), (
            f"{label}: telemetry's g of {name} is {gap(g.expand_as(want), want)} away from the "
            f"product of the vectors declared on its columns ({on}): telemetry.fed_vectors must "
            "take every vector whose folds_into names them")
    stats, want = telemetry.vector_stats(model), {}
    for n, sv in svs.items():
        g = sv().detach().float()
        for i, row in enumerate(g):
            key = n if len(g) == 1 else f"{n}.{sv.names[i] if sv.names else i}"
            want[key] = [row.mean().item(), row.min().item(), row.max().item()]
    assert stats.keys() == want.keys(), (
        f"{label}: telemetry.vector_stats logs {sorted(stats.keys() - want.keys())} and not "
        f"{sorted(want.keys() - stats.keys())}: log each ScaleVector by its name, a row each")
    for key, got in stats.items():
        assert got == pytest.approx(want[key], rel=1e-6), (   # float32, the same sums
            f"{label}: telemetry.vector_stats logs {key} as {got}, but its g has [mean, min, max] "
            f"{want[key]}: log g (the ScaleVector's output), not a raw parameter")


def check_none_folds(label, model, names, idx):
    """The vectors `names` (raw parameter g), declared AFTER_NORM, fold into no weight. Folding at
    g = 1 implies dL/dg_j = sum_i W_ij dL/dW_ij (columns), so only where that holds is a fold tried
    for real. A tied head gets its own tensor first: its gradient holds the embedding's too."""
    tied, model = model, untied(model)
    model(idx, tokens(B=2, T=8, seed=5))[1].backward()
    weights = [(k, W) for k, W in model.named_parameters()
               if W.dim() > 1 and not declared_class(model, k).startswith("sv_")]
    for n in names:
        moving, grad = moved(model, [n]), model.get_submodule(n).g.grad
        g = moving.get_submodule(n)().detach()
        for (key, W), side in itertools.product(weights, ("columns", "rows")):
            if not fits(W, g, side):
                continue
            WdW = (W * W.grad).detach()
            if side == "columns":   # per row block of g, per group of in / width columns
                sums = WdW.reshape(g.size(0), -1, W.size(-1)).sum(1)
                sums = sums.reshape(g.size(0), g.size(1), -1).sum(-1)
            else:
                sums = WdW.sum(-1).reshape(g.shape)
            if torch.allclose(sums, grad, rtol=1e-3, atol=1e-3 * grad.abs().max().item()) and \
                    close(folded(model, {key: factor(W, g, side)})(idx)[0], moving(idx)[0]):
                raise AssertionError(f"{label}: {n} declares a Norm after it (AFTER_NORM), but "
                                     + declare(tied, n, idx, (key, side)))


# a run, then its resume with other settings (sv_decay, a learning-rate factor per class)
RUNS = (dict(learning_rate=1e-3, muon_lr=2e-3, weight_decay=0.1),
        dict(learning_rate=3e-3, muon_lr=4e-3, weight_decay=0.05, sv_decay=0.5,
             lr_mults=dict(embedding=2.0, sv_input=3.0, sv_final=5.0, sv_output=7.0)))
with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:   # a script: its own lines run
    LR_LOOP = compile(ast.Module([n for n in ast.walk(ast.parse(f.read())) if isinstance(
        n, ast.For) and getattr(n.target, "id", None) == "group"], []), "train.py", "exec")


def check_optimizer_groups(reparam, placement):
    """Under each optimizer and decay policy, every parameter is in one group of its declared class,
    on Muon exactly if a 2-D matrix, decayed as the policy says (vectors by sv_decay where set), at
    train.py's rate (LR_LOOP) times its class's factor: at step 0, mid-schedule and after a resume
    with other settings (checkpoint.restore keeps them)."""
    for label, kw in models(reparam, placement):
        model = make(**kw)   # configure_optimizers leaves it as it was: one for every run
        names = {id(p): n for n, p in model.named_parameters()}
        classes = {n: declared_class(model, n) for n in names.values()}
        with pytest.raises(ValueError, match="sv_inptu"):   # a misspelt class: not silently 1
            model.param_groups(0.1, lr_mults=dict(sv_inptu=2.0))
        for optimizer, policy in itertools.product(("adamw", "muon"), model_py.DECAY_POLICIES):
            check_groups(label, model, names, classes, optimizer, policy)


def check_groups(label, model, names, classes, optimizer, policy):
    saved = None
    for run in RUNS:
        opts = model.configure_optimizers(**run, betas=(0.9, 0.95), sv_weight_decay=policy,
                                          optimizer=optimizer)
        if saved:   # a resume: the checkpoint's weights and moments, this run's settings
            checkpoint.restore(model, opts, saved, "ckpt")
        groups = [g for o in opts for g in o.param_groups]
        saved = dict(model=model.state_dict(), optimizers=[o.state_dict() for o in opts])
        grouped = [names[id(p)] for g in groups for p in g["params"]]
        assert sorted(grouped) == sorted(names.values()), (
            f"{label}: {sorted(set(names.values()) - set(grouped))} in no optimizer group, "
            f"{sorted({n for n in grouped if grouped.count(n) > 1})} in several: "
            "GPT.param_groups must put each parameter of param_classes in one")
        for factor in (1 / 101, 0.55):
            exec(LR_LOOP, dict(optimizers=opts, factor=factor))
            for g, p in ((g, p) for g in groups for p in g["params"]):
                cls = classes[names[id(p)]]
                muon = optimizer == "muon" and cls == "matrix" and p.dim() == 2
                decayed = cls in ("matrix", "embedding", *model_py.DECAY_POLICIES[policy])
                coef = run.get("sv_decay", run["weight_decay"]) if cls.startswith("sv_") \
                    else run["weight_decay"]
                lr = run["muon_lr" if muon else "learning_rate"] * factor
                want = (cls, "muon" if muon else "adamw", coef if decayed else 0.0,
                        pytest.approx(lr * run.get("lr_mults", {}).get(cls, 1.0)))
                got = (g["name"], g["optimizer"], g["weight_decay"], g["lr"])
                assert got == want, (
                    f"{label}, {optimizer}, sv_weight_decay={policy!r}, {run}: {names[id(p)]}'s "
                    f"(class, optimizer, weight_decay, lr) is {got}, not {want}: the class is "
                    "what it declares (GPT.param_classes), the decay DECAY_POLICIES', the rate "
                    "the schedule's times lr_mults' (GPT.param_groups)")


def same_loss_and_gradients(label, model, forwards, **tol):
    """Two forwards of `model` (it, another way) give one loss and gradients (None: 0)."""
    runs = []
    for forward in forwards:
        model.zero_grad()
        loss = forward(tokens(), tokens(seed=5))[1]
        loss.backward()
        runs.append((loss.detach(), {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                     for n, p in model.named_parameters()}))
    torch.testing.assert_close(runs[1], runs[0], msg=lambda m: f"{label}: {m}", **tol)


def check_compiles_in_one_graph(reparam, placement):
    """compile=True must capture the whole model (fullgraph: a graph break would silently fall back
    to eager), with the eager model's loss and gradients. Dynamo's capture alone (backend "eager");
    inductor's code is held to eager by gpu_check's compile check."""
    for label, kw in [m for m in models(reparam, placement) if "MoE" not in m[0]][-1:]:   # all on
        model = make(**kw, n_layer=1)   # every block runs one code: a break shows in the first
        randomize_scale_vectors(model)
        torch._dynamo.reset()   # each model compiles afresh (not against dynamo's recompile limit)
        same_loss_and_gradients(label, model, (model, torch.compile(model, backend="eager",
                                                                    fullgraph=True)))


def check_the_moe(reparam, placement):
    """MoE.run_experts' loop (a CPU's) and grouped GEMM (a GPU's, which runs on a CPU in float32)
    give one loss and gradients. A vector has rows per expert (one token routed to k experts gives
    only theirs a gradient) exactly where the experts' ExpertsLinear holds it, as
    num_active_params counts it."""
    for label, kw in [m for m in models(reparam, placement) if "MoE" in m[0]]:
        model, chosen, E = make(**kw), list(range(kw["n_experts_active"])), kw["n_experts"]
        randomize_scale_vectors(model)
        layers = {n: m for n, m in model.named_modules() if isinstance(m, model_py.MoE)}

        def run(impl):
            for m in layers.values():
                m.impl = impl
            return model
        same_loss_and_gradients(label, model, [lambda *a, i=i: run(i)(*a)
                                               for i in ("loop", "grouped")],
                                atol=1e-6, rtol=1e-4)   # float32 sums in another order
        for m in layers.values():
            m.expert_bias.fill_(-10.0)
            m.expert_bias[chosen] = 10.0
        model.zero_grad()
        run(None)(tokens(B=1, T=1), tokens(B=1, T=1, seed=5))[1].backward()
        for name, sv in vectors(model).items():
            if sv.rows % E or not any(name.startswith(n + ".") for n in layers):
                continue
            held = any(name.startswith(f"{n}.experts.") for n in layers)
            for pname, p in sv.named_parameters():
                rows = p.grad.reshape(E, -1).abs().amax(1) > 0   # which experts got a gradient
                per_expert = bool(rows[chosen].all() and not rows[len(chosen):].any())
                assert per_expert == held, (
                    f"{label}: {name}.{pname}'s rows are {'' if per_expert else 'not '}one per "
                    f"expert, but {'' if held else 'not '}the experts' ExpertsLinear holds it: "
                    "num_active_params would count it wrong; a per-expert vector belongs there")


CHECKS = (check_the_init, check_folding, check_optimizer_groups, check_compiles_in_one_graph,
          check_the_moe)


# ---- the tables drive the tests -----------------------------------------------------------------

@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__[len("check_"):])
@pytest.mark.parametrize("entry", entries(), ids="-".join)
def test_every_entry_of_the_tables(entry, check):
    check(*entry)


# ---- decay: toward raw 0, in the optimizer only; what that makes of g is the table's -----------

def test_every_reparameterization_states_what_decay_makes_of_g():
    """Decay pulls every raw parameter toward 0 and nothing else pulls (the test below), so where it
    leads g is the entry's g_at_zero: every trained raw parameter at 0 gives it, with a direction
    (d > 1) and without (d = 1, a fixed buffer)."""
    for name, entry in model_py.REPARAMS.items():
        cfg = model_py.GPTConfig(**TINY, sv_reparam=name)
        for d in (4, 1):
            sv = ScaleVector(2, d, cfg, AFTER_NORM)
            with torch.no_grad():
                for p in sv.parameters():
                    p.zero_()
                g, want = sv(), torch.full((2, d), float(entry.g_at_zero))
            assert torch.allclose(g, want, rtol=1e-6, atol=1e-6), (   # float32 rounding of g
                f"REPARAMS[{name!r}] states g_at_zero={entry.g_at_zero}, but with its raw "
                f"parameters at 0 (where decay leads; d={d}) g is {g.flatten()[:4].tolist()}: "
                "state that value")


STEP_RUN = ("--max_iters=2", "--eval_interval=1", "--eval_iters=1", "--final_eval=False",
            "--warmup_iters=0", "--lr_schedule=constant", "--grad_clip=0", "--dtype=float64",
            "--qk_norm=True")   # qk_norm: a vector of each class (sv_input, sv_final, sv_output)


def run_train_py(monkeypatch, wd, *args):
    """train.py in this process (runpy: an entry registered at run time is seen), on the tiny model
    in `wd`: its globals at the end; its signal handlers and TF32 switches put back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    tf32 = [(m, m.allow_tf32) for m in (torch.backends.cuda.matmul, torch.backends.cudnn)]
    monkeypatch.chdir(wd)
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY_MODEL, *args])
    try:
        run = runpy.run_path(os.path.join(ROOT, "train.py"))
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for module, value in tf32:
            module.allow_tf32 = value
    run["run_log"].file.close()
    run["lock"].close()
    return run


@pytest.mark.parametrize("reparam, policy", list(itertools.product(
    model_py.REPARAMS, model_py.DECAY_POLICIES)))
def test_train_py_moves_the_weights_only_by_the_optimizers_step(reparam, policy, workdir,
                                                                 monkeypatch):
    """No pull hides in train.py's loop: each of two of its steps (float64, constant rate, no
    clipping) gives bit for bit the weights of the optimizer's step alone on the same batches."""
    args = [f"--sv_reparam={reparam}", f"--sv_weight_decay={policy}",
            f"--out_dir=out_step_{reparam}_{policy}"]
    run = run_train_py(monkeypatch, workdir, *STEP_RUN, *args)
    torch.manual_seed(run["seed"])
    model = model_py.GPT(model_py.GPTConfig(**run["model_args"])).to("cpu", torch.float64)
    optimizers = model.configure_optimizers(
        learning_rate=run["learning_rate"], weight_decay=run["weight_decay"],
        betas=(run["beta1"], run["beta2"]), sv_weight_decay=policy)
    saved = checkpoint.checkpoints(os.path.join(workdir, run["out_dir"]))
    assert [checkpoint.step_of(p) for p in saved] == [1, 2], saved
    for step, path in enumerate(saved):
        x, y = run["train_batch"](step, 0)
        model(x, y)[1].backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        got = torch.load(path, weights_only=True)["model"]
        wrong = {k: gap(got[k], w) for k, w in model.state_dict().items()
                 if not torch.equal(got[k], w)}
        assert not wrong, (
            f"sv_reparam={reparam!r}, sv_weight_decay={policy!r}: after step {step + 1} of "
            f"train.py, {', '.join(f'{k} is {d}' for k, d in list(wrong.items())[:4])} away from "
            "the optimizer's own step: train.py must change the weights only by opt.step(); a "
            "decay toward another target is a reparameterization whose g is that target at raw 0 "
            "(REPARAMS' g_at_zero)")


# ---- no flag is inert, and every flag that adds a vector is in the one list ---------------------

def test_no_flag_is_inert():
    """A flag off its default changes the parameters or the function at init, in every combination
    of the flags' values GPTConfig takes (on an MoE where only an MoE takes it)."""
    flags = {"scale_vectors": (True, False), **{f: flag_values(f) for f in model_py.VECTOR_FLAGS}}
    combos = (dict(zip(flags, values)) for values in itertools.product(*flags.values()))
    default, built, idx = defaults(), {}, tokens(B=1, T=8)

    def made(kw, logits=False):   # its parameters' shapes (unseeded) or logits, built once each
        key = (tuple(sorted(kw.items())), logits)
        if key not in built:
            m = make(**kw) if logits else model_py.GPT(model_py.GPTConfig(**TINY, **kw))
            built[key] = m(idx)[0].detach() if logits else {
                k: v.shape for k, v in m.state_dict().items()}
        return built[key]
    for kw in (c if accepted(c) else dict(MOE, **c) for c in combos):
        for flag, value in kw.items() if accepted(kw) else ():
            base = {**kw, flag: default[flag]}
            if flag in MOE or value == default[flag] or not accepted(base) or made(kw) != made(
                    base):
                continue
            assert not torch.equal(made(kw, True), made(base, True)), (
                f"{flag}={value!r} changes neither the parameters nor the function of {base}: "
                + (unregistered(make(**kw)) or "GPTConfig must refuse it (check_config)"))


def test_every_vector_flag_is_listed():
    """The generic tests build their models from VECTOR_FLAGS: a bool field outside it that adds a
    vector, dense or on an MoE, would go untested."""
    for f, base in itertools.product(fields(model_py.GPTConfig), ({}, MOE)):
        flipped = {**base, f.name: not f.default}
        if f.name not in (*model_py.VECTOR_FLAGS, "scale_vectors") and f.type in (bool, "bool") \
                and accepted(flipped):
            model = make(**flipped)
            assert vectors(model).keys() == vectors(make(**base)).keys(), (
                f"{f.name} adds or changes scale vectors: list it in model.VECTOR_FLAGS")
            assert not unregistered(model), f"{f.name}={not f.default}: {unregistered(model)}"


# ---- tests/README.md's checklist, followed mechanically ----------------------------------------

@dataclass
class ToyConfig(model_py.GPTConfig):
    """A new location, step 1: a GPTConfig field each."""
    sv_headgate: bool = False   # a learnable scalar a_h per head on attention's output, before W_o
    sv_router: bool = False     # a vector on the MoE router's input (an MoE-only flag)


class HeadGateAttention(model_py.Attention):
    """Step 4: W_o concat_h(a_h o_h) = (W_o diag(a repeated over a head)) concat_h(o_h): the gate
    folds into W_o's columns, one entry per head."""
    DECLARED = (("proj.weight", "columns"),)   # a wrong toy overrides one of these two
    INIT = None

    def __init__(self, cfg):
        super().__init__(cfg)
        self.gate = None
        if cfg.scale_vectors and cfg.sv_headgate:
            self.gate = ScaleVector(1, cfg.n_head, cfg, self.DECLARED)
            for p in self.gate.parameters() if self.INIT is not None else ():
                nn.init.constant_(p, self.INIT)
            self.proj.register_forward_pre_hook(self.gated)

    def gated(self, proj, args):
        return (args[0] * self.gate().view(-1).repeat_interleave(self.hd),)


class RouterGateMoE(model_py.MoE):
    """An MoE-only location: W_r (g_r * g_ffn * Norm(x)), two vectors folded into one map."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.g_router = (ScaleVector(1, cfg.n_embd, cfg, (("router.weight", "columns"),))
                         if cfg.scale_vectors and cfg.sv_router else None)

    def route(self, x):
        return super().route(x * self.g_router().view(-1) if self.g_router is not None else x)


def register_the_toys(monkeypatch, router=None, **toy):
    """Steps 1-4: the head gate (`toy` overrides DECLARED or INIT); the router's vector, `router`
    its VECTOR_FLAGS entry (None: none)."""
    monkeypatch.setattr(model_py, "GPTConfig", ToyConfig)
    monkeypatch.setattr(model_py, "Attention", type("Toy", (HeadGateAttention,), toy))
    monkeypatch.setattr(model_py, "MoE", RouterGateMoE)
    for flag, spec in (("sv_headgate", model_py.VectorFlag((False, True))), ("sv_router", router)):
        monkeypatch.setitem(config_defaults.DEFAULTS, flag, False)
        monkeypatch.setitem(config_defaults.TRAIN_RULES, flag, config_defaults.boolean)
        if spec:
            monkeypatch.setitem(model_py.VECTOR_FLAGS, flag, spec)


def toy_config(folder, name, base, **keys):
    """Step 5: config/<name>_char.py, here in `folder`: config/<base>_char.py's keys, then keys."""
    (folder / f"{name}_char.py").write_text(f"from config.{base}_char import *  # noqa\n" + "".join(
        f"{k} = {v!r}\n" for k, v in keys.items()))
    return str(folder / f"{name}_char.py")


# named variants: one of training keys; one of every toy (its flags, on an MoE: moe_toy_all_char.py)
TOY_VARIANTS = dict(toy_decay=dict(sv_weight_decay="blocks_all", sv_decay=0.5), toy_all=dict(
    sv_reparam="sp", sv_placement="norm2", sv_headgate=True, sv_router=True))


@pytest.mark.slow   # the toys double the flags' combinations in test_no_flag_is_inert
def test_the_readme_checklist_on_toy_entries(monkeypatch, tmp_path):
    """tests/README.md's checklist, followed at run time with no other edit: a reparameterization
    "sp" (g = softplus(a) / softplus(0)), a placement "norm2" (dnp_novec's entry under a new name),
    a decay policy "blocks_all", two locations (a per-head gate before W_o, an MoE-only vector on
    the router's input) and two named variants pass every generic check. A wrong g_at_zero, an
    MoE-only flag left out of VECTOR_FLAGS, a config without a training key and entries without
    their README rows fail."""
    sp = lambda p, eps: F.softplus(p["a"]) / F.softplus(p["a"].new_zeros(()))  # noqa: E731
    monkeypatch.setitem(model_py.REPARAMS, "sp", model_py.Reparam(dict(a=("vector", 0.0)), sp, 1.0))
    monkeypatch.setitem(model_py.PLACEMENTS, "norm2", model_py.PLACEMENTS["dnp_novec"])
    monkeypatch.setitem(model_py.DECAY_POLICIES, "blocks_all", ("sv_input", "sv_output"))
    register_the_toys(monkeypatch, model_py.VectorFlag((False, True), moe_only=True))
    # dp folds on both sides of the maps, dnp is refused folding, norm2 by its entry, not its name
    for entry, check in itertools.product([("sp", "dp"), ("sp", "dnp"), ("or", "norm2")], CHECKS):
        check(*entry)
    test_every_reparameterization_states_what_decay_makes_of_g()
    monkeypatch.setitem(model_py.REPARAMS, "sp0", model_py.REPARAMS["sp"]._replace(g_at_zero=0.0))
    with pytest.raises(AssertionError, match=r"^REPARAMS\['sp0'\] states g_at_zero=0.0, but with "
                                             r"its raw parameters at 0 .* g is \[1.0"):
        test_every_reparameterization_states_what_decay_makes_of_g()
    monkeypatch.delitem(model_py.REPARAMS, "sp0")
    test_no_flag_is_inert()
    test_every_vector_flag_is_listed()
    assert {"blocks.0.attn.gate", "blocks.0.mlp.g_router"} <= set(vectors(make(
        sv_headgate=True, sv_router=True, **MOE)))
    for name, keys in TOY_VARIANTS.items():
        monkeypatch.setitem(VARIANTS, name, keys)
        moe = "moe_" * keys.get("sv_router", False)
        check_config_file(toy_config(tmp_path, moe + name, moe + "baseline", **keys))
        check_named_variant(name, {f"{moe}{name}_char.py"})
    with pytest.raises(AssertionError, match=r"does not set .*: \{'sv_decay': -1.0\}; set "
                                             r"sv_decay = 0.5 in it"):
        check_config_file(toy_config(tmp_path, "toy_decay_lost", "baseline",
                                     sv_weight_decay="blocks_all"))
    with pytest.raises(AssertionError, match="^README.md's variants table has no row for "
                       "sv_placement='norm2', sv_reparam='sp', sv_headgate=True, sv_router=True, "
                       "sv_weight_decay='blocks_all': add one each"):
        test_every_table_entry_and_flag_has_its_readme_row_and_design_entry()
    monkeypatch.delitem(model_py.VECTOR_FLAGS, "sv_router")   # GPTConfig takes it dense, inert
    with pytest.raises(AssertionError, match="^sv_router adds or changes scale vectors"):
        test_every_vector_flag_is_listed()


BUILT = "folds_into must be AFTER_NORM or"   # refused when it is read


@pytest.mark.parametrize("toy, fails, refused", [
    (dict(INIT=0.1), "is not 1 at init", None),   # the gate starts at 0.1, not 1
    # said to have a Norm after it: IWD would skip it, folding refuse it
    (dict(DECLARED=AFTER_NORM), r"declares a Norm after it \(AFTER_NORM\), but it folds into "
                                r"blocks\.\d\.attn\.proj\.weight's columns", None),
    # folds where it does not act: the fold drops it
    (dict(DECLARED=(("qkv.weight", "columns"),)), r"does not fold where it declares", None),
    *[(dict(DECLARED=d), None, BUILT) for d in ((), None, (("proj.weight", "sideways"),))],
    # a weight the model has not, or one whose shape the vector does not fit (proj has 32 rows,
    # the gate 2 entries): folding names the vector, and the generic checks fail
    *[(dict(DECLARED=(d,)), None, "declares folds_into=")
      for d in (("prj.weight", "columns"), ("proj.weight", "rows"))]],
    ids=["init_tenth", "declared_after_norm", "folded_elsewhere", "empty", "none", "sideways",
         "no_such_weight", "rows_misfit"])
def test_a_wrong_toy_location_fails_the_generic_checks(monkeypatch, toy, fails, refused):
    """A fork's silent mistake on the toy location fails a generic check, naming the vector; a
    declaration the model cannot use is refused by folding, naming it."""
    register_the_toys(monkeypatch, **toy)
    if refused:
        with pytest.raises(ValueError, match=r"^blocks\.0\.attn\.gate:? " + refused):
            make(sv_headgate=True).fold_scale_vectors()
    if refused != BUILT:
        with pytest.raises((AssertionError, KeyError, RuntimeError, AttributeError),
                           match=fails and r"blocks\.\d\.attn\.gate.* " + fails):
            for check in CHECKS if fails else (check_folding,):   # where a misfit shows
                check("none", "pre")


# ---- README's variants table says where each flag's vectors act, as they declare ---------------

def where_they_act(kw):
    """README's column for a flag: the sites ("`attn.qkv` rows") of the vectors it adds or changes
    against the defaults (no vectors for scale_vectors=True), or "after a Norm"."""
    base = make(**({"scale_vectors": False} if kw.get("scale_vectors") else {}))
    model, sites = make(**kw), set()
    for name, sv in vectors(model).items():
        old = vectors(base).get(name)
        if old is not None and old.folds_into == sv.folds_into and old().shape == sv().shape:
            continue
        sites |= {"after a Norm"} if sv.folds_into == AFTER_NORM else set()
        sites |= {f"`{re.sub(r'^blocks[.][0-9]+[.]|[.]weight$', '', key)}` {side}"   # `attn.qkv`
                  for key, side in declared_weights(name, sv)}
    return sites


def readme_rows():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return [line.split(" | ") for line in f if line.startswith("| `")]


def test_the_readme_table_says_where_each_flags_vectors_act():
    checked = 0
    for flag_cell, _, acts, _ in (r for r in readme_rows() if len(r) == 4):
        kw = {k: ast.literal_eval(v) for k, v in re.findall(r"`(\w+)=([^`]+)`", flag_cell)
              if k in defaults()}
        if kw:
            said = set(re.findall(r"`[\w.]+` (?:rows|columns)", acts)) | (
                {"after a Norm"} if "after a Norm" in acts else set())
            assert said == where_they_act(kw), (
                f"README's row {flag_cell} says its vectors act at {sorted(said)}, but they "
                f"declare {sorted(where_they_act(kw))}: write that in its third column, or fix "
                "the declaration (folds_into)")
            checked += 1
    assert checked >= 7, checked


def documented_values():
    """(key, value) of each flag's and decay policy's values but the defaults."""
    values = {**{f: flag_values(f)[1:] for f in model_py.VECTOR_FLAGS}, "sv_weight_decay": [
        p for p in model_py.DECAY_POLICIES if p != DEFAULTS["sv_weight_decay"]]}
    return [(k, v) for k, vs in values.items() for v in vs]


def spelled(key, value):
    """How a doc writes key=value in backticks: `key="v"` or `key='v'`; `key=True`."""
    return [f'`{key}="{value}"`', f"`{key}='{value}'`"] if isinstance(value, str) else [
        f"`{key}={value!r}`"]


def test_every_table_entry_and_flag_has_its_readme_row_and_design_entry():
    """README's variants table has a row for each value of each flag and decay policy, and
    DESIGN.md names each (`key=value`, a bool flag as `key`, a table entry as `value`)."""
    rows = readme_rows()
    with open(os.path.join(ROOT, "DESIGN.md"), encoding="utf-8") as f:
        design = f.read()
    no_row, no_entry = [], []
    for key, value in documented_values():
        if not any(lit in " | ".join(row) for row in rows for lit in spelled(key, value)) and not (
                isinstance(value, str) and any(f"`{key}=" in row[0] and f'`"{value}"`' in row[0]
                                               for row in rows)):
            no_row.append(f"{key}={value!r}")
        names = spelled(key, value) + ([f"`{key}`"] if value is True else []) + (
            [f"`{value}`", f'`"{value}"`'] if isinstance(value, str) else [])
        if not any(n in design for n in names):
            no_entry.append(f"{key}={value!r}")
    assert not no_row and not no_entry, "; ".join(
        ([f"README.md's variants table has no row for {', '.join(no_row)}: add one each, "
          "| `key=value` | what it does | where its vectors act | paper |"] if no_row else [])
        + ([f"DESIGN.md does not name {', '.join(no_entry)}: add each one's definition there, "
            "naming it as `key=value`"] if no_entry else []))


# ---- one list of named variants: configs and grids are checked against config/variants.py -----

CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")
                 and variant_of(f[:-3].rsplit("_", 1)[0]))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_file_sets_the_keys_of_its_name_and_no_vector_of_it_is_inert(config):
    check_config_file(f"config/{config}")


def check_config_file(path):
    """A config file sets each key of its variant, model or training, and no vector of its model
    (at the tiny size) is inert: one applied only under another flag passes the all-on walk."""
    name = variant_of(os.path.basename(path)[:-3].rsplit("_", 1)[0])
    cfg, want = train_config(path), named_flags(name)
    wrong = {k: cfg[k] for k in want if cfg[k] != want[k]}
    assert not wrong, (f"{path} does not set the keys of VARIANTS[{name!r}] ({want}): {wrong}; "
                       f"set {', '.join(f'{k} = {want[k]!r}' for k in wrong)} in it")
    kw = {k: cfg[k] for k in defaults() if k in want or k.startswith(("n_expert", "n_shared"))}
    kw.update(moe_dense_layers=min(cfg["moe_dense_layers"], 1), moe_hidden=32)
    every_vector_trains(make(**kw), path)


def check_named_variant(name, configs):
    """A named variant's keys pass train.py's rules, it builds (on an MoE if it needs one) and has
    a char config file."""
    flags, moe = VARIANTS[name], not accepted(model_keys(VARIANTS[name]))
    train_config(f"config/{'moe_baseline' if moe else 'shakespeare'}_char.py",
                 tuple(f"--{k}={v}" for k, v in flags.items()))
    model_py.GPTConfig(**TINY, **model_keys(flags), **(MOE if moe else {}))
    assert f"{'moe_' * moe}{name}_char.py" in configs or name.endswith(("_novec", "_noiwd")), (
        f"VARIANTS[{name!r}] has no config file: write config/{'moe_' * moe}{name}_char.py "
        f"(from config.{'moe_' * moe}baseline_char import *, then its keys) and its size in "
        "tests/test_configs.py")


def test_every_named_variant_builds_and_has_a_char_config_and_every_config_is_one():
    for name in VARIANTS:
        check_named_variant(name, CONFIGS)
    # a config named after no variant would be size-checked only (tests/test_configs.py); the
    # quick start's shakespeare_char is the baseline under another name
    others = {f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")}
    others -= {*CONFIGS, "__init__.py", "defaults.py", "variants.py", "shakespeare_char.py"}
    assert not others, (f"config/{sorted(others)[0]} is named after no variant: add its variant's "
                        "keys to config/variants.py, or rename it <variant>_char.py")
