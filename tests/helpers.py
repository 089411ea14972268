"""What test modules share (they import it from here, never from each other): ROOT, the tiny
config, the named variants as models, the models of each table entry, a Llama forward, train.py."""
import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import fields

import torch

# the tests import the project's modules (model, prepare_data, ...) from the repo root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import model as model_py  # noqa: E402
from config import variants  # noqa: E402

TINY = dict(block_size=16, vocab_size=50, vocab_pad=8, n_layer=2, n_head=2, n_embd=32)
MOE = dict(n_experts=4, n_experts_active=2, n_shared_experts=1, moe_hidden=32)


def accepted(kw):
    try:
        return bool(model_py.GPTConfig(**{**TINY, **kw}))
    except ValueError:
        return False


# config/variants.py's VARIANTS as models (their model keys), a name per distinct model (gemma_none,
# _iwd, _all: one), one whose flag acts in an MoE only on an MoE; + MoE's
VARIANTS = {}
for _name, _flags in variants.VARIANTS.items():
    _kw = variants.model_keys(_flags)
    _kw = _kw if accepted(_kw) else dict(MOE, moe_dense_layers=1, **_kw)
    if _kw not in VARIANTS.values():
        VARIANTS[_name.replace("_none", "")] = _kw
VARIANTS["moe"] = dict(MOE, moe_dense_layers=1)
VARIANTS["moe_unified"] = dict(MOE, **VARIANTS["unified"])


def make(seed=0, **kw):
    """A tiny GPT (TINY, overridden by kw) from `seed`; GPTConfig read per call: tests patch it."""
    torch.manual_seed(seed)
    return model_py.GPT(model_py.GPTConfig(**{**TINY, **kw}))


# ---- the variant tables walked: each entry with the other flags (test_variant_tables, export_hf)

def defaults():
    return {f.name: f.default for f in fields(model_py.GPTConfig)}


def flag_values(flag):
    """The values model.VECTOR_FLAGS lists for a flag, its default first."""
    values, default = list(model_py.VECTOR_FLAGS[flag].values), defaults()[flag]
    return [default] + [v for v in values if v != default]


def models(reparam, placement):
    """(label, flags) of the tiny models of a REPARAMS x PLACEMENTS entry: alone and with every
    other VECTOR_FLAGS flag on, head tied and untied; with each other flag's value alone (on an MoE
    where only an MoE takes it); as an MoE alone, all on, and untied beside each MoE-only value."""
    others = [f for f in model_py.VECTOR_FLAGS if f not in ("sv_reparam", "sv_placement")]
    entry, moe = dict(sv_reparam=reparam, sv_placement=placement), dict(MOE, moe_dense_layers=1)

    def every(kw):   # kw, then each other flag's i-th value in turn where GPTConfig takes it
        out = dict(kw)
        for i in range(max(map(len, map(flag_values, others)))):
            for f in others:
                value = flag_values(f)[min(i, len(flag_values(f)) - 1)]
                if f not in kw and accepted({**entry, **out, f: value}):
                    out[f] = value
        return out
    alone = [kw if accepted({**entry, **kw}) else dict(moe, **kw)   # only an MoE takes it
             for kw in ({f: v} for f in others for v in flag_values(f)[1:])]
    untied = dict(tie_embeddings=False)
    combos = [{}, untied, *alone, every({}), every(untied), every(moe), moe]
    combos += [every(dict(kw, **untied)) for kw in alone if "n_experts" in kw]
    out = []
    for kw in (dict(entry, **c) for c in combos if accepted(dict(entry, **c))):
        on = ", ".join(f"{f}={kw[f]!r}" for f in kw if f in others or f == "tie_embeddings"
                       if kw[f] != defaults()[f])
        if kw not in [k for _, k in out]:
            out.append((f"reparam={reparam!r} placement={placement!r}"
                        f"{' MoE' * ('n_experts' in kw)} {on or 'other flags at default'}", kw))
    return out


def entries():
    return [(r, p) for r in model_py.REPARAMS for p in model_py.PLACEMENTS]


def vectors(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, model_py.ScaleVector)}


def tokens(B=3, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=g)


