"""Optimizers and learning-rate schedules of train.py, read off real runs (each group's decay,
optimizer and learning rate: tests/test_variant_tables.py's check_optimizer_groups)."""
import math

import pytest

from helpers import records, train

WARMUP, DECAY_END, LR, MIN_LR = 4, 16, 3e-3, 3e-4


def expected_lr(it, schedule, shape):
    """The schedules as the README states them, written out independently of train.py."""
    cos = (1 + math.cos(math.pi * min((it - WARMUP) / (DECAY_END - WARMUP), 1))) / 2
    p = min(max(it - 12, 0) / (DECAY_END - 12), 1)   # wsd: LR until 12 = 16 * (1 - wsd_decay_frac)
    left = {"constant": 1, "cosine": cos, "wsd": 1 - (p if shape == "linear" else math.sqrt(p))}
    return LR * (it + 1) / (WARMUP + 1) if it < WARMUP else MIN_LR + (LR - MIN_LR) * left[schedule]


@pytest.mark.slow
@pytest.mark.parametrize("schedule,shape", [("cosine", "linear"), ("wsd", "linear"),
                                            ("wsd", "1-sqrt"), ("constant", "linear")])
def test_schedule_matches_its_formula(workdir, schedule, shape):
    out = f"out_lr_{schedule}_{shape}"
    train(workdir, f"--out_dir={out}", "--max_iters=20", "--eval_interval=20",
          f"--min_lr={MIN_LR}", f"--warmup_iters={WARMUP}", f"--lr_decay_iters={DECAY_END}",
          f"--learning_rate={LR}", f"--lr_schedule={schedule}", "--wsd_decay_frac=0.25",
          f"--wsd_shape={shape}")
    lrs = [r["lr"] for r in records(workdir, out, "train")]   # record `iter` i: step i - 1's lr
    assert lrs == pytest.approx([expected_lr(it, schedule, shape) for it in range(20)], rel=1e-9)
    assert schedule != "wsd" or lrs[WARMUP:12] == [LR] * (12 - WARMUP)   # the stable phase


@pytest.mark.slow
def test_muon_run_trains_and_resumes_and_the_seed_reaches_the_run(workdir):
    muon = ["--out_dir=out_muon", "--eval_interval=10", "--optimizer=muon", "--lr_schedule=wsd"]
    train(workdir, *muon, "--max_iters=20")
    assert (e := records(workdir, "out_muon", "eval"))[-1]["val_loss"] < e[0]["val_loss"] - 0.3
    train(workdir, *muon, "--max_iters=24", "--init_from=resume")
    assert [r["iter"] for r in records(workdir, "out_muon", "train")] == list(range(1, 25))
    for seed in (7, 8):   # one seed gives one run bit for bit: test_train's pinned run
        train(workdir, f"--out_dir=out_seed{seed}", "--max_iters=8", "--eval_interval=8",
              f"--seed={seed}")
    assert records(workdir, "out_seed7", "eval")[-1] != records(workdir, "out_seed8", "eval")[-1]
