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

import configurator
from config import defaults as config_defaults
import model as model_py
from helpers import (ROOT, TINY, accepted, declared_class, defaults, entries, flag_values, make,
                     model_flags, models, randomize_scale_vectors, tokens, vectors)
from model import AFTER_NORM, ScaleVector
from config.variants import VARIANTS, flags_of, named_flags, variant_of
from config.defaults import train_config


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small run 5-10x faster on one thread than on two threads of a busy 2-core
    machine (measured: check_folding('none', 'pre') 3.5 s -> 0.6 s)."""
    threads = torch.get_num_threads()
    yield torch.set_num_threads(1)
    torch.set_num_threads(threads)


def factor(W, g, side):
    """W * factor folds g into W's columns (W diag(g)) or rows (diag(g) W), written here: row
    block b of W (one per row of g) times g[b]; a column entry spans in / width columns."""
    blocks = torch.ones_like(W).reshape(g.size(0), -1, W.size(-1))
    if side == "columns":
        return (blocks * g.repeat_interleave(W.size(-1) // g.size(1), 1)[:, None]).reshape(W.shape)
    return (blocks * g[:, :, None]).reshape(W.shape)


def fits(W, g, side):
    rows = W[..., 0].numel()
    return (rows == g.numel() if side == "rows"
            else rows % g.size(0) == 0 and W.size(-1) % g.size(1) == 0)


def moved(model, names):
    out = copy.deepcopy(model)
    randomize_scale_vectors(out, names=names)
    return out


def folded(model, factors):
    """A copy of `model`, its weights {path: factor} multiplied (new tensors: tied heads untie)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for key, factor in factors.items():
            holder, _, pname = key.rpartition(".")
            W = out.get_parameter(key)
            setattr(out.get_submodule(holder), pname, nn.Parameter(W * factor))
    return out


def declared_weights(name, sv):
    """The (state_dict path, side) of each weight the vector declares it folds into."""
    holder = name.rpartition(".")[0]
    return [(".".join(filter(None, (holder, w))), side) for w, side in sv.folds_into]


def close(a, b):
    return torch.allclose(a, b, atol=2e-5, rtol=1e-4)   # float32 logits of order 1 (a moved
    # vector moves them by more than 1e-2)


# ---- the checks ---------------------------------------------------------------------------------

def check_vectors_are_exactly_one_at_init(reparam, placement):
    """Paper: "scale vectors initialised to 1", so a variant starts from the baseline's function."""
    for label, kw in models(reparam, placement):
        for name, sv in vectors(make(**kw)).items():
            assert torch.equal(sv(), torch.ones_like(sv())), f"{label}: {name} is not 1 at init"


def check_the_function_at_init_is_that_of_plain_vectors(reparam, placement):
    """g = 1 exactly, so a reparameterized model computes, bit for bit, what plain vectors compute;
    where no Norm is added (no vector declares one before it, no Norm after the maps), what the
    model without any vector flag computes."""
    idx = tokens()
    for label, kw in models(reparam, placement):
        model = make(**kw)
        logits = model(idx)[0]
        plain = make(**{**kw, "sv_reparam": "none"})(idx)[0]
        assert torch.equal(logits, plain), f"{label}: the logits at init differ from 'none'"
        norms = model_py.PLACEMENTS[placement].norm or any(
            sv.folds_into == AFTER_NORM for sv in vectors(model).values())
        if not norms:
            base = make(**{k: v for k, v in kw.items() if k not in model_py.VECTOR_FLAGS})(idx)[0]
            assert torch.equal(logits, base), f"{label}: the logits at init are not the baseline's"


def check_the_matrices_share_the_baseline_init(reparam, placement):
    """A seed fixes every weight the variants share, so variants are compared like with like."""
    for label, kw in models(reparam, placement):
        model = make(seed=3, **kw)
        base = make(seed=3, **{k: v for k, v in kw.items() if k not in model_py.VECTOR_FLAGS})
        ref, own = base.state_dict(), model.state_dict()
        for k, cls in model.param_classes().items():
            if cls in ("matrix", "embedding"):
                assert torch.equal(ref[k], own[k]), f"{label}: {k} is not the baseline's"


