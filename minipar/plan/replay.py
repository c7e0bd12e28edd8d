"""The virtual cluster: a run recorded on a laptop, replayed at the speed of a GPU cluster.

Chapter "From a laptop to a cluster" (and the pipeline, 4D and MFU chapters). A `--profile`
trace holds every rank's program as it really ran: each action's compute, each collective,
send and receive in the order the code issued them, and where the code waited for them. On
two CPU cores the clock that timed them says little about an H100. The replay keeps the
program and throws the clock away:

1. `programs`: each rank's step as a list of operations: compute (a span of an action, or
   of one layer inside it), post (a collective, send or receive issued), wait (the rank
   stops until what it names has arrived). A blocking collective is a post and a wait.
2. `Physics`: each operation re-timed on the target: a layer's forward or backward by the
   cost model's kernels at the target model's shapes (`costmodel.time.pass_seconds` of the
   target, a `Scenario`), split
   over the segments the collectives cut it into in proportion to the recorded time; each
   collective and send by the link its group crosses on the target cluster
   (`costmodel.hardware.axis_seconds`: TP inside a server, DP across), its bytes scaled from
   the recorded tensor to the target's.
3. `simulate`: a discrete-event simulation of all ranks. A rank's compute runs in program
   order; a collective starts when its last member has posted it and each member's stream
   of that axis is free (one NCCL communicator runs its collectives in order), and ends its
   time later; a transfer starts when its sender has posted it (its data exists): on a GPU
   the host runs ahead of the device and has long posted the receive, which waits on the
   device, not in Python. Posting does not stop the rank: only a wait does. So buckets overlap the backward, and the
   collective matmul's ring hides behind its matmuls, exactly as far as the program let
   them.

What the replay lacks, and a GPU run has: kernel launch gaps and host overhead, stragglers
and jitter, NCCL's channels competing with the matmuls for SMs and with each other for
links, and anything the program did outside compute spans (it costs nothing here).

Widening: the recorded ranks stand for a wider cluster when an axis's sequence of operations
does not depend on its degree (the group and the bytes change, the order does not): TP
without the collective matmul (whose ring has tp-1 steps), and DP (whose buckets are
noted even over a group of one, `comm.alone`). The replay says when it widened.
"""
import argparse
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import flops, traces
from .blocking import run_until_blocked, stuck
from .config import ConfigError, ModelConfig, ParallelConfig
from .costmodel import frameworks, gpu_cluster
from .costmodel.gpus import GPU_NAMES
from .costmodel.constants import LLAMA3_EFFICIENCY
from .costmodel.experts import uneven_all_to_all_seconds
from .costmodel.memory import param_total_local
from .costmodel.scenario import Scenario
from .costmodel.time import estimate, pass_seconds
from .costmodel.workload import make_workload
from .formulas.collectives import wire_bytes
from .flags import Parser
from .memory import BF16_MIXED
from .pipes import quiet_on_closed_pipe
from .schedules import rank_layers, stage_layer_counts

AXES = ("tp", "cp", "pp", "dp")
EXPERT_AXIS = "ep"          # a mixture of experts' all-to-alls: reported only when recorded
WIDENABLE = ("tp", "dp")


# ================================================================ 1. the recorded program
@dataclass
class Op:
    """One operation of a rank's program: "compute" (`unit`, `cpu_s` recorded), "post" (the
    comm event `comm`) or "wait" (for the comm events `ids`)."""
    kind: str
    cpu_s: float = 0.0
    unit: tuple = ()
    comm: dict = field(default_factory=dict)
    ids: tuple = ()


def programs(trace: dict, step: int | None = None) -> tuple[dict[int, list[Op]], dict]:
    """Each rank's program in step `step` (default: the last every rank recorded; the first
    warms up), and the units its compute belongs to: {unit: {"kind", "layer_kind",
    "chunk", "stage", "microbatch", "name", "cpu_s"}}."""
    ranks = traces.by_rank(trace)
    windows = {pid: traces.step_windows(t, pid) for pid, t in ranks.items()}
    steps = sorted(set.intersection(*(set(w) for w in windows.values()))) if windows else []
    if not steps:
        raise ConfigError("the trace has no step every rank recorded: record it again with --profile")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        said = (f"{steps[0]} to {steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1))
                else ", ".join(map(str, steps)))
        raise ConfigError(f"--step {step}: the trace records step{'s' if len(steps) > 1 else ''} "
                          f"{said} (every rank)")
    out, units = {}, {}
    for pid, t in ranks.items():
        a, b = windows[pid][step]
        out[pid] = _program(pid, [e for e in t["traceEvents"] if a <= e["ts"] < b], units)
    return out, units


