"""What holds for every variant and scale vector, walked from model.py's tables (PLACEMENTS,
REPARAMS, DECAY_POLICIES) and VECTOR_FLAGS: each check builds its models from them and checks every
ScaleVector in each model's module tree by what it declares (folds_into), never by its name, so a
new entry, flag or location gets every test with no test edit; a failure names entry and vector."""
import ast
import copy
import itertools
import os
import re
from dataclasses import dataclass, fields

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import model as model_py
import telemetry
from config import defaults as config_defaults
from helpers import (MOE, ROOT, TINY, accepted, declared_class, defaults, entries, flag_values,
                     make, models, randomize_scale_vectors, tokens, vectors)
from model import AFTER_NORM, ScaleVector
from config.variants import VARIANTS, model_keys, named_flags, variant_of
from config.defaults import train_config

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


def close(a, b):   # float32 logits of order 1 (a moved vector moves them by more than 1e-2)
    return torch.allclose(a, b, atol=2e-5, rtol=1e-4)


# ---- the checks ---------------------------------------------------------------------------------

def check_the_init(reparam, placement):
    """Paper: "scale vectors initialised to 1", exactly, so a variant starts from the baseline: a
    reparameterized model computes, bit for bit, what plain vectors compute; where no Norm is added
    (no vector declares one before it, no Norm after the maps), what the model without any vector
    flag computes; a seed fixes every weight the variants share; and every vector trains."""
    idx = tokens()
    for label, kw in models(reparam, placement):
        model = make(**kw)
        base = make(**{k: v for k, v in kw.items() if k not in model_py.VECTOR_FLAGS})
        for name, sv in vectors(model).items():
            assert torch.equal(sv(), torch.ones_like(sv())), f"{label}: {name} is not 1 at init"
        ref, own = base.state_dict(), model.state_dict()
        for k in (k for k, c in model.param_classes().items() if not c.startswith("sv_")):
            assert torch.equal(ref[k], own[k]), f"{label}: {k} is not the baseline's"
        logits, plain = model(idx)[0], make(**{**kw, "sv_reparam": "none"})(idx)[0]
        assert torch.equal(logits, plain), f"{label}: the logits at init differ from 'none'"
        if not model_py.PLACEMENTS[placement].norm and all(
                sv.folds_into != AFTER_NORM for sv in vectors(model).values()):
            assert torch.equal(logits, base(idx)[0]), \
                f"{label}: the logits at init are not the baseline's"
        every_vector_trains(model, label)


def every_vector_trains(model, label):
    """Every trained parameter of every scale vector moves the loss at init."""
    model(tokens(), tokens(seed=5))[1].backward()
    for name, sv in vectors(model).items():
        for pname, p in sv.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, \
                f"{label}: {name}.{pname} gets no gradient (an inert vector)"


