"""bench.py runs end to end (its figures are reported, never asserted), and bf16 autocast on a CPU
trains like float32; gpu_check.py's parsing of bench.py's table (the rest of gpu_check:
test_gpu_check.py)."""
import os
import shutil
import subprocess
import sys

import pytest

from tools import bench as bench_py
from tools import gpu_check
from configurator import ConfigError
from conftest import ROOT
from helpers import ENV, records, train
from config.variants import VARIANTS
from config.defaults import DEFAULTS

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2",
        "--vocab_size=50", "--vocab_pad=1", "--device=cpu", "--steps=2", "--warmup=1"]


def bench(*args):
    p = subprocess.run([sys.executable, "-m", "tools.bench", *TINY, *args], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.slow   # a subprocess
def test_bench_prints_every_figure():
    out = bench("--dataset=none")
    for figure in ("M params", "ms/step", "tokens/s", "MFU", "peak memory", "warmup"):
        assert figure in out, out


@pytest.mark.slow   # a subprocess
def test_bench_compares_configurations_side_by_side():
    out = bench("--dataset=none", "--rounds=1", "--compare=gpt2,sv_hetero=True+sv_placement=dnp")
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["base", "gpt2",
                                                           "sv_hetero=True+sv_placement=dnp"]
    assert rows[1].split("|")[4].strip() == "1.000"   # the base's ratio to itself


@pytest.mark.slow   # a subprocess
def test_bench_interleaves_configurations_in_one_process():
    out = bench("--dataset=none", "--rounds=2", "--compare=gpt2,sv_placement=dnp",
                "--interleave=True")
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")][1:]
    assert [r[1].strip() for r in rows] == ["base", "gpt2", "sv_placement=dnp"]
    assert rows[0][4].strip() == "1.000" and all(float(r[3]) > 0 for r in rows)
    table = gpu_check.parse_table(out)   # what the GPU check reads from it
    assert (list(table) == ["base", "gpt2", "sv_placement=dnp"]
            and table["base"]["x base"] == "1.000")
    # MFU against a known peak only, memory on CUDA only
    assert table["gpt2"]["MFU"] == table["gpt2"]["step mem (MB)"] == "—"
    assert table["base"]["x base by round"] == "1.000-1.000"


def profiled_calls(capsys, argv):
    """{op: calls per step} from bench.py --profile=True's table, every op listed."""
    bench_py.profile_step(bench_py.check([*TINY, "--dataset=none", *argv]), top=10**6)
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()[2:]]
    return {r[1].strip(): float(r[3]) for r in rows}


def test_the_profile_counts_one_rsqrt_per_norm_of_a_step(capsys):
    """--profile=True counts the ops of a step: one rsqrt per Norm, forward only. At 2 layers the
    baseline has 5 (2 Input-Norms a layer and the final one); unified adds DNP's Norm of q|k|v and
    of gate|up in each layer (4) and one Norm(alpha) per OR vector (9: 4 a layer and g_final)."""
    base = profiled_calls(capsys, [])
    unified = profiled_calls(capsys, [f"--{k}={v}" for k, v in VARIANTS["unified"].items()
                                      if k != "sv_weight_decay"])   # (no optimizer groups here)
    assert base["aten::rsqrt"] == 5
    assert unified["aten::rsqrt"] == 5 + 4 + 9


def test_the_spread_is_of_the_ratios_round_by_round():
    base = [1.0, 1.0, 3.0, 2.0, 2.0, 9.0]      # 2 rounds of 3 steps: medians 1 and 2
    other = [1.5, 1.5, 1.0, 2.0, 2.2, 2.2]     # medians 1.5 and 2.2
    assert bench_py.round_spread(other, base, steps=3) == "1.100-1.500"


@pytest.mark.slow   # a subprocess
def test_bf16_autocast_on_cpu_trains_like_float32(workdir):
    for dtype in ("float32", "bfloat16"):
        train(workdir, f"--out_dir=out_{dtype}", "--max_iters=30", "--eval_interval=30",
              f"--dtype={dtype}")
    f32, b16 = (records(workdir, f"out_{d}", "eval")[-1]["val_loss"]
                for d in ("float32", "bfloat16"))
    first = records(workdir, "out_float32", "eval")[0]["val_loss"]
    assert abs(f32 - b16) < 0.05 * (first - f32), (f32, b16)   # within 5% of the progress made


