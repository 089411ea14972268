"""Config files and --key=value overrides for a script's defaults (train.py's: config/defaults.py).

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

Positional args are Python config files, applied in order (later wins), then every --key=value.
A key must exist in the defaults and a value have its default's type (an int passes for a float,
anything for a None default); a str default takes the raw text (--out_dir=123 stays a string); a
bool key may stand alone (--compile is --compile=True). Config files are executed: run only those
you trust. This module is the parser and the kinds of rule (at_least, one_of, key_of, ...), and
imports nothing of the project.
"""
import ast
import difflib
import io
import math
import os
import re
import runpy
import sys
import textwrap
import tokenize
import types


class ConfigError(ValueError):
    """A bad config file, unknown key or badly typed value."""


def _known(key, defaults, source):
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "run with --help to list keys"
        raise ConfigError(f"unknown config key {key!r} ({source}); {hint}")


def _check(key, value, defaults, source):
    """value (an int made a float where the default is a float), or ConfigError."""
    _known(key, defaults, source)
    default = defaults[key]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # a bool is an int, but neither takes the other's place
    if default is None or (isinstance(value, type(default))
                           and isinstance(value, bool) == isinstance(default, bool)):
        return value
    raise ConfigError(f"config key {key!r} expects {type(default).__name__}, "
                      f"got {type(value).__name__} {value!r} ({source})")


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
    try:   # a str default takes the raw text
        return raw if isinstance(default, str) else ast.literal_eval(raw)
    except Exception:
        if default is None:
            return raw
        raise ConfigError(f"config key {key!r} expects {type(default).__name__}, "
                          f"could not parse {raw!r} (from --{key}={raw})") from None


def configure(defaults: dict, argv: list, rules=None, pair_rules=(), usage="", comments=None):
    """Return a copy of defaults updated by each config file in argv (positional args, in order)
    and then by each --key=value; each value then meets its rule, and the config every rule on
    several keys (pair_rules: (ok(config), why(config))). -h/--help prints `usage` (a script's
    docstring), then a line per key: its default, `comments` (a dict, or a function returning
    one: key_comments) and the values its rule allows."""
    if "-h" in argv or "--help" in argv:
        comments = comments() if callable(comments) else comments or {}
        print(help_text(defaults, rules or {}, usage, comments))
        raise SystemExit(0)
    files, overrides = [], []
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, eq, raw = arg[2:].partition("=")
            if not eq and isinstance(defaults.get(key), bool):
                word = argv[i + 1] if i + 1 < len(argv) else ""
                # `--compile false` would turn compile on, and take `false` for a config file
                if word.lower() in ("true", "false", "yes", "no", "on", "off", "0", "1"):
                    raise ConfigError(f"bad arguments '{arg} {word}': a bare {arg} means "
                                      f"{arg}=True; write {arg}={word.capitalize()}"
                                      .replace("=0", "=False").replace("=1", "=True"))
                raw = "True"   # a bare --compile means --compile=True, as argparse's store_true
            elif not eq:
                _known(key, defaults, f"from {arg}")
                raise ConfigError(f"bad argument {arg!r}: use --{key}=value (only a key whose "
                                  "default is True or False may stand alone)")
            overrides.append((key, raw, arg))
        elif os.path.isfile(arg):
            files.append(arg)
        else:
            raise ConfigError(f"config file not found: {arg!r}{nearest_file(arg)}")
    config = dict(defaults)
    for path in files:
        for key, value in _run_file(path).items():
            config[key] = _check(key, value, defaults, f"in {path}")
    for key, raw, arg in overrides:   # an unknown key parses as for a None default, then fails
        config[key] = _check(key, _parse(key, raw, defaults.get(key)), defaults, f"from {arg}")
    for key, (ok, allowed) in (rules or {}).items():
        if key in config and not ok(config[key]):
            raise ConfigError(f"{key}={config[key]!r} is out of range: it must be {allowed}")
    for ok, why in pair_rules:
        if not ok(config):
            raise ConfigError(why(config))
    return config


