r"""
Speed and memory of a training step, for a config of train.py; side by side for several.

    python -m tools.bench config/shakespeare_char.py   # ms/step, tokens/s, MFU, peak memory
    python -m tools.bench config/shakespeare_char.py --dtype=bfloat16 --compile=True
    python -m tools.bench config/baseline_124m.py --batch_size=1 --device=cpu \
        --compare=config/unified_124m.py,config/noscale_124m.py
    # against a GPT-2 (nanoGPT) block of the same sizes
    python -m tools.bench config/shakespeare_char.py --compare=gpt2
    # overrides joined by +
    python -m tools.bench config/shakespeare_char.py --compare=dtype=bfloat16,compile=True
    python -m tools.bench config/baseline_124m.py --device=cpu --compare=config/unified_124m.py \
        --interleave=True
    # a sample of 300 tokens (sample.py's loop) instead of a training step; two cores kept busy
    python -m tools.bench config/shakespeare_char.py --sample=300 --steps=3 --busy=2
    # study/BENCHMARKS.md's threads table: the default threads against one, idle and busy
    python -m tools.bench config/shakespeare_char.py --threads_table=True

A step is forward, backward, gradient clipping and an AdamW step on random tokens (no data
needed); AdamW is fused where train.py fuses it (CUDA, CPU), and for the gpt2 reference where
nanoGPT does (CUDA). With --compare, every configuration runs in its own fresh process (so peak
memory is its own), `rounds` times in alternation, and the table gives medians and their ratios to
the first configuration: these machines are noisy, so compare within one run. --interleave=True
runs them all in one process instead, one step of each in turn: the steadiest time ratio, no memory.
Its keys are train.py's config keys (and a few of its own, below); a train.py key it does not use
(--optimizer, --gradient_accumulation_steps, --learning_rate...) is refused on the command line.
Peak memory is the CUDA allocator's peak, or on a CPU the process's peak resident size
(which includes PyTorch itself: compare differences, not ratios, for small models).
--busy=N starts N processes that spin on the cores (a busy machine) and stops them at the end.
--threads_table=True times a training step and a sample (--sample, 300 tokens if 0; 3 samples after
1 unmeasured) at --cpu_threads (0: the idle cores) and at --cpu_threads=1, first on the machine as
it is, then with --busy spinning (2 if 0), `rounds` alternating pairs each in fresh processes.
"""
import contextlib
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import textwrap
import time
from contextlib import nullcontext
from dataclasses import fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from config.defaults import DEFAULTS, TRAIN_RULES, at_least, boolean, help_comments, one_of
from configurator import ConfigError, configure
from dataset import load_meta
from model import GPT, GPTConfig
from runtime import pick_device, setup_cpu
from telemetry import peak_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
# a compared configuration runs as `python -m tools.bench` in the caller's folder (its data/)
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
    ROOT, os.environ.get("PYTHONPATH"))))}


# bench.py's own keys: {key: (default, what it is)}, for --help too
OWN = {
    "vocab_size": (GPTConfig.vocab_size, "the vocabulary to time where data/<dataset>/meta.json "
                   "is missing (a prepared dataset's own wins)"),
    "steps": (20, "measured steps: their median is reported"),
    "warmup": (5, "unmeasured steps first (compile, caches)"),
    "compare": ("", "comma-separated configurations to time beside the base: config files, "
                "gpt2 (a nanoGPT GPT-2 of the same sizes), or key=value[+key=value]"),
    "rounds": (3, "alternations of the compared configurations (medians over them)"),
    "interleave": (False, "--compare in one process, one step of each in turn: the steadiest "
                   "time ratio, no memory"),
    "arch": ("llama", "gpt2: time a GPT-2 (nanoGPT) model of the same sizes instead of ours"),
    "json": (False, "print one JSON line of figures (what --compare reads from its children)"),
    "sample": (0, "N > 0: time a sample of N tokens (sample.py's generation) instead of a step"),
    "busy": (0, "N processes spinning on the cores while it measures (a busy machine)"),
    "threads_table": (False, "the default threads against one, idle and busy, a step and a sample "
                      "(study/BENCHMARKS.md)"),
}
# train.py's keys (config/defaults.py, so any config file of train.py is one here too), then
# bench.py's own
defaults = {**DEFAULTS, **{k: v for k, (v, _) in OWN.items()}}


