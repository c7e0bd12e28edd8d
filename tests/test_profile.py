"""--profile: one Trace Event Format file for the whole job, and the exposure read from it.

The pure parts (interval algebra, exposure, lanes, pairing sends with receives) are checked
against brute force or hand-made traces; two real runs check the file itself: valid Trace
Event Format, a track per rank, one span per collective CommLog counted, one clock.
"""
from __future__ import annotations

import gzip
import json
import random
import time
from collections import Counter

import pytest

from minipar.trainer import profile
from minipar.plan import traces
from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.plan.schedule_analysis import pipeline_events, timeline_from_events
from minipar.plan.schedules import make_schedule
from minipar.runtime.run import train


# ------------------------------------------------------------------ pure: intervals
def _cells(intervals, grid=40):
    return {t for a, b in intervals for t in range(grid) if a <= t < b}


@pytest.mark.parametrize("seed", range(20))
def test_interval_algebra_matches_brute_force(seed):
    rng = random.Random(seed)

    def some():
        out = []
        for _ in range(rng.randrange(6)):
            a = rng.randrange(40)
            out.append((a, min(40, a + rng.randrange(1, 10))))
        return out

    xs, ys = some(), some()
    ux, uy = traces.union(xs), traces.union(ys)
    assert _cells(ux) == _cells(xs)
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(ux, ux[1:]))       # sorted, disjoint
    assert _cells(traces.intersect(ux, uy)) == _cells(xs) & _cells(ys)
    assert _cells(traces.subtract(ux, uy)) == _cells(xs) - _cells(ys)
    assert traces.length(ux) == len(_cells(xs))


def _x(name, cat, ts, dur, pid=0, tid=0, **args):
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def test_exposure_of_a_hand_made_trace():
    # compute 0-100 us; a bucket all-reduce in flight 20-90 while the rank computes, except
    # 60-80 where it waits for it; a blocking TP all-reduce 30-40 inside the compute.
    trace = {"traceEvents": [
        _x("step 0", "step", 0, 100, step=0),
        _x("B mb0", "compute", 0, 100, kind="B"),
        _x("dp all_reduce", "comm", 20, 70, tid=400, axis="dp", blocking=False),
        _x("wait dp all_reduce", "wait", 60, 20),
        _x("tp all_reduce", "comm", 30, 10, tid=100, axis="tp", blocking=True),
    ]}
    got = traces.exposure(trace)
    # dp: 20-90 minus blocked (30-40 tp, 60-80 wait) -> hidden 20-30, 40-60, 80-90 = 40 us
    assert got["dp"]["total"] == pytest.approx(70e-6)
    assert got["dp"]["hidden"] == pytest.approx(40e-6)
    assert got["dp"]["exposed"] == pytest.approx(30e-6)
    assert got["tp"]["hidden"] == 0 and got["tp"]["exposed"] == pytest.approx(10e-6)
    assert "tp" in traces.format_exposure(got)


def test_collectives_in_flight_together_get_lanes_that_nest():
    spans = [{"name": "dp all_reduce", "cat": "comm", "start": a, "end": b,
              "args": {"axis": "dp", "id": i}} for i, (a, b) in
             enumerate([(0, 50), (10, 60), (55, 70), (65, 80)])]
    events = [e for e in traces.rank_events(0, spans, 0) if e["ph"] == "X"]
    by_tid = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(by_tid) == 2
    for lane in by_tid.values():
        lane.sort()
        assert all(b <= c for (_, b), (c, _) in zip(lane, lane[1:]))


def test_a_send_ends_when_its_receive_arrived():
    send = {"cat": "comm", "start": 10, "end": 500, "args": {"op": "send", "peer": 1, "tag": 3}}
    recv = {"cat": "comm", "start": 5, "end": 40, "args": {"op": "recv", "peer": 0, "tag": 3}}
    other = {"cat": "comm", "start": 20, "end": 90, "args": {"op": "recv", "peer": 0, "tag": 4}}
    profile.delivered([{"rank": 0, "spans": [send]}, {"rank": 1, "spans": [recv, other]}])
    assert send["end"] == 40


