"""The layout, read from the files' imports, lazy ones too: the core (config/, tests/*.py too) never
imports tools/ or study/, nor they each other; no script imports another; no cycle; at most 4
floors (a script, a module it imports, one that one imports, model.py). The READMEs' commands:
their configs exist, --help lists each key they pass."""
import ast
import os
import re
import runpy
import sys

import pytest

from helpers import ROOT, commands

# the files with a command line; every other file is a library module
SCRIPTS = {"train", "prepare_data", "sample", "tools.bench", "tools.gpu_check", "tools.export_hf",
           "tools.plot_metrics", "study.reproduce", "study.walkthrough", "study.claims"}
# {dotted name: path}: the top level's .py files, tools/, study/, and config/'s two modules
MODULES = {f[:-3]: f for f in os.listdir(ROOT) if f.endswith(".py")} | {
    f"{d}.{f[:-3]}": os.path.join(d, f) for d in ("config", "tools", "study")
    for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".py") and f != "__init__.py"
    and (d != "config" or f in ("defaults.py", "variants.py"))}


def imported(path):
    """Every dotted name the file at `path` imports anywhere (top, functions, lazily):
    `from study import grids` imports study and study.grids."""
    with open(os.path.join(ROOT, path)) as f:
        nodes = list(ast.walk(ast.parse(f.read())))
    found = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    return found | {m for n in nodes if isinstance(n, ast.ImportFrom) and n.module and n.level == 0
                    for m in (n.module, *(f"{n.module}.{a.name}" for a in n.names))}


def floors(g, m, path=()):
    assert m not in path, f"an import cycle: {' -> '.join((*path, m))}"
    return 1 + max((floors(g, d, (*path, m)) for d in g[m]), default=0)


def crossings(g):
    """Imports of tools/ or study/ from outside that folder (anyone may import the core)."""
    place = lambda m: m.split(".")[0] if m.startswith(("tools.", "study.")) else "core"
    return sorted((a, b) for a in g for b in g[a] if place(b) not in ("core", place(a)))


def test_no_crossing_no_script_importing_a_script_no_cycle_at_most_four_floors():
    g = {m: imported(MODULES[m]) & MODULES.keys() - {m} for m in MODULES}   # the project's modules
    assert not crossings(g), f"imports across the layout: {crossings(g)}; move what they share"
    bad = sorted((a, b) for a in SCRIPTS & g.keys() for b in g[a] if b in SCRIPTS)
    assert not bad, f"scripts importing scripts: {bad}; move what they share into a library module"
    # tests/*.py test the core alone (a fork may delete tools/, study/ and their tests)
    tests = [os.path.join("tests", f) for f in os.listdir(os.path.join(ROOT, "tests"))
             if f.endswith(".py")]
    bad = [(f, m) for f in tests for m in imported(f) if m.split(".")[0] in ("tools", "study")]
    assert not bad, f"the core's tests importing tools/ or study/: {bad}"
    deepest = max(g, key=lambda m: floors(g, m))
    assert floors(g, deepest) <= 4, f"{deepest} is {floors(g, deepest)} floors deep"
    # the test sees every folder, and the rule can fail: a tool importing the study is caught
    assert {"model", "config.defaults", "tools.bench", "study.reproduce"} <= g.keys()
    assert "model" in g["train"] and "config.defaults" in g["tools.bench"]
    assert "study.grids" in g["study.reproduce"]
    assert crossings({**g, "tools.bench": g["tools.bench"] | {"study.grids"}})


def test_every_line_of_python_is_at_most_100_characters():
    folders = [ROOT] + [os.path.join(ROOT, d) for d in ("config", "tools", "study", "tests",
                                                         "tests/tools", "tests/study")]
    files = [os.path.join(d, f) for d in folders for f in os.listdir(d) if f.endswith(".py")]
    long = [f"{f}:{i}" for f in files for i, line in enumerate(open(f, encoding="utf-8"), 1)
            if len(line.rstrip("\n")) > 100]
    assert not long, long


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
    said = text.split("\n\n")[1].rstrip() if "\noptions:" in text else "."   # argparse's
    assert said.endswith((".", ":")), f"{name} --help: its description is cut: ...{said[-60:]!r}"
    for key in (a.split("=")[0] for a in args if a.startswith("--")):
        assert re.search(rf"(^|\s|\[){re.escape(key)}\b", text), (
            f"{doc}: `{' '.join(words)}` passes {key}, which {name} does not list in --help")


def test_the_parser_finds_the_commands():
    assert all(len(commands(doc)) >= 6 for doc in DOCS), [len(commands(d)) for d in DOCS]


def test_the_readme_fork_example_runs_as_written(monkeypatch, capsys):
    """README's forking example is code: run as written, it adds a REPARAMS entry and builds a model
    whose vectors are exactly 1 at init."""
    import model
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        code = re.search(r"## Forking.*?```python\n(.*?)```", f.read(), re.S).group(1)
    monkeypatch.setattr(model, "REPARAMS", dict(model.REPARAMS))   # the entry goes with the test
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    values = re.findall(r"[-\d.e]+(?=[,\]])", out)   # the printed tensor's entries
    assert "square" in model.REPARAMS and values and set(values) == {"1."}, (
        f"README's forking example printed {out!r}, not a vector of ones: fix the example")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # runpy: the module was imported
@pytest.mark.parametrize("name", ["train", "sample", "tools.bench", "tools.export_hf",
                                  "study.walkthrough"])
def test_every_script_that_runs_the_model_on_a_cpu_takes_cpu_threads(name, monkeypatch, capsys):
    """runtime.setup_cpu's default (the idle cores) can be overridden everywhere (gpu_check's CPU
    rehearsal takes the default: its children are train.py and bench.py)."""
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    assert "--cpu_threads" in capsys.readouterr().out, f"{name} has no cpu_threads key"
    with open(os.path.join(ROOT, MODULES[name])) as f:
        assert "setup_cpu(" in f.read(), f"{name} does not call runtime.setup_cpu"
