"""What several test modules share: tiny configs, the variant list, the one weight-decay rule, and running
train.py in a subprocess. Test modules import from here, never from each other."""
import json
import os
import re
import subprocess
import sys

import torch

from model import GPT, GPTConfig, ScaleVector

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- models ------------------------------------------------------------------------------------------------
TINY = dict(block_size=16, vocab_size=50, vocab_pad=8, n_layer=2, n_head=2, n_embd=32)
MOE = dict(n_experts=4, n_experts_active=2, n_shared_experts=1, moe_hidden=32)
VARIANTS = {
    "baseline": {},
    "noscale": dict(scale_vectors=False),
    "hetero": dict(sv_hetero=True),
    "dp": dict(sv_placement="dp"),
    "dnp": dict(sv_placement="dnp"),
    "or": dict(sv_reparam="or"),
    "er": dict(sv_reparam="er"),
    "unified": dict(sv_hetero=True, sv_placement="dnp", sv_reparam="or"),
    "gemma": dict(qk_norm=True, post_norm=True),
}


def make(seed=0, **kw):
    """A tiny GPT (TINY, overridden by kw) initialized from `seed`."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **kw}))


def tokens(B=3, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=g)


def randomize_scale_vectors(model, seed=2):
    """Move every scale-vector parameter away from its init, so that folding has something to fold."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ScaleVector):
                for p in m.parameters():
                    p.add_(0.5 * torch.randn(p.shape, generator=g))


def expected_decay(name, placement, policy):
    """DESIGN.md's weight-decay rules, read off a parameter's name (not off ScaleVector.kind): is it decayed?
    Matrices and embeddings always; a vector that folds into a linear map (every g_in, g_final, DP's g_out)
    under "iwd" and "all"; one after a Norm (qk_norm, post_norm, DNP's g_out) under "all" only."""
    if not re.search(r"\.(g|alpha|beta)$", name):
        return True
    if re.search(r"(^|\.)(g_in|g_final)\.", name) or (placement == "dp" and ".g_out." in name):
        return policy in ("iwd", "all")
    assert re.search(r"(q_norm|k_norm|attn_post|mlp_post)\.g\.", name) or (placement == "dnp" and ".g_out." in name), name
    return policy == "all"


# ---- train.py in a subprocess --------------------------------------------------------------------------------
TINY_MODEL = ["--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
              "--vocab_pad=1", "--device=cpu", "--log_interval=1", "--eval_iters=2", "--warmup_iters=2",
              "--learning_rate=3e-3", "--min_lr=3e-4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def train(wd, *args, launcher=(sys.executable,), check=True):
    cmd = [*launcher, os.path.join(ROOT, "train.py"), *TINY_MODEL, *args]
    p = subprocess.run(cmd, cwd=wd, env=ENV, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    return p


def records(wd, out_dir, kind):
    with open(wd / out_dir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def final_state(wd, out_dir):
    with open(wd / out_dir / "latest") as f:
        return torch.load(wd / out_dir / f.read().strip(), weights_only=True)
