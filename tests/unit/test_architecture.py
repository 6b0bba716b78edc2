"""The package's layers import one way (docs/architecture.md): each subpackage imports only
from layers below it, and nothing in the runtime imports the test oracles (``testing``)
or the benchmarks (``bench``). Checked on the source's import statements (lazy ones too)."""
import ast
import os

import sonarspec_ext

ROOT = os.path.dirname(sonarspec_ext.__file__)

# Lower ranks are imported by higher ones, never the other way.
RANKS = {
    "_C": -1,                                            # the native extension
    "ops": 0, "params": 0, "assets": 0,                  # kernel wrappers, plain data
    "layers": 1, "models": 2,                            # nn.Modules and loaders
    "runtime": 3, "sampling": 3,                         # running models; the sampler
    "spec": 4,                                           # proposers and verification
    "engine": 5,                                         # scheduling glue, step strategies
    "llm": 6,                                            # the API
    "chat_cli": 7, "train": 7, "bench": 7, "server": 7,  # applications of the API
    "cli": 8, "__init__": 9,
    "testing": 10,                                       # test oracles: import anything, imported by nothing
}


def _edges():
    """(importing top-level module, imported top-level module, file) for relative imports."""
    for dirpath, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            pkg = parts[:-1]
            with open(path) as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = pkg[:len(pkg) - (node.level - 1)]
                    target = base + (node.module.split(".") if node.module else [])
                    for alias in ([] if target else node.names):
                        yield parts[0], alias.name, path
                    if target:
                        yield parts[0], target[0], path


def test_every_module_has_a_layer():
    tops = {name[:-3] if name.endswith(".py") else name for name in os.listdir(ROOT)
            if (name.endswith(".py") or os.path.isdir(os.path.join(ROOT, name))) and not name.startswith("__pycache__")}
    tops.discard("py.typed")
    assert tops - set(RANKS) <= {"_C"}, f"modules without a layer in RANKS: {sorted(tops - set(RANKS))}"


def test_imports_point_down_the_layers():
    wrong = sorted({f"{os.path.relpath(path, ROOT)}: {a} -> {b}" for a, b, path in _edges()
                    if a != b and b in RANKS and RANKS[b] >= RANKS[a]})
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)