def test_bench_keys_are_train_config_keys_and_ignored_ones_are_refused():
    # any config file of train.py is one of bench.py too
    assert set(DEFAULTS) <= bench_py.defaults.keys()
    assert all(bench_py.defaults[k] == v for k, v in DEFAULTS.items())
    for arg in ["--optimizer=muon", "--gradient_accumulation_steps=4", "--learning_rate=1e-3"]:
        with pytest.raises(ConfigError, match=f"does not use {arg.split('=')[0]}"):
            bench_py.refuse_ignored([arg])
    bench_py.refuse_ignored(["config/baseline_124m.py", "--batch_size=2", "--sv_hetero=True",
                             "--optimizer=adamw"])


def test_bench_reads_train_keys_as_values_not_source(tmp_path):
    """An ordinary nanoGPT-style edit, `max_iters = 5 * 1000`, in the one home of train.py's keys:
    bench.py imports the module (no script parses another's source), so it reads 5000 and its
    --help works."""
    for name in ("model.py", "configurator.py", "dataset.py", "config", "tools"):
        copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy
        copy(os.path.join(ROOT, name), tmp_path / name)
    home = (tmp_path / "config" / "defaults.py").read_text()
    assert "\nmax_iters = 5000\n" in home
    (tmp_path / "config" / "defaults.py").write_text(home.replace("\nmax_iters = 5000\n",
                                                                  "\nmax_iters = 5 * 1000\n"))
    p = subprocess.run([sys.executable, "-m", "tools.bench", "--help"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True)
    assert p.returncode == 0 and "--max_iters=5000  (int)" in p.stdout, p.stderr


# ---- issue 20, item 19: every bad input is one sentence, before any model is built --------------
@pytest.mark.parametrize("args,words", [
    (["--device=cuda"], "no CUDA device"),
    (["--n_head=3"], "multiple of n_head"),
    (["--dataset=shakespeare_chr"],
     "--dataset=shakespeare_chr has no data/shakespeare_chr/meta.json"),
    (["--compare=n_head=3", "--interleave=True"], "--compare item 'n_head=3': GPTConfig"),
    (["--compare=config/missing.py"], "--compare item 'config/missing.py': config file not found"),
    (["--dataset=bad"], "data/bad/meta.json holds no positive integer vocab_size"),
])
def test_bench_bad_input_is_one_sentence(args, words, tmp_path, monkeypatch):
    import torch
    if "--device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "bad").mkdir(parents=True)
    # a string, not an int
    (tmp_path / "data" / "bad" / "meta.json").write_text('{"vocab_size": "65"}')
    tiny = [a for a in TINY if not a.startswith("--vocab_size=")]
    with pytest.raises(ConfigError) as e:
        bench_py.check([*tiny, *args])
    assert words in str(e.value) and "\n" not in str(e.value), e.value
    # no data: say the size
    assert bench_py.check([*tiny, "--dataset=none", "--vocab_size=50"])["vocab_size"] == 50


@pytest.mark.parametrize("args, named", [
    (["--compare=gpt2"], "--compare"), (["--interleave=True"], "--interleave"),
    (["--json=True"], "--json"), (["--json=True", "--interleave=True"], "--interleave and --json")])
def test_profile_with_an_option_it_would_ignore_is_one_sentence(args, named):
    """Issue 31.10: --profile=True ignored --interleave and --json without a word (--compare was
    refused already)."""
    with pytest.raises(ConfigError) as e:
        bench_py.check([*TINY, "--dataset=none", "--profile=True", *args])
    assert str(e.value) == (f"--profile=True prints one configuration's table of ops, and {named} "
                            f"would be ignored: drop {'them' if ' and ' in named else 'it'} and "
                            "profile each configuration in turn")
    assert bench_py.check([*TINY, "--dataset=none", *args])[args[0][2:].split("=")[0]]


@pytest.mark.parametrize("arg", ["--steps=0", "--rounds=0", "--warmup=-1", "--batch_size=0",
                                 "--arch=gpt3"])
def test_bench_values_out_of_range_are_refused(arg):
    key = arg[2:].split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}=.* is out of range"):
        bench_py.configure(bench_py.defaults, [arg], bench_py.BENCH_RULES)
    assert bench_py.configure(bench_py.defaults, [], bench_py.BENCH_RULES) == bench_py.defaults
