"""The commands the docs show still exist: each `python ...` and `torchrun ...` line in a code
block of README.md and study/README.md names a script or module that answers --help, each config
file it names exists, each --key it passes is in its --help: a stale command fails here."""
import os
import re
import runpy
import shlex
import sys

import pytest

from conftest import ROOT

DOCS = ("README.md", os.path.join("study", "README.md"))


def commands(doc):
    """The python / torchrun command lines of the doc's code blocks, continuations joined."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:   # split at the fence lines
        code = re.split(r"^```.*\n?", f.read(), flags=re.M)[1::2]
    lines = "".join(code).replace("\\\n", " ").splitlines()
    return [w for w in map(lambda l: shlex.split(l, comments=True), lines)
            if w and w[0] in ("python", "torchrun")]


CASES = [(doc, words) for doc in DOCS for words in commands(doc)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # runpy: the module was imported
@pytest.mark.parametrize("doc, words", CASES, ids=[" ".join(w)[:60] for _, w in CASES])
def test_a_command_of_the_docs_exists_with_the_keys_it_passes(monkeypatch, capsys, doc, words):
    m = words[0] == "python" and words[1] == "-m"   # torchrun: its options, then the script
    i = (next(i for i, w in enumerate(words) if w.endswith(".py")) if words[0] == "torchrun"
         else 1 + m)
    (kind, name), args = ("module" if m else "script", words[i]), words[i + 1:]
    configs = [a for a in args if a.startswith("config/")]
    for path in configs + ([name] if kind == "script" else []):
        assert os.path.isfile(os.path.join(ROOT, path)), f"{doc}: {path} does not exist"
    # its --help, run in this process from the repository's root
    monkeypatch.setattr(sys, "argv", [name, *configs, "--help"])
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        (runpy.run_module(name, run_name="__main__", alter_sys=True) if kind == "module"
         else runpy.run_path(os.path.join(ROOT, name), run_name="__main__"))
    assert e.value.code in (0, None), f"{name} --help exited with {e.value.code}"
    text = capsys.readouterr().out
    for key in (a.split("=")[0] for a in args if a.startswith("--")):
        assert re.search(rf"(^|\s|\[){re.escape(key)}\b", text), (
            f"{doc}: `{' '.join(words)}` passes {key}, which {name} does not list in --help")


def test_the_study_readme_grid_commands_work_on_a_fresh_clone_as_written(monkeypatch, capsys,
                                                                          tmp_path):
    """Issue 31.13: `--grid=lr --dry_run` exited 1 there (committed results are of other code than
    any checkout's). Each line but another --dataset's plans; a real run would not be refused."""
    import prepare_data
    from study import reproduce
    for name in ("study", "config"):   # a fresh clone after the quick start
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    prepare_data.main(["shakespeare_char"])
    lines = [w[3:] for w in commands(DOCS[1]) if w[1:3] == ["-m", "study.reproduce"]]
    ran = [args for args in lines if [a for a in args if a.startswith("--dataset=")][-1:]
           in ([], ["--dataset=shakespeare_char"])]
    for args in ran:
        assert reproduce.main([*args, "--dry_run"]) == 0, args
        out = capsys.readouterr().out
        assert "a real run of this command is refused" not in out, (args, out[-400:])
    assert len(ran) >= 6, lines
    assert len(commands("README.md")) >= 6   # the parser finds README's commands too
