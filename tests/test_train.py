"""train.py end to end, as a user runs it: in subprocesses, on a tiny corpus made in tmp_path; its
schedules, a Muon run (each group's lr, decay: test_variant_tables.py's check_optimizer_groups)."""
import importlib.util
import json
import math
import os
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import torch

from helpers import (TORCHRUN, final_state, finish, last_line, metrics, records, start,
                     tiny_corpus, train)
import checkpoint
from config.variants import VARIANTS

COMMON = ["--eval_interval=5", "--lr_decay_iters=12", "--sv_hetero=True", "--sv_reparam=or",
          "--gradient_accumulation_steps=2"]   # under DDP, one micro-step per process


@pytest.fixture(scope="module")
def full_run(workdir):
    """out_full: 12 steps, checkpoints at 5, 10, 12, which a resume and DDP must repeat."""
    return train(workdir, "--out_dir=out_full", "--max_iters=12", *COMMON)


@pytest.mark.slow
def test_resume_repeats_the_run_bit_for_bit_a_requeue_trains_nothing_and_overwrite_starts_again(
        workdir, full_run):
    """out_full killed after step 7 (its checkpoint at 5, its log to 7 and a torn line): the
    resume repeats out_full, every record of metrics.jsonl (wall time aside: helpers.WALL_TIME)
    and every weight; it drops the torn line and what was logged after its checkpoint, reads its
    data renamed (the recorded vocabulary decides, not the name) and continues its wandb run; a
    requeue trains nothing, rewrites no log (a full disk would fail it) and adds no final record."""
    shutil.copytree(workdir / "data" / "tiny", workdir / "data" / "tiny_renamed")
    wandb = ["--wandb_log=True"] * bool(importlib.util.find_spec("wandb"))   # requirements-test
    offline = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}   # its files in out_dir
    out = workdir / "out_resumed"
    out.mkdir()
    shutil.copy(workdir / "out_full" / "ckpt_0000005.pt", out)
    (out / "latest").write_text("ckpt_0000005.pt")
    with open(workdir / "out_full" / "metrics.jsonl") as f:   # up to step 7, then a kill
        logged = [line for line in f if json.loads(line)["iter"] <= 7]
    (out / "metrics.jsonl").write_text("".join(logged) + '{"kind": "train", "iter": null}\n'
                                       '{"kind": "tr')   # a record without a step, a line cut
    p = train(workdir, "--out_dir=out_resumed", "--max_iters=12", "--init_from=resume", *COMMON,
              "--dataset=tiny_renamed", *wandb, env=offline)
    assert "dropped 1 line(s)" in p.stdout, p.stdout
    assert metrics(workdir, "out_resumed") == metrics(workdir, "out_full")   # bit for bit
    a, b = final_state(workdir, "out_full")["model"], final_state(workdir, "out_resumed")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    runs = {p.name.rsplit("-", 1)[-1] for p in (workdir / "out_resumed").glob("wandb/offline-*")}
    assert not wandb or runs == {final_state(workdir, "out_resumed")["wandb_id"]}, runs
    mtime = (out / "metrics.jsonl").stat().st_mtime_ns
    again = train(workdir, "--out_dir=out_resumed", "--max_iters=12", "--init_from=resume",
                  *COMMON).stdout
    assert "at iteration 12 = max_iters: nothing to train" in again, again
    assert (out / "metrics.jsonl").stat().st_mtime_ns == mtime
    assert [r["iter"] for r in records(workdir, "out_resumed", "final")] == [12]
    train(workdir, "--out_dir=out_resumed", "--overwrite=True", "--max_iters=2",
          "--eval_interval=2")
    assert sorted(os.listdir(workdir / "out_resumed")) == [
        "ckpt_0000002.pt", "latest", "lock", "metrics.jsonl", *["wandb"] * bool(wandb)]
    assert [r["iter"] for r in records(workdir, "out_resumed", "train")] == [1, 2]


