"""Every config in config/ builds, as train.py reads it: a model and the optimizers' parameter
groups on the meta device (no memory, no initialization), with the parameter counts the README
states; a new config is covered without a test edit (and fails until the README has its row).
The 124M configs train as a node runs them (the dense one compiled; in bf16 where the CPU has
it), on a CPU, and resume."""
import functools
import glob
import math
import os
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

import checkpoint
from tools import gpu_check
import prepare_data
from conftest import ROOT
from helpers import ENV
from config.defaults import train_config
from model import GPT, GPTConfig

CONFIGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "config", "*.py"))
                 if not p.endswith(("defaults.py", "variants.py")))   # library modules


def vocab_size(dataset):
    """What prepare_data.py writes in the dataset's meta.json: Tiny Shakespeare's characters, or
    GPT-2's BPE."""
    if dataset == "shakespeare_char":
        return len(set(prepare_data.SHAKESPEARE.read_text(encoding="utf-8")))
    assert dataset in ("shakespeare", "fineweb_edu"), f"a config reads {dataset!r}: add it here"
    return prepare_data.EOT + 1


@functools.lru_cache(maxsize=None)
def design_sizes():
    """{config file: (parameters, active parameters)} from DESIGN.md's table of config sizes."""
    with open(os.path.join(ROOT, "DESIGN.md"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    head = next(i for i, line in enumerate(lines) if line.startswith("| config | `_char`"))
    suffixes = [c.strip(" `") for c in lines[head].strip("|").split("|")[1:]]   # "_char", ...
    sizes = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        name, *cells = [c.strip(" `") for c in line.strip("|").split("|")]
        for suffix, cell in zip(suffixes, cells):
            m = re.fullmatch(r"([\d,]+)(?: \(([\d,]+) active\))?", cell)
            if m:
                total, active = (int(s.replace(",", "")) if s else None for s in m.groups())
                sizes[f"{name}{suffix}.py"] = (total, active or total)
    return sizes


def test_design_states_a_size_for_exactly_the_configs_there_are():
    assert sorted(design_sizes()) == CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_a_model_and_optimizers_of_the_stated_size(name):
    cfg = train_config(f"config/{name}")
    model_args = {f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"}
    with torch.device("meta"):
        model = GPT(GPTConfig(**model_args, vocab_size=vocab_size(cfg["dataset"])))
    assert (model.num_params(), model.num_active_params()) == design_sizes()[name]
    # the optimizers as train.py builds them (not fused: meta tensors have no fused kernel)
    groups = model.param_groups(cfg["weight_decay"], cfg["sv_weight_decay"],
                                muon=cfg["optimizer"] == "muon")
    adamw = [g for g in groups if g["optimizer"] == "adamw"]
    muon = [g for g in groups if g["optimizer"] == "muon"]
    opts = [torch.optim.AdamW(adamw, lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]))]
    opts += [torch.optim.Muon(muon, lr=cfg["muon_lr"] or cfg["learning_rate"])] if muon else []
    optimized = [p for opt in opts for group in opt.param_groups for p in group["params"]]
    assert len({id(p) for p in optimized}) == len(optimized) == len(list(model.parameters()))
    assert sum(p.numel() for p in optimized) == model.num_params()


@pytest.fixture(scope="module")
def bpe_workdir(tmp_path_factory):
    """A folder with data/shakespeare: Tiny Shakespeare in GPT-2 BPE (the 124M configs' tokens)."""
    wd = tmp_path_factory.mktemp("bpe")
    prepare_data.main(["shakespeare", "--out_dir", str(wd / "data" / "shakespeare")])
    return wd


# The MoE config at 2 of its 12 layers, eager: on a CPU its experts run the loop of
# MoE.run_experts, whose split by expert (counts.tolist()) breaks the graph and recompiles on each
# new count pattern (569 s for this test's two runs at 2 layers, compiled, on 2 busy cores); a
# node runs the grouped GEMM, which does not. The compiled MoE against eager is gpu_check.py's
# line 2; its resume check runs all 12 layers eagerly, under torchrun.
@pytest.mark.slow   # 132 s on 2 busy cores: torch.compile of 12 layers on a CPU, cold cache
@pytest.mark.parametrize("name, n_layer, compiled", [("unified_124m", 12, True),
                                                      ("moe_unified_124m", 2, False)])
def test_a_124m_config_trains_on_cpu_as_a_node_runs_it_and_resumes(name, n_layer, compiled,
                                                                    bpe_workdir):
    """The config as a node runs it (768 wide, compiled, its optimizer and schedule), in bf16
    autocast where the CPU has bf16 in hardware (float32 where it is emulated, 3-5x slower: see
    gpu_check.rehearsal_dtype), with only the micro-batch, block, iteration counts, dataset (and
    the MoE's depth and compile) made small: 2 steps, a checkpoint, a resume to step 3. No
    whole-split evaluation at the end: 2 x 36,059 tokens of eager 124M forwards, 10 minutes."""
    dtype = gpu_check.rehearsal_dtype()
    config = os.path.join(ROOT, "config", f"{name}.py")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), config,
           "--dataset=shakespeare", "--batch_size=1", "--block_size=32",
           "--gradient_accumulation_steps=2", "--eval_interval=2", "--eval_iters=1",
           "--log_interval=1", "--device=cpu", f"--dtype={dtype}", f"--out_dir={name}",
           f"--n_layer={n_layer}", f"--compile={compiled}", "--final_eval=False"]
    for steps, init in ((2, "scratch"), (3, "resume")):
        p = subprocess.run([*cmd, f"--max_iters={steps}", f"--init_from={init}"], cwd=bpe_workdir,
                           env=ENV, capture_output=True, text=True, timeout=1500)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert f"on cpu in {dtype}" in p.stdout and "at iteration 2" in p.stdout, p.stdout
    state = torch.load(bpe_workdir / name / "ckpt_0000003.pt", weights_only=True)
    run = state["config"]
    shape = (run["n_layer"], run["n_embd"], run["block_size"])
    assert run["compile"] == compiled and shape == (n_layer, 768, 32)
    records, _ = checkpoint.read_metrics(bpe_workdir / name / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iter"] for r in train] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in train)
    assert [r["iter"] for r in records if r["kind"] == "eval"] == [0, 2, 3]
