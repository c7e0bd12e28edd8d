"""The explorers of the HTML book (minipar/teach/web.py, book/_ext/explorer_html.py) draw
what the notebook's explorers draw.

- Every value a page offers (`WEB`) is one its control offers in the notebook, and a page
  offers few enough settings to be drawn when the book is built.
- A frame the page ships is `figure_data(figure(**values))` for the values it says, after
  the trip through JSON the page's script makes; the reading finds every Axes' lines or
  boxes, and a different setting reads as different data (the comparison can fail).
- The 4D chapter's explorer ranks the layouts as `python -m minipar.costmodel plan` does,
  each with the term that limits it.
The browser's side (what Plotly was given equals these frames) is tests/html, run by
`make test-html` after `make book`.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from minipar.teach import web

REPO_ROOT = Path(__file__).resolve().parents[1]


def legal(control, value) -> bool:
    """Whether the notebook's widget of `control` can take `value`."""
    v = control.values
    if control.kind in ("choice", "steps"):
        return value in v
    if control.kind == "toggle":
        return isinstance(value, bool)
    if control.kind in ("int", "float"):
        steps = (value - v[0]) / v[2]
        return v[0] <= value <= v[1] and math.isclose(steps, round(steps), abs_tol=1e-9)
    if control.kind == "log":
        return 10 ** v[0] <= value <= 10 ** v[1]
    raise AssertionError(f"unknown control kind {control.kind}")


def some_keys(chapter: str) -> list[str]:
    """Three settings of a chapter's page: the first shown, the next value of the first
    control, and the last combination."""
    p = web.payload(chapter, keys=())         # controls and the first key, no frames
    first = [int(i) for i in p["first"].split(",")]
    moved = [(first[0] + 1) % len(p["controls"][0]["values"])] + first[1:]
    last = [len(c["values"]) - 1 for c in p["controls"]]
    return list(dict.fromkeys(",".join(map(str, k)) for k in (first, moved, last)))


def drawn(chapter: str, values: dict) -> dict:
    fig = web.explorer(chapter).figure(**values)
    try:
        return web.figure_data(fig)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("chapter", web.CHAPTERS)
def test_the_page_offers_the_notebooks_values(chapter):
    controls, offered = web.controls(chapter), web.grid(chapter)
    assert offered, f"{chapter}: WEB offers nothing"
    for name, values in offered.items():
        assert name in controls, f"{chapter}: WEB names {name!r}, which is no control"
        assert len(values) > 1 and len(set(map(repr, values))) == len(values), (chapter, name)
        for v in values:
            assert legal(controls[name], v), f"{chapter}: {name}={v!r} is no value of its control"
    frames = math.prod(len(v) for v in offered.values())
    assert frames <= web.MAX_FRAMES, f"{chapter}: {frames} frames to draw at build time"
    defaults = web.explorer(chapter).DEFAULTS
    assert all(defaults[name] in values for name, values in offered.items()), \
        f"{chapter}: the page starts at DEFAULTS, so each default must be offered"


@pytest.mark.parametrize("chapter", web.CHAPTERS)
def test_a_shipped_frame_is_the_figure_read_back(chapter):
    keys = some_keys(chapter)
    p = json.loads(json.dumps(web.payload(chapter, keys=keys)))     # what the page reads
    assert set(p["frames"]) == set(keys)
    for key in keys:
        values = p["values"][key]
        assert p["frames"][key] == drawn(chapter, values), f"{chapter} {key}: {values}"
        axes = p["frames"][key]["axes"]
        for i, ax in enumerate(axes):        # an Axes turned off may hold only text, or none
            assert ax["lines"] or ax["shapes"] or not ax["visible"], \
                f"{chapter} {key}: Axes {i} read back with nothing drawn"
        assert any(ax["lines"] or ax["shapes"] or ax["texts"] for ax in axes)


@pytest.mark.parametrize("chapter", web.CHAPTERS)
def test_moving_the_first_control_changes_the_data(chapter):
    first, moved = some_keys(chapter)[:2]
    p = web.payload(chapter, keys=[first, moved])
    assert p["frames"][first] != p["frames"][moved], \
        f"{chapter}: the first control ({p['controls'][0]['name']}) does not change the picture"


