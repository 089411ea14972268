"""Every config builds, as train.py reads it, a model of its size below (a new config fails until it
has its row; its optimizer groups: test_variant_tables.py's check_optimizer_groups, on every flag
and optimizer); the 124M configs train as a node runs them, and resume."""
import math
import os
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

import prepare_data
from config.defaults import train_config
from helpers import ENV, ROOT, records
from model import GPT, GPTConfig

CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py")
                 and f not in ("__init__.py", "defaults.py", "variants.py"))   # library modules
# The parameters of each config as train.py counts them (and, for an MoE, those one token uses):
# _char is 4 x 128 on Tiny Shakespeare's 65 characters, _124m 12 x 768 and _350m 24 x 1024 on
# GPT-2's 50,257 tokens (50,304 rows), embeddings tied.
SIZES = {
    "shakespeare_char": 812_288, "baseline_char": 812_288, "baseline_124m": 123_587_328,
    "baseline_350m": 355_124_224, "noscale_char": 811_136, "noscale_124m": 123_568_128,
    "iwd_char": 812_288, "iwd_124m": 123_587_328, "iwd_blocks_char": 812_288,
    "hetero_char": 813_824, "hetero_124m": 123_614_976, "dp_char": 816_640,
    "dp_124m": 123_664_128, "dnp_char": 816_640, "dnp_124m": 123_664_128,
    "dnp_head_char": 812_680, "or_char": 812_297, "or_124m": 123_587_353, "er_char": 812_297,
    "er_124m": 123_587_353, "unified_char": 818_217, "unified_124m": 123_691_897,
    "unified_350m": 355_404_017, "unified_head_char": 814_249, **{
        f"gemma_{p}_char": 813_568 for p in ("none", "iwd", "all", "iwd_blocks", "owd")}, **{
        f"gemma_{p}_124m": 123_607_296 for p in ("none", "iwd", "all")},
    "moe_baseline_char": (1_256_704, 863_488), "moe_baseline_124m": (162_589_440, 98_888_448),
    "moe_unified_char": (1_269_613, 872_269), "moe_unified_124m": (162_884_869, 99_017_701)}
# the vocab_size prepare_data.py writes in each dataset's meta.json a config reads
VOCAB = {"shakespeare_char": len(set(prepare_data.SHAKESPEARE.read_text(encoding="utf-8"))),
         "shakespeare": prepare_data.EOT + 1, "fineweb_edu": prepare_data.EOT + 1}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_a_model_and_optimizers_of_its_size(name):
    assert name in SIZES, (f"config/{name}.py has no size: add \"{name}\": its parameters (as "
                           "train.py prints them) to SIZES in tests/test_configs.py")
    assert set(SIZES) <= set(CONFIGS), (f"SIZES names {sorted(set(SIZES) - set(CONFIGS))}, which "
                                        "are no config files: remove them from SIZES")
    cfg = train_config(f"config/{name}.py")
    model_args = {f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"}
    with torch.device("meta"):
        model = GPT(GPTConfig(**model_args, vocab_size=VOCAB[cfg["dataset"]]))
    size = SIZES[name] if isinstance(SIZES[name], tuple) else (SIZES[name],) * 2
    assert (model.num_params(), model.num_active_params()) == size


@pytest.fixture(scope="module")
def bpe_workdir(tmp_path_factory):
    """A folder with data/shakespeare: Tiny Shakespeare in GPT-2 BPE (the 124M configs' tokens)."""
    wd = tmp_path_factory.mktemp("bpe")
    prepare_data.main(["shakespeare", "--out_dir", str(wd / "data" / "shakespeare")])
    return wd


# Both at 2 of their 12 layers (all 12 are built and sized on the meta device above): inductor's
# cold compile of 12 took 188 s of a 13-minute suite on 2 idle cores. The MoE eager: on a CPU its
# experts run MoE.run_experts' loop, whose split by expert recompiles on each new count pattern
# (569 s for the two runs, compiled, on 2 busy cores); the compiled MoE is gpu_check.py's line 2.
@pytest.mark.slow
@pytest.mark.parametrize("name, compiled", [("unified_124m", True), ("moe_unified_124m", False)])
def test_a_124m_config_trains_on_cpu_as_a_node_runs_it_and_resumes(name, compiled, bpe_workdir):
    """768 wide, its optimizer and schedule, in the dtype train.py picks on a CPU (float32; bf16:
    test_train.py); micro-batch, block, steps, dataset, depth made small: 2 steps, a checkpoint, a
    resume to step 3. No whole-split evaluation at the end (2 x 36,059 tokens of 124M: 10 min)."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, f"config/{name}.py"),
           "--dataset=shakespeare", "--batch_size=1", "--block_size=32",
           "--gradient_accumulation_steps=2", "--eval_interval=2", "--eval_iters=1",
           "--log_interval=1", "--device=cpu", f"--out_dir={name}",
           "--n_layer=2", f"--compile={compiled}", "--final_eval=False"]
    # inductor's cache of its own: torch 2.13 loads kernels compiled under
    # ATEN_CPU_CAPABILITY=avx2 into an AVX512 process, whose heap then breaks (free(): invalid
    # pointer), so a run of the suite under avx2 crashed the next one
    env = {**ENV, "TORCHINDUCTOR_CACHE_DIR": str(bpe_workdir / "inductor")}
    for steps, init in ((2, "scratch"), (3, "resume")):
        p = subprocess.run([*cmd, f"--max_iters={steps}", f"--init_from={init}"], cwd=bpe_workdir,
                           env=env, capture_output=True, text=True, timeout=1500)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert ") in float32;" in p.stdout and "at iteration 2" in p.stdout, p.stdout
    run = torch.load(bpe_workdir / name / "ckpt_0000003.pt", weights_only=True)["config"]
    shape = (run["compile"], run["n_layer"], run["n_embd"], run["block_size"])
    assert shape == (compiled, 2, 768, 32)
    train = records(bpe_workdir, name, "train")
    assert [r["iter"] for r in train] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in train)
    assert [r["iter"] for r in records(bpe_workdir, name, "eval")] == [0, 2, 3]