def default_device():
    """cuda, then mps, then cpu: what train.py, sample.py and bench.py use unless told otherwise."""
    import torch
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def keep_freed_memory():
    """Make glibc keep freed memory for the next allocation. By default it hands a freed block of
    more than 128 KB back to the OS, then faults it in again, zeroed, page by page: on a CPU,
    where most activations are such blocks, a step of unified_char paid 5,300 page faults and
    about 17 ms of kernel time (tools/bench.py's "faults/step"). Elsewhere than glibc: nothing."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # macOS, Windows, musl: their allocators differ
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    # blocks up to glibc's largest mmap threshold (32 MB) come from the heap, which is not
    # trimmed below 1 GB of free space at its top
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))


def nearest_file(path):
    """"; did you mean 'config/shakespeare_char.py'?" for the .py file beside `path` closest to
    it, or ""."""
    folder = os.path.dirname(path)
    try:
        names = [os.path.join(folder, n) for n in os.listdir(folder or ".") if n.endswith(".py")]
    except OSError:
        return ""
    close = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def help_text(defaults, rules, usage, comments):
    """--help: the usage, then per key its default, what it is and the values it allows."""
    lines = [usage.strip("\n"), "",
             "Keys, each --key=value with its default (a True/False key may stand alone: "
             "--compile); config", "files come first, then the --key=value overrides:"]
    for k, v in defaults.items():
        text = " ".join(filter(None, (comments.get(k, ""), f"[{rules[k][1]}]" if k in rules
                                      else f"[{type(v).__name__}]")))
        plain = isinstance(v, str) and v.isprintable() and v.strip() == v != ""
        shown = f"  --{k}={v if plain else repr(v)}"   # a str that would not read back: its repr
        lines += textwrap.wrap(text, 99, initial_indent=shown.ljust(30) + " ",
                               subsequent_indent=" " * 31)
    return "\n".join(lines)


def key_comments(*paths):
    """{name: its comment} for each `name = value` or `name: type = value` of the source files
    `paths` (the first file with the name wins): the comment after it and the comment lines that
    continue it, or else the comment lines just above it."""
    out = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"( {0,4})(\w+)\s*(?::[^=]*)?=[^=]", line)
            if not m or m.group(2) in out:
                continue
            comment = [c for c in [comment_of(line)] if c]
            j = i + 1
            while comment and j < len(lines) and re.match(r"\s{8,}#", lines[j]):
                comment.append(lines[j].strip()[1:].strip())
                j += 1
            k = i - 1   # a block of comments above, at the name's indentation, not a ---- header
            while not comment and k >= 0 and lines[k].startswith(m.group(1) + "#") \
                    and not lines[k].strip().startswith("# ----"):
                k -= 1
            out[m.group(2)] = " ".join(comment or [x.strip()[1:].strip() for x in lines[k + 1:i]])
    return out


def comment_of(line):
    """The comment that ends a line of code, or None (a # inside a string is not one)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return next((t.string[1:].strip() for t in tokens if t.type == tokenize.COMMENT), None)


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


def key_of(table, name):
    """A key of one of model.py's tables (PLACEMENTS, REPARAMS, ...), read when checked: a fork's
    new entry is allowed as soon as it is in the table."""
    class Keys:
        def __str__(self):
            return f"one of {', '.join(map(repr, table))} (model.{name})"
    return (lambda v: v in table, Keys())


DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps)?")

# a string that names a folder, and one that names a device
folder = (lambda v: v.strip() != "", "a folder name")
device_name = (lambda v: DEVICE.fullmatch(v) is not None,
               "'' (pick one), 'cpu', 'cuda', 'cuda:N' or 'mps'")


def differing_configs(configs):
    """Under DDP every process must run one configuration (a config file that reads RANK would hang
    the job at max_iters or train silently wrong): the sentence that says which keys differ, or
    None. `configs`: the config of each process, by rank."""
    differ = [k for k in configs[0] if any(c.get(k) != configs[0][k] for c in configs)]
    if differ:
        by_rank = ", ".join(repr(c.get(differ[0])) for c in configs)
        return (f"the {len(configs)} processes run different configurations ({', '.join(differ)}; "
                f"{differ[0]}={by_rank} by rank): a config must not depend on the process; give "
                "all the same one")


def check_device(device):
    """'' or a device this machine has, else ConfigError: --device=cuda on a machine without CUDA is
    one sentence."""
    if DEVICE.fullmatch(device) is None:
        raise ConfigError(f"device={device!r} is out of range: it must be {device_name[1]}")
    import torch
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    kind = device.partition(":")[0]
    if kind in available and not available[kind]():
        raise ConfigError(f"device={device!r} but this machine has no {kind.upper()} device torch "
                          "can use: use --device=cpu (or leave it empty)")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"device={device!r} but this machine has {torch.cuda.device_count()} "
                          "CUDA device(s)")