def check_folding(reparam, placement):
    """Paper 2.2, checked on what each vector declares. A vector that says it folds does: moved
    away from 1 it moves the logits, and folded into the weights it names (by factor, not by
    model.py) it gives them back. One that says a Norm stands between folds into no weight of the
    model (every weight and side its shape fits is tried; for reparam 'none', since what a vector
    declares does not depend on how g is parameterized). Telemetry's g of a map is the product of
    the vectors declared on its columns (a second one there must not be left out). And
    fold_scale_vectors reproduces the logits, or is refused exactly where such a vector is (naming
    it) or a Norm follows the maps (DNP)."""
    idx = tokens(B=2, T=8)
    for label, kw in models(reparam, placement):
        model = make(**kw)
        model.vector_sites()   # a declaration the model cannot use: refused, naming the vector
        svs = vectors(model)
        folds = [n for n, sv in svs.items() if sv.folds_into != AFTER_NORM]
        for names in [folds] + [[n] for n in folds]:   # all at once; then one by one, to name it
            moving = moved(model, names)
            logits, factors = moving(idx)[0], {}
            assert not close(logits, model(idx)[0]), f"{label}: moving {names[:1]} moved nothing"
            for n in names:
                for key, side in declared_weights(n, svs[n]):
                    f = factor(model.get_parameter(key), moving.get_submodule(n)().detach(), side)
                    factors[key] = factors.get(key, 1.0) * f
            if close(folded(model, factors)(idx)[0], logits):
                if names is folds:
                    break   # all of them fold where they declare
            elif len(names) == 1:
                raise AssertionError(f"{label}: {names[0]} does not fold where it declares "
                                     f"({svs[names[0]].folds_into!r}): there, the logits differ")
        else:
            assert not folds, f"{label}: the vectors fold one by one as declared, not together"
        after = [n for n, sv in svs.items() if sv.folds_into == AFTER_NORM]
        if after and reparam == "none":
            check_none_folds(label, model, after, idx)
        moving = moved(model, list(svs))
        for name, (W, g) in telemetry.fed_maps(moving).items():   # what train.py logs of the maps
            want, g = torch.ones_like(W[:, 0]), torch.ones_like(W[:1, 0]) if g is None else g
            for n, sv in vectors(moving).items():
                if (f"{name}.weight", "columns") in declared_weights(n, sv):
                    want = want * sv().detach().repeat_interleave(W.size(-1) // sv.width, 1)
            assert torch.allclose(g.expand_as(want), want), \
                f"{label}: telemetry's g of {name} is not the product of the vectors on its columns"
        if after or model_py.PLACEMENTS[placement].norm:
            with pytest.raises(ValueError, match="cannot fold") as e:
                moving.fold_scale_vectors()
            assert not after or after[0] in str(e.value), (label, str(e.value))
            continue
        plain = moving.fold_scale_vectors()
        assert not vectors(plain), label
        assert close(plain(idx)[0], moving(idx)[0]), \
            f"{label}: the folded model does not reproduce the logits (a vector was dropped)"


def check_none_folds(label, model, names, idx):
    """The vectors `names` (plain: their raw parameter is g), said to have a Norm after them, fold
    into no weight of the model. Folding g into W's columns at g = 1 would give dL/dg_j =
    sum_i W_ij dL/dW_ij (rows: sum over j), so only a weight and side where that holds is tried
    for real: g moved, then folded there, must not give the moved model's logits back."""
    model.zero_grad()
    model(idx, tokens(B=2, T=8, seed=5))[1].backward()
    weights = [(k, W) for k, W in model.named_parameters(remove_duplicate=False)
               if W.dim() > 1 and not declared_class(model, k).startswith("sv_")]
    for n in names:
        moving, grad = moved(model, [n]), model.get_submodule(n).g.grad
        g = moving.get_submodule(n)().detach()
        for (key, W), side in itertools.product(weights, ("columns", "rows")):
            rows = W[..., 0].numel()   # g fits W's rows, or its columns
            if not (rows == g.numel() if side == "rows" else rows % g.size(0) == 0
                    and W.size(-1) % g.size(1) == 0):
                continue
            WdW = (W * W.grad).detach()
            if side == "columns":   # per row block of g, per group of in / width columns
                sums = WdW.reshape(g.size(0), -1, W.size(-1)).sum(1)
                sums = sums.reshape(g.size(0), g.size(1), -1).sum(-1)
            else:
                sums = WdW.sum(-1).reshape(g.shape)
            if torch.allclose(sums, grad, rtol=1e-3, atol=1e-3 * grad.abs().max().item()) and \
                    close(folded(model, {key: factor(W, g, side)})(idx)[0], moving(idx)[0]):
                raise AssertionError(f"{label}: {n} declares a Norm after it (AFTER_NORM), but it "
                                     f"folds into {key}'s {side}")


# a run, then its resume with other settings (sv_decay, a learning-rate factor per class)
RUNS = (dict(learning_rate=1e-3, muon_lr=2e-3, weight_decay=0.1),
        dict(learning_rate=3e-3, muon_lr=4e-3, weight_decay=0.05, sv_decay=0.5,
             lr_mults=dict(embedding=2.0, sv_input=3.0, sv_final=5.0, sv_output=7.0)))
with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:   # a script: its own lines run
    LR_LOOP = compile(ast.Module([n for n in ast.walk(ast.parse(f.read())) if isinstance(
        n, ast.For) and getattr(n.target, "id", None) == "group"], []), "train.py", "exec")


def check_optimizer_groups(reparam, placement):
    """Paper 2.2 and train.py's schedule, on each optimizer's groups under each decay policy: every
    parameter in exactly one group, of its declared class, on Muon exactly if a 2-D matrix (muon),
    decayed as the declarations and the policy's entry say (matrices and embeddings always; vectors
    by sv_decay where set), at the rate train.py's loop (LR_LOOP) sets times its class's factor, at
    step 0, mid-schedule and after a resume with other settings (checkpoint.restore keeps them)."""
    for (label, kw), optimizer, policy in itertools.product(
            models(reparam, placement), ("adamw", "muon"), model_py.DECAY_POLICIES):
        model, saved = make(**kw), None
        names = {id(p): n for n, p in model.named_parameters()}
        with pytest.raises(ValueError, match="sv_inptu"):   # a misspelt class: not silently 1
            model.param_groups(0.1, lr_mults=dict(sv_inptu=2.0))
        for run in RUNS:
            opts = model.configure_optimizers(**run, betas=(0.9, 0.95), sv_weight_decay=policy,
                                              optimizer=optimizer)
            if saved:   # a resume: the checkpoint's weights and moments, this run's settings
                checkpoint.restore(model, opts, saved, "ckpt")
            groups = [g for o in opts for g in o.param_groups]
            saved = dict(model=model.state_dict(), optimizers=[o.state_dict() for o in opts])
            assert sorted(names[id(p)] for g in groups for p in g["params"]) == sorted(
                names.values()), f"{label}: not every parameter in exactly one group"
            for factor in (1 / 101, 0.55):
                exec(LR_LOOP, dict(optimizers=opts, factor=factor))
                for g, p in ((g, p) for g in groups for p in g["params"]):
                    cls = declared_class(model, names[id(p)])
                    muon = optimizer == "muon" and cls == "matrix" and p.dim() == 2
                    decayed = cls in ("matrix", "embedding", *model_py.DECAY_POLICIES[policy])
                    coef = run.get("sv_decay", run["weight_decay"]) if cls.startswith("sv_") \
                        else run["weight_decay"]
                    lr = run["muon_lr" if muon else "learning_rate"] * factor
                    want = (cls, "muon" if muon else "adamw", coef if decayed else 0.0,
                            pytest.approx(lr * run.get("lr_mults", {}).get(cls, 1.0)))
                    got = (g["name"], g["optimizer"], g["weight_decay"], g["lr"])
                    assert got == want, (
                        f"{label}, {optimizer}, sv_weight_decay={policy!r}, {run}: {names[id(p)]}'s"
                        f" (class, optimizer, weight_decay, lr) is {got}, not {want}")


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
    to eager), with the eager model's loss and gradients. Dynamo's capture alone (backend "eager",
    about 1 s a model); inductor's code is held to eager by gpu_check's compile check."""
    for label, kw in [m for m in models(reparam, placement) if "MoE" not in m[0]][-1:]:   # all on
        model = make(**kw)
        randomize_scale_vectors(model)
        torch._dynamo.reset()   # each model compiles afresh (not against dynamo's recompile limit)
        same_loss_and_gradients(label, model, (model, torch.compile(model, backend="eager",
                                                                    fullgraph=True)))


def check_the_moe(reparam, placement):
    """MoE.run_experts' loop (a CPU's) and grouped GEMM (a GPU's; torch._grouped_mm runs on a CPU
    in float32 too) give one loss and gradients, so a vector left out of one path is caught. And
    num_active_params counts a vector as one token's only where its rows are per expert, which is
    where the experts' ExpertsLinear holds it: one token routed to k experts (the bias chooses
    them) gives such a vector's rows of the other experts no gradient and its own experts' some;
    any other vector of an MoE layer has no row block of the other experts without gradient."""
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


# ---- no flag is inert, and every flag that adds a vector is in the one list ---------------------

def test_no_flag_is_inert():
    """A flag (or scale_vectors) off its default changes the parameters (names, shapes) or the
    function at init, in every combination of their values GPTConfig takes (dense, or on an MoE
    where only an MoE takes it), or __post_init__ must refuse it."""
    flags = {"scale_vectors": (True, False), **{f: flag_values(f) for f in model_py.VECTOR_FLAGS}}
    combos = (dict(zip(flags, values)) for values in itertools.product(*flags.values()))
    shapes, idx = {}, tokens(B=1, T=8)

    def signature(kw):
        key = tuple(sorted(kw.items()))
        if key not in shapes:
            with torch.device("meta"):
                m = model_py.GPT(model_py.GPTConfig(**{**TINY, **kw}))
            shapes[key] = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        return shapes[key]
    for kw in (c if accepted(c) else dict(MOE, **c) for c in combos):
        for flag, value in kw.items():
            base = {**kw, flag: defaults()[flag]}
            if flag in MOE or value == defaults()[flag] or not accepted(kw) or not accepted(base) \
                    or signature(kw) != signature(base):
                continue
            assert not torch.equal(make(**kw)(idx)[0], make(**base)(idx)[0]), (
                f"{flag}={value!r} changes neither the parameters nor the function of "
                f"{base}: GPTConfig must refuse it")


def test_every_vector_flag_is_listed():
    """The generic tests build their models from model.VECTOR_FLAGS: a bool field outside it (and
    scale_vectors) that adds a vector, to a dense model or an MoE, would go untested."""
    for f, base in itertools.product(fields(model_py.GPTConfig), ({}, MOE)):
        flipped = {**base, f.name: not f.default}
        if f.name not in (*model_py.VECTOR_FLAGS, "scale_vectors") and f.type in (bool, "bool") \
                and accepted(flipped):
            assert vectors(make(**flipped)).keys() == vectors(make(**base)).keys(), (
                f"{f.name} adds or changes scale vectors: list it in model.VECTOR_FLAGS")


# ---- tests/README.md's checklist, followed mechanically ----------------------------------------

@dataclass
class ToyConfig(model_py.GPTConfig):
    """A new location, step 1: a GPTConfig field each (checked by their VECTOR_FLAGS entries:
    GPTConfig refuses them without scale vectors, sv_router without an MoE)."""
    sv_headgate: bool = False   # a learnable scalar a_h per head on attention's output, before W_o
    sv_router: bool = False     # a vector on the MoE router's input (an MoE-only flag)


class HeadGateAttention(model_py.Attention):
    """Step 4: the vector and its declaration. W_o concat_h(a_h o_h) = (W_o diag(a repeated over a
    head's channels)) concat_h(o_h): the gate folds into W_o's columns, one entry per head."""
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
    """An MoE-only location: W_r (g_r * g_ffn * Norm(x)), g_r folded into the router's columns
    beside g_ffn (under HG the router's own g_in): two vectors feed one map."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.g_router = (ScaleVector(1, cfg.n_embd, cfg, (("router.weight", "columns"),))
                         if cfg.scale_vectors and cfg.sv_router else None)

    def route(self, x):
        return super().route(x * self.g_router().view(-1) if self.g_router is not None else x)


def register_the_toys(monkeypatch, router=None, **toy):
    """Steps 1-4 of a new location, at run time: the head gate, `toy` overriding its DECLARED or
    INIT; the router's vector, `router` its VECTOR_FLAGS entry (None: none)."""
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
TOY_VARIANTS = dict(toy_decay=dict(sv_weight_decay="iwd", sv_decay=0.5), toy_all=dict(
    sv_reparam="sp", sv_placement="norm2", sv_weight_decay="blocks_all", sv_headgate=True,
    sv_router=True))


def test_the_readme_checklist_on_toy_entries(monkeypatch, tmp_path):
    """tests/README.md's checklist: one entry per table, registered at runtime, gets every generic
    check with no other edit: a reparameterization "sp" (g = softplus(a) / softplus(0): 1 at a = 0),
    a placement "norm2" (dnp_novec's entry: a Norm after the maps, no vector there, so folding must
    be refused by the entry, not the name), a decay policy "blocks_all" (every vector but g_final);
    so do two locations (a per-head gate before W_o; a vector on the router's input, MoE-only) and
    two named variants with their config files. An MoE-only flag left out of VECTOR_FLAGS, a config
    without a training key, fail."""
    sp = lambda p, eps: F.softplus(p["a"]) / F.softplus(p["a"].new_zeros(()))  # noqa: E731
    monkeypatch.setitem(model_py.REPARAMS, "sp", model_py.Reparam(dict(a=("vector", 0.0)), sp))
    monkeypatch.setitem(model_py.PLACEMENTS, "norm2", model_py.PLACEMENTS["dnp_novec"])
    monkeypatch.setitem(model_py.DECAY_POLICIES, "blocks_all", ("sv_input", "sv_output"))
    for entry, check in itertools.product([("sp", "pre"), ("sp", "dnp"), ("or", "norm2")], CHECKS):
        check(*entry)   # every generic check of each entry
    register_the_toys(monkeypatch, model_py.VectorFlag((False, True), moe_only=True))
    for entry, check in itertools.product([("none", "pre"), ("er", "dp"), ("none", "dnp")], CHECKS):
        check(*entry)
    test_no_flag_is_inert()
    test_every_vector_flag_is_listed()
    assert {"blocks.0.attn.gate", "blocks.0.mlp.g_router"} <= set(vectors(make(
        sv_headgate=True, sv_router=True, **MOE)))
    for name, keys in TOY_VARIANTS.items():
        monkeypatch.setitem(VARIANTS, name, keys)
        moe = "moe_" * keys.get("sv_router", False)
        check_config_file(toy_config(tmp_path, moe + name, moe + "baseline", **keys))
        check_named_variant(name, {f"{moe}{name}_char.py"})
    with pytest.raises(AssertionError, match=r"does not set .*: \{'sv_decay': -1.0\}"):
        check_config_file(toy_config(tmp_path, "toy_decay_lost", "baseline", sv_weight_decay="iwd"))
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
    """Each silent mistake a fork can make, made on the toy location, fails a generic check with a
    message naming the vector; a declaration the model cannot use, folding refuses, naming it."""
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
    """What README's column says of a flag: the sites ("`attn.qkv` rows", per block) of the
    vectors it adds or reshapes against the defaults (against no vectors for scale_vectors=True),
    "after a Norm" for those that declare a Norm after them."""
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


def test_the_readme_table_says_where_each_flags_vectors_act():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        rows = [line.split(" | ") for line in f if line.startswith("| `")]
    checked = 0
    for flag_cell, _, acts, _ in (r for r in rows if len(r) == 4):
        kw = {k: ast.literal_eval(v) for k, v in re.findall(r"`(\w+)=([^`]+)`", flag_cell)
              if k in defaults()}
        if kw:
            said = set(re.findall(r"`[\w.]+` (?:rows|columns)", acts)) | (
                {"after a Norm"} if "after a Norm" in acts else set())
            assert said == where_they_act(kw), (
                f"README's row {flag_cell}: {sorted(where_they_act(kw))}")
            checked += 1
    assert checked >= 7, checked


# ---- one list of named variants: configs and grids are checked against config/variants.py -----

CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")
                 and variant_of(f[:-3].rsplit("_", 1)[0]))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_file_sets_the_keys_of_its_name_and_no_vector_of_it_is_inert(config):
    check_config_file(f"config/{config}")


def check_config_file(path):
    """A config file sets each key of its variant (named_flags), model or training: one without a
    training key runs another variant under its name. And no vector of its model is inert: one
    applied only under another flag (post_norm) got no gradient in its own config file (its flags,
    at the tiny size), while the generic check, every flag on, passed."""
    name = variant_of(os.path.basename(path)[:-3].rsplit("_", 1)[0])
    cfg, want = train_config(path), named_flags(name)
    wrong = {k: cfg[k] for k in want if cfg[k] != want[k]}
    assert not wrong, f"{path} does not set the keys of VARIANTS[{name!r}] ({want}): {wrong}"
    kw = {k: cfg[k] for k in defaults() if k in want or k.startswith(("n_expert", "n_shared"))}
    kw.update(moe_dense_layers=min(cfg["moe_dense_layers"], 1), moe_hidden=32)
    every_vector_trains(make(**kw), path)


def check_named_variant(name, configs):
    """A named variant sets train.py's keys, to values its rules take; it builds (on an MoE, if a
    flag of it acts in an MoE only) and has a char config file (moe_<name>_char.py on an MoE)."""
    flags, moe = VARIANTS[name], not accepted(model_keys(VARIANTS[name]))
    train_config(f"config/{'moe_baseline' if moe else 'shakespeare'}_char.py",
                 tuple(f"--{k}={v}" for k, v in flags.items()))
    model_py.GPTConfig(**TINY, **model_keys(flags), **(MOE if moe else {}))
    assert f"{'moe_' * moe}{name}_char.py" in configs or name.endswith(("_novec", "_noiwd")), name


def test_every_named_variant_builds_and_has_a_char_config_and_every_config_is_one():
    for name in VARIANTS:
        check_named_variant(name, CONFIGS)
    # a config named after no variant would be size-checked only (tests/test_configs.py); the
    # quick start's shakespeare_char is the baseline under another name
    others = {f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")}
    others -= {*CONFIGS, "__init__.py", "defaults.py", "variants.py"}
    assert others == {"shakespeare_char.py"}
