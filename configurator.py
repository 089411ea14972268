"""Config files and --key=value overrides for train.py's module-level defaults.

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

Positional args are Python config files, applied in order (later wins); every
--key=value override is applied after all files. Keys must already exist in the
defaults and values must match the default's type (an int is accepted for a
float; a None default accepts anything). A str default takes the raw text, so
--out_dir=123 and --init_from=None stay strings. A key whose default is a bool may
stand alone: --compile means --compile=True (write --compile=False to turn it off).
-h/--help lists the keys.
Config files are Python and are executed: run only config files you trust.

    config = configure({k: globals()[k] for k in config_keys}, sys.argv[1:], TRAIN_RULES)

TRAIN_RULES is the one table of the values train.py allows, checked before it writes anything.
"""
import ast
import math
import difflib
import os
import re
import runpy
import sys
import types

from model import DECAY_POLICIES


class ConfigError(ValueError):
    """A bad config file, unknown key or badly typed value."""


def _known(key, defaults, source):
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "run with --help to list keys"
        raise ConfigError(f"unknown config key {key!r} ({source}); {hint}")


def _check(key, value, defaults, source):
    """Return value (int -> float where the default is float) or raise ConfigError."""
    _known(key, defaults, source)
    default = defaults[key]
    if default is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        allowed = (int, float) if isinstance(default, float) else int
        ok = isinstance(value, allowed) and not isinstance(value, bool)
        value = float(value) if ok and isinstance(default, float) else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"config key {key!r} expects {type(default).__name__}, "
                          f"got {type(value).__name__} {value!r} ({source})")
    return value


def _run_file(path):
    """Execute a config file; return the public, non-module, non-callable names it defines."""
    path_before, modules_before = list(sys.path), set(sys.modules)
    package = os.path.basename(os.path.dirname(os.path.abspath(path)))
    # so that `from config.base import *` works whatever the cwd is
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(path))))
    try:
        namespace = runpy.run_path(path, run_name="__config__")
    except Exception as e:
        raise ConfigError(f"error in config file {path}: {type(e).__name__}: {e}") from e
    finally:
        sys.path[:] = path_before
        # forget config modules it imported, so a later call re-reads them from disk
        for name in set(sys.modules) - modules_before:
            if name == package or name.startswith(package + "."):
                del sys.modules[name]
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType) and not callable(v)}


def _parse(key, raw, default):
    if isinstance(default, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except Exception:
        if default is None:
            return raw
        raise ConfigError(f"config key {key!r} expects {type(default).__name__}, "
                          f"could not parse {raw!r} (from --{key}={raw})") from None


def configure(defaults: dict, argv: list, rules=None) -> dict:
    """Return a copy of defaults updated by each config file in argv (positional
    args, in order) and then by each --key=value; each value then meets its rule."""
    if "-h" in argv or "--help" in argv:
        for k in sorted(defaults):
            print(f"--{k}={defaults[k]!r}  ({type(defaults[k]).__name__})")
        raise SystemExit(0)
    files, overrides = [], []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, raw = arg[2:].partition("=")
            if not eq and isinstance(defaults.get(key), bool):
                raw = "True"   # a bare --compile means --compile=True, as argparse's store_true
            elif not eq:
                _known(key, defaults, f"from {arg}")
                raise ConfigError(f"bad argument {arg!r}: use --{key}=value (only a key whose "
                                  "default is True or False may stand alone)")
            overrides.append((key, raw, arg))
        elif os.path.isfile(arg):
            files.append(arg)
        else:
            raise ConfigError(f"config file not found: {arg!r}")
    config = dict(defaults)
    for path in files:
        for key, value in _run_file(path).items():
            config[key] = _check(key, value, defaults, f"in {path}")
    for key, raw, arg in overrides:
        _known(key, defaults, f"from {arg}")
        config[key] = _check(key, _parse(key, raw, defaults[key]), defaults, f"from {arg}")
    for key, (ok, allowed) in (rules or {}).items():
        if key in config and not ok(config[key]):
            raise ConfigError(f"{key}={config[key]!r} is out of range: it must be {allowed}")
    return config


# ---- allowed values ------------------------------------------------------------------------------
# a rule is (predicate, the allowed range in words); numbers must also be finite

def at_least(lo):
    return (lambda v: math.isfinite(v) and v >= lo, f">= {lo}")


def above(lo):
    return (lambda v: math.isfinite(v) and v > lo, f"> {lo}")


def fraction(hi_open=True):
    return (lambda v: 0 <= v < 1 if hi_open else 0 <= v <= 1,
            "in [0, 1)" if hi_open else "in [0, 1]")


def one_of(*values):
    return (lambda v: v in values, "one of " + ", ".join(map(repr, values)))


boolean = (lambda v: isinstance(v, bool), "True or False")


def model_table(name):
    """A key of one of model.py's tables (PLACEMENTS, REPARAMS, DNP_WIDTHS), the one list."""
    def ok(v):
        import model   # here: prepare_data.py need not import torch to use this module
        return v in getattr(model, name)
    return (ok, f"a key of model.{name}")


DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps)?")
DATASET = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")   # one folder under data/: no "..", no "/"

