"""The layout of the tools (issue 19): no script imports another script or reads its source, and
the import graph of the project's modules, lazy imports included, is at most 4 floors deep (a
script, a module it imports, a module that one imports, model.py)."""
import ast
import os

from conftest import ROOT

# the files with a command line; every other top-level .py is a library module
SCRIPTS = {"train", "prepare_data", "sample", "bench", "reproduce", "gpu_check", "export_hf",
           "plot_metrics"}
# edges other branches remove (issue 20 moves the dataset readers out of prepare_data.py; issue 22
# rewrites gpu_check.py): this list must shrink, and the test below fails once an edge in it is
# gone
PENDING = set()


def modules():
    return {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}


def imports(name):
    """The project's modules that `name` imports anywhere in its file (top, functions, lazily)."""
    with open(os.path.join(ROOT, f"{name}.py")) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & modules() - {name}


def graph():
    return {m: imports(m) - {b for a, b in PENDING if a == m} for m in modules()}


def floors(g, m, path=()):
    assert m not in path, f"an import cycle: {' -> '.join((*path, m))}"
    return 1 + max((floors(g, d, (*path, m)) for d in g[m]), default=0)


def test_no_script_imports_another_script():
    bad = sorted((a, b) for a, deps in graph().items() if a in SCRIPTS
                 for b in deps if b in SCRIPTS)
    assert not bad, f"scripts importing scripts: {bad}; move what they share into a library module"
    gone = sorted((a, b) for a, b in PENDING if b not in imports(a))
    assert not gone, f"these edges are gone: remove them from PENDING: {gone}"


def test_the_import_graph_is_at_most_four_floors():
    g = graph()
    deepest = max(g, key=lambda m: floors(g, m))
    assert floors(g, deepest) <= 4, f"{deepest} is {floors(g, deepest)} floors deep"


def test_no_script_parses_another_scripts_source():
    """bench.py read train.py's keys with ast.literal_eval of its source: `max_iters = 5 * 1000`
    crashed it."""
    for name in SCRIPTS & modules():
        with open(os.path.join(ROOT, f"{name}.py")) as f:
            src = f.read()
        assert "ast.parse(" not in src and "literal_eval(" not in src, (
            f"{name}.py parses source code")
