"""What several test modules share: the one ROOT, the one tiny config, the named variants read from
model.VARIANTS, the one weight-decay rule, and running train.py in a subprocess. Test modules import
from here, never from each other."""
import json
import os
import re
import subprocess
import sys

import torch

# the tests import the project's modules (model, prepare_data, ...) from the repo root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import model as model_py  # noqa: E402
from model import GPT, GPTConfig, ScaleVector  # noqa: E402

# ---- models -------------------------------------------------------------------------------------
TINY = dict(block_size=16, vocab_size=50, vocab_pad=8, n_layer=2, n_head=2, n_embd=32)
MOE = dict(n_experts=4, n_experts_active=2, n_shared_experts=1, moe_hidden=32)


def model_flags(flags):
    """A named variant's GPTConfig flags: all but train.py's sv_weight_decay."""
    return {k: v for k, v in flags.items() if k != "sv_weight_decay"}


# model.VARIANTS as models: one name per distinct set of GPTConfig flags (gemma_none, _iwd and _all
# are one model), plus "moe" and "moe_unified"
VARIANTS = {}
for _name, _flags in model_py.VARIANTS.items():
    if model_flags(_flags) not in VARIANTS.values():
        VARIANTS[_name.replace("_none", "")] = model_flags(_flags)
VARIANTS["moe"] = dict(MOE, moe_dense_layers=1)
VARIANTS["moe_unified"] = dict(MOE, **VARIANTS["unified"])


def make(seed=0, **kw):
    """A tiny GPT (TINY, overridden by kw) initialized from `seed`."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **kw}))


def tokens(B=3, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=g)


def randomize_scale_vectors(model, seed=2):
    """Move every scale-vector parameter away from its init, so that folding has something to
    fold."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ScaleVector):
                for p in m.parameters():
                    p.add_(0.5 * torch.randn(p.shape, generator=g))


def vector_kind(name, placement):
    """DESIGN.md's classes, read off a parameter's name and the placement's table entry (not off
    ScaleVector.kind): "matrix" (matrices and embeddings), "input" (a block's vector that folds
    into a linear map: every g_in, MoE's g_ffn, an 'input' g_out), "final" (g_final, before the
    head) or "output" (after a Norm: qk_norm, post_norm, an 'output' g_out)."""
    if not re.search(r"(^|\.)(g_in|g_final|g_out|q_norm|k_norm|attn_post|mlp_post)\.", name):
        return "matrix"
    if ".g_out." in name:
        return model_py.PLACEMENTS[placement].g_out
    if name.startswith("g_final."):
        return "final"
    if re.search(r"(^|\.)g_in\.", name):
        return "input"
    assert re.search(r"(q_norm|k_norm|attn_post|mlp_post)\.g\.", name), name
    return "output"


def expected_decay(name, placement, policy):
    """Is the parameter decayed? Matrices and embeddings always; a vector as the policy's entry
    says of its class (DESIGN.md, "Weight decay on scale vectors")."""
    kind = vector_kind(name, placement)
    return kind == "matrix" or f"sv_{kind}" in model_py.DECAY_POLICIES[policy].decays


# ---- train.py in a subprocess -------------------------------------------------------------------
TINY_MODEL = ["--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
              "--batch_size=4", "--vocab_pad=1", "--device=cpu", "--log_interval=1",
              "--eval_iters=2", "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def start(wd, *args, launcher=(sys.executable,), env=None):
    """train.py on the tiny model in `wd`, started (env: more environment variables); finish(p)
    waits for it."""
    cmd = [*launcher, os.path.join(ROOT, "train.py"), *TINY_MODEL, *args]
    return subprocess.Popen(cmd, cwd=wd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p, check=True):
    out, err = p.communicate(timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(p.args)} failed:\n{out}\n{err}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def train(wd, *args, launcher=(sys.executable,), check=True, env=None):
    return finish(start(wd, *args, launcher=launcher, env=env), check)


def records(wd, out_dir, kind):
    with open(wd / out_dir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def final_state(wd, out_dir):
    with open(wd / out_dir / "latest") as f:
        return torch.load(wd / out_dir / f.read().strip(), weights_only=True)