TRAIN_RULES = {
    "out_dir": (lambda v: v.strip() != "", "a folder name"),
    "init_from": one_of("scratch", "resume"),
    "eval_interval": at_least(1), "eval_iters": at_least(1),
    "log_interval": at_least(1), "keep_checkpoints": at_least(1),
    "dataset": (lambda v: DATASET.fullmatch(v) is not None,
                "one folder name under data/ (letters, digits, _ . -)"),
    "batch_size": at_least(1), "gradient_accumulation_steps": at_least(1),
    "block_size": at_least(1), "vocab_pad": at_least(1),
    "n_layer": at_least(1), "n_head": at_least(1), "n_embd": at_least(1),
    "optimizer": one_of("adamw", "muon"),
    "learning_rate": above(0), "muon_lr": at_least(0), "muon_momentum": fraction(),
    "max_iters": at_least(0),
    "weight_decay": at_least(0), "sv_weight_decay": one_of(*DECAY_POLICIES),
    "sv_decay": (lambda v: v == -1 or math.isfinite(v) and v >= 0, ">= 0, or -1 (weight_decay)"),
    "train_tokens": at_least(0), "final_eval": boolean, "wandb_log": boolean,
    "wandb_project": (lambda v: v.strip() != "", "a project name"),
    "wandb_run_name": (lambda v: True, "any name ('': out_dir's)"),
    "beta1": fraction(), "beta2": fraction(), "grad_clip": at_least(0),
    "lr_schedule": one_of("cosine", "wsd", "constant"),
    "warmup_iters": at_least(0), "lr_decay_iters": at_least(0), "min_lr": at_least(0),
    "wsd_decay_frac": fraction(hi_open=False), "wsd_shape": one_of("linear", "1-sqrt"),
    "device": (lambda v: DEVICE.fullmatch(v) is not None,
               "'' (pick one), 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    "dtype": one_of("", "float32", "bfloat16", "float64"), "mfu_peak_flops": at_least(0),
    "overwrite": boolean, "resume_fallback": boolean, "compile": boolean,
    "seed": (lambda v: 0 <= v < 2**63, "in [0, 2**63)"),   # numpy takes no negative seed
    # the model's keys (model.GPTConfig's fields); GPTConfig also checks how they combine
    "mlp_hidden": at_least(0), "rope_theta": above(0), "norm_eps": above(0),
    "tie_embeddings": boolean, "scale_vectors": boolean, "sv_hetero": boolean,
    "qk_norm": boolean, "post_norm": boolean,
    "sv_placement": model_table("PLACEMENTS"), "sv_reparam": model_table("REPARAMS"),
    "sv_dnp_width": model_table("DNP_WIDTHS"),
    "n_experts": at_least(0), "n_experts_active": at_least(1), "n_shared_experts": at_least(0),
    "moe_hidden": at_least(0), "moe_dense_layers": at_least(0),
    "moe_router": one_of("softmax", "sigmoid"), "moe_balance": one_of("bias", "aux"),
    "moe_bias_rate": at_least(0), "moe_aux_weight": at_least(0),
}

# sample.py's: temperature 0 is greedy decoding, top_k 0 keeps every token
SAMPLE_RULES = {"out_dir": TRAIN_RULES["out_dir"], "num_samples": at_least(1),
                "max_new_tokens": at_least(1), "temperature": at_least(0), "top_k": at_least(0),
                "device": TRAIN_RULES["device"]}


def differing_configs(configs):
    """Under DDP every process must run one configuration (a config file that reads RANK would hang
    the job at max_iters or train silently wrong): the sentence that says which keys differ, or
    None. `configs`: the config of each process, by rank."""
    first = configs[0]
    differ = [k for k in first if any(c.get(k) != first[k] for c in configs)]
    if not differ:
        return None
    by_rank = ", ".join(repr(c.get(differ[0])) for c in configs)
    return (f"the {len(configs)} processes run different configurations ({', '.join(differ)}; "
            f"{differ[0]}={by_rank} by rank): a config must not depend on the process; give all "
            "the same one")


def check_device(device):
    """'' or a device this machine has, else ConfigError: --device=cuda on a machine without CUDA is
    one sentence."""
    if DEVICE.fullmatch(device) is None:
        raise ConfigError(f"device={device!r} is out of range: it must be "
                          f"{TRAIN_RULES['device'][1]}")
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but this machine has no CUDA device torch can use: "
                          "use --device=cpu (or leave it empty)")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"device={device!r} but this machine has {torch.cuda.device_count()} "
                          "CUDA device(s)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device='mps' but this machine has no MPS device torch can use: "
                          "use --device=cpu (or leave it empty)")
