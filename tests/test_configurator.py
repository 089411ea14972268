import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configurator import ConfigError, configure  # noqa: E402

DEFAULTS = {
    "out_dir": "out",
    "init_from": "scratch",
    "batch_size": 12,
    "max_iters": 5000,
    "learning_rate": 6e-4,
    "compile": True,
    "wandb_run_name": None,
}


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_returns_copy_and_defaults_untouched():
    defaults = dict(DEFAULTS)
    config = configure(defaults, ["--batch_size=4"])
    assert config["batch_size"] == 4 and defaults["batch_size"] == 12
    assert configure(defaults, []) == DEFAULTS and configure(defaults, []) is not defaults


def test_file_then_cli_and_later_file_wins(tmp_path):
    a = write(tmp_path / "a.py",
              "batch_size = 1\nmax_iters = 10\nimport math\n_private = 3\ndef f(): pass\n")
    b = write(tmp_path / "b.py", "batch_size = 2\n")
    config = configure(DEFAULTS, [a, b])
    assert config["batch_size"] == 2 and config["max_iters"] == 10
    # CLI overrides win even when written before the file
    config = configure(DEFAULTS, ["--batch_size=7", a, b])
    assert config["batch_size"] == 7 and config["max_iters"] == 10
    config = configure(DEFAULTS, [a, "--max_iters=3", "--max_iters=4"])
    assert config["max_iters"] == 4


def test_config_file_sees_its_own_file(tmp_path):
    p = write(tmp_path / "c.py", "import os\nout_dir = os.path.basename(__file__)\n")
    assert configure(DEFAULTS, [p])["out_dir"] == "c.py"


def test_int_accepted_for_float():
    lr = configure(DEFAULTS, ["--learning_rate=1"])["learning_rate"]
    assert lr == 1.0 and type(lr) is float
    assert configure(DEFAULTS, ["--learning_rate=3e-4"])["learning_rate"] == 3e-4


def test_int_accepted_for_float_in_file(tmp_path):
    p = write(tmp_path / "c.py", "learning_rate = 2\n")
    assert type(configure(DEFAULTS, [p])["learning_rate"]) is float


def test_none_default_takes_string_number_or_none():
    assert configure(DEFAULTS, ["--wandb_run_name=run1"])["wandb_run_name"] == "run1"
    assert configure(DEFAULTS, ["--wandb_run_name=42"])["wandb_run_name"] == 42
    assert configure(DEFAULTS, ["--wandb_run_name=None"])["wandb_run_name"] is None
    assert configure(DEFAULTS, ["--wandb_run_name=a b=c"])["wandb_run_name"] == "a b=c"


def test_value_containing_equals():
    config = configure(DEFAULTS, ["--out_dir=runs/a=b", "--init_from=x=y"])
    assert config["out_dir"] == "runs/a=b" and config["init_from"] == "x=y"


def test_str_default_keeps_raw_text():
    # a str default always takes the raw text: no literal_eval, so '123' and 'None' stay strings
    assert configure(DEFAULTS, ["--out_dir=123"])["out_dir"] == "123"
    assert configure(DEFAULTS, ["--out_dir=None"])["out_dir"] == "None"
    assert configure(DEFAULTS, ["--out_dir='q'"])["out_dir"] == "'q'"
    assert configure(DEFAULTS, ["--out_dir="])["out_dir"] == ""


def test_bool_parsing():
    assert configure(DEFAULTS, ["--compile=False"])["compile"] is False
    assert configure(DEFAULTS, ["--compile=True"])["compile"] is True
    for bad in ("0", "1", "false", "yes"):
        with pytest.raises(ConfigError, match="'compile'"):
            configure(DEFAULTS, [f"--compile={bad}"])


@pytest.mark.parametrize("arg, fragment", [
    ("--max_iters=3.5", "config key 'max_iters' expects int, got float 3.5 (from --max_iters=3.5)"),
    ("--max_iters=True", "expects int, got bool"),
    ("--max_iters=None", "expects int, got NoneType"),
    ("--max_iters=abc", "'max_iters' expects int, could not parse 'abc'"),
    ("--learning_rate=True", "'learning_rate' expects float, got bool"),
    ("--learning_rate=[1]", "'learning_rate' expects float, got list"),
])
def test_wrong_types_rejected(arg, fragment):
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, [arg])
    assert fragment in str(e.value)


def test_wrong_type_in_file(tmp_path):
    p = write(tmp_path / "c.py", "out_dir = 5\n")
    with pytest.raises(ConfigError, match=r"'out_dir' expects str, got int 5 \(in .*c\.py\)"):
        configure(DEFAULTS, [p])