def _program(pid: int, events: list[dict], units: dict) -> list[Op]:
    """Sweep one rank's step: at each moment, what was posted and waited for, then the
    compute until the next moment (inside an action, not blocked)."""
    actions = [e for e in events if e["cat"] == "compute"]
    layers = [e for e in events if e["cat"] == "layer"]
    comms = [e for e in events if e["cat"] == "comm"]
    blocked = [e for e in events if e["cat"] == "wait" or e["cat"] == "comm" and e["args"]["blocking"]]
    at = defaultdict(list)               # time -> the posts and waits issued then, in order
    for e in sorted(comms + [w for w in events if w["cat"] == "wait"], key=lambda e: e["ts"]):
        if e["cat"] == "comm":
            at[e["ts"]].append(Op("post", comm=e["args"]))
            if e["args"]["blocking"]:
                at[e["ts"]].append(Op("wait", ids=(e["args"]["id"],)))
        else:
            at[e["ts"]].append(Op("wait", ids=tuple(e["args"]["ids"])))
    marks = defaultdict(list)           # time -> spans that start (+1) or end (-1) then
    for group, e in [("action", e) for e in actions] + [("layer", e) for e in layers] + \
            [("blocked", e) for e in blocked]:
        marks[e["ts"]].append((+1, group, e))
        marks[e["ts"] + e["dur"]].append((-1, group, e))
    edges = sorted(set(marks) | set(at))
    active = {"action": {}, "layer": {}, "blocked": {}}
    ops = []
    for t0, t1 in zip(edges, edges[1:]):
        for sign, group, e in sorted(marks.get(t0, []), key=lambda m: -m[0]):   # starts first
            if sign > 0:
                active[group][id(e)] = e
            else:
                active[group].pop(id(e))
        ops += at.get(t0, [])
        if active["blocked"] or not active["action"]:
            continue
        action = max(active["action"].values(), key=lambda e: e["ts"])
        layer = max(active["layer"].values(), key=lambda e: e["ts"], default=None)
        _compute(ops, units, pid, action, layer, (t1 - t0) / 1e6)
    for t in edges[-1:]:
        ops += at.get(t, [])
    return ops


def _compute(ops: list[Op], units: dict, pid: int, action: dict, layer: dict | None, seconds: float):
    """Append `seconds` of compute inside `action` (and `layer`) to the program."""
    unit = (pid, id(action), id(layer) if layer else None)
    if unit not in units:
        args = action["args"]
        units[unit] = dict(kind=args.get("kind", action["name"]), chunk=args.get("chunk", 0),
                           stage=args.get("stage", 0), microbatch=args.get("microbatch"),
                           layer_kind=layer["args"]["kind"] if layer else None,
                           name=action["name"], cpu_s=0.0)
    units[unit]["cpu_s"] += seconds
    if ops and ops[-1].kind == "compute" and ops[-1].unit == unit:
        ops[-1].cpu_s += seconds
    else:
        ops.append(Op("compute", seconds, unit))


# ================================================================ 2. the target's physics
@dataclass(frozen=True)
class Target(Scenario):
    """The step a trace is replayed as (the cost model's `Scenario`: the target model,
    layout, cluster, batch and stack), and the run it was recorded from."""
    recorded_model: ModelConfig
    recorded_pc: ParallelConfig
    recorded_seq: int
    widened: dict


def target_of(meta: dict, gpu: str = "h100", framework: str | None = None,
              model: str | None = None, seq_len: int | None = None,
              widen: dict | None = None) -> Target:
    """The target of a replay of the run `meta` describes (a trace's otherData.minipar):
    `model` (a preset; default the run's own), `seq_len` (default the run's), `widen`
    ({axis: degree}, tp or dp only). `framework` names the software stack's kernels and
    reduce dtype; what overlaps is the recorded program's, not the framework's."""
    if "model_shape" not in meta:
        raise ConfigError("the trace has no model_shape: record it again with this minipar")
    recorded = ModelConfig(**meta["model_shape"])
    rpc = ParallelConfig(**meta["layout"])
    widen = {k: v for k, v in (widen or {}).items() if v and v != getattr(rpc, k)}
    for axis in widen:
        if axis not in WIDENABLE:
            raise ConfigError(f"--{axis}: only {' and '.join(WIDENABLE)} can be widened (the "
                              "sequence of operations of the others depends on their degree)")
    if "tp" in widen and (rpc.tp == 1 or rpc.tp_overlap):
        raise ConfigError(f"--tp {widen['tp']}: a run with --tp {rpc.tp}"
                          f"{' --tp-overlap' if rpc.tp_overlap else ''} cannot be widened: its "
                          "TP operations depend on the degree (none at 1, tp-1 ring steps with overlap)")
    pc = rpc.replace(**widen)
    target = ModelConfig.preset(model) if model else recorded
    b = meta["global_batch"] // (rpc.dp * rpc.microbatches)
    work = make_workload(seq_len or meta["seq_len"], None, b * rpc.microbatches * pc.dp, b,
                         rpc.recompute)
    cluster = gpu_cluster(gpu)
    precision, eff = BF16_MIXED, LLAMA3_EFFICIENCY
    if framework:
        _, precision, eff = frameworks.apply(frameworks.framework(framework), target, pc, precision)
    return Target(target, pc, cluster, work, precision, eff, recorded, rpc, meta["seq_len"], widen)


