"""A trace file, read: the Trace Event Format file `--profile` writes, and what it says about
communication: how much of each axis' time was hidden behind computation.

Chapter "From a laptop to a cluster", section "Reading a trace". `minipar.trainer.profile` records
and writes the file (it needs torch); this file only reads it, so the replay
(`minipar.replay`) and the book's figures read traces without torch.

Exposure (`exposure`, a pure function of the file): on each rank, the rank *computes* while
inside a compute span and not blocked (in a blocking collective or a wait). An axis'
communication time is the union of its spans; the part of it during which the rank computed
is hidden, the rest is exposed: the rank had nothing to do but wait for it. For the pipeline
axis a receive is posted long before its sender has produced anything, so "exposed" there
includes the bubble: waiting for a message is waiting for the stage that sends it.
"""

import gzip
import json
import math
import os
import zlib
from pathlib import Path

from .config import ConfigError


def trace_path(path: str | Path) -> Path:
    """`--profile DIR` -> DIR/trace.json; a path ending in .json or .json.gz is the file."""
    return Path(path) if str(path).endswith((".json", ".json.gz")) else Path(path) / "trace.json"


def open_trace(path: Path, mode: str):
    return (gzip.open if path.name.endswith(".gz") else open)(path, mode)


# A trace is read whole into memory (and JSON makes it several times larger there): no file,
# and no gzip's contents, beyond this many megabytes is read. A 32-rank pipeline's step is a
# few tens of MB; MINIPAR_TRACE_MAX_MB raises the cap.
MAX_TRACE_MB = 256
MAX_TRACE_ENV = "MINIPAR_TRACE_MAX_MB"


class TraceError(ConfigError):
    """A trace file that cannot be read as a minipar trace: one line naming the file and what
    is wrong with it (a `ConfigError`: the commands exit 2)."""


def max_trace_bytes() -> int:
    """The cap on a trace's size (`MAX_TRACE_MB`, or the environment's MINIPAR_TRACE_MAX_MB)."""
    text = os.environ.get(MAX_TRACE_ENV)
    if text is None:
        return MAX_TRACE_MB * 10**6
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ConfigError(f"{MAX_TRACE_ENV}={text!r} must be a positive number of megabytes")
    return int(mb * 10**6)


def _cap(cap: int) -> str:
    return f"{cap:,} bytes ({MAX_TRACE_ENV}={cap / 1e6:g}; set it to raise the cap)"


def load(path) -> dict:
    """A trace file (or a --profile directory), gzipped or not. Read with bounded memory: a
    file (or a gzip's contents) over `max_trace_bytes` is refused before it is read whole.
    Anything unreadable raises `TraceError` naming the file and what is wrong."""
    path = trace_path(path)
    cap = max_trace_bytes()
    gz = path.name.endswith(".gz")
    try:
        size = path.stat().st_size
        if size > cap:
            raise TraceError(f"{path}: {size:,} bytes, over a trace's cap of {_cap(cap)}")
        with open_trace(path, "rb") as f:
            data = f.read(cap + 1)                    # bounded: a gzip may expand without end
    except TraceError:
        raise
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise TraceError(f"{path}: not a gzip file, or a truncated one ({e or type(e).__name__})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > cap:
        raise TraceError(f"{path}: {'decompressed, ' if gz else ''}over a trace's cap of {_cap(cap)}")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a JSON trace (not UTF-8 text: a binary or "
                         "protobuf trace?)") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON, or truncated: {e.msg} (line {e.lineno}, "
                         f"column {e.colno})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a trace: JSON nested too deep") from None


# ================================================================ writing one
AXES = ("tp", "cp", "pp", "dp", "world")


def track(kind: str, pid: int, tid: int, name: str, index: int) -> list[dict]:
    """The metadata ("M") events that name a process or thread track and set its place."""
    return [{"name": f"{kind}_{key}", "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}
            for key, value in (("name", name), ("sort_index", index))]


def rank_events(rank: int, recorded: list[dict], epoch: int) -> list[dict]:
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
                out += track("thread", rank, tid, name, tid)
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


def by_rank(trace: dict) -> dict[int, dict]:
    """Each rank's complete events as a trace of its own: read the whole trace once, not
    once per rank (a 32-rank pipeline's step is a hundred thousand events)."""
    out: dict[int, dict] = {}
    for e in spans(trace):
        out.setdefault(e["pid"], {"traceEvents": []})["traceEvents"].append(e)
    return dict(sorted(out.items()))


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
    ranks = by_rank(trace)
    pids, out = sorted(ranks), {}
    for pid in pids:
        own = ranks[pid]
        windows = [w for s, w in step_windows(own, pid).items() if s >= from_step]
        start = min((a for a, _ in windows), default=-math.inf)
        posted = [e["args"]["axis"] for e in spans(own, "comm") if e["ts"] >= start]
        for axis, (hidden, exposed) in hidden_and_exposed(own, pid, start).items():
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
