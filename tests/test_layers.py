"""The package reads downward: a walk of minipar's import graph (from the source, no import
runs) fails on any upward import, any circle and any in-package import inside a function.

The order below is the book's: the bottom knows nothing of what is built on it. A module
may import only modules of a lower layer; modules of one group (a subpackage listed by its
prefix) may import each other, but never in a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minipar"

# Bottom first. A trailing ".*" makes every module of that subpackage one group.
LAYERS = [
    "minipar.config",
    "minipar.flops",
    "minipar.formulas",
    "minipar.formulas.*",
    "minipar.costmodel.*",
    "minipar",                      # the package's __init__: ConfigError, the configs
    "minipar.comm",
    "minipar.grid",
    "minipar.placement",            # where the grid's ranks land on servers, racks and pods
    "minipar.profile",              # traces: spans of compute and of every collective
    "minipar.heartbeat",            # under torchrun: which rank (and node) is lost
    "minipar.launch",
    "minipar.peak",
    "minipar.memory",
    "minipar.model",
    "minipar.data",
    "minipar.parallel",
    "minipar.parallel.regions",
    "minipar.parallel.collective_matmul",
    "minipar.parallel.tensor",
    "minipar.parallel.context",
    "minipar.parallel.data",
    "minipar.parallel.zero",
    "minipar.parallel.schedules",
    "minipar.parallel.pipeline",
    "minipar.recompute",
    "minipar.parallelize",
    "minipar.checkpoint",
    "minipar.hf",                   # Hugging Face directories in (a slice per rank) and out
    "minipar.export",               # a checkpoint or a run's ranks -> a Hugging Face directory
    "minipar.generate",             # sampling from the reference model with a KV cache
    "minipar.preflight",            # every check before a rank starts (flags, files, memory)
    "minipar.cli",
    "minipar.train",
    "minipar.torchrun",             # torchrun's agent, ending on a signal with one line
    "minipar.testing",              # tests' hooks: built on everything, used by nothing
    "minipar.teach.*",              # the book's helpers: read everything, read by nothing
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    for i, entry in enumerate(LAYERS):
        if entry == name or (entry.endswith(".*") and
                             (name == entry[:-2] or name.startswith(entry[:-1]))):
            return i
    raise AssertionError(f"{name} is in no layer of tests/test_layers.py: place it")


def imports(name: str, path: Path, known: set[str]):
    """(imported in-package module, line, inside a function?) for each import of `path`."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    functions = [(n.lineno, n.end_lineno) for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        inside = any(lo < node.lineno <= hi for lo, hi in functions)
        for t in targets:
            if t in known and t != name:
                yield t, node.lineno, inside


def graph():
    mods = modules()
    return mods, {n: list(imports(n, p, set(mods))) for n, p in mods.items()}


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_down():
    mods, edges = graph()
    upward = []
    for name, targets in edges.items():
        for t, line, _ in targets:
            same_group = layer_of(t) == layer_of(name) and LAYERS[layer_of(name)].endswith(".*")
            child = t.startswith(name + ".") and mods[name].name == "__init__.py"
            if layer_of(t) >= layer_of(name) and not (same_group or child):
                upward.append(f"{mods[name].relative_to(PACKAGE.parent)}:{line} imports {t}")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circles():
    _, edges = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(n, stack):
        state[n] = 1
        for t, _, inside in edges[n]:
            if inside or t.startswith(n + "."):
                continue
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[n] = 2

    for n in edges:
        if n not in state:
            visit(n, [n])
    assert not circles, "\n".join(circles)


def test_no_in_package_import_inside_a_function():
    mods, edges = graph()
    inner = [f"{mods[n].relative_to(PACKAGE.parent)}:{line} imports {t}"
             for n, targets in edges.items() for t, line, inside in targets
             if inside and mods[n].name != "__init__.py"]
    assert not inner, "\n".join(inner)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_opens_with_a_docstring(name):
    tree = ast.parse(modules()[name].read_text())
    doc = ast.get_docstring(tree) or ""
    assert len(doc.split()) >= 8 and "chapter" in doc.lower(), \
        f"{name}: open with a docstring that says which chapter it belongs to and its idea"


def test_the_walk_sees_an_upward_import(tmp_path):
    """The checks can fail: an import of the loop from the model is caught."""
    fake = PACKAGE / "model.py"
    found = {t for t, _, _ in imports("minipar.model", fake, set(modules()))}
    assert "minipar.train" not in found
    tree_text = fake.read_text() + "\nfrom .train import train\n"
    probe = tmp_path / "model.py"
    probe.write_text(tree_text)
    found = [t for t, _, _ in imports("minipar.model", probe, set(modules()))]
    assert "minipar.train" in found and layer_of("minipar.train") > layer_of("minipar.model")
