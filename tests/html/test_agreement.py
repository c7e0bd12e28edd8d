"""The HTML book's explorers draw what the notebook's explorers draw.

tests/html/check.mjs (`make test-html`) opens every chapter in Chromium, moves each
explorer's first control and writes what Plotly was given, for both settings, to
_build/screens/explorers-drawn.json. Here each of those settings is drawn again in Python,
`figure(**values)`, read back with `web.figure_data`, and compared with the browser's
numbers: every line's x and y, every box's corners, every text and tick label (floats to
1e-6, relative).

`make test` does not collect this folder (tests/conftest.py): it needs a built book and a
browser run. `make test-html` runs it after check.mjs; without the file it skips.
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from minipar.teach import web

DRAWN = Path(__file__).resolve().parents[2] / "_build" / "screens" / "explorers-drawn.json"
REL = 1e-6

if not DRAWN.exists():
    pytest.skip(f"no {DRAWN.name}: run make book, then make test-html", allow_module_level=True)


def settings():
    """(chapter, setting index, what the browser drew) for every dumped setting."""
    for entry in json.loads(DRAWN.read_text()):
        for i, drawn in enumerate(entry["drawn"]):
            yield pytest.param(entry["chapter"], drawn, id=f"{entry['chapter']}-{i}")


def close(a, b) -> bool:
    """Two numbers (or two missing points) equal to REL."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def same(xs, ys) -> bool:
    return len(xs) == len(ys) and all(close(a, b) for a, b in zip(xs, ys))


def text_of(annotation: str) -> str:
    """The text the browser was given, without the HTML minipar-explorer.js added."""
    plain = annotation.replace("<br>", "\n")
    plain = re.sub(r"<sup>(.*?)</sup>", r"^{\1}", plain)
    return html.unescape(re.sub(r"</?b>", "", plain))


def polygons(trace) -> list[list[tuple]]:
    """A shapes trace's polygons (the points between the nulls)."""
    out, current = [], []
    for x, y in zip(trace["x"], trace["y"]):
        if x is None:
            out.append(current)
            current = []
        else:
            current.append((x, y))
    return out + ([current] if current else [])


def expected_polygon(shape) -> list[tuple]:
    if shape["kind"] != "rect":
        return list(zip(shape["x"], shape["y"]))
    x0, y0 = shape["x"], shape["y"]
    x1, y1 = x0 + shape["width"], y0 + shape["height"]
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]


def by_place(polys):
    return sorted(polys, key=lambda p: [round(v, 9) for xy in p for v in xy])


def axis_suffix(i: int) -> str:
    return "" if i == 0 else str(i + 1)


@pytest.mark.parametrize("chapter, drawn", list(settings()))
def test_the_browser_drew_the_python_figure(chapter, drawn):
    fig = web.explorer(chapter).figure(**drawn["values"])
    try:
        data = web.figure_data(fig)
    finally:
        plt.close(fig)
    traces = drawn["traces"]
    for i, ax in enumerate(data["axes"]):
        on = [t for t in traces if t["xaxis"] == "x" + axis_suffix(i)]
        lines = [t for t in on if t["meta"] == "line"]
        assert len(lines) == len(ax["lines"]), f"Axes {i}: lines"
        for got, want in zip(lines, ax["lines"]):
            assert same(got["x"], want["x"]) and same(got["y"], want["y"]), f"Axes {i}: a line"
        got = by_place([p for t in on if t["meta"] == "shapes" for p in polygons(t)])
        want = by_place([expected_polygon(s) for s in ax["shapes"]])
        assert len(got) == len(want), f"Axes {i}: boxes"
        flat = [[v for xy in poly for v in xy] for poly in got + want]
        for g, w in zip(flat[:len(got)], flat[len(got):]):
            assert same(g, w), f"Axes {i}: a box"
    texts = [t["text"] for ax in data["axes"] for t in ax["title"] + ax["texts"]]
    texts += [t["text"] for t in data["texts"]]
    assert [text_of(t) for t in drawn["texts"]] == texts
    ticks = {f"{w}axis{axis_suffix(i)}": ax[w] for i, ax in enumerate(data["axes"]) for w in "xy"}
    for axis in drawn["ticks"]:
        want = ticks[axis["axis"]]
        assert same(axis["vals"], want["ticks"]), axis["axis"]
        assert [text_of(t) for t in axis["text"]] == want["ticklabels"], axis["axis"]


def test_every_chapter_was_drawn_in_the_browser():
    chapters = {entry["chapter"] for entry in json.loads(DRAWN.read_text())}
    assert chapters == set(web.CHAPTERS)
