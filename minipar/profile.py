"""Traces everyone can open: one Chrome/Perfetto file for the whole job (`--profile DIR`),
and what it says about communication: how much of each axis' time was hidden behind
computation, and how much the ranks waited for.

Chapter "From a laptop to a cluster", section "Reading a trace".

What a rank does reaches one stream, `minipar.events` (collectives, waits, compute spans,
activation bytes); this file adds the per-layer spans (`trace_layers`) and turns the stream
into a file others can read.

`finish` gathers every rank's spans on rank 0, which writes them in the Trace Event Format
(the JSON of chrome://tracing, which ui.perfetto.dev opens too): a process per rank
(pid = rank), a thread track for its computation and one per axis for its collectives,
times in microseconds.

Exposure (`exposure`, a pure function of the file): on each rank, the rank *computes* while
inside a compute span and not blocked (in a blocking collective or a wait). An axis'
communication time is the union of its spans; the part of it during which the rank computed
is hidden, the rest is exposed: the rank had nothing to do but wait for it. For the pipeline
axis a receive is posted long before its sender has produced anything, so "exposed" there
includes the bubble: waiting for a message is waiting for the stage that sends it.

The clock: `time.perf_counter_ns` is CLOCK_MONOTONIC on Linux, one clock for every process of
a machine, so ranks forked on one machine share it exactly. Ranks on several machines (under
torchrun) are aligned at a barrier when recording starts, to within that barrier's skew.

What the spans time is the host's view. On CPU with gloo that is the work itself. On GPUs a
kernel launch, and an NCCL collective, return to Python before the device has run them: the
spans then show when work was issued, and the device's own timeline is `torch.profiler`'s
(its trace of a rank opens in Perfetto next to this one).
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from . import events

AXES = ("tp", "cp", "pp", "dp", "world")


# ======================================================================= recording
def start() -> events.Recorder:
    """Start recording on this rank (every rank of the job calls it: a barrier lines them up)."""
    dist.barrier()
    return events.start(dist.get_rank())


# -- per-layer spans, from module and tensor hooks -----------------------------------------
def trace_layers(chunks) -> None:
    """Hooks on every transformer layer of `chunks`: a span for its forward (pre- and post-
    forward hooks) and one for its backward, from the moment the gradient of its output
    arrives to the moment the gradient of its input is complete (hooks on those tensors).
    They record only while a Recorder is installed."""
    for chunk in chunks:
        for name, block in chunk.layers.items():
            block.register_forward_pre_hook(functools.partial(_layer_in, int(name)))
            block.register_forward_hook(functools.partial(_layer_out, int(name)))


def _layer_in(layer, module, args):
    rec = events.RECORDER
    if rec is not None:
        module._profile = {"start": events.now(), "outer": rec.context}
        rec.context = {**rec.context, "layer": layer}       # its collectives say which layer


def _layer_out(layer, module, args, out):
    """The layer's forward span; and its backward's, to begin when the gradient of `out`
    arrives and end when the gradient of its input is complete."""
    rec, state = events.RECORDER, getattr(module, "_profile", None)
    if rec is None or state is None:
        return
    rec.context = state["outer"]
    rec.add(f"layer {layer} F", "layer", state["start"], events.now(), layer=layer, kind="F")
    if torch.is_grad_enabled() and args[0].requires_grad and out.requires_grad:
        backward = {"start": None, "done": False, "args": {**rec.context, "layer": layer}}
        _when_grad_arrives(out)["begins"].append(backward)
        _when_grad_arrives(args[0])["ends"].append(backward)
    module._profile = None


def _when_grad_arrives(t: torch.Tensor) -> dict:
    """The one hook on `t` that times layer backwards: the spans that end and those that
    begin when its gradient arrives, at one timestamp (layer i's input is layer i-1's
    output, so one layer's backward ends exactly where the next one's begins)."""
    if not hasattr(t, "_profile_grad"):
        t._profile_grad = {"ends": [], "begins": []}
        t.register_hook(functools.partial(_grad_arrived, t._profile_grad))
    return t._profile_grad


def _grad_arrived(state, grad):
    rec, now = events.RECORDER, events.now()
    for bwd in state["ends"]:
        # zero-bubble's W may run a node again: a layer's backward span is closed once
        if rec is not None and not bwd["done"] and bwd["start"] is not None:
            bwd["done"] = True
            rec.add(f"layer {bwd['args']['layer']} B", "layer", bwd["start"], now,
                    **{**bwd["args"], "kind": "B"})
    for bwd in state["begins"]:
        if rec is not None and bwd["start"] is None:
            bwd["start"] = now      # the collectives from here on are this layer's backward
            rec.context = {**rec.context, "layer": bwd["args"]["layer"]}


# ==================================================================== the file
def finish(path: str | Path, coords: dict | None = None, meta: dict | None = None):
    """Stop recording, gather every rank's events on rank 0 and write one trace file there
    (gzipped when `path` ends in .gz; a directory gets `trace.json`). Collective: every
    rank calls it. Returns the trace (rank 0) or None."""
    rec = events.stop()
    part = {"rank": rec.rank, "host": socket.gethostname(), "start_ns": rec.start_ns,
            "spans": rec.events, "coords": coords or {}}
    parts = [None] * dist.get_world_size() if rec.rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    if rec.rank == 0:
        trace = trace_events(parts, meta)
        write(trace, path)
        return trace


def trace_path(path: str | Path) -> Path:
    """`--profile DIR` -> DIR/trace.json; a path ending in .json or .json.gz is the file."""
    return Path(path) if str(path).endswith((".json", ".json.gz")) else Path(path) / "trace.json"


def _open(path: Path, mode: str):
    return (gzip.open if path.name.endswith(".gz") else open)(path, mode)


def write(trace: dict, path) -> Path:
    path = trace_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "wt") as f:
        json.dump(trace, f)
    return path


def load(path) -> dict:
    """A trace file (or a --profile directory), gzipped or not."""
    with _open(trace_path(path), "rt") as f:
        return json.load(f)


def delivered(parts: list[dict]) -> None:
    """End each send's span when its message arrived: when the matching receive (the same
    sender, receiver and tag, in posting order) completed on the peer. gloo reports neither
    end's completion; a send's own wait may come much later (the pipeline waits for its
    sends at the end of the step)."""
    sends, recvs = {}, {}
    for me, s in ((part["rank"], s) for part in parts for s in part["spans"]):
        a = s["args"]
        if s["cat"] == "comm" and a.get("op") in ("send", "recv") and "peer" in a:
            key = (me, a["peer"], a["tag"]) if a["op"] == "send" else (a["peer"], me, a["tag"])
            (sends if a["op"] == "send" else recvs).setdefault(key, []).append(s)
    for key, out in sends.items():
        for send, recv in zip(out, recvs.get(key, [])):
            if send["end"] is not None and recv["end"] is not None:
                send["end"] = max(send["start"], min(send["end"], recv["end"]))


def trace_events(parts: list[dict], meta: dict | None = None) -> dict:
    """The Trace Event Format object of every rank's spans (sends ended at their delivery).
    Each rank's time 0, in its own clock: on one machine every process reads the same
    monotonic clock, so one epoch for all (the earliest start); across machines each rank's
    own start, which the start barrier made simultaneous."""
    delivered(parts)
    one_machine = len({p["host"] for p in parts}) == 1
    first = min(p["start_ns"] for p in parts)
    out, ranks = [], {}
    for part in sorted(parts, key=lambda p: p["rank"]):
        r, coords = part["rank"], part["coords"]
        ranks[str(r)] = coords
        label = " ".join(f"{a}{coords[a]}" for a in ("tp", "cp", "pp", "dp") if a in coords)
        out += _track("process", r, 0, f"rank {r}" + (f" ({label})" if label else ""), r)
        out += _track("thread", r, 0, "compute", 0)
        out += _rank_events(r, part["spans"], first if one_machine else part["start_ns"])
    clock = ("one machine: one monotonic clock" if one_machine
             else "several machines: aligned at a start barrier")
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"minipar": {**(meta or {}), "clock": clock, "ranks": ranks}}}


def _track(kind: str, pid: int, tid: int, name: str, index: int) -> list[dict]:
    """The metadata ("M") events that name a process or thread track and set its place."""
    return [{"name": f"{kind}_{key}", "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}
            for key, value in (("name", name), ("sort_index", index))]


def _rank_events(rank: int, recorded: list[dict], epoch: int) -> list[dict]:
    """One rank's X events. Collectives go on one track per axis; overlapping ones (buckets
    in flight together) on extra lanes of it, so that every track nests properly."""
    out, lanes = [], {}                     # axis -> end of the last span on each lane
    done = [s for s in recorded if s["end"] is not None]
    for s in sorted(done, key=lambda s: (s["start"], -s["end"])):
        tid = 0
        if s["cat"] == "comm":
            axis = s["args"]["axis"]
            ends = lanes.setdefault(axis, [])
            lane = next((i for i, e in enumerate(ends) if e <= s["start"]), len(ends))
            tid = 100 * (1 + (AXES.index(axis) if axis in AXES else len(AXES))) + lane
            if lane == len(ends):          # a new lane: name its track
                name = f"{axis} comm" + (f" ({lane + 1})" if lane else "")
                out += _track("thread", rank, tid, name, tid)
            ends[lane:lane + 1] = [s["end"]]     # a new lane's end, or a later one on its lane
        out.append({"name": s["name"], "cat": s["cat"], "ph": "X", "pid": rank, "tid": tid,
                    "ts": (s["start"] - epoch) / 1e3, "dur": (s["end"] - s["start"]) / 1e3,
                    "args": s["args"]})
    return out


# ================================================================ reading a trace
def spans(trace: dict, cat: str | None = None, pid: int | None = None) -> list[dict]:
    """The complete ("X") events of a trace, of one category and rank if given."""
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and (cat is None or e["cat"] == cat) and (pid is None or e["pid"] == pid)]


def intervals(xs) -> list[tuple[float, float]]:
    """(start, end) of each X event of `xs`, in microseconds."""
    return [(e["ts"], e["ts"] + e["dur"]) for e in xs]


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as `intervals`."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(xs, ys) -> list[tuple[float, float]]:
    """The overlap of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        i, j = (i + 1, j) if xs[i][1] < ys[j][1] else (i, j + 1)   # drop the one ending first
    return out