class Physics:
    """Seconds of each operation of a recorded program on the target."""

    def __init__(self, t: Target, element_bytes: int = 4):
        self.t, self.elem = t, element_bytes            # the recorded run computed in fp32
        self.passes = pass_seconds(t)
        self.layers = t.model.n_layers / t.recorded_model.n_layers   # target layers per recorded one
        self.tokens = t.work.microbatch_size * t.work.seq_len / t.parallel.cp
        self.recorded_tokens = t.work.microbatch_size * t.recorded_seq / t.recorded_pc.cp

    def compute(self, u: dict) -> float:
        """Seconds of a unit of compute: one layer's pass, or an action's own part."""
        p, pc, kind, layer = self.passes, self.t.parallel, u["kind"], u["layer_kind"]
        last = u["stage"] == pc.pp * pc.virtual_stages - 1      # the global stage of the head
        if kind == "optimizer":
            return p.optimizer
        if layer == "F":                       # a forward, or its recomputation in a backward
            return p.F * self.layers
        if layer == "B":
            return (p.B + (0.0 if pc.schedule == "zb" else p.W)) * self.layers
        if kind == "W":                        # zero-bubble's weight gradients, all the chunk's
            counts = stage_layer_counts(self.t.model.n_layers, pc.pp * pc.virtual_stages)
            return p.W * counts[u["stage"]]
        return getattr(p, f"head_{kind}", 0.0) if last else 0.0     # the head's F or B

    def comm(self, c: dict, stage: int) -> float:
        """Seconds of one collective or send on the target's link for its axis."""
        axis, op = c["axis"], c["op"]
        if axis == EXPERT_AXIS and op == "all_to_all":
            return self.all_to_all(c)
        if axis not in AXES or op == "recv":
            return 0.0
        n_rec = len(c["group"])
        full = c["payload_bytes"] * (n_rec if op == "all_gather" else 1)
        full *= self.ratio(axis, op, full, stage)
        # a layer's TP and CP messages: one recorded layer's stand for several target layers'
        # (DP's buckets scale with the parameters instead, which count every layer)
        times = self.layers if "layer" in c and axis in ("tp", "cp") else 1.0
        pc = self.t.parallel
        n = {"tp": pc.tp, "cp": pc.cp, "pp": 2, "dp": pc.dp * pc.cp}[axis]
        nbytes = full if op == "send" else wire_bytes(op, n, int(full))
        return times * self.t.seconds(nbytes, axis, op, 1)

    def all_to_all(self, c: dict) -> float:
        """An expert-parallel all-to-all: the bytes this rank sent to each member of its group
        (args split_bytes) and received from each (`expert_receives`), each scaled as a token's
        row of dim activations is from the recorded run to the target, timed by the cost
        model's all-to-all physics (`experts.uneven_all_to_all_seconds`)."""
        t, r = self.t, self.t.recorded_model
        scale = (self.tokens / self.recorded_tokens * t.model.dim / r.dim
                 * t.precision.act_bytes / self.elem)
        me = c["group"].index(c["rank"]) if "rank" in c else 0
        send = [b * scale for b in c["split_bytes"]]
        recv = [b * scale for b in c.get("recv_bytes", c["split_bytes"])]
        times = self.layers if "layer" in c else 1.0
        return times * uneven_all_to_all_seconds(send, recv, me, t)

    def ratio(self, axis: str, op: str, full: float, stage: int) -> float:
        """Target bytes over recorded bytes of one message of `axis`."""
        t, m, r = self.t, self.t.model, self.t.recorded_model
        act = t.precision.act_bytes / self.elem
        tokens = self.tokens / self.recorded_tokens
        if axis == "tp":     # activations, a row of dim per token; or one number per token (the loss)
            row = full >= self.recorded_tokens * r.dim * self.elem / t.recorded_pc.tp
            return tokens * (m.dim / r.dim * act if row else 1.0)
        if axis == "cp":     # K and V of the rank's heads (Ulysses' all-to-all: every head)
            width = (lambda x: x.dim) if op == "all_to_all" else (lambda x: x.n_kv_heads * x.head_dim)
            return tokens * act * (width(m) / t.parallel.tp) / (width(r) / t.recorded_pc.tp)
        if axis == "pp":
            sp = t.recorded_pc.tp / t.parallel.tp if t.parallel.sp else 1.0
            return tokens * act * m.dim / r.dim * sp
        dtype = t.precision.param_bytes if op == "all_gather" else t.precision.reduce_bytes
        return (self._params(m, t.parallel, stage) / self._params(r, t.recorded_pc, stage)) * dtype / self.elem

    @staticmethod
    def _params(model: ModelConfig, pc: ParallelConfig, stage: int) -> int:
        layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
        return flops.local_param_count(model, pc.tp, layers, stage == 0, stage == pc.pp - 1)


# ================================================================ 3. the simulation
@dataclass
class Flight:
    """One collective or transfer of the replay: who takes part, when each posted it, and
    (once known) when it ran."""
    axis: str
    seconds: float
    members: tuple
    posted: dict = field(default_factory=dict)      # rank -> time it posted
    start: float | None = None
    end: float | None = None
    op: str = ""