def every_vector_trains(model, label):
    """Every trained parameter of every scale vector moves the loss at init."""
    model(tokens(), tokens(seed=5))[1].backward()
    for name, sv in vectors(model).items():
        for pname, p in sv.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, \
                f"{label}: {name}.{pname} gets no gradient (an inert vector)"


def check_no_vector_is_inert(reparam, placement):
    for label, kw in models(reparam, placement):
        every_vector_trains(make(**kw), label)


def check_folding(reparam, placement):
    """Paper 2.2, checked on what each vector declares. A vector that says it folds does: moved
    away from 1 it moves the logits, and folded into the weights it names (by factor, not by
    model.py) it gives them back. One that says a Norm stands between folds into no weight of the
    model (every weight and side its shape fits is tried; for reparam 'none', since what a vector
    declares does not depend on how g is parameterized). fold_scale_vectors reproduces the logits,
    or is refused exactly where such a vector is (naming it) or a Norm follows the maps (DNP)."""
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
               if W.dim() > 1 and declared_class(model, k) == "matrix"]
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
                raise AssertionError(f"{label}: {n} declares a Norm after it (AFTER_NORM), but it "
                                     f"folds into {key}'s {side}")


def check_decay_groups(reparam, placement, policy):
    """The optimizer groups decay exactly what each vector's declaration and the policy's entry
    say (matrices and embeddings always), every parameter in exactly one group."""
    for label, kw in models(reparam, placement):
        model = make(**kw)
        names = {id(p): n for n, p in model.named_parameters()}
        groups = model.param_groups(0.1, policy)
        grouped = sorted(names[id(p)] for g in groups for p in g["params"])
        assert grouped == sorted(names.values()), (
            f"{label}: not every parameter in exactly one group: "
            f"{sorted(set(names.values()) ^ set(grouped)) or 'some twice'}")
        for g in groups:
            for p in g["params"]:
                name = names[id(p)]   # matrices, embeddings always; a vector if its class is listed
                want = declared_class(model, name) in ("matrix", *model_py.DECAY_POLICIES[policy])
                assert (g["weight_decay"] > 0) == want, (
                    f"{label}, sv_weight_decay={policy!r}: {name} is "
                    f"{'not ' if want else ''}meant to be decayed, its group {g['name']!r} has "
                    f"weight_decay={g['weight_decay']}")
                assert g["name"] in ("matrix", "embedding", declared_class(model, name)), (
                    f"{label}: {name} is in group {g['name']!r}, not in its declared class "
                    f"{declared_class(model, name)!r}")


def check_compiles_in_one_graph(reparam, placement):
    """compile=True must capture the whole model (fullgraph: a graph break would silently fall back
    to eager), with the eager model's loss and gradients. Dynamo's capture alone (backend "eager",
    about 1 s a model); inductor's code is held to eager by gpu_check's compile check."""
    idx, targets = tokens(), tokens(seed=5)
    for label, kw in [m for m in models(reparam, placement) if "MoE" not in m[0]][-1:]:   # all on
        model = make(**kw)
        randomize_scale_vectors(model)
        runs = []
        torch._dynamo.reset()   # each model compiles afresh (not against dynamo's recompile limit)
        for m in (model, torch.compile(model, backend="eager", fullgraph=True)):
            model.zero_grad()
            loss = m(idx, targets)[1]
            loss.backward()
            runs.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        (a, ga), (b, gb) = runs
        torch.testing.assert_close(b, a, msg=label)
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], msg=f"{label}: {n}")


def check_moe_paths_agree(reparam, placement):
    """MoE.run_experts' loop (a CPU's) and grouped GEMM (a GPU's; torch._grouped_mm runs on a CPU
    in float32 too): one loss and gradients, so a vector left out of one path is caught."""
    idx, targets = tokens(), tokens(seed=5)
    for label, kw in [m for m in models(reparam, placement) if "MoE" in m[0]]:
        model = make(**kw)
        randomize_scale_vectors(model)
        runs = []
        for impl in ("loop", "grouped"):
            for m in model.modules():
                if isinstance(m, model_py.MoE):
                    m.impl = impl
            model.zero_grad()
            loss = model(idx, targets)[1]
            loss.backward()
            runs.append((loss.detach(), {n: torch.zeros_like(p) if p.grad is None else p.grad
                                         for n, p in model.named_parameters()}))
        (a, ga), (b, gb) = runs
        torch.testing.assert_close(b, a, msg=label)
        for n in ga:   # float32 sums in another order
            torch.testing.assert_close(gb[n], ga[n], atol=1e-6, rtol=1e-4, msg=f"{label}: {n}")


