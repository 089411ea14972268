"""gpu_check.py: its helpers, its command line, its resume check on a tiny model, and the whole of
it rehearsed on the CPU (`gpu_check.py --device=cpu`: every check but the CUDA tests)."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from tools import gpu_check
from conftest import ROOT

CHECKS = ["cuda tests", "compile", "speed", "resume unified_124m", "resume moe_unified_124m"]


def test_gpu_check_lists_its_checks_for_every_device():
    for device in gpu_check.SETTINGS:
        assert [name for name, _ in gpu_check.checks("w", device)] == CHECKS
    cuda, cpu = gpu_check.SETTINGS["cuda"], gpu_check.SETTINGS["cpu"]
    assert cuda.keys() == cpu.keys()
    assert cpu["nproc"] == 2 and 0 < cpu["resume_at"] < cpu["iters"]   # two gloo processes


@pytest.mark.parametrize("bf16, amx, dtype", [(True, False, "bfloat16"), (False, True, "bfloat16"),
                                               (False, False, "float32")])
def test_the_cpu_rehearsal_runs_bf16_only_where_the_cpu_has_it(bf16, amx, dtype, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert gpu_check.settings_for("cpu")["dtype"] == dtype
    assert gpu_check.settings_for("cuda")["dtype"] == "bfloat16"   # a GPU's is fixed
    assert gpu_check.SETTINGS["cpu"]["dtype"] is None                # the table is not changed
    assert f"reduced sizes, {dtype};" in gpu_check.first_line("cpu")


def test_gpu_check_compare_after_is_bit_exact_or_fails():
    def recs(losses, val):
        train = [{"iter": i, "loss": x, "lr": 1e-3, "grad_norm": 1.0}
                 for i, x in enumerate(losses, 1)]
        return {"train": train, "eval": [{"iter": len(losses), "train_loss": val, "val_loss": val}]}
    ref = recs([4.0, 3.5, 3.25, 3.125], 3.0)
    ok, detail = gpu_check.compare_after(ref, recs([9.0, 9.0, 3.25, 3.125], 3.0), after=2)
    assert ok and "bit-exact" in detail   # only what follows iteration 2 counts
    ok, detail = gpu_check.compare_after(ref, recs([4.0, 3.5, 3.25, 3.125 + 2**-40], 3.0), after=2)
    assert not ok and "differ" in detail
    ok, detail = gpu_check.compare_after(ref, recs([4.0, 3.5, 3.25], 3.0), after=2)   # one missing
    assert not ok and "records" in detail


def test_a_gradient_zero_up_to_rounding_is_compared_against_the_whole_gradient():
    g = torch.Generator().manual_seed(0)
    ref = {"w": torch.randn(100, generator=g), "beta": torch.tensor([3e-7])}
    noisy = {"w": ref["w"] * (1 + 1e-6), "beta": torch.tensor([2e-7])}   # beta: 33% off, noise
    worst, zero = gpu_check.worst_gradient_diff(ref, noisy)
    assert worst < 1e-3 and zero == 1
    wrong = {"w": ref["w"] * (1 + 1e-6), "beta": torch.tensor([1e-2])}   # a gradient out of nothing
    assert gpu_check.worst_gradient_diff(ref, wrong)[0] > 1e-3
    off = {"w": ref["w"] * 1.01, "beta": ref["beta"]}                    # 1% off a real gradient
    assert gpu_check.worst_gradient_diff(ref, off)[0] == pytest.approx(1e-2, rel=1e-3)


def test_speed_figures_leave_out_what_bench_does_not_measure():
    cpu = {"tokens/s": "17", "MFU": "—", "step mem (MB)": "—"}
    assert gpu_check.speed_figures(cpu) == "17 tok/s"
    gpu = {"tokens/s": "170,000", "MFU": "41.0%", "step mem (MB)": "9,000"}
    assert gpu_check.speed_figures(gpu) == "170,000 tok/s, MFU 41.0%, step memory 9,000 MB"


@pytest.mark.parametrize("argv, message", [(["--device=cuda"], "no CUDA device torch can use"),
                                           (["--device=mps"], "device='mps' is out of range"),
                                           (["--devcie=cpu"], "did you mean 'device'")])
def test_a_bad_command_line_is_one_sentence(argv, message):
    if argv == ["--device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    error = gpu_check.main(argv)
    assert error.startswith("error: ") and message in error and "\n" not in error


@pytest.mark.slow   # a subprocess
def test_gpu_check_without_cuda_says_so_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check itself runs here")
    p = subprocess.run([sys.executable, "-m", "tools.gpu_check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and p.stdout.count("\n") == 1
    assert "no CUDA device" in p.stdout and "--device=cpu" in p.stdout


@pytest.mark.slow
def test_gpu_check_resume_check_on_cpu(workdir, monkeypatch):
    """The resume check's own logic (a run, its checkpoint copied, a resumed run, the comparison),
    with the CPU's schedule, on a tiny model in one process."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # a tiny model: more threads only wait
    tiny = ["--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
            "--batch_size=4", "--gradient_accumulation_steps=1", "--vocab_pad=1", "--eval_iters=2"]
    ok, detail = gpu_check.check_resume("config/baseline_char.py", str(workdir),
                                        gpu_check.settings_for("cpu"), [sys.executable], tiny)
    assert ok and "bit-exact" in detail, detail
    assert not (workdir / "baseline_char").exists()   # its checkpoints are removed after