# train.py keys that a benchmark step uses; it times one micro-step of fused AdamW on random tokens,
# so the others (optimizer, gradient_accumulation_steps, learning rate, schedule...) would be
# silently ignored
HONOURED = {f.name for f in fields(GPTConfig)} | {"batch_size", "device", "dtype", "compile",
                                                  "dataset", "mfu_peak_flops", "cpu_threads"}


# the values a benchmark accepts: train.py's rules for the keys it uses, and its own
BENCH_RULES = {**{k: v for k, v in TRAIN_RULES.items() if k in HONOURED},
               "vocab_size": at_least(1), "steps": at_least(1), "warmup": at_least(0),
               "rounds": at_least(1), "arch": one_of("llama", "gpt2"),
               "compare": (lambda v: True, "'' (none), or items joined by commas"),
               "interleave": boolean, "json": boolean, "sample": at_least(0),
               "busy": at_least(0), "threads_table": boolean}


def show_help(argv):
    """--help: the usage, then the keys a step uses, each described with the values it allows;
    the train.py keys it ignores in one line (a config file may set them, a --key may not)."""
    used = {k: v for k, v in defaults.items() if k in HONOURED or k in OWN}
    ignored = ", ".join(k for k in defaults if k not in used)
    usage = __doc__.strip("\n") + "\n\n" + textwrap.fill(
        f"train.py keys it does not use (a config file may set them; on the command line they "
        f"are refused): {ignored}", 99)
    configure(used, argv, BENCH_RULES, usage=usage,
              comments=lambda: {**help_comments(), **{k: why for k, (_, why) in OWN.items()}})


def refuse_ignored(argv):
    """A --key=value of train.py that bench.py does not use is an error (in a config file it is
    expected)."""
    train_keys = set(DEFAULTS) - HONOURED
    for arg in argv:
        key, _, value = arg[2:].partition("=")
        if arg.startswith("--") and key in train_keys and value != str(defaults[key]):
            raise ConfigError(f"bench.py does not use --{key} (it times one micro-step of AdamW "
                              "on random tokens): drop it, or measure a real run with train.py")