def test_figure_data_reads_lines_boxes_texts_and_scales():
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(6, 3))
    ax.plot([1, 10, 100], [1, 2, 3], "o--", color="red", label="curve")
    ax.set(xscale="log", title="t", xlabel="x")
    ax.legend()
    bx.bar([0, 1], [2, 3], color="#00ff00", label="bars")
    bx.axhline(2.5, color="black")
    bx.text(1, 1, "hello")
    d = web.figure_data(fig)
    plt.close(fig)
    a, b = d["axes"]
    assert a["x"]["scale"] == "log" and a["x"]["label"] == "x" and a["title"][0]["text"] == "t"
    [curve] = a["lines"]
    assert (curve["x"], curve["y"], curve["style"], curve["marker"]) == \
        ([1, 10, 100], [1, 2, 3], "--", "o")
    assert curve["color"] == "#ff0000" and curve["label"] == "curve"
    assert [e["label"] for e in a["legend"]["entries"]] == ["curve"] and b["legend"] is None
    assert 0 < a["legend"]["box"][0] < a["legend"]["box"][2] < 0.5       # on the left Axes
    [flat] = b["lines"]                       # axhline: x in Axes fractions, read as data
    assert flat["y"] == [2.5, 2.5] and flat["x"] == pytest.approx(b["x"]["limits"])
    assert [(s["kind"], s["x"], s["height"], s["facecolor"], s["label"]) for s in b["shapes"]] == \
        [("rect", -0.4, 2, "#00ff00", "bars"), ("rect", 0.6, 3, "#00ff00", "bars")]
    assert [t["text"] for t in b["texts"]] == ["hello"]
    assert 0.5 < b["texts"][0]["x"] < 1 and 0 < b["texts"][0]["y"] < 1   # figure fractions


# ---------------------------------------------------------------- the planner, both ways
FOURD_SETTINGS = [dict(model="llama3-70b", gpus=1024, seq_len=8192),
                  dict(model="llama3-405b", gpus=4096, seq_len=8192),
                  dict(model="llama3-8b", gpus=256, seq_len=32768)]


def cli_ranking(values: dict) -> list[tuple[str, str, str]]:
    """(layout, limiting term, the next one) in the order `... plan` prints them."""
    out = subprocess.run(
        [sys.executable, "-m", "minipar.costmodel", "plan", "--preset", values["model"],
         "--gpu", values["gpu"], "--gpus", str(values["gpus"]), "--seq-len", str(values["seq_len"]),
         "--global-batch-tokens", f"{values['batch_mtokens']}M", "--top", str(values["top"])],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    layouts = re.findall(r"^\d+\. (.+?): MFU", out, flags=re.M)
    limits = re.findall(r"^\s+limited by (.+?) \(.*?\), then (.+?) \(", out, flags=re.M)
    assert len(layouts) == len(limits) > 0, out
    return [(lay, first, then) for lay, (first, then) in zip(layouts, limits)]


def explorer_ranking(frame: dict) -> list[tuple[str, str, str]]:
    """The same, read from the explorer's frame: its labels, top to bottom."""
    texts = sorted(frame["axes"][0]["texts"], key=lambda t: -t["y"])
    rows = [re.match(r"(.+?): limited by (.+?), then (.+?)\s+\(MFU", t["text"]) for t in texts]
    assert all(rows), [t["text"] for t in texts]
    return [row.groups() for row in rows]


@pytest.mark.parametrize("setting", FOURD_SETTINGS, ids=lambda s: f"{s['model']}-{s['gpus']}")
def test_the_4d_explorer_ranks_as_the_cli_plans(setting):
    offered = web.grid("fourd")
    key = ",".join(str(offered[name].index(setting[name])) for name in offered)
    p = json.loads(json.dumps(web.payload("fourd", keys=[key])))
    values = p["values"][key]
    assert explorer_ranking(p["frames"][key]) == cli_ranking(values)
