"""The properties that hold for every variant, parametrized over model.py's tables themselves
(PLACEMENTS, REPARAMS, DECAY_POLICIES, VARIANTS): a new table entry gets every test below with no
test edit, and a failure names the entry. Each `check_*` is one property; the tests call them for
every entry, and test_the_readme_checklist_on_toy_entries calls them for entries registered at
runtime, as README's "Adding a scale-vector variant" says a fork adds them."""
import itertools
import os
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F

import configurator
from tools import export_hf
import model as model_py
from helpers import (MOE, ROOT, TINY, expected_decay, make, model_flags, randomize_scale_vectors,
                     tokens)
from model import GPTConfig, ScaleVector


def widths(placement):
    """The values of sv_dnp_width a placement takes: both where a Norm follows the map."""
    return model_py.DNP_WIDTHS if model_py.PLACEMENTS[placement].norm else ("full",)


def models(reparam, placement, seed=0):
    """(label, flags) of the tiny models built for one entry of each table: dense and MoE, plain and
    HG, every width of g_out, and the Output-Norms where the placement allows them."""
    out = []
    for moe, hetero, width in itertools.product((False, True), (False, True), widths(placement)):
        kw = dict(sv_reparam=reparam, sv_placement=placement, sv_hetero=hetero, sv_dnp_width=width,
                  **(dict(MOE, moe_dense_layers=1) if moe else {}))
        if not moe:   # the Output-Norms where the placement allows them; an untied head
            kw.update(tie_embeddings=not hetero)
            if not model_py.PLACEMENTS[placement].norm:
                kw.update(qk_norm=hetero, post_norm=hetero)
        out.append((f"reparam={reparam!r} placement={placement!r} " + ", ".join(
            f"{k}={v}" for k, v in kw.items()
            if k in ("sv_hetero", "sv_dnp_width", "n_experts")), kw))
    return out


def entries():
    return [(r, p) for r in model_py.REPARAMS for p in model_py.PLACEMENTS]


def vectors(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, ScaleVector)}


# ---- the checks ---------------------------------------------------------------------------------

def check_vectors_are_exactly_one_at_init(reparam, placement):
    """Paper: "scale vectors initialised to 1", so a variant starts from the baseline's function."""
    for label, kw in models(reparam, placement):
        for name, sv in vectors(make(**kw)).items():
            assert torch.equal(sv(), torch.ones_like(sv())), f"{label}: {name} is not 1 at init"


def check_the_function_at_init_is_that_of_plain_vectors(reparam, placement):
    """g = 1 exactly, so a reparameterized model computes, bit for bit, what plain vectors compute;
    where no Norm is added (no Norm after the map, no Output-Norm), what the baseline computes."""
    idx = tokens()
    for label, kw in models(reparam, placement):
        logits = make(**kw)(idx)[0]
        plain = make(**{**kw, "sv_reparam": "none"})(idx)[0]
        assert torch.equal(logits, plain), f"{label}: the logits at init differ from 'none'"
        if not (model_py.PLACEMENTS[placement].norm or kw.get("qk_norm")):
            base = make(**{k: v for k, v in kw.items() if not k.startswith("sv_")})(idx)[0]
            assert torch.equal(logits, base), (
                f"{label}: the logits at init differ from the baseline's")


def check_the_matrices_share_the_baseline_init(reparam, placement):
    """A seed fixes every weight the variants share, so variants are compared like with like."""
    for label, kw in models(reparam, placement):
        model = make(seed=3, **kw)
        base = make(seed=3, **{k: v for k, v in kw.items()
                               if not k.startswith(("sv_", "qk", "post"))})
        ref, own = base.state_dict(), model.state_dict()
        for k, cls in model.param_classes().items():
            if cls in ("matrix", "embedding"):
                assert torch.equal(ref[k], own[k]), f"{label}: {k} is not the baseline's"


def check_no_vector_is_inert(reparam, placement):
    """Every trained parameter of every scale vector moves the loss at init."""
    for label, kw in models(reparam, placement):
        model = make(**kw)
        model(tokens(), tokens(seed=5))[1].backward()
        for name, sv in vectors(model).items():
            for pname, p in sv.named_parameters():
                assert p.grad is not None and p.grad.abs().max() > 0, \
                    f"{label}: {name}.{pname} gets no gradient (an inert vector)"


def check_folding(reparam, placement):
    """Paper 2.2: an Input-Norm vector folds into the map it meets, so the folded model reproduces
    the logits; where a Norm follows the map (PLACEMENTS' norm), folding is refused."""
    idx = tokens()
    for label, kw in models(reparam, placement):
        model = make(**{**kw, "qk_norm": False, "post_norm": False})
        if model_py.PLACEMENTS[placement].norm:
            with pytest.raises(ValueError, match="cannot fold"):
                model.fold_scale_vectors()
            continue
        randomize_scale_vectors(model)
        logits = model(idx)[0]
        assert not torch.allclose(logits, make(**kw)(idx)[0], atol=1e-3), (
            f"{label}: vectors unmoved")
        plain = model.fold_scale_vectors()
        assert not vectors(plain), label
        assert torch.allclose(plain(idx)[0], logits, atol=2e-5, rtol=1e-4), \
            f"{label}: the folded model does not reproduce the logits (a vector was dropped)"


