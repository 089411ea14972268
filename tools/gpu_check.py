"""
Check a machine with a CUDA GPU in one command (under 5 minutes on one GPU), a verdict per line.

    python -m tools.gpu_check                 # on a machine with a CUDA GPU
    python -m tools.gpu_check --device=cpu    # the same checks rehearsed on a CPU (CI runs it)

1. cuda tests:  the tests that only run on CUDA, named `*on_cuda*` (pytest -k on_cuda: the
                grouped-GEMM MoE path against the loop in bf16); a skip on CUDA is a FAIL
2. compile:     torch.compile(fullgraph=True) of the dense and the MoE model (unified's flags,
                2 layers) against eager: loss and every gradient, in float32
3. speed:       tokens/s, MFU and memory of baseline_124m and unified_124m (one GPU's
                micro-batch, bf16, compile), interleaved step by step in one process
                (bench.py --interleave), and their ratio
4. resume:      a 30-step torchrun run of unified_124m on Tiny Shakespeare in GPT-2 BPE, then
                a run resumed from its step-20 checkpoint: steps 21-30 must repeat bit for bit
5. resume moe:  the same for moe_unified_124m (grouped GEMM)

With --device=cpu the same functions run with the CPU's SETTINGS (below), in about 2 minutes on
2 busy cores, in bf16 autocast where the CPU has bf16 in hardware and in float32 where it does
not (rehearsal_dtype): compile through dynamo and AOTAutograd only (backend aot_eager, 1 layer);
speed and each resume at 2 layers 64 wide (speed without MFU, which needs a known peak, or
memory); each resume under torchrun with one process, as on a GPU, 6 steps resumed from step 4;
the CUDA tests skip and are reported as SKIP with pytest's reason. Its figures say nothing about
a GPU: the point is that the lines a GPU will run have run (a 124M model at its real width
trains and resumes on a CPU in tests/test_configs.py).

Without CUDA and without --device=cpu it says so in one line and exits 0. Exit status 1 if a
check failed; 143 if SIGTERM stopped it (its running check is ended and its work folder removed,
as after Ctrl-C). The figures of line 3 give the --tokens_per_s of `reproduce.py --dry_run` (times
the number of GPUs, for an estimate).
"""
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from config.defaults import one_of, train_config
from configurator import ConfigError, configure
from runtime import pick_device, setup_cpu
from telemetry import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository

# What each device runs: the same checks at sizes that fit it. The GPU's are one GPU's
# micro-batch. The CPU's keep every code path and shrink the rest, so that CI's rehearsal takes 2
# minutes on 2 busy cores (at the 124M models' real size it took 20): 2 layers 64 wide, one
# torchrun process as on a GPU, and compile by aot_eager: on a CPU inductor writes C++, not the
# GPU's Triton, and compiling that took 146 s for one 1-layer model on 2 busy cores (aot_eager:
# 16 s). Dynamo's whole-graph capture and the autograd graph it partitions are the GPU's; the ops
# are eager's, so the CPU's differences come out 0. Its speed line runs eager. Its dtype (None
# here) is rehearsal_dtype()'s: bf16 autocast as on a GPU where the CPU has bf16 in hardware.
SMALL = ["--n_layer=2", "--n_head=2", "--n_embd=64"]
SETTINGS = {
    "cuda": {
        "dtype": "bfloat16", "backend": "inductor",
        "compile": ["--n_layer=2", "--n_embd=256", "--n_head=4", "--block_size=256"],
        "compile_batch": 4,
        "speed": ["--compile=True", "--steps=10", "--warmup=3", "--rounds=2"],
        "resume": ["--batch_size=8", "--gradient_accumulation_steps=1", "--warmup_iters=5",
                   "--eval_interval=10", "--eval_iters=5", "--keep_checkpoints=5"],
        "nproc": 1, "iters": 30, "resume_at": 20,
    },
    "cpu": {
        "dtype": None, "backend": "aot_eager",
        "compile": ["--n_layer=1", "--n_embd=64", "--n_head=2", "--block_size=64"],
        "compile_batch": 2,
        "speed": ["--device=cpu", "--batch_size=1", "--block_size=64", "--compile=False",
                  "--steps=2", "--warmup=1", "--rounds=1", *SMALL],
        "resume": ["--device=cpu", "--batch_size=1", "--block_size=64",
                   "--gradient_accumulation_steps=2", "--warmup_iters=2", "--eval_interval=4",
                   "--eval_iters=2", "--keep_checkpoints=2", *SMALL],
        "nproc": 1, "iters": 6, "resume_at": 4,
    },
}
# every resume run: GPT-2 BPE Tiny Shakespeare, a record per step, eager (compile is line 2's),
# without the whole-split evaluation at the end (the check compares steps; on a CPU that
# evaluation of 2 x 36,059 tokens at micro-batch 1 took 10 of a 124M run's 11 minutes)
RESUME_ARGS = ["--dataset=shakespeare", "--log_interval=1", "--compile=False",
               "--final_eval=False"]


