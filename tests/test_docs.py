"""The commands the docs show still exist: every `python ...` and `torchrun ...` line in a code
block of README.md and study/README.md names a script or module that answers --help, every config
file it names exists, and every --key it passes is one that command lists in its --help. A command
left stale by a move or a rename fails here."""
import contextlib
import io
import os
import re
import runpy
import shlex
import sys
import warnings

import pytest

from conftest import ROOT

DOCS = ("README.md", os.path.join("study", "README.md"))


def commands(doc):
    """The python / torchrun command lines of the doc's code blocks, continuations joined."""
    code, inside = [], False
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                inside = not inside
            elif inside:
                code.append(line)
    lines = "".join(code).replace("\\\n", " ").splitlines()
    found = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words and words[0] in ("python", "torchrun"):
            found.append(words)
    return found


def target(words):
    """(how to run it: ("module", name) or ("script", path), its arguments) of a command."""
    if words[0] == "torchrun":   # torchrun's own options, then the script and its arguments
        i = next(i for i, w in enumerate(words) if w.endswith(".py"))
        return ("script", words[i]), words[i + 1:]
    if words[1] == "-m":
        return ("module", words[2]), words[3:]
    return ("script", words[1]), words[2:]


def help_text(kind, name, args):
    """What `name args --help` prints, run in this process from the repository's root."""
    out, argv, cwd = io.StringIO(), sys.argv, os.getcwd()
    sys.argv = [name, *args, "--help"]
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # runpy: the module was imported
            if kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(os.path.join(ROOT, name), run_name="__main__")
    finally:
        sys.argv = argv
        os.chdir(cwd)
    assert e.value.code in (0, None), f"{name} --help exited with {e.value.code}"
    return out.getvalue()


CASES = [(doc, words) for doc in DOCS for words in commands(doc)]


def test_the_docs_show_commands():
    assert len(commands("README.md")) >= 6 and len(commands(DOCS[1])) >= 6


@pytest.mark.parametrize("doc, words", CASES, ids=[" ".join(w)[:60] for _, w in CASES])
def test_a_command_of_the_docs_exists_with_the_keys_it_passes(doc, words):
    (kind, name), args = target(words)
    if kind == "script":
        assert os.path.isfile(os.path.join(ROOT, name)), f"{doc}: {name} does not exist"
    for arg in args:
        if arg.startswith("config/"):
            assert os.path.isfile(os.path.join(ROOT, arg)), f"{doc}: {arg} does not exist"
    text = help_text(kind, name, [a for a in args if a.startswith("config/")])
    for arg in args:
        key = arg.split("=")[0]
        if key.startswith("--"):
            assert re.search(rf"(^|\s|\[){re.escape(key)}\b", text), (
                f"{doc}: `{' '.join(words)}` passes {key}, which {name} does not list in --help")


def test_the_study_readme_grid_commands_work_on_a_fresh_clone_as_written(monkeypatch, capsys,
                                                                          tmp_path):
    """Issue 31.13: `--grid=lr --dry_run` exited 1 on a fresh clone (the committed results are of
    other code than any checkout's), and so did a real run of the README's lr command. Each
    `python -m study.reproduce` line of study/README.md (with --dry_run) shows its plan, and none
    would be refused as written. It runs where a fresh clone stands after the quick start: the
    committed study/results beside shakespeare_char prepared (a tmp folder that links study/ and
    config/, so the clone's data/ is not touched); a line of another --dataset is left out."""
    import prepare_data
    from study import reproduce
    for name in ("study", "config"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    prepare_data.main(["shakespeare_char"])
    lines = [w[3:] for w in commands(DOCS[1]) if w[1:3] == ["-m", "study.reproduce"]]
    ran = 0
    for args in lines:
        data = [a.split("=", 1)[1] for a in args if a.startswith("--dataset=")]
        if data and data[-1] != "shakespeare_char":
            continue
        ran += 1
        assert reproduce.main([*args, "--dry_run"]) == 0, args
        out = capsys.readouterr().out
        assert "a real run of this command is refused" not in out, (args, out[-400:])
    assert ran >= 6, lines