def flights(progs: dict[int, list[Op]], seconds) -> tuple[dict, dict]:
    """Match every rank's posts into flights: the k-th collective of a group on each member
    is one collective (every rank issues a group's collectives in the same order); the k-th
    send from a to b with a tag meets the k-th such receive. Returns {(rank, id): Flight}
    and each rank's flights per axis, in posting order (a stream runs them in order)."""
    by_key, of, queues = {}, {}, defaultdict(list)
    counts = defaultdict(int)
    for rank, prog in progs.items():
        for op in (o for o in prog if o.kind == "post"):
            c = op.comm
            if c["op"] in ("send", "recv"):
                src, dst = (rank, c["peer"]) if c["op"] == "send" else (c["peer"], rank)
                key = ("p2p", src, dst, c.get("tag"))
            else:
                key = (c["axis"], c["op"], tuple(c["group"]))
            counts[(key, rank)] += 1
            key = (key, counts[(key, rank)])
            members = (key[0][1], key[0][2]) if key[0][0] == "p2p" else tuple(c["group"])
            f = by_key.setdefault(key, Flight(c["axis"], 0.0, members, op=c["op"]))
            f.seconds = max(f.seconds, seconds(c, rank))     # the send's time (a receive's is 0)
            of[(rank, c["id"])] = f
            if key[0][0] != "p2p":
                queues[(rank, c["axis"])].append(f)
    return of, queues


class Streams:
    """Every flight of the replay and each rank's streams: a collective runs when its last
    member has posted it and, on each member, the flight before it on that axis has ended."""

    def __init__(self, progs: dict[int, list[Op]], comm):
        self.of, self.queues = flights(progs, comm)
        self.order = {id(f): i for q in self.queues.values() for i, f in enumerate(q)}

    def previous(self, f: Flight, m: int) -> Flight | None:
        i = self.order[id(f)]
        return self.queues[(m, f.axis)][i - 1] if i else None

    def ready(self, f: Flight) -> bool:
        if f.start is not None:
            return False
        if f.op in ("send", "recv"):        # a transfer needs its data; the receive is long posted
            return f.members[0] in f.posted
        if len(f.posted) < len(f.members):
            return False
        return id(f) not in self.order or all(
            p is None or p.end is not None for p in (self.previous(f, m) for m in f.members))

    def post(self, f: Flight, rank: int, t: float):
        """`rank` posts `f` at `t`; run it, and every flight that was waiting for it, if ready."""
        f.posted[rank] = t
        todo = [f] if self.ready(f) else []
        while todo:
            f = todo.pop()
            if f.start is not None:
                continue
            queued = id(f) in self.order
            before = [p.end for p in (self.previous(f, m) for m in f.members) if p] if queued else []
            posted = [f.posted[f.members[0]]] if f.op in ("send", "recv") else f.posted.values()
            f.start = max([*posted, *before])
            f.end = f.start + f.seconds
            for m in f.members if queued else ():      # each member's next may now run
                q, i = self.queues[(m, f.axis)], self.order[id(f)] + 1
                if i < len(q) and self.ready(q[i]):
                    todo.append(q[i])


def simulate(progs: dict[int, list[Op]], compute, comm) -> dict:
    """Replay every rank's program: `compute(rank, op)` and `comm(comm_event, rank)` give
    seconds. Each rank runs until a wait stops it (`blocking.run_until_blocked`, the
    schedules' simulator too). Returns each rank's spans {"spans": {rank: [(cat, what, start,
    end)]}, "end": {rank: time}} in seconds. A program that can never finish (a wait whose
    peer never posts) raises naming the ranks and what they wait for."""
    streams = Streams(progs, comm)

    def start(r: int, op: Op, clock: float):      # each rank runs until it must wait
        if op.kind == "compute":
            return clock, clock + compute(r, op)
        if op.kind == "post":                     # posting does not stop the rank
            streams.post(streams.of[(r, op.comm["id"])], r, clock)
            return clock, clock
        waited = [streams.of[(r, i)] for i in op.ids if (r, i) in streams.of]
        if any(f.end is None for f in waited):
            return None
        return clock, max([clock, *(f.end for f in waited)])

    times = run_until_blocked(progs, start)
    if blocked := stuck(progs, times):
        raise RuntimeError("the replay cannot finish: " + "; ".join(
            f"rank {r} waits for {op.ids}" for r, op in sorted(blocked.items())[:8]))
    spans = {r: _spans(prog, times[r]) for r, prog in progs.items()}
    for (r, _), f in streams.of.items():
        spans[r].append(("comm", f, f.start, f.end))
    return {"spans": spans, "end": {r: t[-1][1] if t else 0.0 for r, t in times.items()}}


def _spans(prog: list[Op], times: list) -> list:
    """A rank's computations and the waits that took time, as (cat, what, start, end)."""
    out = []
    for op, (begin, end) in zip(prog, times):
        if op.kind == "compute":
            out.append(("compute", op.unit, begin, end))
        elif op.kind == "wait" and end > begin:
            out.append(("wait", op.ids, begin, end))
    return out