@pytest.mark.slow
def test_ddp_two_processes_match_one_and_stop_before_torchrun_kills(
        workdir, full_run):
    """Two processes, one micro-step each, make out_full's step 5 of two; torchrun forwards SIGTERM
    and SIGKILLs 30 s later: they agree every step, so the save comes within a step. Refused: an
    accumulation they cannot share."""
    p = start(workdir, "--out_dir=out_ddp", "--max_iters=100000", *COMMON, launcher=TORCHRUN)
    while not (workdir / "out_ddp" / "latest").exists():   # step 5's checkpoint, complete
        assert p.poll() is None, finish(p, check=False).stderr
        time.sleep(0.05)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=90)
    stopped = final_state(workdir, "out_ddp")["iter_num"]
    assert time.time() - t0 < 25 and f"stop signal at step {stopped}" in out, out + err
    assert "terminate called" not in err and p.returncode == 1   # torchrun's own exit code
    single, ddp = (torch.load(workdir / run / "ckpt_0000005.pt", weights_only=True)["model"]
                   for run in ("out_full", "out_ddp"))
    for k in single:   # measured: equal bit for bit (default and AVX2 kernels, 1 thread)
        assert torch.allclose(single[k], ddp[k], atol=1e-5, rtol=0), k
    p = train(workdir, "--out_dir=out_ddp_bad", "--max_iters=4", "--gradient_accumulation_steps=3",
              check=False, launcher=TORCHRUN)
    assert p.returncode != 0 and ("gradient_accumulation_steps=3 counts the micro-steps of all 2 "
                                  "processes: set it to a multiple of 2") in p.stderr, p.stderr
    assert not (workdir / "out_ddp_bad").exists()


@pytest.mark.slow
def test_a_run_learns_ends_with_the_whole_val_split_logs_each_eval_and_bf16_trains_alike(workdir):
    """The final loss is over every window of the val split; a precond record follows each
    evaluation but the last; the first log line comes after step 1, with the ETA."""
    run = ["--max_iters=30", "--eval_interval=15", "--log_interval=7"]
    stdout = train(workdir, "--out_dir=out_final", *run).stdout
    assert "iter 1/30: loss" in stdout and "eta 0h00m" in stdout
    # the first step, every 7th, and the last, which is no multiple of 7
    assert [r["iter"] for r in records(workdir, "out_final", "train")] == [1, 7, 14, 21, 28, 30]
    evals = records(workdir, "out_final", "eval")
    assert [r["iter"] for r in evals] == [0, 15, 30] and evals[2]["val_loss"] < evals[0][
        "val_loss"] - 0.3, evals   # it learns
    assert "blocks.1.mlp.gate_up.g_in" in evals[2]["scale_vectors"]   # every effective vector
    assert [r["iter"] for r in records(workdir, "out_final", "precond")] == [1, 16]
    maps = records(workdir, "out_final", "precond")[-1]["maps"]
    assert set(maps) == {"blocks.0.attn.qkv", "blocks.0.mlp.gate_up", "blocks.1.attn.qkv",
                         "blocks.1.mlp.gate_up", "head"}
    final = records(workdir, "out_final", "final")[-1]
    model = checkpoint.load_model(workdir / "out_final")[2].eval()
    val = torch.from_numpy(np.fromfile(workdir / "data" / "tiny" / "val.bin",
                                       dtype=np.uint16).astype(np.int64))
    T, targets, total = 16, len(val) - 1, 0.0   # helpers.TINY_MODEL's block_size
    with torch.no_grad():
        for a in range(0, targets, T):   # every target: windows of T, the last one shorter
            b = min(a + T, targets)
            total += model(val[None, a:b], val[None, a + 1 : b + 1])[1].item() * (b - a)
    assert final["val_loss"] == pytest.approx(total / targets, rel=1e-5)   # float32, another order
    train(workdir, "--out_dir=out_bfloat16", *run, "--dtype=bfloat16")
    first, f32 = evals[0]["val_loss"], evals[2]["val_loss"]
    b16 = records(workdir, "out_bfloat16", "eval")[-1]["val_loss"]
    # within 5% of the progress made: measured 0.05% here, at most 1.6% with seeds 1-3
    assert abs(f32 - b16) < 0.05 * (first - f32), (f32, b16)


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
    for seed in (7, 8):   # one seed gives one run bit for bit: the pinned run
        train(workdir, f"--out_dir=out_seed{seed}", "--max_iters=8", "--eval_interval=8",
              f"--seed={seed}")
    assert records(workdir, "out_seed7", "eval")[-1] != records(workdir, "out_seed8", "eval")[-1]


