"""
Check a machine with a CUDA GPU in one command (under 5 minutes on one GPU), one verdict per line:

    python gpu_check.py

1. cuda tests:  the tests that only run on CUDA (pytest -k cuda: the grouped-GEMM MoE path against the loop in bf16)
2. compile:     torch.compile(fullgraph=True) of the dense and the MoE model (unified's flags, 2 layers)
                against eager on CUDA: loss and every gradient, in float32
3. speed:       tokens/s, MFU and memory of baseline_124m and unified_124m (bf16, compile, one GPU's micro-batch),
                interleaved step by step in one process (bench.py --interleave), and their ratio
4. resume:      a 30-step `torchrun --nproc_per_node=1` run of unified_124m on Tiny Shakespeare in GPT-2 BPE, then
                a run resumed from its step-20 checkpoint: steps 21-30 must repeat bit for bit
5. resume moe:  the same for moe_unified_124m (grouped GEMM)

Without CUDA it says so in one line and exits 0. Exit status 1 if a check failed. The figures of line 3
give the --tokens_per_s of `reproduce.py --dry_run` (times the number of GPUs, for an estimate).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
# the resume runs: the 124M models at one GPU's micro-batch, a short schedule, an evaluation every 10 steps
RESUME_ARGS = ["--dataset=shakespeare", "--batch_size=8", "--gradient_accumulation_steps=1", "--max_iters=30",
               "--lr_decay_iters=30", "--warmup_iters=5", "--eval_interval=10", "--eval_iters=5", "--log_interval=1",
               "--keep_checkpoints=5", "--compile=False"]


def run(cmd, cwd=ROOT, timeout=600):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return p.returncode, p.stdout + p.stderr


def last_line(text):
    return (text.strip().splitlines() or ["(no output)"])[-1]


# ---- 1. the CUDA-only tests ---------------------------------------------------------------------------
def check_cuda_tests():
    rc, out = run([sys.executable, "-m", "pytest", "-q", "-rs", "-k", "cuda", "tests"])
    passed = int((re.findall(r"(\d+) passed", out) or ["0"])[-1])
    return rc == 0 and passed > 0, last_line(out)


# ---- 2. compile against eager ---------------------------------------------------------------------------
def compile_matches_eager(config, device="cuda", rtol=1e-3):
    """(ok, detail): torch.compile(fullgraph=True) of a 2-layer model of `config` against eager, in float32:
    the relative difference of the loss and of every gradient (as a norm) within rtol."""
    import torch
    from dataclasses import fields
    from model import GPT, GPTConfig
    from reproduce import train_config
    cfg = train_config(config, ("--n_layer=2", "--n_embd=256", "--n_head=4", "--block_size=256"))
    torch.backends.cuda.matmul.allow_tf32 = False   # both sides in true float32
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"})).to(device)
    x, y = (torch.randint(0, 50257, (4, 256), device=device) for _ in range(2))
    losses, grads = [], []
    for m in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad(set_to_none=True)
        _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    loss_err = abs(losses[0] - losses[1]) / abs(losses[0])
    grad_err = max(((grads[0][n] - grads[1][n]).norm() / grads[0][n].norm().clamp_min(1e-12)).item() for n in grads[0])
    return loss_err <= rtol and grad_err <= rtol and grads[0].keys() == grads[1].keys(), \
        f"loss rel. diff {loss_err:.1e}, worst gradient rel. diff {grad_err:.1e} over {len(grads[0])} tensors (limit {rtol:g})"


def check_compile():
    results = {name: compile_matches_eager(f"config/{name}.py") for name in ("unified_124m", "moe_unified_124m")}
    return all(ok for ok, _ in results.values()), "; ".join(f"{n}: {d}" for n, (_, d) in results.items())


# ---- 3. speed -----------------------------------------------------------------------------------------------
def parse_table(text):
    """bench.py's markdown table: {config: {column: cell}}."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    if len(rows) < 2:
        return {}
    return {r[0]: dict(zip(rows[0], r)) for r in rows[1:] if not set(r[0]) <= {"-"}}


def check_speed():
    rc, out = run([sys.executable, "bench.py", "config/baseline_124m.py", "--compare=config/unified_124m.py",
                   "--interleave=True", "--dtype=bfloat16", "--compile=True", "--steps=10", "--warmup=3", "--rounds=2"])
    table = parse_table(out)
    if rc != 0 or len(table) != 2:
        return False, f"bench.py failed: {last_line(out)}"
    base, uni = table["base"], table["config/unified_124m.py"]
    return True, (f"baseline {base['tokens/s']} tok/s, MFU {base['MFU']}, step memory {base['step mem (MB)']} MB; "
                  f"unified {uni['tokens/s']} tok/s, MFU {uni['MFU']}, step memory {uni['step mem (MB)']} MB; "
                  f"unified/baseline time per step {uni['x base']}")


