"""configurator.py: config files, then --key=value, each value typed and checked by its rule
(config/defaults.py's for train.py); --help that teaches; every mistake one sentence."""
import os

import pytest

from config.defaults import DEFAULTS as TRAIN, PAIR_RULES, TRAIN_RULES, help_comments
from configurator import ConfigError, configure
from helpers import ROOT

DEFAULTS = {"out_dir": "out", "init_from": "scratch", "batch_size": 12, "max_iters": 5000,
            "learning_rate": 6e-4, "compile": True, "wandb_run_name": None}
BAD_FILES = {"type.py": "out_dir = 5\n", "key.py": "batch_sise = 3\n",
             "raises.py": "batch_size = 1 / 0\n"}


@pytest.mark.parametrize("arg, value", [
    ("--learning_rate=1", 1.0), ("--learning_rate=3e-4", 3e-4), ("--wandb_run_name=run1", "run1"),
    ("--wandb_run_name=42", 42), ("--wandb_run_name=None", None),   # a None default: anything
    # a str default takes the raw text: '123' and 'None' stay strings
    ("--out_dir=runs/a=b", "runs/a=b"), ("--out_dir=123", "123"), ("--out_dir=None", "None"),
    ("--out_dir=", ""), ("--compile=False", False),
    ("--compile", True)])   # a bare boolean is True, as argparse's store_true
def test_a_value_is_typed_as_its_default(arg, value):
    key = arg[2:].partition("=")[0]
    config = configure({**DEFAULTS, "compile": False}, [arg])
    assert config[key] == value and type(config[key]) is type(value)


@pytest.mark.parametrize("argv, message", [
    (["--max_iters=3.5"], "config key 'max_iters' expects int, got float 3.5 (from --max_iters="),
    (["--max_iters=True"], "expects int, got bool"), (["--max_iters=None"], "got NoneType"),
    (["--max_iters=abc"], "config key 'max_iters' could not parse 'abc'"),
    (["--learning_rate=[1]"], "expects float, got list"), (["--compile=1"], "bool, got int"),
    (["--learnig_rate=1e-3"], "unknown config key 'learnig_rate' (from --learnig_rate=1e-3); did "
                              "you mean 'learning_rate'?"),
    (["--zzzzqqqq=1"], "unknown config key 'zzzzqqqq' (from --zzzzqqqq=1); run with --help"),
    (["--compil"], "did you mean 'compile'?"),
    (["--batch_size"], "bad argument '--batch_size': use --batch_size=value (only a True/False "
                       "key may stand alone)"),
    (["--wandb_run_name"], "use --wandb_run_name=value"),
    # `false` would be taken for a config file (and run if one existed), compile would stay on
    (["--compile", "false"], "bad arguments '--compile false': a bare --compile means "
                             "--compile=True; write --compile=False"),
    (["no_such_file.py"], "config file not found: 'no_such_file.py'"), (["-x"], "not found"),
    # a mistake in a config file names the file (BAD_FILES)
    (["config/type.py"], "config key 'out_dir' expects str, got int 5 (in config/type.py)"),
    (["config/key.py"], "'batch_sise' (in config/key.py); did you mean 'batch_size'"),
    (["config/raises.py"], "error in config file config/raises.py: ZeroDivisionError")])
def test_a_mistake_on_the_command_line_or_in_a_file_is_one_sentence(argv, message, tmp_path,
                                                                    monkeypatch):
    (tmp_path / "config").mkdir()
    for name, text in {**BAD_FILES, "shakespeare_char.py": ""}.items():   # and the one near
        (tmp_path / "config" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, argv)
    assert e.value.code.startswith("error: ") and message in e.value.code, e.value.code
    assert "\n" not in e.value.code


@pytest.mark.parametrize("where, arg, near", [
    ("repo", "config/shakespear_char.py", "config/shakespeare_char.py"),
    ("repo", "shakespeare_char", "config/shakespeare_char.py"),   # nanoGPT's habit: a bare name
    ("repo", "shakespeare_char.py", "config/shakespeare_char.py"),
    ("elsewhere", "config/shakespeare_char.py", "REPO/config/shakespeare_char.py"),   # from above
    ("elsewhere", "mine/tiny_rn.py", "mine/tiny_run.py"),   # a folder of one's own
    ("repo", "config/zzqqxx.py", None)])
def test_a_config_file_not_there_names_the_nearest_one(where, arg, near, tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tiny_run.py").write_text("")
    monkeypatch.chdir(ROOT if where == "repo" else tmp_path)
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, [arg])
    near = near and near.replace("REPO", os.path.relpath(ROOT))
    assert e.value.code == f"error: config file not found: {arg!r}" + (
        f"; did you mean {near!r}?" if near else ""), e.value.code


def test_files_in_order_then_the_command_line(tmp_path):
    (tmp_path / "a.py").write_text(   # a config file may import the repository's
        "from config.shakespeare_char import *\nmax_iters = 10\nimport math\n_private = 3\n"
        "def f(): pass\nout_dir = math.__name__\nlearning_rate = 2\n")
    (tmp_path / "b.py").write_text("batch_size = 2\n")
    a, b = str(tmp_path / "a.py"), str(tmp_path / "b.py")
    config = configure(TRAIN, ["--batch_size=7", a, b, "--max_iters=3", "--max_iters=4"])
    assert (config["batch_size"], config["max_iters"], config["out_dir"]) == (7, 4, "math")
    config = configure(TRAIN, [a])
    assert (config["n_layer"], config["batch_size"], config["learning_rate"]) == (4, 12, 2.0)
    assert type(config["learning_rate"]) is float and configure(TRAIN, [a, b])["batch_size"] == 2