def subtract(xs, ys) -> list[tuple[float, float]]:
    """xs minus ys (both sorted and disjoint): xs within the gaps between the ys."""
    edges = [-math.inf, *(t for y in ys for t in y), math.inf]
    return intersect(xs, list(zip(edges[::2], edges[1::2])))


def step_windows(trace: dict, pid: int) -> dict[int, tuple[float, float]]:
    """{step: (start, end)} of rank `pid`'s steps, in microseconds."""
    return {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in spans(trace, "step", pid)}


def hidden_and_exposed(trace: dict, pid: int, start: float = -math.inf,
                       end: float = math.inf) -> dict[str, tuple[list, list]]:
    """Rank `pid`'s communication of each axis posted between `start` and `end`, as two
    interval lists: hidden (the rank computed meanwhile) and exposed (it did not)."""
    mine = spans(trace, pid=pid)
    # the rank computes while inside a compute span and not blocked in a collective or a wait
    blocked = union(intervals(e for e in mine if e["cat"] == "wait"
                              or e["cat"] == "comm" and e["args"].get("blocking")))
    busy = subtract(union(intervals(e for e in mine if e["cat"] == "compute")), blocked)
    posted = [e for e in mine if e["cat"] == "comm" and start <= e["ts"] <= end]
    out = {}
    for axis in sorted({e["args"]["axis"] for e in posted}):
        comm = union(intervals(e for e in posted if e["args"]["axis"] == axis))
        out[axis] = (intersect(comm, busy), subtract(comm, busy))
    return out


