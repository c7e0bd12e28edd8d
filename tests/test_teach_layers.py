"""The book's machinery reads one way: a walk of minipar.teach's imports (from the source,
no import runs) fails on one that goes against this order

    style, replays -> numbers -> figures -> widgets -> explorers -> web   numbers -> exercises

- `replays` (the runs the book records and replays at H100 speed) reads no other part, and
  numbers, figures and exercises read it;
- `style` (the colours) and `numbers` (every number the book states, and the few models the
  figures and the checks share, such as the commit crashed at every moment) read no other
  part of teach;
- figures draw numbers in the style; widgets (the one shape of every explorer) and the
  explorers draw figures; web reads the explorers' figures back as data for the HTML book; the exercises check answers against numbers and never a figure,
  so a check runs without matplotlib and no number waits on a check;
- a chapter's module reads teach modules of its own or an earlier chapter only (the order
  of _toc.yml), besides the ones of no chapter (style, widgets, each part's core);
- no name with a leading underscore is imported from another module.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACH = ROOT / "minipar" / "teach"
READS = {"style": set(), "replays": set(), "numbers": {"replays"},
         "figures": {"style", "numbers", "replays"},
         "widgets": {"style", "numbers", "figures"},
         "explorers": {"style", "numbers", "figures", "widgets"},
         "web": {"style", "numbers", "figures", "widgets", "explorers"},
         "exercises": {"numbers", "replays"}}


def chapters() -> list[str]:
    """The book's chapters in reading order, as _toc.yml lists them."""
    return re.findall(r"(?:root|file):\s*book/(\w+)", (ROOT / "_toc.yml").read_text())


def sources() -> dict[str, tuple[str, bool]]:
    """{"numbers.fourd": (source, is a package's __init__), "style": ..., "exercises": ...}."""
    out = {}
    for path in sorted(TEACH.rglob("*.py")):
        parts = path.relative_to(TEACH).with_suffix("").parts
        package = parts[-1] == "__init__"
        if len(parts) > 1 or not package:          # teach/__init__.py imports nothing of teach
            out[".".join(parts[:-1] if package else parts)] = (path.read_text(), package)
    return out


def imports(name: str, source: str, package: bool, known: set[str]):
    """(line, the teach module imported or None for one outside teach, the names imported)."""
    here = name.split(".") if package else name.split(".")[:-1]     # the folder, within teach
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        names = [a.name for a in node.names]
        if node.level == 0 and (node.module or "").startswith("minipar.teach."):
            base = node.module[len("minipar.teach."):]
        elif 0 < node.level <= len(here) + 1:
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
        else:
            yield node.lineno, None, names
            continue
        targets: dict[str, list[str]] = {}             # `from . import failures` names a module
        for n in names:
            targets.setdefault(f"{base}.{n}" if f"{base}.{n}" in known else base, []).append(n)
        for target, imported in targets.items():
            yield node.lineno, target, imported


def chapter_of(name: str, order: list[str]) -> int:
    """Where `name` sits in the reading order; -1 for the modules of no chapter."""
    stem = name.split(".")[-1]
    return order.index(stem) if stem in order else -1


def problems(modules: dict[str, tuple[str, bool]], order: list[str]) -> list[str]:
    found = []
    for name, (source, package) in modules.items():
        part, where = name.split(".")[0], f"teach/{name.replace('.', '/')}"
        for line, target, names in imports(name, source, package, set(modules)):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                found.append(f"{where}:{line} imports the private {', '.join(private)}")
            if not target:
                continue
            if target.split(".")[0] not in READS[part] | {part}:
                found.append(f"{where}:{line}: {part} may not read {target.split('.')[0]} ({target})")
            if chapter_of(target, order) > chapter_of(name, order) >= 0:
                found.append(f"{where}:{line}: chapter {name.split('.')[-1]} reads the later {target}")
    return found


def test_teach_reads_one_way():
    found = problems(sources(), chapters())
    assert not found, "teach/ imports against its order:\n" + "\n".join(found)


def test_every_teach_part_has_its_place():
    assert {name.split(".")[0] for name in sources()} <= set(READS)


def test_the_walk_sees_each_kind_of_wrong_import():
    """The checks can fail: a number that reads a check, a figure that reads a check, a check
    that reads a figure, a private name, and a chapter that reads a later one."""
    order = ["llama3", "collectives", "memory", "fourd"]
    fake = {"numbers": ("", True), "exercises": ("", True), "figures": ("", True),
            "explorers": ("", True), "style": ("", False)}
    fake.update((name, (source, False)) for name, source in {
        "numbers.core": "", "exercises.core": "", "numbers.llama3": "",
        "numbers.fourd": "from ..exercises.fourd import check_plan\n",
        "exercises.fourd": "from .core import number\nfrom ..numbers.fourd import PLAN\n",
        "figures.llama3": "from ..style import COLORS\n\ndef _draw_row(): pass\n",
        "exercises.llama3": "from ..figures.llama3 import replica_pods\n",
        "explorers.llama3": "from ..figures.llama3 import _draw_row\n",
        "numbers.memory": "from .fourd import X\nfrom .llama3 import Y\n"}.items())
    found = "\n".join(problems(fake, order))
    assert "numbers/fourd:1: numbers may not read exercises" in found
    assert "exercises/llama3:1: exercises may not read figures" in found
    assert "explorers/llama3:1 imports the private _draw_row" in found
    assert "chapter memory reads the later numbers.fourd" in found
    assert "exercises/fourd" not in found and "numbers.llama3" not in found
    assert len(found.splitlines()) == 4