def test_help_shows_the_usage_and_a_described_line_per_key_with_its_values(capsys):
    """Each key with what it is and the values it takes, not a bare `--key=default (type)`."""
    with pytest.raises(SystemExit) as e:
        configure(TRAIN, ["--batch_size=3", "--help"], TRAIN_RULES, usage="usage: train.py X",
                  comments=help_comments)
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: train.py X\n")
    for line in ("--batch_size=12 sequences per micro-step and process [>= 1]",
                 "--sv_placement=pre DP, DNP: vectors on both sides of the maps (paper 3.2) [one "
                 "of 'pre', 'dp', 'dnp', 'dnp_novec'", "--n_layer=12 blocks [>= 1]"):
        assert line in " ".join(out.split()), out
    comments = help_comments()
    assert not [k for k in TRAIN if not comments.get(k)], "every key says what it is"


# ---- train.py's allowed values -------------------------------------------------------------------

def test_every_train_key_has_a_rule_its_default_passes_and_the_pair_rules_refuse(monkeypatch):
    """A key without a rule would take any value of its type (--seed=-1: a traceback after the
    lock is written). wandb_log=True without wandb: refused before anything is written."""
    assert not TRAIN.keys() - TRAIN_RULES.keys(), (
        f"{sorted(TRAIN.keys() - TRAIN_RULES.keys())} have no rule: give each its allowed values "
        "in config/defaults.py's TRAIN_RULES (e.g. boolean, at_least(0), key_of(table))")
    assert not TRAIN_RULES.keys() - TRAIN.keys(), (
        f"TRAIN_RULES has rules for {sorted(TRAIN_RULES.keys() - TRAIN.keys())}, which are no "
        "keys: remove them, or add the key with its default to config/defaults.py")
    assert configure(TRAIN, [], TRAIN_RULES, PAIR_RULES) == TRAIN
    for good in ("--max_iters=0", "--grad_clip=0", "--device=cuda:1", "--wsd_decay_frac=1",
                 "--dataset=web-v2.1", "--seed=0", f"--seed={2**63 - 1}", "--sv_reparam=er",
                 "--sv_placement=dnp", "--sv_weight_decay=owd", "--learning_rate=1e30",
                 "--sv_reparam=er --sv_weight_decay=iwd"):   # decay leads ER's g toward 1
        configure(TRAIN, good.split(), TRAIN_RULES, PAIR_RULES)
    ok = TRAIN_RULES["learning_rate"][0]   # a config file can set these; --key=value cannot
    assert not ok(float("nan")) and not ok(float("inf"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)   # wandb not installed
    with pytest.raises(ConfigError, match="^error: wandb_log=True needs the wandb package: pip "
                                          "install wandb$"):
        configure(TRAIN, ["--wandb_log=True"], TRAIN_RULES, PAIR_RULES)


TABLE_KEYS = {   # the choices, not only the table's name
    "--sv_placement=dnpp": "'pre', 'dp', 'dnp', 'dnp_novec'",
    "--sv_reparam=exp": "'none', 'or', 'er'", "--sv_dnp_width=half": "'full', 'head'",
    "--sv_weight_decay=iwdd": "'none', 'iwd', 'iwd_blocks', 'all', 'owd'"}


@pytest.mark.parametrize("arg", [
    "--batch_size=0", "--block_size=0", "--eval_interval=0", "--log_interval=0", "--vocab_pad=0",
    "--learning_rate=-0.001", "--learning_rate=0", "--beta2=1.5", "--beta1=-0.1",
    "--weight_decay=-0.1", "--grad_clip=-1", "--gradient_accumulation_steps=0", "--eval_iters=0",
    "--device=tpu", "--device=cuda0", "--muon_lr=-1", "--min_lr=-1", "--keep_checkpoints=0",
    "--init_from=resum", "--dtype=float16", "--optimizer=sgd", "--out_dir=", "--n_head=0",
    "--warmup_iters=-1", "--max_iters=-1", "--dataset=..", "--dataset=a/b", "--seed=-1",
    "--seed=9223372036854775808", "--mlp_hidden=-1", "--rope_theta=0", "--norm_eps=0",
    "--n_experts=-1", "--n_experts_active=0", "--moe_hidden=-32", "--moe_bias_rate=-1",
    "--n_shared_experts=-1", "--moe_dense_layers=-1", "--lr_decay_iters=-1", "--sv_decay=-2",
    *TABLE_KEYS])
def test_a_value_out_of_range_is_one_sentence_naming_key_value_and_range(arg):
    key, _, raw = arg[2:].partition("=")
    with pytest.raises(ConfigError) as e:
        configure(TRAIN, [arg], TRAIN_RULES)
    msg = e.value.code
    assert msg.startswith(f"error: {key}=") and raw in msg and "must be" in msg, msg
    assert "\n" not in msg
    assert arg not in TABLE_KEYS or f"it must be one of {TABLE_KEYS[arg]}" in msg, msg
