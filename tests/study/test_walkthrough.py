"""study/walkthrough.py as a script on a small model of data/tiny: the paper's argument, run."""
import re
import subprocess
import sys

import pytest

from helpers import ENV, ROOT


@pytest.mark.slow
def test_the_walkthrough_runs_as_a_script_and_shows_the_papers_argument(workdir, tmp_path):
    p = subprocess.run([sys.executable, "-m", "study.walkthrough", "--dataset=tiny",
                        "--max_iters=40", "--n_layer=2", "--n_embd=32", "--n_head=2",
                        "--block_size=32", f"--out_dir={tmp_path / 'walk'}"], cwd=workdir,
                       env={**ENV, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    out = p.stdout
    assert p.returncode == 0, p.stderr
    # a line every tenth of the steps: step, loss, elapsed seconds
    progress = re.findall(r"^(\w+) step (\d+)/40: loss \d+\.\d{4}, \d+ s$", out, re.M)
    assert progress == [(v, str(i)) for v in ("baseline", "unified") for i in range(4, 41, 4)], out
    assert sorted(f.name for f in (tmp_path / "walk").glob("*.png")) == [
        "folding.png", "g_per_layer.png", "loss.png", "preconditioning.png"]
    assert not (workdir / "out").exists()   # only the folder it was given
    # float32: the folded W * g rounds once, W(g * z) twice: 9.5e-7 measured at 4 x 64, logits 7.7
    diff = float(re.search(r"max \|logit difference\| (\S+) over", out).group(1))
    # float64: a difference of two close matrices; 2.8e-13 measured
    err = float(re.search(r"folded model's step, to a relative (\S+) \(", out).group(1))
    assert diff < 1e-4 and err < 1e-9 and "with g's own step, at least g_i^2: True" in out, out
    # DNP's output side has a Norm after it, so the walkthrough says why unified does not fold
    assert ("unified: cannot fold scale vectors: blocks.0.attn.qkv.g_out has a Norm, not a "
            "linear map, after it") in out, out
    assert re.search(r"unified - baseline: [-+]\d\.\d{4} val loss", out), out
