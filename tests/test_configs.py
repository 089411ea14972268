"""Every config in config/ builds, as train.py reads it: a model and the optimizers' parameter groups on the meta
device (no memory, no initialization), with the parameter counts the README states. A new config is covered
without a test edit (and fails until the README has its row)."""
import glob
import os
import re
from dataclasses import fields

import pytest
import torch

import gpu_check
import prepare_data
from conftest import ROOT
from model import GPT, GPTConfig

CONFIGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "config", "*.py")))


def vocab_size(dataset):
    """What prepare_data.py writes in the dataset's meta.json: Tiny Shakespeare's characters, or GPT-2's BPE."""
    if dataset == "shakespeare_char":
        return len(set(prepare_data.SHAKESPEARE.read_text(encoding="utf-8")))
    assert dataset in ("shakespeare", "fineweb_edu"), f"a config trains on {dataset!r}: add its vocabulary here"
    return prepare_data.EOT + 1


def readme_sizes():
    """{config file: (parameters, active parameters)} from the README's table of the configs' sizes."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    head = next(i for i, line in enumerate(lines) if line.startswith("| config | `_char`"))
    suffixes = [c.strip(" `") for c in lines[head].strip("|").split("|")[1:]]   # "_char", "_124m", ...
    sizes = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        name, *cells = [c.strip(" `") for c in line.strip("|").split("|")]
        for suffix, cell in zip(suffixes, cells):
            m = re.fullmatch(r"([\d,]+)(?: \(([\d,]+) active\))?", cell)
            if m:
                total = int(m[1].replace(",", ""))
                sizes[f"{name}{suffix}.py"] = (total, int(m[2].replace(",", "")) if m[2] else total)
    return sizes


def test_the_readme_states_a_size_for_exactly_the_configs_there_are():
    assert sorted(readme_sizes()) == CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_a_model_and_optimizer_of_the_stated_size(name):
    cfg = gpu_check.train_config(f"config/{name}")
    with torch.device("meta"):
        model = GPT(GPTConfig(**{f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"},
                              vocab_size=vocab_size(cfg["dataset"])))
    assert (model.num_params(), model.num_active_params()) == readme_sizes()[name]
    # the optimizers as train.py builds them (not fused: meta tensors have no fused kernel)
    groups = model.param_groups(cfg["weight_decay"], cfg["sv_weight_decay"], muon=cfg["optimizer"] == "muon")
    adamw = torch.optim.AdamW([g for g in groups if g["optimizer"] == "adamw"], lr=cfg["learning_rate"],
                              betas=(cfg["beta1"], cfg["beta2"]))
    muon = [torch.optim.Muon(g, lr=cfg["muon_lr"] or cfg["learning_rate"])
            for g in [[g for g in groups if g["optimizer"] == "muon"]] if g]
    optimized = [p for opt in (adamw, *muon) for group in opt.param_groups for p in group["params"]]
    assert len({id(p) for p in optimized}) == len(optimized) == len(list(model.parameters()))
    assert sum(p.numel() for p in optimized) == model.num_params()