def check_decay_groups(reparam, placement, policy):
    """The optimizer groups decay exactly what DESIGN.md's rule and the policy's entry say."""
    for label, kw in models(reparam, placement):
        model = make(**kw)
        names = {id(p): n for n, p in model.named_parameters()}
        groups = model.param_groups(0.1, policy)
        assert sorted(names[id(p)] for g in groups for p in g["params"]) == sorted(names.values())
        for g in groups:
            decayed = g["weight_decay"] > 0 or g.get("decay", 0) > 0
            for p in g["params"]:
                assert decayed == expected_decay(names[id(p)], placement, policy), \
                    f"{label}, sv_weight_decay={policy!r}: {names[id(p)]}"


def check_compiles_in_one_graph(reparam, placement):
    """compile=True must capture the whole model (fullgraph: a graph break would silently fall back
    to eager), with the eager model's loss and gradients. Dynamo's capture alone (backend "eager",
    about 1 s a model); inductor's code is held to eager by gpu_check's compile check."""
    idx, targets = tokens(), tokens(seed=5)
    for label, kw in models(reparam, placement)[2:3]:   # dense HG: the most vectors
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


def check_export_refuses_exactly_what_cannot_fold(placement):
    """export_hf refuses a placement by its entry (a Norm follows the map), in one sentence naming
    it; it takes every placement that folds."""
    cfg = GPTConfig(**TINY, sv_placement=placement)
    if model_py.PLACEMENTS[placement].norm:
        with pytest.raises(export_hf.ExportError) as e:
            export_hf.check_exportable(cfg)
        msg = str(e.value)
        assert msg.startswith(f"sv_placement={placement!r} cannot be exported") and "\n" not in msg
        assert msg.count(". ") == 0, msg   # one sentence
    else:
        export_hf.check_exportable(cfg)


# ---- the tables drive the tests -----------------------------------------------------------------

ids = lambda e: "-".join(e) if isinstance(e, tuple) else e


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_every_vector_is_exactly_one_at_init(entry):
    check_vectors_are_exactly_one_at_init(*entry)


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_the_function_at_init_is_that_of_plain_vectors(entry):
    check_the_function_at_init_is_that_of_plain_vectors(*entry)


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_the_matrices_share_the_baseline_init(entry):
    check_the_matrices_share_the_baseline_init(*entry)


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_no_vector_is_inert(entry):
    check_no_vector_is_inert(*entry)


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_folding_reproduces_the_logits_or_is_refused(entry):
    check_folding(*entry)


@pytest.mark.parametrize("policy", list(model_py.DECAY_POLICIES))
@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_the_decay_groups_follow_the_policy(entry, policy):
    check_decay_groups(*entry, policy)


@pytest.mark.parametrize("entry", entries(), ids=ids)
def test_the_model_compiles_in_one_graph(entry):
    check_compiles_in_one_graph(*entry)


@pytest.mark.parametrize("placement", list(model_py.PLACEMENTS))
def test_export_refuses_exactly_what_cannot_fold(placement):
    check_export_refuses_exactly_what_cannot_fold(placement)


@pytest.mark.parametrize("placement", list(model_py.PLACEMENTS))
def test_a_copy_of_a_placement_under_a_new_name_is_treated_as_the_original(monkeypatch, placement):
    """Export and folding read the entry, never the name: a copy of PLACEMENTS['dnp'] is refused by
    export_hf.py in one sentence, a copy of 'dp' exports."""
    monkeypatch.setitem(model_py.PLACEMENTS, "copy", model_py.PLACEMENTS[placement])
    check_export_refuses_exactly_what_cannot_fold("copy")
    check_folding("none", "copy")


# ---- the README checklist, followed mechanically ------------------------------------------------

def softplus_g(p, eps):
    """g = softplus(a) / softplus(0): 1 at a = 0."""
    return F.softplus(p["a"]) / F.softplus(torch.zeros((), dtype=p["a"].dtype))