# ---- 4-5. a short run, then a resume that must repeat it bit for bit ----------------------------------------
def resume_from(src, dst, at_iter):
    """dst: an out_dir holding src's checkpoint of iteration at_iter (and its metrics), as a run killed right after it."""
    os.makedirs(dst, exist_ok=True)
    name = f"ckpt_{at_iter:07d}.pt"
    shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    shutil.copy(os.path.join(src, "metrics.jsonl"), os.path.join(dst, "metrics.jsonl"))   # train.py cuts what follows
    with open(os.path.join(dst, "latest"), "w") as f:
        f.write(name)


def compare_after(reference, resumed, after):
    """(ok, detail): the records (read_metrics of each kind) past iteration `after` must be equal, bit for bit."""
    keys = {"train": ("loss", "lr", "grad_norm"), "eval": ("train_loss", "val_loss")}
    worst, n = 0.0, 0
    for kind, names in keys.items():
        a = {r["iter"]: r for r in reference[kind] if r["iter"] > after}
        b = {r["iter"]: r for r in resumed[kind] if r["iter"] > after}
        if sorted(a) != sorted(b) or not a:
            return False, f"{kind} records past iteration {after}: reference has {sorted(a)}, resumed run has {sorted(b)}"
        for it in a:
            for k in names:
                worst, n = max(worst, abs(a[it][k] - b[it][k])), n + 1
    return worst == 0.0, f"{n} values past iteration {after}: " + ("bit-exact" if worst == 0 else f"differ, max |diff| {worst:.3e}")


def check_resume(config, workdir, launcher=None, extra=()):
    """A 30-step run of config, then a resume from its step-20 checkpoint (launcher: torchrun on one GPU)."""
    from plot_metrics import read_metrics
    launcher = launcher or [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    name = os.path.basename(config).removesuffix(".py")
    ref, res = os.path.join(workdir, name, "reference"), os.path.join(workdir, name, "resumed")
    cmd = [*launcher, os.path.join(ROOT, "train.py"), os.path.join(ROOT, config), *RESUME_ARGS, *extra]
    t0 = time.time()
    rc, out = run([*cmd, f"--out_dir={ref}"], cwd=workdir)
    if rc != 0:
        return False, f"the 30-step run failed: {last_line(out)}"
    resume_from(ref, res, 20)
    rc, out = run([*cmd, f"--out_dir={res}", "--init_from=resume"], cwd=workdir)
    if rc != 0:
        return False, f"the resumed run failed: {last_line(out)}"
    records = [{k: read_metrics(d, k) for k in ("train", "eval")} for d in (ref, res)]
    ok, detail = compare_after(*records, after=20)
    speed = [r["tokens_per_s"] for r in records[0]["train"][5:]]
    return ok, f"{detail}; final val loss {records[0]['eval'][-1]['val_loss']:.4f}; " \
               f"{sum(speed) / max(len(speed), 1):,.0f} tok/s eager; {time.time() - t0:.0f} s"


def prepare_shakespeare(workdir):
    import prepare_data
    prepare_data.main(["shakespeare", "--out_dir", os.path.join(workdir, "data", "shakespeare")])


def checks(workdir):
    """(name, function) of every check, in order."""
    return [("cuda tests", check_cuda_tests),
            ("compile", check_compile),
            ("speed", check_speed),
            ("resume unified_124m", lambda: check_resume("config/unified_124m.py", workdir)),
            ("resume moe_unified_124m", lambda: check_resume("config/moe_unified_124m.py", workdir))]


def main():
    import torch
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}): nothing to check; run it on a machine with a GPU")
        return 0
    print(f"gpu_check on {torch.cuda.get_device_name()} ({torch.cuda.device_count()} GPUs), torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    t_start, failed = time.time(), 0
    with tempfile.TemporaryDirectory() as workdir:
        prepare_shakespeare(workdir)
        for name, check in checks(workdir):
            t0 = time.time()
            try:
                ok, detail = check()
            except Exception as e:   # a check that crashes is a failed check; the others still run
                ok, detail = False, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {name} ({time.time() - t0:.0f} s): {detail}", flush=True)
    print(f"gpu_check: {len(checks(''))- failed} of {len(checks(''))} checks passed in {(time.time() - t_start) / 60:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