# ================================================================ 4. what the replay shows
@dataclass
class Replay:
    """A replayed step: the JSON keys of `python -m minipar.replay --json`, the trace
    (`trace.json`) and the target it ran on."""
    step_time_s: float
    bubble_fraction: float
    exposed_s: dict
    hidden_s: dict
    mfu: float
    widened: dict
    trace: dict
    target: Target

    def as_dict(self) -> dict:
        t = self.target
        return {"step_time_s": self.step_time_s, "bubble_fraction": self.bubble_fraction,
                "exposed_s": self.exposed_s, "hidden_s": self.hidden_s, "mfu": self.mfu,
                "widened": self.widened, "gpus": t.parallel.world_size, "model": t.model.name,
                "layout": t.parallel.as_dict(), "seq_len": t.work.seq_len, "gpu": t.cluster.name}


def replay(trace: dict, gpu: str = "h100", framework: str | None = None, model: str | None = None,
           seq_len: int | None = None, widen: dict | None = None, step: int | None = None,
           physics=None) -> Replay:
    """Replay the step `step` (default: the last) of a `--profile` trace on `gpu`s. `physics`
    (default `Physics` of the target) times each operation: a test may pass its own."""
    meta = trace["otherData"]["minipar"]
    target = target_of(meta, gpu, framework, model, seq_len, widen)
    progs, units = programs(trace, step)
    if "dp" in target.widened and not any(o.comm.get("axis") == "dp" for p in progs.values() for o in p):
        raise ConfigError("--dp: the trace has no data-parallel operations to widen "
                          "(record it again with this minipar: it notes them over one rank)")
    physics = physics or Physics(target)
    expert_receives(progs)
    stage = {int(r): c.get("pp", 0) for r, c in meta["ranks"].items()}
    share = segment_shares(progs, units)

    def compute(rank: int, op: Op) -> float:
        return physics.compute(units[op.unit]) * share[id(op)]

    sim = simulate(progs, compute, lambda c, rank: physics.comm(c, stage[rank]))
    out = replayed_trace(sim, units, meta, target)
    return measure(out, sim, units, target)


def expert_receives(progs: dict[int, list[Op]]) -> None:
    """Each expert-parallel all-to-all's comm event gains `rank` (the poster) and
    `recv_bytes`: what it received from each member, read off the other members' split_bytes
    for the same collective (the k-th of that group on each member, as `flights` matches
    them). A hot expert's rank receives more than it sends: the replay times both."""
    posts = defaultdict(dict)                     # (group, k) -> {rank: its post}
    counts = defaultdict(int)
    for rank, prog in progs.items():
        for op in prog:
            c = op.comm
            if op.kind == "post" and c.get("axis") == EXPERT_AXIS and c.get("op") == "all_to_all":
                key = tuple(c["group"])
                counts[(key, rank)] += 1
                posts[(key, counts[(key, rank)])][rank] = op
    for (group, _), members in posts.items():
        for rank, op in members.items():        # a copy: the trace itself stays as read
            me = group.index(rank)
            op.comm = {**op.comm, "rank": rank, "recv_bytes": [
                members[g].comm["split_bytes"][me] if g in members else 0 for g in group]}


def segment_shares(progs: dict[int, list[Op]], units: dict) -> dict[int, float]:
    """{id(op): its share of its unit's time}. The collectives inside a layer cut it into
    segments; each gets the share of the layer its position took on the CPU, averaged over
    every unit of the same kind (rank, micro-batch), so that the CPU's noise does not make
    one rank of a group late for the next collective."""
    segments = defaultdict(list)                  # unit -> its compute ops, in order
    for prog in progs.values():
        for op in prog:
            if op.kind == "compute":
                segments[op.unit].append(op)
    sums = defaultdict(lambda: defaultdict(float))       # signature -> position -> seconds
    for unit, ops in segments.items():
        sig = _signature(units[unit], len(ops))
        for i, op in enumerate(ops):
            sums[sig][i] += op.cpu_s
    out = {}
    for unit, ops in segments.items():
        row = sums[_signature(units[unit], len(ops))]
        total = sum(row.values())
        out.update({id(op): row[i] / total if total else 1 / len(ops) for i, op in enumerate(ops)})
    return out


def _signature(u: dict, n: int) -> tuple:
    return u["kind"], u["layer_kind"], u["stage"], u["chunk"], n