# ------------------------------------------------------------------ real runs
def _run(tmp_path, name, steps=2, **layout):
    path = tmp_path / name
    t0 = time.perf_counter()
    out = train(TrainConfig(parallel=ParallelConfig(**layout), steps=steps, progress=False,
                            profile=str(path)))
    wall_us = (time.perf_counter() - t0) * 1e6
    return out, traces.load(path), wall_us


@pytest.fixture(scope="module")
def tp_pp(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("profile"), "tp2pp2", tp=2, pp=2, microbatches=2)


@pytest.fixture(scope="module")
def dp_cp(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("profile"), "trace.json.gz", dp=2, cp=2)


def _check_format(trace):
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    json.dumps(trace)                                             # plain JSON
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["name"], str)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["cat"], str)
        else:
            assert isinstance(e["args"], dict)
    # complete events on one thread track nest (viewers draw them as a stack)
    tracks = {}
    for e in traces.spans(trace):
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, events in tracks.items():
        stack = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + 1e-3:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"] + 1e-3, \
                (track, stack[-1]["name"], e["name"])
            stack.append(e)


def _last_step_comm(trace, pid, alone=False):
    """(axis, op) -> spans of collectives posted during this rank's last step: over two or
    more ranks (what CommLog counts), or with `alone` the notes of collectives over a group
    of one (`comm.alone`: no bytes, for a replay that widens the axis)."""
    windows = traces.step_windows(trace, pid)
    a, b = windows[max(windows)]
    return Counter((e["args"]["axis"], e["args"]["op"]) for e in traces.spans(trace, "comm", pid)
                   if a <= e["ts"] <= b and (len(e["args"]["group"]) == 1) == alone)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["tp_pp", "dp_cp"])
def test_profile_is_one_trace_event_file_with_a_track_per_rank(run, request):
    out, trace, wall_us = request.getfixturevalue(run)
    _check_format(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(len(out["all"])))
    # one clock, inside the run's wall window (time 0 is the first rank's start)
    xs = traces.spans(trace)
    assert min(e["ts"] for e in xs) >= 0
    assert max(e["ts"] + e["dur"] for e in xs) <= wall_us


@pytest.mark.slow
@pytest.mark.parametrize("run", ["tp_pp", "dp_cp"])
def test_one_span_per_collective_that_commlog_counted(run, request):
    out, trace, _ = request.getfixturevalue(run)
    for rank, result in enumerate(out["all"]):
        counted = Counter({(axis, op): st["calls"] for axis, ops in result["comm"].items()
                           for op, st in ops.items()})
        assert _last_step_comm(trace, rank) == counted, f"rank {rank}"
        if run == "tp_pp":     # dp = 1: the gradient sync is noted where it was issued
            assert _last_step_comm(trace, rank, alone=True) == {("dp", "all_reduce"): 1}
        for e in traces.spans(trace, "comm", rank):
            assert {"axis", "op", "payload_bytes", "wire_bytes"} <= set(e["args"])


@pytest.mark.slow
@pytest.mark.parametrize("run", ["tp_pp", "dp_cp"])
def test_every_message_is_sent_before_it_is_received(run, request):
    _, trace, _ = request.getfixturevalue(run)
    sends, recvs = {}, {}
    for e in traces.spans(trace, "comm"):
        a = e["args"]
        if a["op"] in ("send", "recv"):
            src, dst = (e["pid"], a["peer"]) if a["op"] == "send" else (a["peer"], e["pid"])
            (sends if a["op"] == "send" else recvs).setdefault((src, dst, a["tag"]), []).append(e)
    assert sends and sends.keys() == recvs.keys()
    for key in sends:
        assert len(sends[key]) == len(recvs[key])
        for s, r in zip(sorted(sends[key], key=lambda e: e["ts"]), sorted(recvs[key], key=lambda e: e["ts"])):
            assert s["ts"] <= r["ts"] + r["dur"]          # on one clock, posted before it arrived


