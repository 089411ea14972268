"""Optimizers and learning-rate schedules of train.py, read off real runs."""
import math

import pytest
import torch

import model as model_py
from model import GPT, GPTConfig
from helpers import TINY, records, train

WARMUP, DECAY_END, LR, MIN_LR = 4, 16, 3e-3, 3e-4


def expected_lr(it, schedule, frac=0.25, shape="linear"):
    """The schedules as the README states them, written out independently of train.py."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if schedule == "constant":
        return LR
    if schedule == "cosine":
        p = min((it - WARMUP) / (DECAY_END - WARMUP), 1)
        return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * p)) / 2
    start = DECAY_END * (1 - frac)   # wsd: stable at LR until the decay starts
    p = min(max(it - start, 0) / (DECAY_END - start), 1)
    return MIN_LR + (LR - MIN_LR) * (1 - (p if shape == "linear" else math.sqrt(p)))


@pytest.mark.slow
@pytest.mark.parametrize("schedule,shape", [("cosine", "linear"), ("wsd", "linear"),
                                            ("wsd", "1-sqrt"), ("constant", "linear")])
def test_schedule_matches_its_formula(workdir, schedule, shape):
    out = f"out_lr_{schedule}_{shape}"
    train(workdir, f"--out_dir={out}", "--max_iters=20", "--eval_interval=20",
          f"--warmup_iters={WARMUP}", f"--lr_decay_iters={DECAY_END}", f"--learning_rate={LR}",
          f"--min_lr={MIN_LR}", f"--lr_schedule={schedule}", "--wsd_decay_frac=0.25",
          f"--wsd_shape={shape}")
    # record `iter` i logs the lr of step i - 1
    lrs = [r["lr"] for r in records(workdir, out, "train")]
    assert lrs == pytest.approx([expected_lr(it, schedule, 0.25, shape) for it in range(20)],
                                rel=1e-9)
    if schedule == "wsd":
        assert lrs[WARMUP:12] == [LR] * (12 - WARMUP)   # the stable phase


@pytest.mark.parametrize("kw", [{}, dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or",
                                         tie_embeddings=False)])
def test_muon_takes_exactly_the_hidden_matrices(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **kw}))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = model.param_groups(0.1, "iwd", muon=True)
    muon = sorted(names[id(p)] for g in groups if g["optimizer"] == "muon" for p in g["params"])
    adamw = sorted(names[id(p)] for g in groups if g["optimizer"] == "adamw" for p in g["params"])
    hidden = sorted(n for n in names.values()
                    if n.endswith(("qkv.weight", "proj.weight", "gate_up.weight", "down.weight")))
    assert muon == hidden and all(model.get_parameter(n).dim() == 2 for n in muon)
    # the union is every parameter, each once
    assert sorted(muon + adamw) == sorted(names.values())


@pytest.mark.parametrize("policy", ["none", "iwd", "iwd_blocks", "all"])
def test_sv_decay_sets_the_vectors_decay_apart_from_the_matrices(policy):
    """--sv_decay (issue 33): the decayed vectors get it, matrices and embeddings keep
    weight_decay; iwd_blocks spares g_final, the class sv_final."""
    model = GPT(GPTConfig(**TINY, qk_norm=True, post_norm=True))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = model_py.DECAY_POLICIES[policy]
    for g in model.param_groups(0.1, policy, sv_decay=1.0):
        want = 0.1 if g["name"] in ("matrix", "embedding") else 1.0 if g["name"] in decayed else 0
        assert g["weight_decay"] == want, (policy, g["name"])
        if g["name"] == "sv_final":
            assert [names[id(p)] for p in g["params"]] == ["g_final.g"]
    assert ("sv_final" in decayed) == (policy in ("iwd", "all"))


@pytest.mark.slow
def test_muon_run_trains_and_resumes(workdir):
    train(workdir, "--out_dir=out_muon", "--max_iters=20", "--eval_interval=10",
          "--optimizer=muon", "--lr_schedule=wsd")
    evals = records(workdir, "out_muon", "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3
    train(workdir, "--out_dir=out_muon", "--max_iters=24", "--eval_interval=10",
          "--optimizer=muon", "--lr_schedule=wsd", "--init_from=resume")
    assert [r["iter"] for r in records(workdir, "out_muon", "train")] == list(range(1, 25))


@pytest.mark.slow
def test_the_same_seed_gives_the_same_final_loss(workdir):
    finals = []
    for out, seed in (("out_seed_a", 7), ("out_seed_b", 7), ("out_seed_c", 8)):
        train(workdir, f"--out_dir={out}", "--max_iters=8", "--eval_interval=8", f"--seed={seed}")
        finals.append(records(workdir, out, "eval")[-1]["val_loss"])
    assert finals[0] == finals[1] and finals[0] != finals[2]
