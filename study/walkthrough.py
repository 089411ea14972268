# %% [markdown]
# # The paper's argument, step by step
#
# arXiv:2605.26895 in four cells: an RMSNorm's scale vector `g` adds no expressivity to a
# Pre-Norm network (it folds into the next linear map), yet it changes how that map trains (it
# preconditions it), and the paper's unified strategy (HG + DNP + OR + IWD) trains to a lower
# loss. A Python script in cells: it opens as a notebook in Jupyter (jupytext) or VS Code, and
# runs as a plain script from the repository's root, in under a minute on a CPU:
#
#     python -m study.walkthrough                      # figures in out/walkthrough/
#     python -m study.walkthrough --max_iters=100 --out_dir=out/walk_short
#
# It trains a small baseline and the unified model in this process (the char recipe of
# config/shakespeare_char.py at a quarter of its width and a few hundred steps), or loads two
# train.py runs (`--baseline_dir=out/shakespeare_char --unified_dir=out/unified_char`).

# %%
import argparse
import copy
import math
import os
import signal
import sys
import time
from pathlib import Path

NOTEBOOK = "ipykernel" in sys.modules
if not NOTEBOOK:   # Ctrl-C ends the script without a traceback, as it does train.py and sample.py
    signal.signal(signal.SIGINT, lambda sig, frame: sys.exit(130))

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd()
if not (ROOT / "model.py").is_file():   # a notebook opened in study/
    ROOT = ROOT.parent
if NOTEBOOK:   # data/<name> is read from the working directory, as by every tool
    os.chdir(ROOT)
if str(ROOT) not in sys.path:   # the core, for `python study/walkthrough.py` and a notebook
    sys.path.insert(0, str(ROOT))

import checkpoint  # noqa: E402
from dataset import dataset_dir, load_meta, read_rows, token_file  # noqa: E402
import telemetry  # noqa: E402
from config.variants import VARIANTS  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from runtime import setup_cpu  # noqa: E402

parser = argparse.ArgumentParser(description="The paper's argument on a small model: g per "
                                 "layer, folding, preconditioning, baseline against unified.")
parser.add_argument("--out_dir", default="out/walkthrough", help="the folder of the figures")
parser.add_argument("--dataset", default="shakespeare_char", help="data/<dataset>, prepared")
parser.add_argument("--max_iters", type=int, default=300, help="training steps of each model")
parser.add_argument("--n_layer", type=int, default=4)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--n_head", type=int, default=4)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--batch_size", type=int, default=12)
parser.add_argument("--learning_rate", type=float, default=2e-3)
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--cpu_threads", type=int, default=0,
                    help="torch's threads; 0: the cores idle at start, at most 2")
parser.add_argument("--baseline_dir", default="", help="load this train.py run instead of training")
parser.add_argument("--unified_dir", default="", help="load this train.py run instead of training")
args = parser.parse_args([] if NOTEBOOK else None)
if bool(args.baseline_dir) != bool(args.unified_dir):
    sys.exit("error: give both --baseline_dir and --unified_dir (train.py runs), or neither")
out = Path(args.out_dir)
out.mkdir(parents=True, exist_ok=True)
setup_cpu(args.cpu_threads)
if not args.cpu_threads:   # a small model: more threads only wait
    torch.set_num_threads(min(torch.get_num_threads(), 2))

