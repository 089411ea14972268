"""
Config files, then --key=value overrides, for a script's defaults (train.py's: config/defaults.py):

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

Files are Python, executed in order (run only those you trust), then every --key=value. A key must
be a default's, a value of its type (an int passes for a float; a str key takes the raw text) and
within its rule (config/defaults.py); a True/False key may stand alone (--compile).
"""
import ast
import difflib
import os
import re
import runpy
import textwrap
import types


class ConfigError(SystemExit):
    """A bad config file, key or value: a SystemExit, so uncaught it ends a script in a sentence."""
    def __init__(self, sentence):
        super().__init__(f"error: {sentence}")


def run_file(path):
    """Execute a config file; the public names it defines (not modules, classes or functions)."""
    if not os.path.isfile(path):
        near = nearest_config(path)
        raise ConfigError(f"config file not found: {path!r}" + (f"; did you mean {near!r}?"
                                                                 if near else ""))
    try:
        namespace = runpy.run_path(path, run_name="__config__")
    except Exception as e:
        raise ConfigError(f"error in config file {path}: {type(e).__name__}: {e}") from e
    return {k: v for k, v in namespace.items() if not k.startswith("_")
            and not isinstance(v, types.ModuleType) and not callable(v)}


def nearest_config(path):
    """The .py file in the repository's config/ (or beside `path`) whose name is closest to path's
    (shakespeare_char, config/shakespear_char.py: config/shakespeare_char.py), or None."""
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
    near = {}
    for folder in filter(os.path.isdir, (os.path.relpath(repo), os.path.dirname(path))):
        near.update({n[:-3]: os.path.join(folder, n) for n in sorted(os.listdir(folder))
                     if n.endswith(".py") and not n.startswith("_")})   # beside `path` wins a tie
    close = difflib.get_close_matches(os.path.basename(path).removesuffix(".py"), near, n=1)
    return near[close[0]] if close else None


def typed(key, value, defaults, source):
    """value, an int made a float for a float default; one sentence for another type or key."""
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "run with --help to list the keys"
        raise ConfigError(f"unknown config key {key!r} ({source}); {hint}")
    default = defaults[key]
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if default is not None and type(value) is not type(default):   # a bool is no int here
        raise ConfigError(f"config key {key!r} expects {type(default).__name__}, got "
                          f"{type(value).__name__} {value!r} ({source})")
    return value


def parse(arg, defaults):
    """(key, value) of one --key=value; a bare --key is True for a True/False key."""
    key, eq, raw = arg[2:].partition("=")
    default = defaults.get(key)
    if not eq and not isinstance(default, bool):
        if key not in defaults:
            typed(key, None, defaults, f"from {arg}")   # an unknown key says so first
        raise ConfigError(f"bad argument {arg!r}: use --{key}=value (only a True/False key may "
                          "stand alone)")
    try:   # a str key takes the raw text
        return key, True if not eq else raw if isinstance(default, str) else ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        if default is None:   # anything, or an unknown key: refused as one next
            return key, raw
        raise ConfigError(f"config key {key!r} could not parse {raw!r} (from {arg})") from None


def configure(defaults, argv, rules=None, pair_rules=(), usage="", comments=None):
    """defaults updated by each config file of argv (in order), then by each --key=value; each
    value checked by its rule, the whole by pair_rules ((ok(config), why(config))). -h/--help: the
    usage, then each key with its default, its comment (comments() gives them) and its rule."""
    if "-h" in argv or "--help" in argv:
        print(help_text(defaults, rules or {}, usage, comments() if comments else {}))
        raise SystemExit(0)
    for arg, word in zip(argv, argv[1:]):   # `--compile false` would read `false` as a file
        if isinstance(defaults.get(arg[2:]), bool) and word.lower() in ("true", "false", "0", "1"):
            raise ConfigError(f"bad arguments '{arg} {word}': a bare {arg} means {arg}=True; "
                              f"write {arg}={word.capitalize()}")
    config = dict(defaults)
    for path in [a for a in argv if not a.startswith("--")]:
        config.update({k: typed(k, v, defaults, f"in {path}") for k, v in run_file(path).items()})
    for key, value, arg in [(*parse(a, defaults), a) for a in argv if a.startswith("--")]:
        config[key] = typed(key, value, defaults, f"from {arg}")
    for key, (ok, allowed) in (rules or {}).items():
        if key in config and not ok(config[key]):
            raise ConfigError(f"{key}={config[key]!r} is out of range: it must be {allowed}")
    for ok, why in pair_rules:
        if not ok(config):
            raise ConfigError(why(config))
    return config


def help_text(defaults, rules, usage, comments):
    lines = [usage.strip("\n"), "", "Keys, with their defaults (config files first, then "
             "--key=value; a True/False key may stand alone):"]
    for k, v in defaults.items():
        plain = isinstance(v, str) and v.isprintable() and v.strip() == v != ""
        text = f"{comments.get(k, '')} [{rules[k][1] if k in rules else type(v).__name__}]"
        lines += textwrap.wrap(text.strip(), 99, subsequent_indent=" " * 31, initial_indent=(
            f"  --{k}={v if plain else repr(v)}".ljust(30) + " "))
    return "\n".join(lines)


def key_comments(*paths):
    """{name: its comment} of each `name = value` or `name: type = value` in the files `paths`
    (the first wins): the comment after it, with the comment lines under it that continue it."""
    out = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r" {0,4}(\w+)\s*(?::[^=]*)?=[^=][^#]*(#\s?(.*))?", line)
            if not m or m.group(1) in out:
                continue
            said, j = [m.group(3)] if m.group(2) else [], i + 1
            while said and j < len(lines) and re.match(r"\s{8,}#", lines[j]):   # continued
                said, j = said + [lines[j].strip()[1:].strip()], j + 1
            out[m.group(1)] = " ".join(said)
    return out