class GPT2Block(nn.Module):
    """A GPT-2 block as nanoGPT has it (LayerNorm without bias, 4x GELU MLP), a speed reference."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head, self.ln1, self.ln2 = (n_head, nn.LayerNorm(d, bias=False),
                                           nn.LayerNorm(d, bias=False))
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True)
                          .transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte, self.wpe = (nn.Embedding(c.padded_vocab, c.n_embd),
                              nn.Embedding(c.block_size, c.n_embd))
        self.blocks = nn.ModuleList(GPT2Block(c.n_embd, c.n_head) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def flops_per_token(self):
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * len(self.blocks) * self.wte.weight.size(1) * self.wpe.weight.size(0)


def model_config(cfg, argv=()):
    """The GPTConfig to time, its vocabulary from data/<dataset>/meta.json (else --vocab_size).
    A --dataset named in argv must exist unless --vocab_size is given too: a misspelled name is
    no silent GPT-2 vocabulary."""
    meta_path = os.path.join("data", cfg["dataset"], "meta.json")
    given = {a[2:].partition("=")[0] for a in argv if a.startswith("--")}
    if os.path.exists(meta_path):   # a torn or odd one: load_meta exits with one sentence
        vocab = load_meta(os.path.dirname(meta_path))["vocab_size"]
    elif "dataset" in given and "vocab_size" not in given:
        raise ConfigError(f"--dataset={cfg['dataset']} has no {meta_path}: check the name, "
                          "prepare it with prepare_data.py, or give --vocab_size=N to time the "
                          "model without data")
    else:
        vocab = cfg["vocab_size"]
        # a config's own dataset, not prepared: say what is timed
        if argv and "vocab_size" not in given:
            print(f"note: {meta_path} not found: timing vocab_size={vocab} (prepare the dataset, "
                  "or give --vocab_size)", file=sys.stderr)
    try:
        return GPTConfig(**{**{f.name: cfg[f.name] for f in fields(GPTConfig)},
                            "vocab_size": vocab})
    except ValueError as e:   # a shape or flag the model refuses (n_embd % n_head, ...)
        raise ConfigError(str(e)) from None


def build(cfg):
    """The configured model and a function that runs one training step on it (synchronized)."""
    device = pick_device(cfg["device"])
    dtype = cfg["dtype"] or ("bfloat16" if device.startswith("cuda") else "float32")
    gcfg = model_config(cfg)
    vocab = gcfg.vocab_size
    if device == "cpu":   # as train.py
        setup_cpu(cfg["cpu_threads"])
    torch.manual_seed(0)
    model = (GPT2(gcfg) if cfg["arch"] == "gpt2" else GPT(gcfg)).to(device)
    if dtype == "float64":   # as train.py: a reference run
        model.double()
    # as train.py: the fused AdamW on CUDA and CPU; the reference as nanoGPT: fused on CUDA only
    fused = device.startswith("cuda") or (device == "cpu" and cfg["arch"] != "gpt2")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    step_model = torch.compile(model) if cfg["compile"] else model
    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
                if dtype == "bfloat16" else nullcontext())
    B, T = cfg["batch_size"], cfg["block_size"]
    x, y = (torch.randint(0, vocab, (B, T), device=device) for _ in range(2))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if cfg["sample"]:   # as sample.py: a token at a time after a one-token prompt
        model.eval()

        def sample():
            for _ in model.generate_tokens(x[:1, :1], cfg["sample"], temperature=0.8, top_k=200):
                pass
            sync()
        return model, sample, {"device": device, "dtype": dtype, "tokens": cfg["sample"]}

    def step():
        with autocast:
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()

    return model, step, {"device": device, "dtype": dtype, "tokens": B * T}


def measure(cfg):
    """Time `steps` training steps of the configured model; returns a dict of figures."""
    model, step, info = build(cfg)
    device, dtype = info["device"], info["dtype"]
    t0 = time.perf_counter()
    for _ in range(cfg["warmup"]):
        step()
    warmup_s, times = time.perf_counter() - t0, []
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / cfg["steps"]
    ms = 1000 * statistics.median(times)
    tokens = info["tokens"]
    peak = None if cfg["sample"] else cfg["mfu_peak_flops"] or peak_flops(   # a training step's
        torch.device(device), torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    flops = model.flops_per_token() * tokens
    peak_mem = torch.cuda.max_memory_allocated() if device.startswith("cuda") else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"ms": ms, "tokens_per_s": tokens / ms * 1000, "warmup_s": warmup_s,
            "peak_mem_mb": peak_mem / 2**20, "faults_per_step": faults,
            "mfu": flops / (ms / 1000) / peak if peak else None,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "device": device, "dtype": dtype,
            "threads": torch.get_num_threads() if device == "cpu" else None}


def compared_runs(argv, cfg):
    """{name: argv} for the base configuration and each one of --compare."""
    base_files = [a for a in argv if not a.startswith("--")]
    overrides = [a for a in argv if a.startswith("--") and not a.startswith(
        ("--compare=", "--json=", "--interleave=", "--busy=", "--threads_table="))]
    runs = {"base": [*base_files, *overrides]}
    # a config file, "gpt2", or overrides: dtype=bfloat16+compile=True
    for item in cfg["compare"].split(","):
        extra = (["--arch=gpt2"] if item == "gpt2"
                 else [f"--{kv}" for kv in item.split("+")] if "=" in item else [item])
        runs[item] = [*base_files, *overrides, *extra]
    return runs


def interleave(runs, cfg):
    """Every configuration in this one process, one step of each in turn, `rounds` x `steps` times:
    all of them see the same machine conditions, so this is the steadiest time ratio on a noisy
    machine. Memory, on CUDA only: "step mem", the peak during a step of that configuration above
    what was allocated before it (its activations, gradients and optimizer temporaries; all models'
    weights stay resident, so the process's peak is not any one model's: compare() without
    --interleave gives that)."""
    built = {name: build(configure(defaults, args, BENCH_RULES)) for name, args in runs.items()}
    for _, step, _ in built.values():
        for _ in range(cfg["warmup"]):
            step()
    times, step_mem = {name: [] for name in built}, {name: 0 for name in built}
    for _ in range(cfg["rounds"] * cfg["steps"]):
        for name, (_, step, info) in built.items():
            cuda = info["device"].startswith("cuda")
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
            if cuda:
                step_mem[name] = max(step_mem[name], torch.cuda.max_memory_allocated() - before)
    base_ms = 1000 * statistics.median(times["base"])
    print("| config | params (M) | ms/step | x base | tokens/s | MFU | step mem (MB) "
          "| x base by round |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (model, _, info) in built.items():
        ms = 1000 * statistics.median(times[name])
        c = configure(defaults, runs[name])
        peak = c["mfu_peak_flops"] or peak_flops(
            torch.device(info["device"]),
            torch.bfloat16 if info["dtype"] == "bfloat16" else torch.float32)
        mfu = (f"{100 * model.flops_per_token() * info['tokens'] / (ms / 1000) / peak:.1f}%"
               if peak else "—")   # no known CPU peak
        mem = f"{step_mem[name] / 2**20:,.0f}" if info["device"].startswith("cuda") else "—"
        print(f"| {name} | {sum(p.numel() for p in model.parameters()) / 1e6:.2f} | {ms:.1f} "
              f"| {ms / base_ms:.3f} | {info['tokens'] / ms * 1000:,.0f} | {mfu} | {mem} "
              f"| {round_spread(times[name], times['base'], cfg['steps'])} |")


def round_spread(times, base, steps):
    """The lowest and highest of the per-round ratios (median over a round's `steps` steps, to
    the base's in the same round): how far one round's ratio can stray."""
    rounds = range(0, len(times), steps)
    ratios = [statistics.median(times[i:i + steps]) / statistics.median(base[i:i + steps])
              for i in rounds]
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def compare(runs, cfg):
    """Run the base configuration and each compared one in fresh processes, alternating, `rounds`
    times."""
    results = {name: [] for name in runs}
    for r in range(cfg["rounds"]):
        for name, args in runs.items():
            results[name].append(child(name, args))
            print(f"round {r + 1}/{cfg['rounds']}: {name}: {results[name][-1]['ms']:.1f} ms/step",
                  file=sys.stderr)
    base_ms = statistics.median(x["ms"] for x in results["base"])
    base_mem = statistics.median(x["peak_mem_mb"] for x in results["base"])
    print("| config | params (M) | ms/step | x base | tokens/s | peak mem (MB) | x base |")
    print("|---|---|---|---|---|---|---|")
    for name, xs in results.items():
        ms, mem = (statistics.median(x["ms"] for x in xs),
                   statistics.median(x["peak_mem_mb"] for x in xs))
        print(f"| {name} | {xs[0]['params_m']:.2f} | {ms:.1f} | {ms / base_ms:.3f} "
              f"| {statistics.median(x['tokens_per_s'] for x in xs):,.0f} "
              f"| {mem:,.0f} | {mem / base_mem:.3f} |")


def child(name, args):
    """The figures of one configuration, measured by bench.py in a fresh process."""
    p = subprocess.run([sys.executable, "-m", "tools.bench", *args, "--json=True"],
                       capture_output=True, text=True, env=CHILD_ENV)
    if p.returncode != 0:
        sys.exit(f"error: {name} failed:\n{p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def spinning(n):
    """n processes that keep a core busy each while the block runs (a busy machine); killed
    after, whatever ends the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield spinners
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def threads_table(argv, cfg):
    """A training step and a sample at cpu_threads' value against cpu_threads=1, as the machine is
    and with `busy` spinners, `rounds` alternating pairs of fresh processes each: the table."""
    base = [a for a in argv if not a.startswith(("--busy=", "--threads_table="))]
    n, busy, threads = cfg["sample"] or 300, cfg["busy"] or 2, cfg["cpu_threads"]
    print(f"`python -m tools.bench {shlex.join(argv)}`: {cfg['rounds']} alternating pair(s) of "
          f"fresh processes; a sample is {n} tokens, the median of 3\n")
    print(f"| machine | timed | cpu_threads={threads}: threads | ms | cpu_threads=1: ms "
          "| default / best | pairs (ms) |")
    print("|---|---|---|---|---|---|---|")
    for spinners in (0, busy):
        with spinning(spinners):
            for what, more in (("training step", ["--sample=0"]), (f"sample of {n} tokens", [
                    f"--sample={n}", "--steps=3", "--warmup=1"])):
                pairs = [[child(what, [*base, *more, *one]) for one in ([], ["--cpu_threads=1"])]
                         for _ in range(cfg["rounds"])]
                ms = [statistics.median(p[k]["ms"] for p in pairs) for k in (0, 1)]
                each = ", ".join(f"{a['ms']:,.0f}/{b['ms']:,.0f}" for a, b in pairs)
                print(f"| {f'{spinners} spinning' if spinners else 'as it is'} | {what} | "
                      f"{'/'.join(str(p[0]['threads']) for p in pairs)} | {ms[0]:,.1f} | "
                      f"{ms[1]:,.1f} | {ms[0] / min(ms):.2f} | {each} |", flush=True)


def check(argv):
    """The base configuration, after every check that needs no model: its keys and values, and
    for it and each --compare item, a device this machine has and a model that can be built
    (ConfigError otherwise)."""
    if "-h" in argv or "--help" in argv:
        show_help(argv)
    refuse_ignored(argv)
    cfg = configure(defaults, argv, BENCH_RULES)
    if cfg["threads_table"] and (cfg["compare"] or cfg["interleave"] or cfg["json"]):
        raise ConfigError("--threads_table=True makes its own comparison: drop --compare, "
                          "--interleave and --json")
    for name, args in (compared_runs(argv, cfg) if cfg["compare"] else {"base": argv}).items():
        try:
            c = configure(defaults, args, BENCH_RULES)
            pick_device(c["device"])
            model_config(c, args)
        except ConfigError as e:
            if name == "base":
                raise
            raise ConfigError(f"--compare item {name!r}: {str(e)[7:]}") from None   # "error: "
    return cfg


def main(argv):
    cfg = check(argv)   # a bad key or value: ConfigError, its one sentence
    if cfg["threads_table"]:
        return threads_table(argv, cfg)
    with spinning(cfg["busy"]):
        if cfg["compare"]:
            return (interleave if cfg["interleave"] else compare)(compared_runs(argv, cfg), cfg)
        r = measure(cfg)
    if cfg["json"]:
        print(json.dumps(r))
    else:
        timed = f"sample of {cfg['sample']} tokens" if cfg["sample"] else "step"
        print(f"{r['params_m']:.2f}M params on {r['device']} in {r['dtype']}: "
              f"{r['ms']:.1f} ms/{timed} (median of {cfg['steps']}), "
              f"{r['tokens_per_s']:,.0f} tokens/s, "
              + (f"MFU {100 * r['mfu']:.1f}%, " if r["mfu"] is not None
                 else "MFU — (no known peak: --mfu_peak_flops), " * (not cfg["sample"]))
              + f"peak memory {r['peak_mem_mb']:,.0f} MB, {r['faults_per_step']:,.0f} page "
              f"faults/step; warmup {r['warmup_s']:.1f} s"
              + (f"; {r['threads']} thread(s)" if r["threads"] else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