def check_per_expert_vectors_declare_it(reparam, placement):
    """num_active_params counts a vector as one token's only where it declares its rows per expert
    (ScaleVector.experts): one token routed to k experts (the bias chooses them) gives a declared
    vector's rows of the other experts no gradient and its own experts' some; a vector of an MoE
    layer that declares no experts has no row block of the other experts without gradient."""
    for label, kw in [m for m in models(reparam, placement) if "MoE" in m[0]]:
        model = make(**kw)
        randomize_scale_vectors(model)
        chosen = list(range(model.config.n_experts_active))
        for m in model.modules():
            if isinstance(m, model_py.MoE):
                m.expert_bias.fill_(-10.0)
                m.expert_bias[chosen] = 10.0
        model(tokens(B=1, T=1), tokens(B=1, T=1, seed=5))[1].backward()
        E = model.config.n_experts
        for name, sv in vectors(model).items():
            layer = next((m for n, m in model.named_modules()
                          if isinstance(m, model_py.MoE) and name.startswith(n + ".")), None)
            if layer is None or sv.rows % E:
                continue
            for pname, p in sv.named_parameters():
                rows = p.grad.reshape(E, -1).abs().amax(1) > 0   # which experts got a gradient
                per_expert = bool(rows[chosen].all() and not rows[len(chosen):].any())
                assert per_expert == bool(sv.experts), (
                    f"{label}: {name}.{pname}'s rows are "
                    f"{'' if per_expert else 'not '}one per expert, but it declares experts="
                    f"{sv.experts}: num_active_params would count it wrong")


CHECKS = (check_vectors_are_exactly_one_at_init,
          check_the_function_at_init_is_that_of_plain_vectors,
          check_the_matrices_share_the_baseline_init, check_no_vector_is_inert, check_folding,
          check_compiles_in_one_graph, check_moe_paths_agree, check_per_expert_vectors_declare_it)


def check_all(reparam, placement):
    """Every generic check of one entry, as a new location gets them."""
    for check in CHECKS:
        check(reparam, placement)
    for policy in model_py.DECAY_POLICIES:
        check_decay_groups(reparam, placement, policy)


# ---- the tables drive the tests -----------------------------------------------------------------

@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__[len("check_"):])
@pytest.mark.parametrize("entry", entries(), ids="-".join)
def test_every_entry_of_the_tables(entry, check):
    check(*entry)


@pytest.mark.parametrize("policy", list(model_py.DECAY_POLICIES))
@pytest.mark.parametrize("entry", entries(), ids="-".join)
def test_the_decay_groups_follow_the_declarations_and_the_policy(entry, policy):
    check_decay_groups(*entry, policy)


# ---- no flag is inert, and every flag that adds a vector is in the one list ---------------------

def flag_configs():
    """Every combination of scale_vectors and VECTOR_FLAGS' values that GPTConfig takes (dense)."""
    flags = {"scale_vectors": (True, False), **{f: flag_values(f) for f in model_py.VECTOR_FLAGS}}
    combos = (dict(zip(flags, values)) for values in itertools.product(*flags.values()))
    return [kw for kw in combos if accepted(kw)]


def test_no_flag_is_inert():
    """A flag (or scale_vectors) off its default changes the parameters (names, shapes) or the
    function at init, in every combination GPTConfig takes, or __post_init__ must refuse it."""
    shapes, idx = {}, tokens(B=1, T=8)

    def signature(kw):
        key = tuple(sorted(kw.items()))
        if key not in shapes:
            with torch.device("meta"):
                m = model_py.GPT(model_py.GPTConfig(**{**TINY, **kw}))
            shapes[key] = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        return shapes[key]
    for kw in flag_configs():
        for flag, value in kw.items():
            base = {**kw, flag: defaults()[flag]}
            if value == defaults()[flag] or not accepted(base) or signature(kw) != signature(base):
                continue
            assert not torch.equal(make(**kw)(idx)[0], make(**base)(idx)[0]), (
                f"{flag}={value!r} changes neither the parameters nor the function of "
                f"{base}: GPTConfig must refuse it")