def replayed_trace(sim: dict, units: dict, meta: dict, target: Target) -> dict:
    """The replay as a Trace Event Format file with `--profile`'s tracks."""
    events = []
    for r, spans in sim["spans"].items():
        mine = [dict(name="step", cat="step", start=0, end=_ns(sim["end"][r]), args={"step": 0})]
        for cat, what, a, b in spans:
            if cat == "compute":
                u = units[what]
                name = u["name"] + (f" layer {u['layer_kind']}" if u["layer_kind"] else "")
                args = {k: u[k] for k in ("kind", "chunk", "stage", "microbatch")}
            elif cat == "wait":
                name, args = "wait", {"ids": list(what)}
            else:
                name, args = f"{what.axis} {what.op}", {"axis": what.axis, "op": what.op,
                                                        "blocking": False, "seconds": what.seconds}
            mine.append(dict(name=name, cat=cat, start=_ns(a), end=_ns(b), args=args))
        coords = meta["ranks"][str(r)]
        label = " ".join(f"{a}{coords[a]}" for a in AXES if a in coords)
        events += traces.track("process", r, 0, f"rank {r} ({label})", r)
        events += traces.track("thread", r, 0, "compute", 0)
        events += traces.rank_events(r, mine, 0)
    replayed = {"gpu": target.cluster.name, "model": target.model.name,
                "layout": target.parallel.as_dict(), "widened": target.widened, "recorded": meta}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"minipar": {**meta, "replay": replayed}}}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def measure(trace: dict, sim: dict, units: dict, target: Target) -> Replay:
    """Step time, bubble, each axis's hidden and exposed seconds (mean over ranks) and MFU."""
    ranks = sorted(sim["end"])
    step = max(sim["end"].values())
    pipeline_end = max((b for r in ranks for cat, u, a, b in sim["spans"][r]
                        if cat == "compute" and units[u]["kind"] in ("F", "B", "W")), default=step)
    window = [(0.0, pipeline_end * 1e6)]
    hidden, exposed, idle = defaultdict(float), defaultdict(float), 0.0
    for r, mine in traces.by_rank(trace).items():
        busy = traces.union(traces.intervals(traces.spans(mine, "compute")))
        comm = traces.union(traces.intervals(traces.spans(mine, "comm")))
        for axis, (h, x) in traces.hidden_and_exposed(mine, r).items():
            hidden[axis] += traces.length(h) / 1e6 / len(ranks)
            exposed[axis] += traces.length(x) / 1e6 / len(ranks)
        doing = traces.union(busy + traces.subtract(comm, busy))
        idle += (window[0][1] - traces.length(traces.intersect(doing, window))) / 1e6
    bubble = idle / len(ranks) / pipeline_end if pipeline_end else 0.0
    w = target.work
    mfu = flops.mfu(w.tokens / step, target.model, w.seq_len, target.cluster.peak_flops,
                    target.parallel.world_size)
    axes = AXES + ((EXPERT_AXIS,) if EXPERT_AXIS in exposed or EXPERT_AXIS in hidden else ())
    keep = {a: 0.0 for a in axes}
    return Replay(step, bubble, {**keep, **{a: exposed[a] for a in axes if a in exposed}},
                  {**keep, **{a: hidden[a] for a in axes if a in hidden}}, mfu, target.widened,
                  trace, target)


def analytic(target: Target, trace: dict | None = None):
    """The cost model's estimate (`costmodel.estimate`) of the same step: the other
    derivation the replay is compared with. With the `trace`, its DP buckets are the
    recorded ones (as many per step, each carrying its share of the target's gradients):
    --bucket-mb means a size, and the target's gradients are far larger than the run's.
    Its pipeline ranks hold what the trainer's did: the layers balanced, the head on the
    last (the cost model's default spreads the head, as Llama 3 balanced its stages)."""
    w, pc = target.work, target.parallel
    if trace is not None and pc.bucket_mb > 0:
        first = traces.by_rank(trace)[0]
        windows = traces.step_windows(first, 0)
        a, b = windows[max(windows)]           # the last step, as `programs` replays
        n = sum(e["args"]["axis"] == "dp" and e["args"]["op"] != "all_gather" and a <= e["ts"] < b
                for e in traces.spans(first, "comm"))
        n /= pc.microbatches if pc.zero >= 2 else 1       # ZeRO-2/3 reduce every micro-batch
        grads = param_total_local(target.model, pc.tp) / pc.pp * target.precision.reduce_bytes
        pc = pc.replace(bucket_mb=grads / max(n, 1) / 1e6)
    return estimate(target.model, pc, target.cluster, w.seq_len, global_batch=w.global_batch,
                    microbatch_size=w.microbatch_size, recompute=w.recompute,
                    precision=target.precision, efficiency=target.efficiency, stage_split="trainer")


