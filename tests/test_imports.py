"""The layout (issues 19 and 30), read from the files' imports, lazy ones included: the core at the
top (and config/defaults.py) never imports tools/ or study/; those two never import each other;
no script imports another script or reads its source; no import cycle; at most 4 floors (a
script, a module it imports, a module that one imports, model.py)."""
import ast
import os

from conftest import ROOT

# the files with a command line; every other file is a library module
SCRIPTS = {"train", "prepare_data", "sample", "tools.bench", "tools.gpu_check", "tools.export_hf",
           "tools.plot_metrics", "study.reproduce", "study.walkthrough"}
FOLDERS = ("config", "tools", "study")   # besides the top level


def modules():
    """{dotted name: path} of the project's Python files, but for the config files themselves."""
    found = {f[:-3]: f for f in os.listdir(ROOT) if f.endswith(".py")}
    for folder in FOLDERS:
        for f in os.listdir(os.path.join(ROOT, folder)):
            if f.endswith(".py") and f != "__init__.py" and (folder != "config"
                                                              or f in ("defaults.py", "variants.py")):
                found[f"{folder}.{f[:-3]}"] = os.path.join(folder, f)
    return found


def imports(name):
    """The project's modules that `name` imports anywhere in its file (top, functions, lazily)."""
    known = modules()
    with open(os.path.join(ROOT, known[name])) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from study import grids` imports study.grids; `from model import GPT`, model
            found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    return found & known.keys() - {name}


def graph():
    return {m: imports(m) for m in modules()}


def floors(g, m, path=()):
    assert m not in path, f"an import cycle: {' -> '.join((*path, m))}"
    return 1 + max((floors(g, d, (*path, m)) for d in g[m]), default=0)


def place(m):
    return m.split(".")[0] if m.startswith(("tools.", "study.")) else "core"


def test_the_core_imports_neither_tools_nor_the_study_and_they_not_each_other():
    bad = sorted((a, b) for a, deps in graph().items() for b in deps
                 if place(b) != "core" and place(a) != place(b))
    assert not bad, f"imports across the layout: {bad}; move what they share into the core"


def test_no_script_imports_another_script():
    bad = sorted((a, b) for a, deps in graph().items() if a in SCRIPTS
                 for b in deps if b in SCRIPTS)
    assert not bad, f"scripts importing scripts: {bad}; move what they share into a library module"


def test_the_import_graph_is_at_most_four_floors():
    g = graph()
    deepest = max(g, key=lambda m: floors(g, m))
    assert floors(g, deepest) <= 4, f"{deepest} is {floors(g, deepest)} floors deep"


def test_the_layout_test_sees_every_folder_and_fails_on_a_crossing():
    """The rule can fail: a tool importing the study is caught."""
    g = graph()
    assert {"model", "config.defaults", "tools.bench", "study.reproduce"} <= g.keys()
    assert "model" in g["train"] and "config.defaults" in g["tools.bench"]
    assert "study.grids" in g["study.reproduce"]
    g["tools.bench"].add("study.grids")
    assert any(place(a) != place(b) and place(b) != "core" for a, deps in g.items() for b in deps)


def test_no_script_parses_another_scripts_source():
    """bench.py read train.py's keys with ast.literal_eval of its source: `max_iters = 5 * 1000`
    crashed it."""
    for name, path in modules().items():
        if name in SCRIPTS:
            with open(os.path.join(ROOT, path)) as f:
                src = f.read()
            assert "ast.parse(" not in src and "literal_eval(" not in src, (
                f"{path} parses source code")