def exposure(trace: dict, from_step: int = 0) -> dict[str, dict[str, float]]:
    """Each axis' communication time, split into hidden (the rank computed meanwhile) and
    exposed, in seconds per rank (the mean over ranks), over the steps from `from_step` on
    (the first step warms up). {axis: {"total", "hidden", "exposed", "spans", "steps"}}:
    "spans" the collectives per rank, "steps" how many steps that covers."""
    pids = sorted({e["pid"] for e in spans(trace)})
    out: dict[str, dict[str, float]] = {}
    for pid in pids:
        windows = [w for s, w in step_windows(trace, pid).items() if s >= from_step]
        start = min((a for a, _ in windows), default=-math.inf)
        posted = [e["args"]["axis"] for e in spans(trace, "comm", pid) if e["ts"] >= start]
        for axis, (hidden, exposed) in hidden_and_exposed(trace, pid, start).items():
            row = out.setdefault(axis, dict(hidden=0.0, exposed=0.0, spans=0, steps=len(windows)))
            row["hidden"] += length(hidden) / 1e6 / len(pids)
            row["exposed"] += length(exposed) / 1e6 / len(pids)
            row["total"] = row["hidden"] + row["exposed"]
            row["spans"] += posted.count(axis) / len(pids)
    return out


def format_exposure(table: dict, backend: str = "gloo") -> str:
    """The small table a --profile run prints at its end."""
    note = ("gloo on shared CPU cores: what the code lets overlap, not NCCL's speed on GPUs"
            if backend == "gloo" else f"{backend}: when the host issued the work; the "
            "device's own timeline is torch.profiler's")
    lines = [f"communication per rank, mean over ranks ({note}):",
             "axis    spans  total ms  hidden ms  exposed ms  hidden"]
    lines += [f"{axis:6s} {r['spans']:6.0f} {1e3 * r['total']:9.2f} {1e3 * r['hidden']:10.2f} "
              f"{1e3 * r['exposed']:11.2f} {r['hidden'] / (r['total'] or 1):7.0%}"   # hidden share
              for axis, r in table.items()]
    return "\n".join(lines)