def test_unknown_key_on_cli_names_closest():
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, ["--learnig_rate=1e-3"])
    assert "unknown config key 'learnig_rate'" in str(e.value)
    assert "did you mean 'learning_rate'?" in str(e.value)


def test_unknown_key_without_close_match():
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, ["--zzzzqqqq=1"])
    assert "zzzzqqqq" in str(e.value) and "did you mean" not in str(e.value)
    assert "--help" in str(e.value)


def test_unknown_key_in_file_names_file_and_closest(tmp_path):
    p = write(tmp_path / "foo.py", "batch_sise = 3\n")
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, [p])
    msg = str(e.value)
    assert "'batch_sise'" in msg and "foo.py" in msg and "did you mean 'batch_size'?" in msg


def test_a_bare_boolean_flag_means_true_and_a_bare_other_key_is_one_sentence(tmp_path):
    off = write(tmp_path / "off.py", "compile = False\n")
    assert configure({**DEFAULTS, "compile": False}, ["--compile"])["compile"] is True
    assert configure(DEFAULTS, [off, "--compile"])["compile"] is True   # after the files, as =True
    assert configure(DEFAULTS, ["--compile", "--compile=False"])["compile"] is False
    with pytest.raises(ConfigError, match=r"bad argument '--batch_size': use --batch_size=value "
                                          r"\(only a key whose default is True or False"):
        configure(DEFAULTS, ["--batch_size"])
    with pytest.raises(ConfigError, match="unknown config key 'compil'.*did you mean 'compile'"):
        configure(DEFAULTS, ["--compil"])
    with pytest.raises(ConfigError, match="use --wandb_run_name=value"):   # a None default too
        configure(DEFAULTS, ["--wandb_run_name"])


def test_bad_arguments():
    with pytest.raises(ConfigError, match="no_such_file.py"):
        configure(DEFAULTS, ["no_such_file.py"])
    with pytest.raises(ConfigError):
        configure(DEFAULTS, ["-x"])


def test_exception_in_config_file(tmp_path):
    p = write(tmp_path / "broken.py", "batch_size = 1 / 0\n")
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, [p])
    assert "broken.py" in str(e.value) and "ZeroDivisionError" in str(e.value)


def make_package(root, pkg, base_batch):
    write(root / pkg / "base.py", f"batch_size = {base_batch}\nmax_iters = 100\n")
    return write(root / pkg / "child.py", f"from {pkg}.base import *\nmax_iters = 200\n")


@pytest.mark.parametrize("base_batch", [3, 5])  # runs twice: must not reuse a cached config.base
def test_config_file_imports_another(tmp_path, monkeypatch, base_batch):
    make_package(tmp_path, "config", base_batch)
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    config = configure(DEFAULTS, ["config/child.py"])
    assert config["batch_size"] == base_batch and config["max_iters"] == 200
    assert not [m for m in set(sys.modules) - before if m.split(".")[0] == "config"]
    assert str(tmp_path) not in sys.path


def test_imports_work_from_another_cwd_and_after_file_changes(tmp_path, monkeypatch):
    child = make_package(tmp_path, "config", 7)
    monkeypatch.chdir(tmp_path / "config")  # a relative path that is not under the repo root
    assert configure(DEFAULTS, ["child.py"])["batch_size"] == 7
    (tmp_path / "config" / "base.py").write_text("batch_size = 8\n")
    assert configure(DEFAULTS, [child])["batch_size"] == 8