@pytest.mark.slow   # ~6 CPU-minutes: two compiles, two 124M models, four torchrun runs
def test_gpu_check_rehearsed_on_the_cpu_passes():
    p = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--device=cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1500)
    print(p.stdout)   # the lines a GPU will print, in CI's log
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("gpu_check rehearsed on cpu")
    assert f"torch {torch.__version__}" in lines[0]
    verdicts = [line.split(" (")[0].split("  ") for line in lines[1:-1]]
    assert verdicts == [["SKIP", "cuda tests"]] + [["PASS", name] for name in CHECKS[1:]], p.stdout
    assert "MFU" not in lines[3] and "bit-exact" in lines[4] and "bit-exact" in lines[5]
    assert lines[-1].startswith("gpu_check: 4 of 5 checks passed, 1 skipped, 0 failed")


class Guard(BaseException):
    """What this test's own SIGTERM handler raises where gpu_check installs none."""


def test_a_sigterm_removes_the_work_folder_and_exits_143(tmp_path, monkeypatch, capsys):
    """Issue 31.5: gpu_check ended by SIGTERM (a CI timeout, a scheduler) left its work folder (4.2
    GB on a GPU) in the system temp folder. Now the check running stops, the folder goes, and the
    exit status is 143; the next checks do not run."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(gpu_check, "first_line", lambda device: "gpu_check rehearsed")
    monkeypatch.setattr(gpu_check, "prepare_shakespeare",
                        lambda workdir: open(os.path.join(workdir, "train.bin"), "w").close())

    def stopped():
        assert len(os.listdir(tmp_path)) == 1   # the work folder
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)   # the signal arrives here
        return True, "not reached"
    monkeypatch.setattr(gpu_check, "checks", lambda workdir, device: [
        ("stopped", stopped), ("next", lambda: pytest.fail("a check after the stop ran"))])
    old = signal.signal(signal.SIGTERM, lambda sig, frame: (_ for _ in ()).throw(Guard()))
    try:
        assert gpu_check.main(["--device=cpu"]) == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN   # given back
    finally:
        signal.signal(signal.SIGTERM, old)
    assert os.listdir(tmp_path) == []
    assert capsys.readouterr().out.splitlines()[-1] == ("gpu_check: stopped by SIGTERM; its work "
                                                        "folder is removed")


@pytest.mark.slow   # gpu_check in a subprocess, stopped during its first check (a pytest child)
def test_gpu_check_stopped_by_sigterm_leaves_nothing_in_the_temp_folder(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "tools.gpu_check", "--device=cpu"], cwd=ROOT,
                         env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    # Tiny Shakespeare is prepared: the first check (a pytest run in a child) has started
    while time.time() < deadline and not list(tmp_path.glob("*/data/shakespeare/val.bin")):
        time.sleep(0.1)
    assert list(tmp_path.glob("*/data/shakespeare/val.bin")), "the work folder never appeared"
    time.sleep(1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in out, out
    assert out.splitlines()[-1] == "gpu_check: stopped by SIGTERM; its work folder is removed"
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
