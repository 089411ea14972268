"""gpu_check.py: each verdict on what its commands print (run faked), SIGTERM, the whole on CPU."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from helpers import ROOT
from tools import gpu_check


def test_the_cuda_tests_compile_and_speed_pass_only_on_what_they_should(monkeypatch):
    skip = "SKIPPED [1] tests/test_moe.py:153: the grouped GEMM needs a GPU\n"
    for device, rc, out, verdict in (
            ("cpu", 0, skip + "1 skipped", None), ("cuda", 0, "1 passed", True),
            ("cuda", 0, skip + "2 passed, 1 skipped", False),   # on CUDA a skip: a test not run
            ("cuda", 1, "1 failed", False), ("cpu", 5, "746 deselected", False)):   # 5: no test
        # -k on_cuda, not -k cuda: that also chose tests like "--device=cuda is refused"
        monkeypatch.setattr(gpu_check, "run", lambda c: (rc, out) if "on_cuda" in c else "")
        ok, detail = gpu_check.check_cuda_tests(device)
        assert ok is verdict and detail.endswith(out.splitlines()[-1])
        assert ("the grouped GEMM needs a GPU" in detail) == (skip in out)
    ref = {"w": torch.ones(100), "beta": torch.tensor([3e-7])}   # beta: 0 in exact arithmetic
    (noise, zero), (wrong, _) = (gpu_check.worst_gradient_diff(ref, {**ref, "beta": b})
                                 for b in (torch.tensor([2e-7]), torch.tensor([1e-2])))
    assert noise < 1e-3 < wrong and zero == 1   # 33% off: rounding noise against the whole gradient
    table = ("| config | tokens/s | MFU | step mem (MB) | x base |\n|---|---|---|---|---|\n"
             "| base | 100 | 41% | 9,000 | 1.000 |\n| config/unified_124m.py | 90 | — | — | 1.1 |")
    for rc, out, words in ((0, table, "baseline 100 tok/s, MFU 41%, step memory 9,000 MB; "
                            "unified 90 tok/s; unified/baseline time per step 1.1"),
                           (1, "error: bad", "bench.py failed: error: bad")):
        monkeypatch.setattr(gpu_check, "run", lambda cmd: (rc, out))
        assert gpu_check.check_speed(gpu_check.settings_for("cpu")) == (rc == 0, words)


@pytest.mark.parametrize("rc, resumed, verdict, words", [
    (0, {}, True, "8 values past iteration 4: bit-exact"),
    (0, {2: 1.0}, True, "bit-exact"),                            # before its checkpoint
    (0, {5: 2**-40}, False, "differ, max |diff| 9.095e-13"),     # 1e-12 off is a FAIL
    (0, {6: None}, False, "train records past iteration 4: reference has [5, 6], resumed run"),
    (1, {}, False, "the 6-step run failed: the last line")])
def test_resume_bit_for_bit_and_no_run_left(rc, resumed, verdict, words, tmp_path, monkeypatch):
    def train(cmd, cwd):   # train.py's records in --out_dir, the resumed run's changed
        out = next(a[10:] for a in cmd if a.startswith("--out_dir="))
        change = resumed if "--init_from=resume" in cmd else {}
        os.makedirs(out, exist_ok=True)   # the resumed run: its checkpoint is copied in
        open(os.path.join(out, "ckpt_0000004.pt"), "w").close()
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for i in (i for i in range(1, 7) if change.get(i, 0) is not None):
                f.write(json.dumps({"kind": "train", "iter": i, "lr": 1e-3, "grad_norm": 1.0,
                                    "tokens_per_s": 9, "loss": 4 / i + change.get(i, 0)}) + "\n")
            f.write(json.dumps({"kind": "eval", "iter": 6, "train_loss": 1, "val_loss": 1}))
        return rc, "a line\nthe last line"
    monkeypatch.setattr(gpu_check, "run", train)
    ok, detail = gpu_check.check_resume("config/unified_124m.py", str(tmp_path),
                                        gpu_check.settings_for("cpu"))
    assert ok is verdict and words in detail, detail
    assert os.listdir(tmp_path) == []   # a 124M run's checkpoints: 1.5-2 GB each on a GPU


def test_a_sigterm_ends_the_running_child_and_removes_the_work_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the work folder: 4.2 GB on a GPU
    monkeypatch.setattr(gpu_check, "prepare_shakespeare", lambda workdir: None)
    child = "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
    monkeypatch.setattr(gpu_check, "checks", lambda workdir, device: [   # a stop as a FAIL: 1
        ("stopped", lambda: gpu_check.run([sys.executable, "-c", child], cwd=workdir))])
    t0, pytests = time.time(), signal.getsignal(signal.SIGTERM)   # no handler: pytest would end
    assert gpu_check.main(["--device=cpu"]) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is pytests   # given back
    assert time.time() - t0 < 30 and os.listdir(tmp_path) == []   # the child ended, not waited


@pytest.mark.slow   # the whole rehearsal: 4 torchrun runs, 2 compiles; 130 s on 2 busy cores
def test_gpu_check_rehearsed_on_the_cpu_passes(capsys):
    if not torch.cuda.is_available():   # and without --device=cpu: one line, exit status 0
        assert gpu_check.main([]) == 0 and capsys.readouterr().out.count("\n") == 1
    p = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--device=cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1500)
    print(p.stdout)   # the lines a GPU will print, in CI's log
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    # bf16 autocast only where the CPU has bf16 in hardware (AVX512-BF16, AMX)
    assert f"reduced sizes, {gpu_check.rehearsal_dtype()};" in lines[0], lines[0]
    names = [name for name, _ in gpu_check.checks("w", "cuda")]   # a GPU's checks: the same
    assert [line.split(" (")[0] for line in lines[1:-1]] == ["SKIP  cuda tests"] + [
        f"PASS  {name}" for name in names[1:]] and len(names) == 5, p.stdout
    assert "grouped GEMM" in lines[1] and "MFU" not in lines[3]   # a CPU has no known peak
    assert "bit-exact" in lines[4] and "bit-exact" in lines[5] and "4 of 5" in lines[-1]