def test_help_lists_keys_and_exits(capsys):
    with pytest.raises(SystemExit) as e:
        configure(DEFAULTS, ["--batch_size=3", "--help"])
    assert e.value.code in (0, None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(DEFAULTS)
    assert [line.split("=")[0].lstrip("-") for line in lines] == sorted(DEFAULTS)
    assert any("batch_size" in l and "12" in l and "int" in l for l in lines)
    with pytest.raises(SystemExit):
        configure(DEFAULTS, ["-h"])


def test_validation_does_not_rely_on_assert():
    code = textwrap.dedent("""
        assert False, "asserts are on"
        from configurator import configure, ConfigError
        for argv in (["--learnig_rate=1"], ["--max_iters=3.5"], ["--compile=1"]):
            try:
                configure({"learning_rate": 0.1, "max_iters": 1, "compile": True}, argv)
            except ConfigError:
                continue
            raise SystemExit("no ConfigError for %r" % argv)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ---- train.py's allowed values: one sentence naming the key, its value and the range ------------
from config.defaults import TRAIN_RULES  # noqa: E402
from configurator import check_device  # noqa: E402

from config.defaults import DEFAULTS as TRAIN  # noqa: E402


def test_every_train_key_has_a_rule_and_every_rule_a_key():
    """Issue 20.13: a key without a rule took any value of its type (--seed=-1 wrote the lock and
    the metrics, then a traceback; --rope_theta=0 a NaN blamed on the learning rate). A new key of
    train.py (or a new field of model.GPTConfig) fails here until it gets one."""
    assert (sorted(set(TRAIN) - set(TRAIN_RULES)) == []
            and sorted(set(TRAIN_RULES) - set(TRAIN)) == [])


def test_every_rule_names_a_train_key_and_the_defaults_pass():
    assert configure(TRAIN, [], TRAIN_RULES) == TRAIN
    for good in ("--max_iters=0", "--grad_clip=0", "--weight_decay=0", "--device=cuda:1",
                 "--device=cpu", "--wsd_decay_frac=1", "--learning_rate=1e30", "--muon_lr=0.02",
                 "--dataset=web-v2.1", "--seed=0", f"--seed={2**63 - 1}", "--mlp_hidden=0",
                 "--sv_placement=dnp", "--sv_reparam=er"):
        configure(TRAIN, [good], TRAIN_RULES)
    ok = TRAIN_RULES["learning_rate"][0]   # a config file can set these; --key=value cannot
    assert not ok(float("nan")) and not ok(float("inf"))


@pytest.mark.parametrize("arg", ["--batch_size=0", "--block_size=0", "--eval_interval=0",
                                 "--log_interval=0", "--vocab_pad=0", "--learning_rate=-0.001",
                                 "--learning_rate=0", "--beta2=1.5", "--beta1=-0.1",
                                 "--weight_decay=-0.1", "--grad_clip=-1",
                                 "--gradient_accumulation_steps=0", "--eval_iters=0",
                                 "--device=tpu", "--device=cuda0", "--muon_lr=-1", "--min_lr=-1",
                                 "--keep_checkpoints=0", "--init_from=resum", "--dtype=float16",
                                 "--optimizer=sgd", "--out_dir=", "--n_head=0",
                                 "--warmup_iters=-1", "--max_iters=-1", "--dataset=..",
                                 "--dataset=a/b", "--seed=-1", "--seed=9223372036854775808",
                                 "--mlp_hidden=-1", "--rope_theta=0", "--norm_eps=-1",
                                 "--norm_eps=0", "--n_experts=-1", "--n_experts_active=0",
                                 "--moe_hidden=-32", "--moe_bias_rate=-1", "--moe_aux_weight=-0.1",
                                 "--sv_placement=bogus", "--sv_reparam=exp", "--sv_dnp_width=half",
                                 "--moe_router=top1", "--moe_balance=none",
                                 "--n_shared_experts=-1", "--moe_dense_layers=-1"])
def test_a_value_out_of_range_is_one_sentence_naming_key_value_and_range(arg):
    key, _, raw = arg[2:].partition("=")
    with pytest.raises(ConfigError) as e:
        configure(TRAIN, [arg], TRAIN_RULES)
    msg = str(e.value)
    assert msg.startswith(f"{key}=") and raw in msg and "must be" in msg and "\n" not in msg, msg


def test_a_device_this_machine_lacks_is_one_sentence():
    import torch
    check_device("cpu")
    check_device("")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            check_device("cuda")
    with pytest.raises(ConfigError, match="out of range"):
        check_device("tpu")


@pytest.mark.parametrize("arg,expects", [("--lr_decay_iters=abc", "expects int"),
                                         ("--muon_lr=abc", "expects float")])
def test_keys_with_a_sentinel_default_are_typed(arg, expects):
    """lr_decay_iters and muon_lr default to 0 ("use max_iters / learning_rate"), not None, which
    took anything and failed only after warmup or under Muon."""
    with pytest.raises(ConfigError, match=expects):
        configure(TRAIN, [arg], TRAIN_RULES)


@pytest.mark.slow   # two train.py subprocesses
def test_a_seed_out_of_range_stops_train_py_before_it_touches_the_run(workdir):
    """Issue 20.13: --seed=-1 wrote the lock and the metrics, then a traceback; with
    --overwrite=True it deleted the old run first. Now one sentence, and the run folder is as it
    was."""
    from helpers import train
    train(workdir, "--out_dir=out_seed", "--max_iters=2", "--eval_interval=2")
    before = {p.name: p.stat().st_mtime_ns for p in (workdir / "out_seed").iterdir()}
    p = train(workdir, "--out_dir=out_seed", "--seed=-1", "--overwrite=True", check=False)
    assert p.returncode == 1 and p.stderr.strip() == (
        "error: seed=-1 is out of range: it must be in [0, 2**63)"), p.stderr
    assert {q.name: q.stat().st_mtime_ns for q in (workdir / "out_seed").iterdir()} == before

