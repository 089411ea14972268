"""The READMEs' `python`/`torchrun` lines: configs exist, --help lists each key they pass."""
import os
import re
import runpy
import sys

import pytest

from helpers import ROOT, commands

DOCS = ("README.md", os.path.join("study", "README.md"))
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


def test_the_parser_finds_the_commands():
    assert all(len(commands(doc)) >= 6 for doc in DOCS), [len(commands(d)) for d in DOCS]