def test_every_vector_flag_is_listed():
    """The generic tests build their models from model.VECTOR_FLAGS: a bool field outside it (and
    scale_vectors) that adds a vector would go untested."""
    for f in fields(model_py.GPTConfig):
        if f.name in model_py.VECTOR_FLAGS or f.name == "scale_vectors" or f.type not in (
                bool, "bool"):
            continue
        flipped = {f.name: not f.default}
        if accepted(flipped):
            assert vectors(make(**flipped)).keys() == vectors(make()).keys(), (
                f"{f.name} adds or changes scale vectors: list it in model.VECTOR_FLAGS")


# ---- the README checklist, followed mechanically ------------------------------------------------

def softplus_g(p, eps):
    """g = softplus(a) / softplus(0): 1 at a = 0."""
    return F.softplus(p["a"]) / F.softplus(torch.zeros((), dtype=p["a"].dtype))


@dataclass
class HeadGateConfig(model_py.GPTConfig):
    """README "Forking", a new location, step 1: a GPTConfig field (its check: GPTConfig refuses it
    without scale vectors, since it is in model.VECTOR_FLAGS)."""
    sv_headgate: bool = False   # a learnable scalar a_h per head on attention's output, before W_o


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
            if self.INIT is not None:
                with torch.no_grad():
                    for p in self.gate.parameters():
                        p.fill_(self.INIT)
            self.proj.register_forward_pre_hook(self.gated)

    def gated(self, proj, args):
        return (args[0] * self.gate().view(-1).repeat_interleave(self.hd),)


def register_the_toy_location(monkeypatch, **toy):
    """Steps 1-4 of the README's "new location", at run time (step 5 is a config file); `toy`
    overrides HeadGateAttention's DECLARED or INIT."""
    monkeypatch.setattr(model_py, "GPTConfig", HeadGateConfig)
    monkeypatch.setitem(config_defaults.TRAIN_RULES, "sv_headgate", config_defaults.boolean)
    monkeypatch.setitem(model_py.VECTOR_FLAGS, "sv_headgate", model_py.VectorFlag((False, True)))
    monkeypatch.setattr(model_py, "Attention", type("Toy", (HeadGateAttention,), toy))


def test_the_readme_checklist_on_toy_entries(monkeypatch):
    """README "Forking: a new variant": one entry per table, registered at runtime, gets every
    generic check with no other edit, and train.py takes its name: a reparameterization "sp", a
    placement "norm2" (dnp_novec's entry: a Norm after the maps, no vector there, so folding must
    be refused by the entry, not the name), a decay policy "blocks_all" (every vector but
    g_final); and a new location (a per-head gate before W_o, one flag) gets them too."""
    # g = 1 where softplus(a) = softplus(0): a = 0
    monkeypatch.setitem(model_py.REPARAMS, "sp", model_py.Reparam(params=dict(a=("vector", 0.0)),
                                                                  g=softplus_g))
    monkeypatch.setitem(model_py.PLACEMENTS, "norm2", model_py.PLACEMENTS["dnp_novec"])
    monkeypatch.setitem(model_py.DECAY_POLICIES, "blocks_all", ("sv_input", "sv_output"))
    for reparam, placement in (("sp", "pre"), ("sp", "dnp"), ("or", "norm2")):
        check_all(reparam, placement)
    configurator.configure(dict(sv_reparam="none", sv_placement="pre", sv_weight_decay="none"),
                           ["--sv_reparam=sp", "--sv_placement=norm2",
                            "--sv_weight_decay=blocks_all"], config_defaults.TRAIN_RULES)
    register_the_toy_location(monkeypatch)
    configurator.configure({"sv_headgate": False}, ["--sv_headgate=True"],
                           config_defaults.TRAIN_RULES)
    for reparam, placement in (("none", "pre"), ("er", "dp"), ("none", "dnp")):
        check_all(reparam, placement)
    test_no_flag_is_inert()
    test_every_vector_flag_is_listed()
    assert any(".attn.gate" in n for n in vectors(make(sv_headgate=True)))


