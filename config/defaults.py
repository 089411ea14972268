"""
train.py's config keys, with their defaults, what each does and the values each allows. A config
file (config/*.py) sets some of them, --key=value overrides them (configurator.py), and the rules
below check every value before train.py writes anything. tools/bench.py and study/reproduce.py read
a config the same way, through train_config.

Every module-level value up to DEFAULTS is a key, and so is every field of model.GPTConfig.
"""
import functools
import importlib.util
import math
import os
import re
from dataclasses import fields

import model
from configurator import configure, key_comments
from model import DECAY_POLICIES, DNP_WIDTHS, PLACEMENTS, REPARAMS, GPTConfig

# ---- I/O ----
out_dir = "out"            # the run's folder: checkpoints, `latest`, metrics.jsonl
eval_interval = 250        # evaluate, save a checkpoint and log the vectors every N steps
eval_iters = 20            # fixed validation batches: the same ones at every eval and in every run
log_interval = 10          # print and log the training loss every N steps
init_from = "scratch"      # "resume": the newest complete checkpoint in out_dir (none: scratch)
overwrite = False          # scratch into an out_dir that holds a run: True deletes its checkpoints
                           # and metrics
keep_checkpoints = 3       # the newest N checkpoints stay, older ones are deleted
final_eval = True          # at the end: the loss on the whole val split and on as many train tokens
wandb_log = False          # also log to Weights & Biases (pip install wandb), rank 0 only
wandb_project = "scale-vectors"   # the wandb project
wandb_run_name = ""        # "": out_dir's name; a resumed run continues the same wandb run
# ---- data ----
dataset = "shakespeare_char"   # data/<dataset>/{train,val}.bin from prepare_data.py
batch_size = 12            # sequences per micro-step and process
gradient_accumulation_steps = 1   # micro-steps per optimizer step, summed over all processes
train_tokens = 0           # train on the first N tokens of train.bin only (0: all of them): less
                           # text, the same validation split
# ---- model: every field of model.GPTConfig is a key too (block_size, n_layer, sv_hetero, ...);
# the vocabulary's size comes from the dataset's meta.json, not from a key ----
globals().update({f.name: f.default for f in fields(GPTConfig) if f.name != "vocab_size"})
# ---- optimizer ----
optimizer = "adamw"        # "muon": Muon for the 2-D hidden matrices, AdamW for the rest
learning_rate = 6e-4       # AdamW's peak rate
muon_lr = 0.0              # Muon's peak rate; 0: learning_rate (Muon's update is scaled to AdamW's
                           # RMS, "match_rms_adamw")
muon_momentum = 0.95       # Muon's momentum
max_iters = 5000           # optimizer steps
weight_decay = 0.1         # AdamW's decoupled decay of the matrices and embeddings
sv_weight_decay = "none"   # which scale vectors get decayed (model.DECAY_POLICIES): "iwd" the
                           # Input-Norm ones, "owd" the Output-Norm ones, "all", or "none"
sv_decay = -1.0            # the decayed vectors' weight decay; -1: weight_decay's value
beta1 = 0.9                # AdamW's
beta2 = 0.95               # AdamW's
grad_clip = 1.0            # clip the gradient's norm to this; 0 disables
# ---- learning rate: linear warmup, then a schedule that ends at min_lr ----
lr_schedule = "cosine"     # "wsd": warmup-stable-decay; "constant"
warmup_iters = 100         # steps of linear warmup
lr_decay_iters = 0         # the schedule's end; 0: max_iters
min_lr = 6e-5              # the rate at the schedule's end (the same fraction for Muon's)
wsd_decay_frac = 0.2       # wsd: the last 20% of lr_decay_iters decay
wsd_shape = "linear"       # wsd: "linear" | "1-sqrt" (Hagele et al. 2024)
# ---- system ----
device = ""                # "" picks cuda, then mps, then cpu
cpu_threads = 0            # torch's threads on a CPU; 0: the cores idle at start (at least 1,
                           # at most torch's default), or OMP_NUM_THREADS where it is set
dtype = ""                 # "bfloat16" (autocast), "float32" or "float64" (a reference run); ""
                           # picks bfloat16 on CUDA, float32 elsewhere
compile = False            # torch.compile the model
seed = 1337                # fixes the initialization and the order of training batches
mfu_peak_flops = 0.0       # FLOP/s that MFU divides by; 0: telemetry.GPU_PEAK_FLOPS's for a GPU,
                           # else no MFU is printed

# {key: default}: every name above (not the imports)
DEFAULTS = {k: v for k, v in globals().items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}


# ---- the kinds of rule: (predicate, the allowed values in words); numbers must be finite -------

def at_least(lo):
    return (lambda v: math.isfinite(v) and v >= lo, f">= {lo}")


def above(lo):
    return (lambda v: math.isfinite(v) and v > lo, f"> {lo}")