@pytest.mark.slow
def test_compute_spans_per_layer_and_microbatch(tp_pp):
    out, trace, _ = tp_pp
    steps, m = 2, 2
    for rank in range(4):
        layers = [e for e in traces.spans(trace, "layer", rank)]
        for kind in ("F", "B"):
            got = Counter((e["args"]["layer"], e["args"]["microbatch"]) for e in layers
                          if e["args"]["kind"] == kind)
            stage = trace["otherData"]["minipar"]["ranks"][str(rank)]["pp"]
            want = {(layer, mb): steps for layer in range(4 * stage, 4 * stage + 4) for mb in range(m)}
            assert got == want, (rank, kind)
    # the Gantt chart's events are the schedule's actions, once per step
    tl = timeline_from_events(pipeline_events(trace))
    schedule = make_schedule("1f1b", 2, m)
    assert Counter((e.rank, e.kind, e.microbatch) for e in tl.events) == Counter(
        {(r, a.kind, a.microbatch): steps for r, acts in enumerate(schedule) for a in acts})


@pytest.mark.slow
@pytest.mark.parametrize("run", ["tp_pp", "dp_cp"])
def test_exposure_splits_every_axis_time(run, request):
    out, trace, _ = request.getfixturevalue(run)
    table = out["profile"]["exposure"]
    assert table == traces.exposure(trace, from_step=1)
    want = {"tp", "pp"} if run == "tp_pp" else {"dp", "cp"}
    assert want <= set(table)
    for row in table.values():
        assert row["hidden"] >= 0 and row["exposed"] >= 0
        assert row["hidden"] + row["exposed"] == pytest.approx(row["total"])


def test_a_gzipped_trace_reads_back(tmp_path):
    trace = profile.trace_events([{"rank": 0, "host": "h", "start_ns": 0, "coords": {},
                                   "spans": [{"name": "F mb0", "cat": "compute", "start": 1000,
                                              "end": 3000, "args": {}}]}])
    path = profile.write(trace, tmp_path / "t.json.gz")
    with gzip.open(path, "rt") as f:
        assert json.load(f) == trace == traces.load(path)
    assert traces.spans(trace)[0]["dur"] == 2.0                  # microseconds


@pytest.mark.slow
def test_the_book_s_figures_read_the_trace(tp_pp, dp_cp):
    import matplotlib
    matplotlib.use("Agg")
    from minipar.teach import figures as viz

    out, trace, _ = tp_pp
    key = lambda e: (e["global_rank"], e["start"])  # noqa: E731
    assert sorted(pipeline_events(traces.load(out["profile"]["path"])), key=key) == \
        sorted(pipeline_events(trace), key=key)
    ax = viz.plot_trace_tracks(trace)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [x for x in labels if x.endswith("compute")] == [f"rank {r} compute" for r in range(4)]

    out, trace, _ = dp_cp                      # the data-parallel overlap timeline
    events = viz.overlap_from_trace(trace, pid=0)
    _, buckets, marks = viz.overlap_rows(events)
    a, b = traces.step_windows(trace, 0)[1]
    dp_spans = [e for e in traces.spans(trace, "comm", 0)
                if e["args"]["axis"] == "dp" and a <= e["ts"] <= b]
    assert len(buckets) == len(dp_spans) > 0
    assert all(ev["launch"] <= ev["complete"] <= marks["synced"] + 1e-9 for ev in buckets.values())
    assert len(viz.plot_overlap_timeline({"dp2 cp2": events})) == 1
    rows = {"dp": ("dp", out["profile"]["exposure"]["dp"])}
    assert len(viz.plot_exposure(rows).patches) == 2        # hidden and exposed


@pytest.mark.slow
def test_profiling_leaves_the_run_unchanged(tp_pp):
    from helpers import assert_same_losses, reference
    out, _, _ = tp_pp
    ref = reference(steps=2)
    assert_same_losses(out, ref)
    assert out["records"][-1]["memory"]["activations"] > 0