def rehearsal_dtype():
    """bf16 autocast where the CPU computes bf16 in hardware (AVX512-BF16 or AMX), as a GPU runs;
    float32 elsewhere. On an AVX2-only CPU bf16 matmuls are emulated, 3-5x slower than float32:
    one 124M step of the rehearsal took 20 s and its speed line ran past 10 minutes. (The bf16
    autocast tests in tests/ use tiny models and run on every CPU.)"""
    import torch
    native = [getattr(torch.cpu, f"_is_{k}_supported", lambda: False)()
              for k in ("avx512_bf16", "amx_tile")]
    # ATEN_CPU_CAPABILITY=avx2 keeps ATen's kernels off AVX512: its bf16 matmuls then raise
    # ("pack_vnni2 is only supported when avx512 is supported")
    wide = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return "bfloat16" if any(native) and wide else "float32"


def settings_for(device):
    """SETTINGS[device] with its dtype decided."""
    settings = dict(SETTINGS[device])
    settings["dtype"] = settings["dtype"] or rehearsal_dtype()
    return settings


def run(cmd, cwd=ROOT, timeout=600):
    """(exit status, stdout + stderr) of cmd. A stop (SIGTERM, Ctrl-C, the timeout) ends the child
    first, by SIGTERM, which torchrun passes on to its workers (SIGKILL after 30 s), so that
    nothing writes into the work folder as it is removed."""
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            p.terminate()
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    return p.returncode, out + err


def last_line(text):
    return (text.strip().splitlines() or ["(no output)"])[-1]


# ---- 1. the CUDA-only tests ------------------------------------------------------------------
# The tests that only run on CUDA are named *on_cuda*: `-k cuda` also chose 5 tests that pass
# anywhere (--device=cuda refused without CUDA...), whose passes hid a CUDA test that did not run
CUDA_TESTS = [sys.executable, "-m", "pytest", "-q", "-rs", "-k", "on_cuda", "tests"]