def fraction(hi_open=True):
    return (lambda v: 0 <= v < 1 if hi_open else 0 <= v <= 1, f"in [0, 1{')' if hi_open else ']'}")


def one_of(*values):
    return (lambda v: v in values, "one of " + ", ".join(map(repr, values)))


def key_of(table, name):   # a key of one of model.py's tables
    return (lambda v: v in table, f"one of {', '.join(map(repr, table))} (model.{name})")


boolean = (lambda v: isinstance(v, bool), "True or False")
folder = (lambda v: v.strip() != "", "a folder name")
device_name = (lambda v: re.fullmatch(r"(cpu|cuda(:\d+)?|mps)?", v) is not None,
               "'' (pick one), 'cpu', 'cuda', 'cuda:N' or 'mps'")


# ---- the values each key allows: (predicate, the allowed range in words) ------------------------
TRAIN_RULES = {
    "out_dir": folder,
    "init_from": one_of("scratch", "resume"),
    "eval_interval": at_least(1), "eval_iters": at_least(1),
    "log_interval": at_least(1), "keep_checkpoints": at_least(1),
    "dataset": (lambda v: re.fullmatch(r"\w[\w.-]*", v) is not None, "a folder name under data/"),
    "batch_size": at_least(1), "gradient_accumulation_steps": at_least(1),
    "block_size": at_least(1), "vocab_pad": at_least(1),
    "n_layer": at_least(1), "n_head": at_least(1), "n_embd": at_least(1),
    "optimizer": one_of("adamw", "muon"),
    "learning_rate": above(0), "muon_lr": at_least(0), "muon_momentum": fraction(),
    "max_iters": at_least(0),
    "weight_decay": at_least(0), "sv_weight_decay": key_of(DECAY_POLICIES, "DECAY_POLICIES"),
    "sv_decay": (lambda v: v == -1 or math.isfinite(v) and v >= 0, ">= 0, or -1 (weight_decay)"),
    "train_tokens": at_least(0), "final_eval": boolean, "wandb_log": boolean,
    "wandb_project": (lambda v: v.strip() != "", "a project name"),
    "wandb_run_name": (lambda v: True, "any name ('': out_dir's)"),
    "beta1": fraction(), "beta2": fraction(), "grad_clip": at_least(0),
    "lr_schedule": one_of("cosine", "wsd", "constant"),
    "warmup_iters": at_least(0), "lr_decay_iters": at_least(0), "min_lr": at_least(0),
    "wsd_decay_frac": fraction(hi_open=False), "wsd_shape": one_of("linear", "1-sqrt"),
    "device": device_name,
    "dtype": one_of("", "float32", "bfloat16", "float64"), "mfu_peak_flops": at_least(0),
    "overwrite": boolean, "compile": boolean,
    "cpu_threads": at_least(0),
    "seed": (lambda v: 0 <= v < 2**63, "in [0, 2**63)"),   # numpy takes no negative seed
    # the model's keys (model.GPTConfig's fields); GPTConfig also checks how they combine
    "mlp_hidden": at_least(0), "rope_theta": above(0), "norm_eps": above(0),
    "tie_embeddings": boolean, "scale_vectors": boolean, "sv_hetero": boolean,
    "qk_norm": boolean, "post_norm": boolean,
    "sv_placement": key_of(PLACEMENTS, "PLACEMENTS"), "sv_reparam": key_of(REPARAMS, "REPARAMS"),
    "sv_dnp_width": key_of(DNP_WIDTHS, "DNP_WIDTHS"),
    "n_experts": at_least(0), "n_experts_active": at_least(1), "n_shared_experts": at_least(0),
    "moe_hidden": at_least(0), "moe_dense_layers": at_least(0),
    "moe_bias_rate": at_least(0),
}


def model_problem(c):
    """GPTConfig's sentence on a config's model keys, or None when it builds a model."""
    cls = model.GPTConfig   # read when checked, as a fork's test may replace it
    try:
        cls(**{f.name: c[f.name] for f in fields(cls) if f.name != "vocab_size"})
    except ValueError as e:   # flags that contradict each other (model.check_config)
        return str(e)


# rules on several keys at once: (ok(config), why(config) in one sentence)
PAIR_RULES = [
    (lambda c: model_problem(c) is None, model_problem),
    (lambda c: not c["wandb_log"] or importlib.util.find_spec("wandb"),
     lambda c: "wandb_log=True needs the wandb package: pip install wandb"),
]


def help_comments():
    """{key: the comment beside its default}, here and in model.GPTConfig: train.py's --help."""
    import model
    return key_comments(__file__, model.__file__)


@functools.lru_cache(maxsize=None)
def train_config(config, overrides=()):
    """train.py's config for a config file (a path from the repository's root) and a tuple of
    overrides, as train.py would see it, without running it: the defaults, then the file, then the
    overrides, checked by the rules (shared between callers: do not modify it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return configure(DEFAULTS, [os.path.join(root, config), *overrides], TRAIN_RULES, PAIR_RULES)