# ================================================================ the command line
def _count(text: str) -> int:
    """A flag's count (--tp, --dp, --seq-len): a positive integer."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return n


def _step(text: str) -> int:
    """--step: an integer (whether the trace recorded it is checked against the trace)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer, a recorded step") from None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m minipar.replay", description=(
        "Replay a --profile trace on a GPU cluster: every rank's program re-timed with the cost "
        "model's physics, as a discrete-event simulation."))
    p.add_argument("profile_dir", metavar="PROFILE_DIR", help="a --profile directory or trace file")
    p.add_argument("--gpu", default="h100", choices=GPU_NAMES, help="the target GPU (default: h100)")
    p.add_argument("--framework", default=None, choices=sorted(frameworks.FRAMEWORKS),
                   help="the software stack's kernels and reduce dtype (default: Llama 3's kernels)")
    p.add_argument("--model", default=None, help="a model preset to replay at (default: the run's own)")
    p.add_argument("--seq-len", type=_count, default=None, help="tokens per sequence (default: the run's)")
    p.add_argument("--tp", type=_count, default=None, help="widen TP to this degree (not with --tp-overlap)")
    p.add_argument("--dp", type=_count, default=None, help="widen DP to this degree")
    p.add_argument("--step", type=_step, default=None, help="the recorded step (default: the last)")
    p.add_argument("--out", default=None, help="write the replayed trace to OUT/trace.json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


# What a damaged or edited trace breaks deep in the replay, once `check_trace` let it through:
# named as the trace's fault (its file), never a traceback.
DAMAGED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError,
           RuntimeError)


@quiet_on_closed_pipe
def main(argv=None) -> int:
    """The command: exit 0; 2 with one line naming the flag, the file or its field."""
    args = build_parser().parse_args(argv)
    try:
        path = traces.trace_path(args.profile_dir)
        if not path.exists():
            raise ConfigError(f"PROFILE_DIR {args.profile_dir}: no trace ({path}); record one with --profile")
        if args.out:
            writable(args.out)
        trace = traces.load(path)
        check_trace(trace, path)
        try:
            r = replay(trace, args.gpu, args.framework, args.model, args.seq_len,
                       {"tp": args.tp, "dp": args.dp}, args.step)
        except ConfigError:
            raise
        except OverflowError:                 # the flags' arithmetic, not the trace's
            raise ConfigError(BEYOND) from None
        except DAMAGED as e:
            raise traces.TraceError(f"{path}: a damaged or edited trace: the replay fails on "
                                    f"it ({type(e).__name__}: {e})") from None
        finite(r.as_dict())
        if args.out:
            write_trace(r.trace, Path(args.out))
    except ConfigError as e:
        print(f"python -m minipar.replay: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r.as_dict(), indent=2, allow_nan=False))
    else:
        print(format_replay(r) + (f"\ntrace: {args.out}/trace.json (open it in ui.perfetto.dev)"
                                  if args.out else ""))
    return 0


BEYOND = "the target (--model, --seq-len, --tp, --dp, --gpu) is beyond what floating point carries"


def finite(d: dict) -> None:
    """The replay's every number must be finite (JSON has no NaN or Infinity): a step beyond
    floating point is refused naming the flags that size it."""
    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(x, float) and not math.isfinite(x):
            raise ConfigError(f"the replay's {where} is {x}: {BEYOND}")
    walk(d, "")


def writable(out: str) -> None:
    """--out names a directory that is, or can be made, writable: checked before the replay."""
    p = Path(out)
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise ConfigError(f"--out {out}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {p} is not writable")


def write_trace(trace: dict, out: Path) -> None:
    """OUT/trace.json, never half-written, and nothing left behind when it cannot be written
    (--out named in the error): the temporary file and the directories made for it go."""
    made = [d for d in (out, *out.parents) if not d.exists()]
    path = out / "trace.json"
    tmp = path.with_suffix(".tmp")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(trace, allow_nan=False))
        tmp.replace(path)
    except (OSError, ValueError) as e:
        for leftover in (tmp, *made):       # innermost first: only what was made here
            try:
                leftover.rmdir() if leftover in made else leftover.unlink(missing_ok=True)
            except OSError:
                pass
        raise ConfigError(f"--out {out}: cannot write {path.name} there "
                          f"({getattr(e, 'strerror', None) or e})") from None


def check_trace(trace, path) -> None:
    """What the replay reads of a trace, checked before it reads it: the Trace Event Format
    object, minipar's metadata (otherData.minipar: the model, layout, batch, ranks) and every
    complete event's fields. `TraceError` names the file and the first field that is wrong."""
    try:
        meta = _minipar_meta(trace)
        world = _check_meta(meta)
        _check_events(trace["traceEvents"], world)
    except ValueError as e:
        raise traces.TraceError(f"{path}: {e}") from None


def _minipar_meta(trace) -> dict:
    """otherData.minipar of a Trace Event Format object, or ValueError saying what it is."""
    if isinstance(trace, list):
        raise ValueError("a JSON array of events (Chrome's array format), not a minipar "
                         "--profile trace (it has no otherData.minipar)")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a Trace Event Format object: it has no traceEvents list")
    other = trace.get("otherData")
    meta = other.get("minipar") if isinstance(other, dict) else None
    if not isinstance(meta, dict):
        raise ValueError("no otherData.minipar: not a trace of minipar's --profile (a foreign "
                         "Chrome or Perfetto trace?)")
    for key, kind in (("model_shape", dict), ("layout", dict), ("ranks", dict),
                      ("seq_len", int), ("global_batch", int)):
        v = meta.get(key)
        if kind is int and not (_is_int(v) and v > 0):
            raise ValueError(f"otherData.minipar.{key} = {v!r} must be a positive integer")
        if kind is dict and not isinstance(v, dict):
            raise ValueError(f"otherData.minipar.{key} = {v!r} must be an object")
    return meta