import matplotlib  # noqa: E402
if not NOTEBOOK:
    matplotlib.use("Agg")   # files only
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, name):
    """Write the figure into out_dir as a PNG; a notebook shows it too."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    print(f"wrote {out / name}")
    plt.show() if NOTEBOOK else plt.close(fig)


# %% [markdown]
# ## 1. Two models: the baseline and the unified strategy
#
# The baseline has one `g` per RMSNorm (`g_attn`, `g_ffn` per layer, `g_final`). The unified
# model (paper 4) has a vector per branch (HG: `g_q, g_k, g_v`, `g_gate, g_up`), a Norm and a
# vector after each map (DNP), `g = beta * Norm(alpha)` (OR), and weight decay on the Input-Norm
# vectors only (IWD). Both see the same batches (a batch depends on the seed and the step only).

# %%
SIZE = dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
            block_size=args.block_size, vocab_pad=1)
FLAGS = {name: VARIANTS[name] for name in ("baseline", "unified")}
data = dataset_dir(args.dataset)
meta = load_meta(data)   # a dataset not prepared: one sentence naming the command


def split(name, block_size):
    return token_file(data, name, block_size, meta["vocab_size"])


def rows(tokens, starts, block_size):
    r = torch.from_numpy(read_rows(tokens, starts, block_size + 1, meta["vocab_size"]))
    return r[:, :-1], r[:, 1:]


def val_batches(block_size, n=10):
    """n batches at fixed, evenly spaced offsets of the val split: the same for both models."""
    val = split("val", block_size)
    starts = np.linspace(0, len(val) - block_size - 1, n * args.batch_size).astype(np.int64)
    return [rows(val, s, block_size) for s in starts.reshape(n, args.batch_size)]


@torch.no_grad()
def val_loss(model, batches):
    model.eval()
    loss = sum(model(x, y)[1].item() for x, y in batches) / len(batches)
    model.train()
    return loss


def train(name):
    """The loop of train.py, short: AdamW, warmup then cosine, clipping, the variant's decay
    policy, a progress line every tenth of the steps (minutes on a busy machine, not seconds).
    Returns the model and the training loss of each step."""
    flags, t0 = FLAGS[name], time.time()
    train_split = split("train", SIZE["block_size"])
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=meta["vocab_size"], **SIZE,
                          **{k: v for k, v in flags.items() if k != "sv_weight_decay"}))
    opts = model.configure_optimizers(learning_rate=args.learning_rate, weight_decay=0.1,
                                      betas=(0.9, 0.99),
                                      sv_weight_decay=flags.get("sv_weight_decay", "none"))
    warmup, losses = max(args.max_iters // 10, 1), []
    for it in range(args.max_iters):
        progress = max(it - warmup, 0) / max(args.max_iters - warmup, 1)
        factor = min((it + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in (g for opt in opts for g in opt.param_groups):
            group["lr"] = group["base_lr"] * group["lr_mult"] * factor
        rng = np.random.default_rng([args.seed, it])
        x, y = rows(train_split, rng.integers(0, len(train_split) - SIZE["block_size"] - 1,
                                              size=args.batch_size), SIZE["block_size"])
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (it + 1) % max(args.max_iters // 10, 1) == 0 or it + 1 == args.max_iters:
            print(f"{name} step {it + 1}/{args.max_iters}: loss {losses[-1]:.4f}, "
                  f"{time.time() - t0:.0f} s", flush=True)
    return model.eval(), losses


def load(run_dir):
    """A train.py run: its newest checkpoint, and its logged training losses by step."""
    _, state, model = checkpoint.load_model(run_dir)   # a bad one: its one sentence
    if state["config"].get("dataset") != args.dataset:
        sys.exit(f"error: {run_dir} was trained on data/{state['config'].get('dataset')}: pass "
                 f"--dataset={state['config'].get('dataset')}")
    records = telemetry.read_metrics(Path(run_dir) / "metrics.jsonl")[0]
    return model.eval(), {r["iter"]: r["loss"] for r in records if r.get("kind") == "train"}


if args.baseline_dir:
    (base, base_curve), (unif, unif_curve) = load(args.baseline_dir), load(args.unified_dir)
else:
    (base, base_losses), (unif, unif_losses) = train("baseline"), train("unified")
    base_curve, unif_curve = (dict(enumerate(c, 1)) for c in (base_losses, unif_losses))
batches = val_batches(base.config.block_size)
losses = {"baseline": val_loss(base, batches), "unified": val_loss(unif, batches)}
print(f"{base.num_params():,} parameters (baseline), {unif.num_params():,} (unified); val loss "
      f"baseline {losses['baseline']:.4f}, unified {losses['unified']:.4f}")

# %% [markdown]
# ## 2. `g` per layer
#
# Every vector starts at 1. Training moves it: per layer, the mean of each vector and the range
# of its entries. The paper (2.2) calls the growth of Input-Norm vectors self-amplifying: a larger
# `g` makes its map learn faster (section 4 below), which makes `g` grow again.

# %%
def per_layer(model):
    """{vector kind: [(layer, mean, min, max), ...]} from telemetry.vector_stats(model)."""
    kinds = {}
    for name, (mean, lo, hi) in telemetry.vector_stats(model).items():
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blocks" else model.config.n_layer   # g_final last
        kind = ".".join(parts[2:]) if parts[0] == "blocks" else name
        kinds.setdefault(kind, []).append((layer, mean, lo, hi))
    return kinds


fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, (label, model) in zip(axes, (("baseline", base), ("unified", unif))):
    for i, (kind, points) in enumerate(sorted(per_layer(model).items())):
        layer, mean, lo, hi = map(np.array, zip(*points))
        shift = 0.6 * (i / max(len(per_layer(model)) - 1, 1) - 0.5)   # side by side per layer
        ax.errorbar(layer + shift, mean, yerr=[mean - lo, hi - mean], fmt="o", ms=4, capsize=2,
                    label=kind)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set(title=f"{label}: effective g per layer (mean, min-max)", xlabel="layer "
           f"({model.config.n_layer}: g_final)", ylabel="g")
    ax.legend(fontsize=6, ncol=2)
save(fig, "g_per_layer.png")
for kind, points in sorted(per_layer(base).items()):
    print(f"baseline {kind:<18} mean by layer: " + " ".join(f"{p[1]:.3f}" for p in points))

# %% [markdown]
# ## 3. Folding: the same logits without a single vector
#
# `W (g * z) = (W diag(g)) z`: `GPT.fold_scale_vectors()` multiplies every Input-Norm vector into
# the columns of the map it feeds and returns a model with `scale_vectors=False`. Its logits are
# the baseline's, up to float32 rounding: the vectors add nothing the network could not express.
# The unified model refuses, because under DNP a Norm follows its maps (an Output-Norm adds
# expressivity).

# %%
folded = base.fold_scale_vectors()
x, _ = batches[0]
with torch.no_grad():
    a, b = base(x)[0], folded(x)[0]
diff = (a - b).abs().max().item()
vectors = sum(p.numel() for n, p in base.named_parameters() if ".g_in." in n or "g_final" in n)
print(f"folded: {vectors:,} scale-vector entries multiplied into the maps they feed, max |logit "
      f"difference| {diff:.1e} over {a.numel():,} logits (largest |logit| "
      f"{a.abs().max().item():.1f})")
try:
    unif.fold_scale_vectors()
except ValueError as e:
    print(f"unified: {e}")
fig, ax = plt.subplots(figsize=(4.5, 4.5))
ax.plot(a.flatten()[::7], b.flatten()[::7], ".", ms=1)
ax.set(xlabel="baseline logit", ylabel="folded model's logit (no scale vectors)",
       title=f"same logits: max |difference| {diff:.1e}")
save(fig, "folding.png")

# %% [markdown]
# ## 4. Preconditioning, on one map
#
# Take the map whose Input-Norm vector has spread widest in training (a layer's fused q, k, v or
# gate, up map) and its `g`; the folded map is `V = W diag(g)`. One gradient step on `W` (with
# `g` held) moves column `i` of `V` by `-lr * g_i^2 * dL/dV_i`: the folded model, trained
# directly, would move it by `-lr * dL/dV_i`. So the vector preconditions the map's columns by
# `g^2` (paper 2.2). The step of `g` itself adds `w_i w_i^T` (DESIGN.md): together
# `g_i^2 I + w_i w_i^T`, never less than `g_i^2`. Under Adam the per-coordinate normalization
# changes the power (its first step moves `V_i` by `lr * |g_i|` per entry), but a larger `g`
# still means a faster-learning column.

# %%
def widest(model):
    """The name of the block map whose g_in ranges widest."""
    maps = {n: m for n, m in model.named_modules() if n.endswith(("attn.qkv", "mlp.gate_up"))}
    spread = {n: m.g_in().detach() for n, m in maps.items()}
    return max(spread, key=lambda n: float(spread[n].max() - spread[n].min()))


def column_steps(model, name, lr=1e-3, only_w=True):
    """Column norms of the folded map's change after one SGD step of lr on the model's loss (only
    W, or W and g), over those of the folded model's own gradient step. In float64: the change is
    a difference of two close matrices."""
    model = copy.deepcopy(model).double().train()
    lin = model.get_submodule(name)
    plain = model.fold_scale_vectors().train()
    xb, yb = batches[1]
    plain(xb, yb)[1].backward()
    plain_step = lr * plain.get_submodule(name).weight.grad.norm(dim=0)   # per column
    before = lin.effective_weight().detach().clone()
    model(xb, yb)[1].backward()
    with torch.no_grad():
        for p in (lin.weight,) if only_w else (lin.weight, *lin.g_in.parameters()):
            p -= lr * p.grad
        after = lin.effective_weight()
    return (after - before).norm(dim=0) / plain_step, lin.g_in()[0].detach()


name = widest(base)
ratio_w, g = column_steps(base, name)
ratio_both, _ = column_steps(base, name, only_w=False)
err = ((ratio_w - g ** 2).abs() / g ** 2).max().item()
print(f"preconditioning: a step on W alone moves column i of W diag(g) by g_i^2 times the "
      f"folded model's step, to a relative {err:.1e} ({name}: g from {g.min():.3f} to "
      f"{g.max():.3f}); "
      f"with g's own step, at least g_i^2: {bool((ratio_both >= g ** 2 * (1 - 1e-3)).all())}")
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.plot(g ** 2, ratio_both, "o", ms=3, alpha=0.6, label="step of W and g")
ax.plot(g ** 2, ratio_w, "o", ms=3, label="step of W alone")
lim = [float(g.min() ** 2) * 0.95, float(max(ratio_both.max(), g.max() ** 2)) * 1.05]
ax.plot(lim, lim, color="grey", lw=0.5, label="g_i^2")
ax.set(xlabel=f"g_i^2 ({name}.g_in)", ylabel="column update of W diag(g) / folded model's",
       title="one SGD step: the columns of the folded map", xlim=lim, ylim=lim)
ax.legend(fontsize=7)
save(fig, "preconditioning.png")

# %% [markdown]
# ## 5. Baseline against unified
#
# The training loss of each step (smoothed) and the validation loss at the end, on the same fixed
# batches. At this size and length one seed says little: study/README.md has the paired
# comparison over seeds (unified lower by about 0.05 at 4 x 128 and 1000 steps).

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for i, (label, curve) in enumerate((("baseline", base_curve), ("unified", unif_curve))):
    steps, values = np.array(list(curve)), np.array(list(curve.values()))
    k = max(len(values) // 20, 1)   # a moving mean over a twentieth of the run
    smooth = np.convolve(values, np.ones(k) / k, mode="valid")
    ax.plot(steps[k - 1:], smooth, color=f"C{i}", label=f"{label} train")
    ax.plot(steps[-1], losses[label], "o", color=f"C{i}",
            label=f"{label} val {losses[label]:.3f}")
ax.set(xlabel="step", ylabel="loss", title="baseline against unified (HG + DNP + OR + IWD)")
ax.legend(fontsize=7)
save(fig, "loss.png")
print(f"unified - baseline: {losses['unified'] - losses['baseline']:+.4f} val loss (one seed)")