DATA_FAULTS = {   # data/bad_<name>: data/tiny, one file changed (None: removed) -> the sentence
    "no_bin": ("val.bin", None, "val.bin is missing or empty"),
    "bad_json": ("meta.json", lambda raw, vocab: raw[:20], "meta.json is not valid JSON"),
    "torn_bin": ("train.bin", lambda raw, vocab: raw[:-1],   # a copy cut short mid-token
                 "train.bin is cut short (an odd number of bytes)"),
    # ids beyond the vocabulary after the first 500 (out_keep's run reads only those)
    "vocab": ("train.bin", lambda raw, vocab: raw[:1000] + np.full(
        len(raw) // 2 - 500, vocab, np.uint16).tobytes(), "beyond vocab_size"),
    # the same ids, other characters: no fault for a new run, but out_keep's resume is refused
    "chars": ("meta.json", lambda raw, vocab: json.dumps(
        {**json.loads(raw), "chars": json.loads(raw)["chars"][::-1]}).encode(), None)}


@pytest.fixture(scope="module")
def existing_runs(workdir):
    """DATA_FAULTS' datasets; out_keep, a run on bad_vocab's first 500 tokens, checkpoints at 2 and
    4; out_renamed, its copy, a weight of ckpt_0000004.pt renamed (as a later model.py might)."""
    for name, (file, change, _) in DATA_FAULTS.items():
        bad = workdir / "data" / f"bad_{name}"
        shutil.copytree(workdir / "data" / "tiny", bad, dirs_exist_ok=True)
        vocab = json.loads((bad / "meta.json").read_text())["vocab_size"]
        if change is None:
            os.remove(bad / file)
        else:
            (bad / file).write_bytes(change((bad / file).read_bytes(), vocab))
    train(workdir, "--out_dir=out_keep", "--max_iters=4", "--eval_interval=2",
          "--dataset=bad_vocab", "--train_tokens=500")
    runs = [workdir / "out_keep", shutil.copytree(workdir / "out_keep", workdir / "out_renamed")]
    state = torch.load(runs[0] / "ckpt_0000004.pt", weights_only=True)
    state["model"]["blocks.0.attn.qkv.g_in.gain"] = state["model"].pop("blocks.0.attn.qkv.g_in.g")
    torch.save(state, runs[1] / "ckpt_0000004.pt")
    return runs


RESUME = ["--init_from=resume", "--max_iters=6"]


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--batch_size=0"], "batch_size=0 is out of range: it must be >= 1"),   # the config first
    *[([f"--dataset=bad_{name}"], message) for name, (_, _, message) in DATA_FAULTS.items()
      if message],
    # fits train, not val: found at start, not at the first eval
    (["--block_size=5000"], "val.bin has 2000 tokens"),
    (["--train_tokens=10000000"], "train_tokens=10,000,000 but"),
    (["--out_dir=tiny.txt"], "is a file"),
    # 2 x 12 x 2^44 weights: more than any memory (and any address space) holds
    (["--n_embd=4194304"], "a model of 422,213,266,178,048 parameters (1,688,853.1 GB of float32 "
     "weights alone) does not fit in the memory of cpu: make it smaller (n_layer, n_embd)"),
    ([*RESUME, "--n_embd=64", "--sv_hetero=True", "--optimizer=muon"], "out_keep/ckpt_0000004.pt "
     "was trained with a different model or optimizer; mismatched keys (checkpoint, requested): "
     "n_embd=(32, 64), sv_hetero=(False, True), optimizer=('adamw', 'muon')"),
    ([*RESUME, "--dataset=bad_chars"], "out_keep/ckpt_0000004.pt was trained on another "
     "vocabulary than data/bad_chars/meta.json holds"),   # the same ids, other characters
    ([*RESUME, "--out_dir=out_renamed"], "checkpoint out_renamed/ckpt_0000004.pt does not fit "
     "this model (Error(s) in loading state_dict for GPT: Missing key(s) in state_dict: "
     "\"blocks.0.attn.qkv.g_in.g\""),
])
def test_bad_input_is_one_sentence_and_leaves_the_existing_runs_as_they_were(
        workdir, existing_runs, args, message):
    """Found before out_dir is touched, even with --overwrite=True (which would clear the run)."""
    snapshot = lambda: {(d.name, p.name): p.read_bytes() for d in existing_runs  # noqa: E731
                        for p in sorted(d.iterdir()) if p.name != "lock"}
    before = snapshot()
    p = train(workdir, "--max_iters=4", "--out_dir=out_keep", "--overwrite=True", *args,
              check=False)
    assert message in last_line(p), p.stderr
    assert snapshot() == before