def _field_ok(f, v) -> bool:
    """Is `v` of the type of dataclass field `f`'s default (None: an integer or None)?"""
    want = type(f.default) if f.default is not None else None
    return (v is None and f.default is None or want is None and (_is_int(v) or v is None)
            or want is bool and isinstance(v, bool)
            or want is int and _is_int(v)
            or want is float and (_is_int(v) or isinstance(v, float))
            or want is str and isinstance(v, str))


def _built(key: str, cls, values: dict):
    """`cls(**values)` of the metadata's `key`, each field checked for its type first."""
    known = {f.name: f for f in fields(cls)}
    for name, v in values.items():
        f = known.get(name)
        if f is None:
            raise ValueError(f"otherData.minipar.{key}.{name}: no such field of {cls.__name__}")
        if not _field_ok(f, v):
            want = type(f.default) if f.default is not None else int
            what = {bool: "true or false", int: "an integer", float: "a number",
                    str: "a string"}.get(want, "an integer")
            raise ValueError(f"otherData.minipar.{key}.{name} = {v!r} is not {what}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"otherData.minipar.{key}: {e}") from None


def _check_meta(meta: dict) -> int:
    """The model and layout the trace was recorded with obey the trainer's rules, and its
    ranks are the layout's; returns the world size."""
    model = _built("model_shape", ModelConfig, meta["model_shape"])
    rpc = _built("layout", ParallelConfig, meta["layout"])
    problems = model.problems() or rpc.problems(model, meta["seq_len"], meta["global_batch"])
    if problems:
        raise ValueError(f"otherData.minipar.layout or model_shape breaks a rule: {problems[0]}")
    if sorted(meta["ranks"]) != sorted(map(str, range(rpc.world_size))) or \
            not all(isinstance(c, dict) for c in meta["ranks"].values()):
        raise ValueError(f"otherData.minipar.ranks must hold ranks 0 to {rpc.world_size - 1} "
                         f"(the layout's {rpc.world_size}), each its coordinates")
    return rpc.world_size


def _check_events(events: list, world: int) -> None:
    """Every complete ("X") event is one the replay can read, and every rank has some."""
    pids = set()
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
            raise ValueError(f"traceEvents[{i}] is not an event (an object with a ph)")
        if e["ph"] != "X":
            continue
        problem = _event_problem(e, world)
        if problem:
            raise ValueError(f"traceEvents[{i}] ({e.get('name')!r}): {problem}")
        pids.add(e["pid"])
    if pids != set(range(world)):
        raise ValueError(f"its events are of ranks {sorted(pids)[:8]}, not of the layout's 0 "
                         f"to {world - 1}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _event_problem(e: dict, world: int) -> str | None:
    """What is wrong with a complete event the replay reads, or None."""
    if not (_is_int(e.get("pid")) and 0 <= e["pid"] < world):
        return f"pid {e.get('pid')!r} is not a rank of the layout"
    if not (_number(e.get("ts")) and _number(e.get("dur")) and e["dur"] >= 0):
        return "ts and dur must be finite numbers, dur >= 0"
    if not (isinstance(e.get("cat"), str) and isinstance(e.get("name"), str) and isinstance(e.get("args"), dict)):
        return "cat, name (strings) and args (an object) are required"
    a, cat = e["args"], e["cat"]
    if cat == "step" and not _is_int(a.get("step")):
        return "a step span needs args.step, an integer"
    if cat == "comm":
        if not (isinstance(a.get("axis"), str) and isinstance(a.get("op"), str) and "id" in a
                and isinstance(a.get("blocking"), bool) and isinstance(a.get("group"), list)
                and _number(a.get("payload_bytes"))):
            return "a comm span needs args axis, op, id, blocking, group and payload_bytes"
        if a["op"] in ("send", "recv") and not (_is_int(a.get("peer")) and 0 <= a["peer"] < world):
            return f"a {a['op']} needs args.peer, a rank"
    if cat == "wait" and not isinstance(a.get("ids"), list):
        return "a wait span needs args.ids, a list"
    if cat == "layer" and not isinstance(a.get("kind"), str):
        return "a layer span needs args.kind"
    return None


def format_replay(r: Replay) -> str:
    t = r.target
    lines = [f"{t.model.name} on {t.parallel.world_size:,} x {t.cluster.name}, "
             + " ".join(f"{k}{getattr(t.parallel, k)}" for k in AXES)
             + (f" (widened: {', '.join(f'{k} to {v}' for k, v in r.widened.items())})" if r.widened else ""),
             f"step {r.step_time_s:.3f} s, MFU {r.mfu:.1%}, bubble {r.bubble_fraction:.1%}",
             "axis   exposed ms  hidden ms"]
    lines += [f"{a:5s} {1e3 * r.exposed_s[a]:11.2f} {1e3 * r.hidden_s[a]:10.2f}" for a in AXES]
    return "\n".join(lines)
