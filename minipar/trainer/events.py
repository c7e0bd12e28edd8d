"""One stream of events: everything a rank does in a step, on one clock, in one list.

Chapter "Collectives" (the first thing worth recording is a collective); the chapter "From a
laptop to a cluster" reads the stream back (`minipar.trainer.profile`).

While a `Recorder` is installed (`start`), each rank notes its events here, and nowhere else:

    comm      one per collective, send or receive that `comm.py` performs: its axis, op,
              group (the global ranks taking part), payload and wire bytes; a blocking one
              from call to return, an asynchronous one from post to completion
    wait      the time the rank sat in `comm.Handle.wait()`
    compute   the actions of a step: a micro-batch's forward F and backward B (zero-bubble:
              B and W), the optimizer; `step` spans around each optimizer step
    layer     each transformer layer's forward and backward inside them (`profile.trace_layers`)

Every event carries the context it happened in (the pipeline action's micro-batch, chunk and
stage; the layer; the data-parallel bucket), so that a collective issued inside layer 3's
forward of micro-batch 1 says so. Compute spans also carry the value of every *probe*
installed when they end: `memory.ActivationMeter` installs one, so each action records the
activation bytes alive after it. With no recorder installed nothing is noted and every
function here costs one `if` (`waiting`: two reads of the clock).

The clock is `time.perf_counter_ns`: CLOCK_MONOTONIC on Linux, shared by the processes of
one machine; `profile.py` aligns machines at a start barrier.
"""

import contextlib
import time

now = time.perf_counter_ns


class Recorder:
    """One rank's events (dicts: name, cat, start, end in nanoseconds, args)."""

    def __init__(self, rank: int):
        self.rank, self.start_ns = rank, now()
        # events; context: what the rank is inside (action, layer, bucket); probes: name -> a
        # function read at the end of each action; in_flight: id(work) -> its comm events,
        # until they complete
        self.events, self.context, self.probes, self.in_flight = [], {}, {}, {}

    def add(self, name: str, cat: str, start: int, end: int | None, **args) -> dict:
        self.events.append(dict(name=name, cat=cat, start=start, end=end,
                                args={**self.context, **args}))
        return self.events[-1]

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "compute", **args):
        """A span around the `with` block; it yields its args, to add what is known only at
        the end (the micro-batches a pipeline action left in flight). Events noted inside
        the block carry its args too."""
        start = now()
        try:
            with self.extended("context", args):
                yield args
        finally:
            if cat == "compute":
                args.update({k: probe() for k, probe in self.probes.items()})
            self.add(name, cat, start, now(), **args)

    @contextlib.contextmanager
    def extended(self, what: str, items: dict):
        """The dict `what` ("context" or "probes") holds `items` too while the block runs."""
        outer = getattr(self, what)
        setattr(self, what, {**outer, **items})
        try:
            yield
        finally:
            setattr(self, what, outer)


RECORDER: Recorder | None = None


def start(rank: int) -> Recorder:
    global RECORDER
    RECORDER = Recorder(rank)
    return RECORDER


def stop() -> Recorder | None:
    global RECORDER
    rec, RECORDER = RECORDER, None
    return rec


def span(name: str, cat: str = "compute", **args):
    """`with events.span("F mb0", kind="F", microbatch=0) as args:` while recording;
    nothing otherwise (then `args` is a dict nobody reads)."""
    return RECORDER.span(name, cat, **args) if RECORDER else contextlib.nullcontext(args)


def inside(**context):
    """`with events.inside(bucket=3):` events noted in the block carry this context (nothing
    happens with no recorder)."""
    return RECORDER.extended("context", context) if RECORDER else contextlib.nullcontext()


def probe(name: str, read):
    """While the block runs, every compute span records `name` = read() at its end."""
    return RECORDER.extended("probes", {name: read}) if RECORDER else contextlib.nullcontext()


def collective(axis: str, op: str, group, payload: int, wire: int, start: int, work=None, **args):
    """`comm`'s note of one collective over the global ranks `group`, posted at `start`. A
    blocking one ends now; an asynchronous one (`work`) ends when it completes: its future's
    callback, or else the wait that finds it done."""
    if RECORDER is None:
        return
    event = RECORDER.add(f"{axis} {op}", "comm", start, None if work else now(), axis=axis,
                         op=op, group=list(group), payload_bytes=payload, wire_bytes=wire,
                         blocking=work is None, id=len(RECORDER.events), **args)
    if work is not None:
        RECORDER.in_flight.setdefault(id(work), []).append(event)
        # told the moment it completes, before anyone waits (gloo's reduce-scatter has no future)
        with contextlib.suppress(AttributeError, RuntimeError):
            work.get_future().add_done_callback(lambda _: _ended(event, now()))


def _ended(event: dict, t: int):
    event["end"] = t if event["end"] is None else min(event["end"], t)


@contextlib.contextmanager
def waiting(works):
    """Around a `Handle.wait()`: a wait span, and the end of what it waited for."""
    mine = [e for w in works for e in RECORDER.in_flight.pop(id(w), [])] if RECORDER else []
    start = now()
    yield
    end = now()
    for event in mine:
        _ended(event, end)
    if mine:
        RECORDER.add("wait " + ", ".join(sorted({e["name"] for e in mine})), "wait", start, end,
                     ids=[e["args"]["id"] for e in mine])