def randomize_scale_vectors(model, seed=2, names=None):
    """Scale vectors (all, or those named) moved away from their init: folding has work to do."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in vectors(model) if names is None else names:
            for p in model.get_submodule(name).parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=g))


def declared_class(model, name):
    """A parameter's class as its module declares it: 'embedding' (the input's, an untied head's),
    'matrix'; for a scale vector 'sv_final' (g_final), 'sv_output' (AFTER_NORM: a Norm stands
    between), else 'sv_input'."""
    holder = model.get_submodule(name.rpartition(".")[0])
    return ("embedding" if holder in (model.wte, model.head) else "matrix"
            if not isinstance(holder, model_py.ScaleVector) else "sv_final"
            if holder is model.g_final else "sv_output"
            if holder.folds_into == model_py.AFTER_NORM else "sv_input")


def llama_forward(config, state, idx):
    """The logits of the Llama (or Qwen3) that tools/export_hf.py wrote (config.json, state dict),
    in float64 as Hugging Face's LlamaModel defines it, not as model.py does: per layer RMSNorm,
    q, k, v, Qwen3's per-head q_norm / k_norm, RoPE as rotate_half (channel i pairs with i + hd/2),
    causal attention, o_proj, RMSNorm, SwiGLU; final RMSNorm, lm_head (or the tied embedding)."""
    w = {k: v.double() for k, v in state.items()}
    H, hd, eps = config["num_attention_heads"], config["head_dim"], config["rms_norm_eps"]
    B, T = idx.shape
    rms = lambda x, g: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    inv = config["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv).repeat(1, 2)[:, None]  # T,1,hd
    rotate_half = lambda x: torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1)
    x = w["model.embed_tokens.weight"][idx]
    for i in range(config["num_hidden_layers"]):
        p = lambda name: w[f"model.layers.{i}.{name}"]
        h = rms(x, p("input_layernorm.weight"))
        q, k, v = ((h @ p(f"self_attn.{n}_proj.weight").T).view(B, T, H, hd) for n in "qkv")
        if f"model.layers.{i}.self_attn.q_norm.weight" in w:   # Qwen3: before RoPE
            q, k = rms(q, p("self_attn.q_norm.weight")), rms(k, p("self_attn.k_norm.weight"))
        q, k = (z * angles.cos() + rotate_half(z) * angles.sin() for z in (q, k))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        att = scores.masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf).softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, H * hd)
        x = x + y @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"))
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ p("mlp.down_proj.weight").T
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


# train.py in a subprocess, on the tiny model
TINY_MODEL = ["--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
              "--batch_size=4", "--vocab_pad=1", "--device=cpu", "--log_interval=1",
              "--eval_iters=2", "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")


def tiny_corpus(wd):
    """`wd` with data/tiny prepared from 20 KB of Tiny Shakespeare, where train.py runs."""
    with open(os.path.join(ROOT, "data", "raw", "tinyshakespeare.txt"), encoding="utf-8") as f:
        (wd / "tiny.txt").write_text(f.read()[:20000], encoding="utf-8")
    import prepare_data
    prepare_data.main(["text", "--input", str(wd / "tiny.txt"), "--name", "tiny",
                       "--tokenizer", "char", "--out_dir", str(wd / "data" / "tiny")])
    return wd


def start(wd, *args, launcher=(sys.executable,), env=None):
    """train.py on the tiny model in `wd`, started (env: more variables); finish(p) waits."""
    cmd = [*launcher, os.path.join(ROOT, "train.py"), *TINY_MODEL, *args]
    return subprocess.Popen(cmd, cwd=wd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p, check=True):
    out, err = p.communicate(timeout=300)
    assert not check or p.returncode == 0, f"{' '.join(p.args)} failed:\n{out}\n{err}"
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def train(wd, *args, launcher=(sys.executable,), check=True, env=None):
    return finish(start(wd, *args, launcher=launcher, env=env), check)


def last_line(p):
    """A failed run's one sentence: the last line of its stderr, which holds no traceback."""
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    return p.stderr.strip().splitlines()[-1]


def records(wd, out_dir, kind):
    with open(wd / out_dir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


WALL_TIME = ("ms_per_iter", "tokens_per_s", "mfu")   # a train record's speed, never repeated


def metrics(wd, out_dir):
    """Every record of out_dir/metrics.jsonl, in order, but their wall-time fields (WALL_TIME)."""
    with open(wd / out_dir / "metrics.jsonl") as f:
        return [{k: v for k, v in r.items() if k not in WALL_TIME} for r in map(json.loads, f)]


def final_state(wd, out_dir):
    with open(wd / out_dir / "latest") as f:
        return torch.load(wd / out_dir / f.read().strip(), weights_only=True)


# the docs' commands (test_imports.py, study/test_reproduce.py)

def commands(doc):
    """The python / torchrun command lines of the doc's code blocks, continuations joined."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:   # split at the fence lines
        code = re.split(r"^```.*\n?", f.read(), flags=re.M)[1::2]
    lines = "".join(code).replace("\\\n", " ").splitlines()
    return [w for w in (shlex.split(line, comments=True) for line in lines)
            if w and w[0] in ("python", "torchrun")]
