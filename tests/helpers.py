"""What several test modules share: the one ROOT, the one tiny config, the named variants read from
model.VARIANTS, the one weight-decay rule, an independent Llama forward, and running train.py in a
subprocess. Test modules import
from here, never from each other."""
import json
import math
import os
import subprocess
import sys

import torch

# the tests import the project's modules (model, prepare_data, ...) from the repo root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import model as model_py  # noqa: E402
from config import variants  # noqa: E402
from model import GPT, ScaleVector  # noqa: E402

# ---- models -------------------------------------------------------------------------------------
TINY = dict(block_size=16, vocab_size=50, vocab_pad=8, n_layer=2, n_head=2, n_embd=32)
MOE = dict(n_experts=4, n_experts_active=2, n_shared_experts=1, moe_hidden=32)


def model_flags(flags):
    """A named variant's GPTConfig flags: all but train.py's sv_weight_decay."""
    return {k: v for k, v in flags.items() if k != "sv_weight_decay"}


# config/variants.py's VARIANTS as models: one name per distinct set of GPTConfig flags (gemma_none, _iwd and _all
# are one model), plus "moe" and "moe_unified"
VARIANTS = {}
for _name, _flags in variants.VARIANTS.items():
    if model_flags(_flags) not in VARIANTS.values():
        VARIANTS[_name.replace("_none", "")] = model_flags(_flags)
VARIANTS["moe"] = dict(MOE, moe_dense_layers=1)
VARIANTS["moe_unified"] = dict(MOE, **VARIANTS["unified"])


def make(seed=0, **kw):
    """A tiny GPT (TINY, overridden by kw) initialized from `seed`; model.GPTConfig is read at each
    call, so a test may register a config with a new flag (test_variant_tables)."""
    torch.manual_seed(seed)
    return GPT(model_py.GPTConfig(**{**TINY, **kw}))


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


def declared_class(model, name):
    """A parameter's class as its module declares it: 'matrix' (matrices and embeddings), or, for a
    scale vector, 'sv_input' where its ScaleVector says it folds into a linear map (folds_into),
    'sv_final' for g_final (it folds into the head), 'sv_output' where it says a Norm stands
    between (model.AFTER_NORM). That a declaration is true is checked by folding
    (test_variant_tables.check_folding), not here."""
    holder = model.get_submodule(name.rpartition(".")[0])
    if not isinstance(holder, ScaleVector):
        return "matrix"
    if holder is model.g_final:
        return "sv_final"
    return "sv_output" if holder.folds_into == model_py.AFTER_NORM else "sv_input"


def expected_decay(model, name, policy):
    """Is the parameter decayed? Matrices and embeddings always; a vector as the policy's entry
    says of its declared class (DESIGN.md, "Weight decay on scale vectors")."""
    cls = declared_class(model, name)
    return cls == "matrix" or cls in model_py.DECAY_POLICIES[policy]


# ---- an independent Llama forward over an export -----------------------------------------------

def llama_forward(config, state, idx):
    """The logits of the Llama (or Qwen3) that tools/export_hf.py wrote (its config.json and state
    dict), computed here in float64 as Hugging Face's LlamaModel defines it, not as model.py does:
    embedding; per layer RMSNorm with its weight, q, k, v, Qwen3's q_norm / k_norm per head, RoPE
    in rotate_half form (channel i pairs with i + hd/2), causal softmax attention, o_proj, RMSNorm,
    SwiGLU MLP; the final RMSNorm and lm_head (the embedding when tied)."""
    w = {k: v.double() for k, v in state.items()}
    H, hd, eps = config["num_attention_heads"], config["head_dim"], config["rms_norm_eps"]
    B, T = idx.shape
    rms = lambda x, g: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    inv = config["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv).repeat(1, 2)   # (T, hd)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    rotate_half = lambda x: torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][idx]
    for i in range(config["num_hidden_layers"]):
        p = lambda name: w[f"model.layers.{i}.{name}"]
        h = rms(x, p("input_layernorm.weight"))
        q, k, v = ((h @ p(f"self_attn.{n}_proj.weight").T).view(B, T, H, hd) for n in "qkv")
        if f"model.layers.{i}.self_attn.q_norm.weight" in w:   # Qwen3: before RoPE
            q, k = rms(q, p("self_attn.q_norm.weight")), rms(k, p("self_attn.k_norm.weight"))
        q, k = (z * cos + rotate_half(z) * sin for z in (q, k))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        att = scores.masked_fill(~mask, -math.inf).softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, H * hd)
        x = x + y @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"))
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ p("mlp.down_proj.weight").T
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


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
