"""Traces everyone can open: one Chrome/Perfetto file for the whole job (`--profile DIR`),
and what it says about communication: how much of each axis' time was hidden behind
computation, and how much the ranks waited for.

Chapter "From a laptop to a cluster", section "Reading a trace".

What a rank does reaches one stream, `minipar.trainer.events` (collectives, waits, compute spans,
activation bytes); this file adds the per-layer spans (`trace_layers`) and turns the stream
into a file others can read.

`finish` gathers every rank's spans on rank 0, which writes them in the Trace Event Format
(the JSON of chrome://tracing, which ui.perfetto.dev opens too): a process per rank
(pid = rank), a thread track for its computation and one per axis for its collectives,
times in microseconds.

Reading the file back (the exposure of each axis) is `minipar.plan.traces`', without torch.

The clock: `time.perf_counter_ns` is CLOCK_MONOTONIC on Linux, one clock for every process of
a machine, so ranks forked on one machine share it exactly. Ranks on several machines (under
torchrun) are aligned at a barrier when recording starts, to within that barrier's skew.

What the spans time is the host's view. On CPU with gloo that is the work itself. On GPUs a
kernel launch, and an NCCL collective, return to Python before the device has run them: the
spans then show when work was issued, and the device's own timeline is `torch.profiler`'s
(its trace of a rank opens in Perfetto next to this one).
"""

import functools
import json
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from ..plan.traces import open_trace, rank_events, trace_path, track
from . import events

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


def write(trace: dict, path) -> Path:
    path = trace_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_trace(path, "wt") as f:
        json.dump(trace, f)
    return path


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
        out += track("process", r, 0, f"rank {r}" + (f" ({label})" if label else ""), r)
        out += track("thread", r, 0, "compute", 0)
        out += rank_events(r, part["spans"], first if one_machine else part["start_ns"])
    clock = ("one machine: one monotonic clock" if one_machine
             else "several machines: aligned at a start barrier")
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"minipar": {**(meta or {}), "clock": clock, "ranks": ranks}}}