@pytest.mark.parametrize("toy, fails", [
    (dict(INIT=0.1), "is not 1 at init"),   # the gate starts at 0.1, not 1
    # said to have a Norm after it: IWD would skip it, folding refuse it
    (dict(DECLARED=AFTER_NORM), r"declares a Norm after it \(AFTER_NORM\), but it folds into "
                                r"blocks\.\d\.attn\.proj\.weight's columns"),
    # folds where it does not act: the fold drops it
    (dict(DECLARED=(("qkv.weight", "columns"),)), r"does not fold where it declares")],
    ids=["init_tenth", "declared_after_norm", "folded_elsewhere"])
def test_a_wrong_toy_location_fails_the_generic_checks(monkeypatch, toy, fails):
    """Each of three silent mistakes a fork can make, made on the toy location, fails a generic
    check with a message naming the vector."""
    register_the_toy_location(monkeypatch, **toy)
    with pytest.raises(AssertionError, match=r"blocks\.\d\.attn\.gate.* " + fails):
        check_all("none", "pre")


BUILT = r"^blocks\.0\.attn\.gate: folds_into must be AFTER_NORM or"   # refused when it is read


@pytest.mark.parametrize("declared, refused", [
    ((), BUILT), (None, BUILT), ((("proj.weight", "sideways"),), BUILT),
    # a weight the model has not, or one whose shape the vector does not fit (proj has 32 rows,
    # the gate 2 entries): folding names the vector, and the generic checks fail
    ((("prj.weight", "columns"),), r"^blocks\.0\.attn\.gate declares folds_into="),
    ((("proj.weight", "rows"),), r"^blocks\.0\.attn\.gate declares folds_into=")])
def test_a_declaration_of_no_site_or_one_the_model_cannot_fold_is_refused(monkeypatch, declared,
                                                                           refused):
    register_the_toy_location(monkeypatch, DECLARED=declared)
    with pytest.raises(ValueError, match=refused):
        make(sv_headgate=True).fold_scale_vectors()
    if refused != BUILT:
        with pytest.raises((AssertionError, KeyError, RuntimeError, AttributeError)):
            check_folding("none", "pre")


# ---- README's variants table says where each flag's vectors act, as they declare ---------------

BLOCK_OR_WEIGHT = r"^blocks[.]\d+[.]|[.]weight$"


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
        if sv.folds_into == AFTER_NORM:
            sites.add("after a Norm")
            continue
        for key, side in declared_weights(name, sv):   # blocks.0.attn.qkv.weight: `attn.qkv`
            sites.add(f"`{re.sub(BLOCK_OR_WEIGHT, '', key)}` {side}")
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


# ---- one list of named variants: configs and grids are checked against model.VARIANTS -----------

CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")
                 and variant_of(f[:-3].rsplit("_", 1)[0]))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_file_sets_the_flags_of_its_name_and_no_vector_of_it_is_inert(config):
    """Issue 37.7: a vector applied only under another flag (post_norm) got no gradient in its own
    config file (its flags, at the tiny size), while the generic check, every flag on, passed."""
    name, cfg = variant_of(config[:-3].rsplit("_", 1)[0]), train_config(f"config/{config}")
    assert flags_of(cfg) == named_flags(name), \
        f"config/{config} does not set the flags of model.VARIANTS[{name!r}]"
    keep = set(flags_of(cfg)) | {f.name for f in fields(model_py.GPTConfig)
                                 if f.name.startswith(("n_expert", "moe_", "n_shared"))}
    kw = {k: cfg[k] for k in keep if k in defaults() and k not in ("moe_hidden",)}
    kw.update(moe_dense_layers=min(kw.get("moe_dense_layers", 0), 1), moe_hidden=32)
    every_vector_trains(make(**kw), f"config/{config}")


def test_every_named_variant_builds_and_has_a_char_config_and_every_config_is_one():
    for name, flags in VARIANTS.items():
        model_py.GPTConfig(**TINY, **model_flags(flags))
        assert flags.get("sv_weight_decay", "none") in model_py.DECAY_POLICIES, name
        assert f"{name}_char.py" in CONFIGS or name.endswith(("_novec", "_noiwd")), name
    # a config named after no variant would be size-checked only (tests/test_configs.py); the
    # quick start's shakespeare_char is the baseline under another name
    others = {f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")}
    others -= {*CONFIGS, "__init__.py", "defaults.py", "variants.py"}
    assert others == {"shakespeare_char.py"}