def test_the_readme_checklist_on_toy_entries(monkeypatch):
    """README "Adding a scale-vector variant": one entry per table, registered at runtime
    (steps 1-2), gets every generic check with no other edit: a reparameterization "sp", a
    placement "dp2" (a copy of DP's entry), a decay policy "to1" that pulls every vector toward
    1."""
    monkeypatch.setitem(model_py.REPARAMS, "sp",
                        model_py.Reparam(params=dict(a=("vector", 0.0)), g=softplus_g))
    monkeypatch.setitem(model_py.PLACEMENTS, "dp2", model_py.PLACEMENTS["dp"])
    monkeypatch.setitem(model_py.DECAY_POLICIES, "to1",
                        model_py.DecayPolicy(decays=("sv_input", "sv_output"), toward=1.0))
    for reparam, placement in (("sp", "pre"), ("sp", "dnp"), ("or", "dp2"), ("sp", "dp2")):
        check_vectors_are_exactly_one_at_init(reparam, placement)
        check_the_function_at_init_is_that_of_plain_vectors(reparam, placement)
        check_the_matrices_share_the_baseline_init(reparam, placement)
        check_no_vector_is_inert(reparam, placement)
        check_folding(reparam, placement)
        check_compiles_in_one_graph(reparam, placement)
        for policy in model_py.DECAY_POLICIES:
            check_decay_groups(reparam, placement, policy)
    check_export_refuses_exactly_what_cannot_fold("dp2")
    check_pull_toward("to1")


@pytest.mark.parametrize("policy", list(model_py.DECAY_POLICIES))
def test_one_step_decays_as_the_policy_says(policy):
    check_pull_toward(policy)


def check_pull_toward(policy):
    """optimizer_step with zero gradients (Adam's update is then 0) leaves only the decay: AdamW's
    p * (1 - lr * wd) for matrices and a policy toward 0, p - lr * wd * (p - t) for one toward t."""
    lr, wd = 0.1, 0.5
    model = make(sv_placement="dnp", sv_reparam="or", qk_norm=False)
    randomize_scale_vectors(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.param_groups(wd, policy), lr=lr)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model_py.optimizer_step([opt])
    entry = model_py.DECAY_POLICIES[policy]
    for n, p in model.named_parameters():
        decayed = expected_decay(n, "dnp", policy)
        toward = entry.toward if decayed and model.param_classes()[n].startswith("sv_") else 0.0
        expected = before[n] - lr * wd * (before[n] - toward) if decayed else before[n]
        assert torch.allclose(p, expected, atol=1e-7, rtol=1e-6), (policy, n)
        assert p.grad is None, "optimizer_step ends with zero_grad"


# ---- one list of named variants: configs and grids are checked against model.VARIANTS -----------

FLAGS = ("scale_vectors", "sv_hetero", "sv_placement", "sv_reparam", "sv_dnp_width", "qk_norm",
         "post_norm", "sv_weight_decay")
DEFAULTS = {**{f.name: f.default for f in fields(GPTConfig) if f.name in FLAGS},
            "sv_weight_decay": "none"}


def variant_of(name):
    """The named variant a config file or grid row is named after: its longest '_'-prefix in
    model.VARIANTS, after a leading 'moe_' (the MoE twin)."""
    parts = name.removeprefix("moe_").split("_")
    return next(("_".join(parts[:i]) for i in range(len(parts), 0, -1)
                 if "_".join(parts[:i]) in model_py.VARIANTS), None)


def resolved_flags(config, overrides=()):
    """The variant flags a config file plus --key=value overrides give train.py."""
    values = configurator._run_file(os.path.join(ROOT, config))
    flags = {k: values.get(k, v) for k, v in DEFAULTS.items()}
    for arg in overrides:
        key, _, raw = arg[2:].partition("=")
        if key in flags:
            flags[key] = configurator._parse(key, raw, DEFAULTS[key])
    return flags


def expected_flags(name):
    return {**DEFAULTS, **model_py.VARIANTS[name]}


CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")
                 and variant_of(f[:-3].rsplit("_", 1)[0]))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_file_sets_the_flags_of_its_name(config):
    name = variant_of(config[:-3].rsplit("_", 1)[0])
    assert resolved_flags(f"config/{config}") == expected_flags(name), \
        f"config/{config} does not set the flags of model.VARIANTS[{name!r}]"


def test_every_named_variant_builds_and_has_a_char_config():
    for name, flags in model_py.VARIANTS.items():
        GPTConfig(**TINY, **model_flags(flags))
        assert flags.get("sv_weight_decay", "none") in model_py.DECAY_POLICIES, name
        assert f"{name}_char.py" in CONFIGS or name.endswith(("_novec", "_noiwd")), name


def test_a_grid_row_runs_the_flags_of_its_name():
    """A row pointing at the wrong config file would label its results silently wrong."""
    reproduce = pytest.importorskip("reproduce")
    for grid, rows in reproduce.GRIDS.items():
        for v in rows():
            name = variant_of(v.name)
            assert name is not None, (
                f"grid {grid}: row {v.name!r} is named after no model.VARIANTS entry")
            assert resolved_flags(v.config, v.overrides) == expected_flags(name), \
                f"grid {grid}: row {v.name!r} ({v.config} {' '.join(v.overrides)}) " \
                f"is not model.VARIANTS[{name!r}]"
