"""The explorers of the HTML book (minipar/teach/web.py, book/_ext/explorer_html.py) draw
what the notebook's explorers draw.

- A page offers every control of the notebook's explorer over the notebook's range (every
  value of a list, a number slider's ends, default and values between), each value one its
  control offers in the notebook, and few enough settings to be drawn when the book is built.
- A frame the page ships is `figure_data(figure(**values))` for the values it says, after
  the trip through JSON the page's script makes; the reading finds every Axes' lines or
  boxes, and a different setting reads as different data (the comparison can fail).
- The 4D chapter's explorer ranks the layouts as `python -m minipar.costmodel plan` does,
  each with the term that limits it, and reaches the chapter's own case (405B on 8,192 and
  16,384 H100s at 16M tokens), which it shows first.
- Each explorer agrees with its chapter: the pipeline's "zb" splits B and W and its bubble is
  the simulator's; the CP panel draws the cp of the slider; the TP explorer's link is the
  data sheet's; an invalid setting says, in the picture's place, the rule and the fix.
The browser's side (what Plotly was given equals these frames) is tests/html, run by
`make test-html` after `make book`.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from minipar.plan.config import ModelConfig
from minipar.plan.datasheets import H100
from minipar.plan.schedules import make_schedule, simulate
from minipar.teach import web
from minipar.teach.explorers.prefetch import Prefetcher
from minipar.teach.widgets import (WHATIF_CONTROLS, layout_problems_of, offered as values_of,
                                   one_change_fixes, whatif_estimate)

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
    """Three or four settings of a chapter's page: the first shown, the next value of the
    first control, the last combination of those moved together, and the last value of the
    last control moved alone."""
    p = web.payload(chapter, keys=())         # controls and the first key, no frames
    first = [int(i) for i in p["first"].split(",")]
    moved = [(first[0] + 1) % len(p["controls"][0]["values"])] + first[1:]
    last = [len(c["values"]) - 1 if not c["alone"] else i for c, i in zip(p["controls"], first)]
    keys = [first, moved, last]
    if p["controls"][-1]["alone"]:
        keys.append(first[:-1] + [len(p["controls"][-1]["values"]) - 1])
    return list(dict.fromkeys(",".join(map(str, k)) for k in keys))


def drawn(chapter: str, values: dict) -> dict:
    fig = web.explorer(chapter).figure(**values)
    try:
        return web.figure_data(fig)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------- every control, its whole range
SLIDER_VALUES = (4, 7)       # a number slider: at least its ends, its default and one between


def short_of_the_notebook(chapter: str) -> list[str]:
    """What the chapter's page lacks of its notebook's explorer (grids only, no frames): a
    control it does not offer, a value of a list it leaves out (steps, choice, toggle), or
    a number slider without its ends, its default or a handful of values."""
    controls, offered = web.controls(chapter), web.grid(chapter)
    default = web.explorer(chapter).DEFAULTS
    out = [f"{name}: not on the page" for name in controls if name not in offered]
    for name, values in offered.items():
        control = controls.get(name)
        if control is None:
            out.append(f"{name}: no control of the notebook")
        elif control.kind in ("choice", "steps", "toggle"):
            missing = [v for v in values_of(control) if v not in values]
            out += [f"{name}: leaves out {missing}"] if missing else []
        else:
            out += _slider_short(name, control, values, default[name])
    return out


def _slider_short(name, control, values, default) -> list[str]:
    lo, hi = control.values[:2]
    if control.kind == "log":
        lo, hi = 10.0 ** lo, 10.0 ** hi
    out = [f"{name}: {what} value {v:g} is not offered"
           for what, v in (("its lowest", lo), ("its highest", hi), ("its default", default))
           if not any(math.isclose(v, x, rel_tol=1e-9) for x in values)]
    if not SLIDER_VALUES[0] <= len(values) <= SLIDER_VALUES[1]:
        out.append(f"{name}: {len(values)} values, not a handful")
    return out


@pytest.mark.parametrize("chapter", web.CHAPTERS)
def test_the_page_offers_every_control_of_the_notebook_over_its_range(chapter):
    controls, offered = web.controls(chapter), web.grid(chapter)
    assert short_of_the_notebook(chapter) == [], chapter
    for name, values in offered.items():
        assert len(values) > 1 and len(set(map(repr, values))) == len(values), (chapter, name)
        for v in values:
            assert legal(controls[name], v), f"{chapter}: {name}={v!r} is no value of its control"
    frames = len(list(web.settings(chapter)))
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


def test_settings_cross_every_combination_with_one_alone_control_moved():
    offered, single = web.grid("pipeline_parallel"), web.alone("pipeline_parallel")
    settings = dict(web.settings("pipeline_parallel"))
    together = math.prod(len(v) for name, v in offered.items() if name not in single)
    assert len(settings) == together * (1 + sum(len(v) - 1 for v in single.values()))
    defaults = web.explorer("pipeline_parallel").DEFAULTS
    for values in settings.values():
        assert sum(values[name] != defaults[name] for name in single) <= 1, values


def test_a_page_short_of_the_notebook_is_caught(monkeypatch):
    cluster, tp = web.explorer("cluster"), web.explorer("tensor_parallel")
    monkeypatch.setattr(cluster, "ALONE", {k: v for k, v in cluster.ALONE.items() if k != "dp"})
    monkeypatch.setattr(tp, "ALONE", {**tp.ALONE, "tflops": [100.0, 430.0, 600.0, 800.0],
                                      "seq_len": tp.ALONE["seq_len"][1:]})
    assert short_of_the_notebook("cluster") == ["dp: not on the page"]
    assert short_of_the_notebook("tensor_parallel") == [
        "seq_len: leaves out [1024]", "tflops: its highest value 900 is not offered"]


# ---------------------------------------------------------------- agreeing with the chapter


# ---------------------------------------------------------------- agreeing with the chapter


def gantt_passes(frame: dict) -> dict[str, float]:
    """Each pass's total box width in a pipeline frame (the boxes' legend names)."""
    widths: dict[str, float] = {}
    colours = {e["label"]: e["color"] for e in frame["axes"][0]["legend"]["entries"]}
    for shape in frame["axes"][0]["shapes"]:
        for name, colour in colours.items():
            if shape["facecolor"] == colour:
                widths[name] = widths.get(name, 0.0) + shape["width"]
    return widths


def test_zero_bubble_splits_b_and_w_and_draws_the_simulators_bubble():
    pipeline = web.explorer("pipeline_parallel")
    values = {**pipeline.DEFAULTS, "schedule": "zb"}
    assert values["t_w"] > 0
    frame = drawn("pipeline_parallel", values)
    assert gantt_passes(frame).get("W", 0) > 0, "zb draws no W"
    timeline = simulate(make_schedule("zb", values["p"], values["m"]), values["t_f"],
                        values["t_b"], values["t_w"])
    [closed, simulated] = [ln for ln in frame["axes"][1]["lines"] if ln["label"]]
    at_m = closed["y"][closed["x"].index(values["m"])]
    assert simulated["y"] == [pytest.approx(timeline.bubble_fraction, rel=1e-5)]
    assert at_m == pytest.approx(timeline.bubble_fraction, rel=1e-5)   # m >= p, t_w <= t_f, t_b
    one_f_one_b = simulate(make_schedule("1f1b", values["p"], values["m"]), values["t_f"],
                           values["t_b"], values["t_w"])
    assert timeline.bubble_fraction < one_f_one_b.bubble_fraction / 2   # the chapter: a third


def test_the_cp_layout_panel_draws_the_cp_of_the_slider():
    cp_explorer = web.explorer("context_parallel")
    for cp in web.grid("context_parallel")["cp"]:
        frame = drawn("context_parallel", {**cp_explorer.DEFAULTS, "cp": cp})
        layout_title = frame["axes"][0]["title"][0]["text"]
        assert f"cp={cp}:" in layout_title, (cp, layout_title)
        assert not any(line.startswith(":") for t in frame["texts"] for line in t["text"].split("\n"))
        bytes_axis = frame["axes"][2]["y"]
        assert bytes_axis["scale"] == "log" and len(bytes_axis["ticks"]) >= 2, bytes_axis


def test_the_tp_explorer_reads_the_data_sheets_link():
    tp = web.explorer("tensor_parallel")
    assert tp.DEFAULTS["link_GBps"] == H100.nvlink_GBps
    assert tp.NIC_GBps == H100.nic_Gbps / 8
    assert H100.nvlink_GBps in web.grid("tensor_parallel")["link_GBps"]
    assert all(web.controls("tensor_parallel")[name].kind != "log" for name in tp.CONTROLS)


def invalid_lines(frame: dict) -> str:
    return "\n".join(t["text"] for ax in frame["axes"] for t in ax["texts"])


def test_the_mfu_explorers_tp16_says_the_rule_and_the_fix():
    assert 16 in web.grid("mfu")["tp"]
    frame = drawn("mfu", {**web.explorer("mfu").DEFAULTS, "tp": 16})
    text = invalid_lines(frame)
    assert "--tp 16 does not divide n_kv_heads=8" in text
    assert "tp = 1, 2, 4 or 8" in text, text
    for fix in (1, 2, 4, 8):                      # each fix it names is valid
        assert whatif_estimate(tp=fix)[1] is None


def test_an_invalid_pipeline_says_the_rule_and_values_that_fix_it():
    pipeline = web.explorer("pipeline_parallel")
    values = {**pipeline.DEFAULTS, "schedule": "interleaved", "p": 4, "m": 2}
    text = invalid_lines(drawn("pipeline_parallel", values))
    assert "--schedule interleaved needs --microbatches (2) to be a multiple of --pp 4" in text
    assert "m = 4, 8, 16 or 32" in text, text
    for line in text.split("\n"):
        assert len(line) <= 100, line                  # wrapped: a page does not wrap it


def test_every_whatif_fix_named_is_valid():
    model = ModelConfig.preset("llama3-405b")
    values = {**web.explorer("mfu").DEFAULTS, "seq_len": 131072}
    assert layout_problems_of(model, values)
    fixes = one_change_fixes(WHATIF_CONTROLS, values, lambda kw: layout_problems_of(model, kw))
    assert fixes
    for fix in fixes:
        name, _, shown = fix.partition(" = ")
        control = next(n for n, c in WHATIF_CONTROLS.items() if (c.label or n) == name)
        first = shown.replace(" or ", ", ").split(", ")[0].replace(",", "")
        value = type(values[control])(first) if not isinstance(values[control], str) else first
        assert not layout_problems_of(model, {**values, control: value}), fix


# ---------------------------------------------------------------- the planner, both ways
FOURD_SETTINGS = [dict(model="llama3-405b", gpus=8192, seq_len=8192, batch_mtokens=16),
                  dict(model="llama3-405b", gpus=16384, seq_len=8192, batch_mtokens=16),
                  dict(model="llama3-70b", gpus=1024, seq_len=8192, batch_mtokens=16)]


def test_the_planner_starts_at_the_chapters_case_and_reaches_16k_gpus():
    fourd = web.explorer("fourd")
    assert {k: fourd.DEFAULTS[k] for k in ("model", "gpu", "gpus", "seq_len", "batch_mtokens")} == \
        dict(model="llama3-405b", gpu="h100", gpus=8192, seq_len=8192, batch_mtokens=16)
    reachable = [values for _, values in web.settings("fourd")]
    for gpus in (8192, 16384):
        assert any(v["model"] == "llama3-405b" and v["gpu"] == "h100" and v["gpus"] == gpus
                   and v["batch_mtokens"] == 16 and v["seq_len"] == 8192 and not v["tp_overlap"]
                   for v in reachable), gpus


def test_the_planners_box_is_one_size_and_holds_its_labels():
    fourd = web.explorer("fourd")
    boxes = set()
    for values in (fourd.DEFAULTS, {**fourd.DEFAULTS, "model": "llama3-8b", "gpus": 1024},
                   {**fourd.DEFAULTS, "gpus": 8, "batch_mtokens": 4}):     # 405B on 8: nothing fits
        fig = fourd.figure(**values)
        try:
            fig.draw_without_rendering()
            renderer = fig.canvas.get_renderer()
            boxes.add((tuple(fig.get_size_inches()), tuple(fig.axes[0].get_position().bounds)))
            for ax in fig.axes:
                for text in ax.texts + [ax.title]:
                    box = text.get_window_extent(renderer).transformed(fig.transFigure.inverted())
                    assert 0 <= box.x0 and box.x1 <= 1, text.get_text()
        finally:
            plt.close(fig)
    assert len(boxes) == 1, boxes


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
    offered, setting = web.grid("fourd"), {**web.explorer("fourd").DEFAULTS, **setting}
    key = ",".join(str(offered[name].index(setting[name])) for name in offered)
    p = json.loads(json.dumps(web.payload("fourd", keys=[key])))
    values = p["values"][key]
    assert explorer_ranking(p["frames"][key]) == cli_ranking(values)


def test_a_setting_where_nothing_fits_says_why_and_what_to_change():
    fourd = web.explorer("fourd")
    text = invalid_lines(drawn("fourd", {**fourd.DEFAULTS, "gpus": 8, "batch_mtokens": 4}))
    assert "nothing fits: memory" in text and "more GPUs" in text, text


def test_the_prefetcher_keeps_each_result_and_computes_it_once():
    calls = []

    def compute(x, y):
        calls.append((x, y))
        if x < 0:
            raise ValueError("negative")
        return x + y

    plans = Prefetcher(compute)
    plans.warm([(1, 2), (3, 4)])
    assert plans.get((3, 4)) == 7 and plans.get((1, 2)) == 3
    assert plans.get((5, 6)) == 11
    assert sorted(calls) == [(1, 2), (3, 4), (5, 6)]         # kept: asked twice, computed once
    with pytest.raises(ValueError, match="negative"):
        plans.get((-1, 0))


def test_the_prefetchers_guesses_run_in_their_own_process():
    """A guess runs beside the kernel, not in its thread (which it would slow: the
    interpreter's lock), and what it found is kept; what the reader asks for and nobody
    guessed is computed in the caller."""
    # In a process of its own: a spawned worker starts multiprocessing's resource tracker,
    # which would outlive this test in pytest's process group (the signal tests' target).
    code = ("import os\n"
            "from minipar.teach.explorers.prefetch import Prefetcher\n"
            "plans = Prefetcher(os.getpid)\n"
            "plans.warm([()])\n"
            "assert plans.get(()) != os.getpid()\n"
            "assert plans.get(()) == plans.get(())\n"                 # kept
            "assert Prefetcher(os.getpid).get(()) == os.getpid()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=REPO_ROOT)