def check_cuda_tests(device):
    """PASS: on CUDA they ran, passed, none skipped. SKIP: on a CPU, where they skip (pytest's
    reasons said). FAIL: anything else (a failure, no such test, a skip on CUDA)."""
    rc, out = run(CUDA_TESTS)
    passed, skipped = (int((re.findall(rf"(\d+) {w}", out) or ["0"])[-1])
                       for w in ("passed", "skipped"))
    reasons = "; ".join(sorted(set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", out, re.M))))
    if rc == 0 and device != "cuda":
        return None, f"needs CUDA ({reasons or 'none skipped'}); here: {last_line(out)}"
    if rc == 0 and skipped:
        return False, f"{skipped} skipped on CUDA ({reasons}): {last_line(out)}"
    return rc == 0 and passed > 0, last_line(out)


# ---- 2. compile against eager ----------------------------------------------------------------
def compile_matches_eager(config, device, settings, rtol=1e-3):
    """(ok, detail): torch.compile(fullgraph=True, backend=settings["backend"]) of a small model of
    `config` (the sizes of settings["compile"]) against eager, in float32: the relative difference
    of the loss and of every gradient (as a norm) within rtol."""
    import torch
    from dataclasses import fields
    from model import GPT, GPTConfig
    cfg = train_config(config, tuple(settings["compile"]))
    torch.backends.cuda.matmul.allow_tf32 = False   # both sides in true float32
    # RoPE's complex product stays an eager op in the compiled graph: slower, not different
    warnings.filterwarnings("ignore", "Torchinductor does not support code generation for complex")
    torch.manual_seed(0)
    model_args = {f.name: cfg[f.name] for f in fields(GPTConfig) if f.name != "vocab_size"}
    model = GPT(GPTConfig(**model_args)).to(device)
    shape = (settings["compile_batch"], cfg["block_size"])
    x, y = (torch.randint(0, 50257, shape, device=device) for _ in range(2))
    losses, grads = [], []
    for m in (model, torch.compile(model, fullgraph=True, backend=settings["backend"])):
        model.zero_grad(set_to_none=True)
        _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    if grads[0].keys() != grads[1].keys():
        return False, f"gradients on one side only: {sorted(grads[0].keys() ^ grads[1].keys())}"
    loss_err = abs(losses[0] - losses[1]) / abs(losses[0])
    grad_err, noise = worst_gradient_diff(*grads)
    return loss_err <= rtol and grad_err <= rtol, (
        f"loss rel. diff {loss_err:.1e}, worst gradient rel. diff {grad_err:.1e} over "
        f"{len(grads[0])} tensors ({noise} zero up to rounding; limit {rtol:g})")


def worst_gradient_diff(reference, other, floor=1e-4):
    """(the worst relative difference, how many are zero up to rounding) of two {name: gradient}.
    A gradient that is zero in exact arithmetic is rounding noise on both sides (DNP's Norm after
    W makes the output blind to the magnitude of g_in: OR's beta of a g_in gets ~1e-7), so each
    difference is taken relative to the gradient's own norm or, where that is smaller, to `floor`
    times the whole gradient's norm."""
    import torch
    least = floor * torch.cat([g.flatten() for g in reference.values()]).norm()
    worst = max(((g - other[n]).norm() / torch.maximum(g.norm(), least)).item()
                for n, g in reference.items())
    return worst, sum(bool(g.norm() < least) for g in reference.values())


def check_compile(device, settings):
    results = {name: compile_matches_eager(f"config/{name}.py", device, settings)
               for name in ("unified_124m", "moe_unified_124m")}
    detail = "; ".join(f"{name}: {d}" for name, (_, d) in results.items())
    return all(ok for ok, _ in results.values()), detail


# ---- 3. speed --------------------------------------------------------------------------------
def parse_table(text):
    """bench.py's markdown table: {config: {column: cell}}."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ")]
    if len(rows) < 2:
        return {}
    return {r[0]: dict(zip(rows[0], r)) for r in rows[1:] if not set(r[0]) <= {"-"}}


def speed_figures(row):
    """A row of bench.py's table in words; MFU and memory only where it has them (on CUDA)."""
    words = [f"{row['tokens/s']} tok/s"]
    words += [f"MFU {row['MFU']}"] if row["MFU"] != "—" else []
    words += [f"step memory {row['step mem (MB)']} MB"] if row["step mem (MB)"] != "—" else []
    return ", ".join(words)


def check_speed(settings):
    rc, out = run([sys.executable, "-m", "tools.bench", "config/baseline_124m.py",
                   "--compare=config/unified_124m.py", "--interleave=True", *settings["speed"],
                   f"--dtype={settings['dtype']}"])
    table = parse_table(out)
    if rc != 0 or len(table) != 2:
        return False, f"bench.py failed: {last_line(out)}"
    base, uni = table["base"], table["config/unified_124m.py"]
    return True, (f"baseline {speed_figures(base)}; unified {speed_figures(uni)}; "
                  f"unified/baseline time per step {uni['x base']}")


# ---- 4-5. a short run, then a resume that must repeat it bit for bit -------------------------
def resume_from(src, dst, at_iter):
    """dst: an out_dir holding src's checkpoint of iteration at_iter (and its metrics), as a run
    killed right after it."""
    os.makedirs(dst, exist_ok=True)
    name = f"ckpt_{at_iter:07d}.pt"
    shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    # the metrics in full: train.py cuts what follows the checkpoint
    shutil.copy(os.path.join(src, "metrics.jsonl"), os.path.join(dst, "metrics.jsonl"))
    with open(os.path.join(dst, "latest"), "w") as f:
        f.write(name)


def records_of(run_dir):
    """{kind: [records]} of a run's metrics.jsonl, for kinds "train" and "eval"."""
    lines = read_metrics(os.path.join(run_dir, "metrics.jsonl"))[0]
    return {kind: [r for r in lines if isinstance(r, dict) and r.get("kind") == kind]
            for kind in ("train", "eval")}


def compare_after(reference, resumed, after):
    """(ok, detail): the records (records_of each run) past iteration `after` must be equal, bit
    for bit."""
    keys = {"train": ("loss", "lr", "grad_norm"), "eval": ("train_loss", "val_loss")}
    worst, n = 0.0, 0
    for kind, names in keys.items():
        a = {r["iter"]: r for r in reference[kind] if r["iter"] > after}
        b = {r["iter"]: r for r in resumed[kind] if r["iter"] > after}
        if sorted(a) != sorted(b) or not a:
            return False, (f"{kind} records past iteration {after}: reference has {sorted(a)}, "
                           f"resumed run has {sorted(b)}")
        for it in a:
            for k in names:
                worst, n = max(worst, abs(a[it][k] - b[it][k])), n + 1
    same = "bit-exact" if worst == 0 else f"differ, max |diff| {worst:.3e}"
    return worst == 0.0, f"{n} values past iteration {after}: {same}"


def check_resume(config, workdir, settings, launcher=None, extra=()):
    """A run of settings["iters"] steps of config, then a resume from its checkpoint of step
    settings["resume_at"] (launcher: torchrun with settings["nproc"] processes). The runs' folders
    are removed after: a 124M checkpoint with its optimizer state is 1.5-2 GB."""
    launcher = launcher or [sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={settings['nproc']}"]
    iters, at = settings["iters"], settings["resume_at"]
    name = os.path.basename(config).removesuffix(".py")
    ref, res = os.path.join(workdir, name, "reference"), os.path.join(workdir, name, "resumed")
    cmd = [*launcher, os.path.join(ROOT, "train.py"), os.path.join(ROOT, config), *RESUME_ARGS,
           *settings["resume"], f"--dtype={settings['dtype']}", f"--max_iters={iters}",
           f"--lr_decay_iters={iters}", *extra]
    t0 = time.time()
    try:
        rc, out = run([*cmd, f"--out_dir={ref}"], cwd=workdir)
        if rc != 0:
            return False, f"the {iters}-step run failed: {last_line(out)}"
        resume_from(ref, res, at)
        rc, out = run([*cmd, f"--out_dir={res}", "--init_from=resume"], cwd=workdir)
        if rc != 0:
            return False, f"the resumed run failed: {last_line(out)}"
        records = [records_of(d) for d in (ref, res)]
    finally:
        shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
    ok, detail = compare_after(*records, after=at)
    speed = statistics.median(r["tokens_per_s"] for r in records[0]["train"])
    return ok, (f"{detail}; final val loss {records[0]['eval'][-1]['val_loss']:.4f}; "
                f"{speed:,.0f} tok/s eager (median); {time.time() - t0:.0f} s")


def prepare_shakespeare(workdir):
    """Tiny Shakespeare in GPT-2 BPE for the resume runs, by prepare_data.py in a subprocess (no
    script imports another; its progress lines are not verdicts)."""
    out_dir = os.path.join(workdir, "data", "shakespeare")
    rc, out = run([sys.executable, "prepare_data.py", "shakespeare", "--out_dir", out_dir])
    if rc != 0:
        raise SystemExit(f"error: prepare_data.py shakespeare failed: {last_line(out)}")


def checks(workdir, device="cuda"):
    """(name, function) of every check, in order; a function returns (ok, detail), ok True,
    False, or None for a check skipped."""
    settings = settings_for(device)

    def resume(name):
        return lambda: check_resume(f"config/{name}.py", workdir, settings)

    return [("cuda tests", lambda: check_cuda_tests(device)),
            ("compile", lambda: check_compile(device, settings)),
            ("speed", lambda: check_speed(settings)),
            ("resume unified_124m", resume("unified_124m")),
            ("resume moe_unified_124m", resume("moe_unified_124m"))]


def first_line(device):
    import torch
    if device == "cuda":
        return (f"gpu_check on {torch.cuda.get_device_name()} ({torch.cuda.device_count()} GPUs), "
                f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    dtype = settings_for("cpu")["dtype"]
    return (f"gpu_check rehearsed on cpu ({os.cpu_count()} cores), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'none'}: reduced sizes, {dtype}; its figures say "
            "nothing of a GPU")


def run_checks(device):
    """Every check in order, one line each; returns the number that failed."""
    t_start, verdicts = time.time(), []
    with tempfile.TemporaryDirectory() as workdir:
        prepare_shakespeare(workdir)
        for name, check in checks(workdir, device):
            t0 = time.time()
            try:
                ok, detail = check()
            except Exception as e:   # a check that crashes is a failed check; the others still run
                ok, detail = False, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            verdicts.append({True: "PASS", False: "FAIL", None: "SKIP"}[ok])
            print(f"{verdicts[-1]}  {name} ({time.time() - t0:.0f} s): {detail}", flush=True)
    count = {v: verdicts.count(v) for v in ("PASS", "SKIP", "FAIL")}
    print(f"gpu_check: {count['PASS']} of {len(verdicts)} checks passed, {count['SKIP']} skipped, "
          f"{count['FAIL']} failed, in {(time.time() - t_start) / 60:.1f} min")
    return count["FAIL"]


class Terminated(BaseException):
    """A SIGTERM (a CI timeout, a scheduler): raised where the checks are, so that the work folder
    (4.2 GB of checkpoints on a GPU) is removed on the way out; not an Exception, which a check
    that crashes is."""


def terminated(sig, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # one stop; a second signal waits for it
    raise Terminated


# its one key, for --help
KEY_HELP = {"device": "'': check this machine's CUDA GPU (one line and exit 0 without one); cpu: "
                      "rehearse every check on the CPU at reduced sizes"}


def main(argv):
    import torch
    try:
        device = configure({"device": ""}, argv, {"device": one_of("", "cpu", "cuda")},
                           usage=__doc__, comments=lambda: KEY_HELP)["device"]
        pick_device(device)
    except ConfigError as e:   # returned: main's caller exits with it
        return e.code
    if device == "" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}): nothing to check; "
              "run it on a machine with a GPU, or rehearse it with --device=cpu")
        return 0
    device = device or "cuda"
    print(first_line(device), flush=True)
    if device == "cpu":   # the compile check runs its models in this process
        setup_cpu()
    old = signal.signal(signal.SIGTERM, terminated)
    try:
        return 1 if run_checks(device) else 0
    except Terminated:
        print("gpu_check: stopped by SIGTERM; its work folder is removed", flush=True)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