# ---- the pinned run: what training does, against committed numbers ------------------------------
# The baseline and unified (with its weight decay) for PINNED_STEPS steps on a fixed seed: every
# step's loss and the sum of squares of each final weight (positive, so a relative tolerance means
# the same for every tensor, and one that moved is named) against tests/pinned_run.json. Any change
# to the step, the schedule, the init or the data order moves them. In float64 (--dtype=float64),
# where rounding stays far below what Adam could amplify into a visible step. Tolerance: relative
# 1e-9. Measured spread across ATEN_CPU_CAPABILITY=default|avx2|avx512 and OMP_NUM_THREADS=1|2:
# losses within 3e-16, weights within 3e-16 but for unified's Input-Norm betas (their
# gradient is rounding noise under DNP, which Adam turns into steps), within 2.3e-13; a 0.1% shrink
# of every weight after each step, the smallest change this must catch, moves them by more than
# 1e-2. Updating the numbers is a deliberate act: `python tests/test_train.py --repin` (helpers,
# imported first, puts the repository on sys.path), and say why in the commit message.
PINNED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pinned_run.json")
PINNED_STEPS = 30
PINNED_RUNS = {"baseline": [],
               "unified": [f"--{k}={v}" for k, v in VARIANTS["unified"].items()]}


def pinned_numbers(wd):
    """{run: {"losses": [...], "weights": {name: sum of squares}}}, the runs started together."""
    procs = [start(wd, f"--out_dir=out_pin_{name}", f"--max_iters={PINNED_STEPS}",
                   f"--eval_interval={PINNED_STEPS}", "--seed=7", "--dtype=float64", *args)
             for name, args in PINNED_RUNS.items()]
    for p in procs:
        finish(p)
    return {name: {"losses": [r["loss"] for r in records(wd, f"out_pin_{name}", "train")],
                   "weights": {k: v.double().pow(2).sum().item() for k, v in
                               final_state(wd, f"out_pin_{name}")["model"].items()}}
            for name in PINNED_RUNS}


def test_training_matches_the_pinned_run(workdir):
    with open(PINNED) as f:
        pinned = json.load(f)
    if pinned["torch"] != torch.__version__:
        pytest.skip(f"the pinned numbers were computed with torch {pinned['torch']}, this is "
                    f"{torch.__version__}: repin with `python tests/test_train.py --repin` if "
                    "this version is the new reference")
    got = pinned_numbers(workdir)
    for name, want in pinned["runs"].items():
        assert len(got[name]["losses"]) == PINNED_STEPS, name
        assert got[name]["losses"] == pytest.approx(want["losses"], rel=1e-9), (
            f"{name}: the losses moved")
        assert got[name]["weights"].keys() == want["weights"].keys(), f"{name}: other weights"
        for k, v in want["weights"].items():
            assert got[name]["weights"][k] == pytest.approx(v, rel=1e-9), (
                f"{name}: the final {k} moved")


if __name__ == "__main__" and sys.argv[1:] == ["--repin"]:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        runs = pinned_numbers(tiny_corpus(Path(tmp)))
    with open(PINNED, "w") as f:
        json.dump({"torch": torch.__version__, "steps": PINNED_STEPS, "runs": runs}, f, indent=1)
        f.write("\n")
    print(f"wrote {PINNED}")
