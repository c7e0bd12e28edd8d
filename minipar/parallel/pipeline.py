"""Pipeline parallelism on real ranks: the executor that runs a schedule.

Chapter "Pipeline parallelism".

Each pipeline rank holds consecutive layers of the model, one `Transformer` chunk per
virtual stage (chunk c on rank r is global stage c*p + r), and runs its list of actions from
`schedules.make_schedule`: F receives a micro-batch's activations from the previous stage,
runs the chunk and sends its output on; B receives the gradient of that output from the next
stage, runs the backward and sends the gradient of the input back. The schedule is data;
this file only obeys it.

    build_stage_modules          this rank's chunks, with exactly the single-device weights
    pipeline_forward_backward    run one step's program (`schedules.p2p_plan`: receives,
                                 computations, sends, in one order); return this rank's
                                 share of the loss

Three things a toy executor gets wrong, and how this one gets them right:

* Deadlock. Every rank posts its sends and receives in one global order, taken from the
  simulated timeline: a message is posted, by sender and receiver alike, at the time its
  producer finishes. Even where a send blocks until its receive is posted (NCCL), the
  earliest message not yet delivered has both ends waiting for it, so one always moves
  (`check_p2p_plan` runs that argument as a test). Messages carry a tag, so a pair of ranks
  that exchanges activations *and* gradients (p = 2 with chunks) never confuses them.
* The loss. Each micro-batch's loss is loss_fn(logits, y) / n_tokens, the token count of the
  whole global batch, exactly as on one device, and backward starts from it: summing the
  micro-batches' gradients gives the single-device gradient.
* Data parallelism. `dp.set_last_microbatch(mb == m - 1)` before every backward: the last
  micro-batch's backward of each chunk launches that chunk's gradient buckets (buckets never
  span chunks), and their all-reduce overlaps with the rest of the pipeline's work.

Zero-bubble (`zb`) splits the backward. B computes only the gradient w.r.t. the stage input
(what the previous stage waits for): `torch.autograd.grad(out, input, retain_graph=True)`.
Before it runs, a hook is placed on every graph node where a path to a weight branches off
the path to the input (the node of `x @ W.T`, say) and records the gradient that arrives
there. W then restarts autograd from those nodes with the recorded gradients and
`inputs=weights` (`torch.autograd.backward(GradientEdge, ..., inputs=...)`): it computes
dW = dy^T x and nothing twice, and it *accumulates* into `.grad`, so the post-accumulate
hooks that DataParallel's buckets hang on fire as in a plain backward. On the first stage the
"input" is the embedding's output; the embedding's own gradient is W's work.

Tied embeddings (`tie_embeddings`, input embedding = output head) live on the first and the
last stage: each computes its own gradient, `sync_tied_gradients` sums the two over a group
of those two ranks after the data-parallel reduction and before clipping, and the head's copy
is `mark_replica`-ed along "pp" so the gradient norm counts the shared matrix once.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from .. import comm, memory, profile
from ..comm import Axis
from ..config import ConfigError
from ..formulas.pipeline_parallel import split_layers
from ..model import Transformer
from .context import shard_sequence
from .tensor import mark_replica
from .schedules import Action, Message, inputs_of, make_schedule, outputs_of, p2p_plan, stage_of


# ===================================================================== the stages
def build_stage_modules(mcfg, pcfg, grid, seed) -> list[Transformer]:
    """This rank's chunks, one per virtual stage: chunk c holds global stage c*p + rank.

    The layers are split evenly over the p*v stages (`split_layers`); the first stage alone
    holds the embedding, the last alone the final norm and head. Weights are initialised by
    name and seed, so every chunk holds exactly the single-device model's weights.
    Collective (creates the tied-embedding groups): every rank calls it.
    """
    p, v, r = pcfg.pp, pcfg.virtual_stages, grid.pp.rank
    n_stages = p * v
    if mcfg.n_layers < n_stages:
        raise ConfigError(f"--pp {p} x --virtual-stages {v} = {n_stages} stages exceeds "
                          f"n_layers={mcfg.n_layers}")
    layers = split_layers(mcfg.n_layers, n_stages)
    chunks = []
    for c in range(v):
        s = stage_of(r, c, p)
        chunks.append(Transformer(mcfg, layer_ids=layers[s], first=s == 0,
                                 last=s == n_stages - 1, seed=seed))
    if mcfg.tie_embeddings:
        _tie_group(chunks, grid)
    return chunks


def _tie_group(chunks, grid):
    # One group per (tp, cp, dp) position: {its first stage, its last stage}. new_group is
    # collective, so every rank creates every group, in the same order.
    p = grid.sizes["pp"]
    for ranks in sorted({(grid.rank_of(**{**grid.coords(q), "pp": 0}),
                          grid.rank_of(**{**grid.coords(q), "pp": p - 1}))
                         for q in range(grid.world_size)}):
        g = dist.new_group(list(ranks))
        if grid.rank in ranks:
            axis = Axis("pp_tie", ranks, ranks.index(grid.rank), group=g, log_as="pp")
            for m in chunks:
                m.tie_axis = axis


def _tied_params(chunks) -> list[nn.Parameter]:
    # looked up by module name at use time: tensor parallelism replaces the modules
    out = []
    for m in chunks:
        if getattr(m, "tie_axis", None) is None:
            continue
        if m.embed_tokens is not None:
            out.append(m.embed_tokens.weight)
        if m.lm_head is not None:
            out.append(m.lm_head.weight)
    return out


def sync_tied_gradients(chunks, dp, grid):
    """Sum the gradients of the tied embedding (first stage) and head (last stage).

    Called after `dp.finish_backward()` and before clipping: the sum over the tie group and
    the data-parallel sum commute, and with ZeRO both copies are sharded identically (same
    shape, same dp rank), so summing this rank's pieces is summing the whole. The head's copy
    is marked a replica along "pp" so the global gradient norm counts the matrix once.
    """
    tied = {id(p): p for p in _tied_params(chunks)}
    if not tied:
        return
    axis = chunks[0].tie_axis
    for g, p in dp.grads():
        if id(p) in tied:
            comm.all_reduce(g, axis)
    for m in chunks:
        if m.lm_head is not None and "pp" not in getattr(m.lm_head.weight, "_replica_axes", ()):
            mark_replica(m.lm_head.weight, "pp")


def boundary_shape(rows: int, seq_local: int, dim: int, pcfg) -> tuple[int, int, int]:
    """Shape of the hidden states between two stages: [b, s, dim] for this rank's tokens
    (CP-local s). Under sequence parallelism they stay split along the sequence over TP."""
    return (rows, seq_local // pcfg.tp if pcfg.sp else seq_local, dim)


# =================================================== zero-bubble: B and W apart
def _reaches(root, target) -> dict:
    """For every graph node below `root`: does a path from it lead to `target`?"""
    memo, stack = {}, [(root, False)]
    while stack:                                  # iterative: graphs are deep
        node, children_done = stack.pop()
        if children_done:
            memo[node] = node is target or any(memo.get(c, False) for c, _ in node.next_functions
                                               if c is not None)
        elif node not in memo:
            stack.append((node, True))
            stack += [(c, False) for c, _ in node.next_functions if c is not None and c not in memo]
    return memo


def _weights_below(node, weights: dict) -> list[nn.Parameter]:
    found, seen, stack = [], {node}, [node]
    while stack:
        n = stack.pop()
        var = getattr(n, "variable", None)           # an AccumulateGrad node: a leaf
        if var is not None and id(var) in weights:
            found.append(weights[id(var)])
        for c, _ in n.next_functions:
            if c is not None and c not in seen:
                seen.add(c)
                stack.append(c)
    return found


def backward_input(out, dout, boundary, weights):
    """Zero-bubble's B: the gradient w.r.t. `boundary` (the stage input) alone.

    Returns it and the deferred weight work for `backward_weight`: for each node where a
    path to weights leaves the path to the input, the gradient that reached it."""
    weights = {id(w): w for w in weights}
    root = get_gradient_edge(boundary).node
    on_path = _reaches(out.grad_fn, root)
    branches = []
    for node, reaches_input in on_path.items():
        if reaches_input and node is not root:
            below = [w for c, _ in node.next_functions if c is not None and not on_path.get(c)
                     for w in _weights_below(c, weights)]
            if below:
                branches.append((node, below))
    seen = {}
    hooks = [node.register_prehook(lambda grads, node=node: seen.__setitem__(node, grads))
             for node, _ in branches]
    try:
        (d_input,) = torch.autograd.grad(out, boundary, dout, retain_graph=True)
    finally:
        for h in hooks:
            h.remove()
    work = []
    below_root = _weights_below(root, weights)       # the embedding, on the first stage
    if below_root:
        work.append(([get_gradient_edge(boundary)], [d_input], below_root))
    for node, below in branches:
        grads = seen[node]
        work.append(([GradientEdge(node, i) for i, g in enumerate(grads) if g is not None],
                     [g for g in grads if g is not None], below))
    return d_input, work


def backward_weight(work) -> None:
    """Zero-bubble's W: weight gradients from what B left, accumulated into `.grad`."""
    for edges, grads, weights in work:
        torch.autograd.backward(edges, grads, inputs=weights, retain_graph=True)


# ============================================================== memory accounting
class SavedBytes:
    """Bytes autograd saves for backward inside `with` (activations, not weights): each
    storage counted once, however many operations save a view of it. `enabled=False`
    counts nothing and costs nothing (the executor measures only when tracing).

    Saved-tensor hooks do not nest (the innermost win), so each tensor is handed on to the
    step's `memory.ActivationMeter`, if one is measuring, and kept detached: a saved output
    that held itself would tie its graph into a cycle the collector cannot free."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.storages: dict[int, int] = {}

    def _pack(self, t):
        base = t if t._base is None else t._base
        if not isinstance(base, nn.Parameter):
            st = t.untyped_storage()
            self.storages[st.data_ptr()] = st.nbytes()
        return memory.hold(t)

    def __enter__(self):
        if self.enabled:
            self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda h: h.tensor)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._ctx.__exit__(*exc)

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


# ================================================================= the executor
class Stashed(NamedTuple):
    """What a micro-batch leaves on a chunk between its F and its B (or W)."""

    boundary: torch.Tensor | None     # the stage input (or embedding output) to differentiate
    out: torch.Tensor                 # the stage output, or the loss on the last stage
    nbytes: int                       # activation bytes autograd saved for it


class _Pipeline:
    """One step of one rank: the state the actions share."""

    def __init__(self, chunks, micro, loss_fn, n_tokens, dp, pcfg, grid, trace):
        self.chunks, self.micro, self.loss_fn, self.n_tokens = chunks, micro, loss_fn, n_tokens
        self.dp, self.pcfg, self.grid = dp, pcfg, grid
        self.p, self.r, self.m = pcfg.pp, grid.pp.rank, len(micro)
        self.n_stages = self.p * len(chunks)
        self.split = pcfg.schedule == "zb"
        self.stash: dict[tuple[int, int], Stashed] = {}   # (mb, chunk) in flight
        self.deferred: dict[tuple[int, int], list] = {}  # zb: W's work, left by B
        self.received: dict[Message, comm.Handle] = {}
        self.outbox: dict[Message, torch.Tensor] = {}   # computed, not yet posted
        self.sent: list = []                            # (tensor, handle): alive until done
        self.loss = torch.zeros(())
        self._tokens: dict[int, tuple] = {}
        p0 = next(chunks[0].parameters())
        self.dtype, self.device = p0.dtype, p0.device
        # one replica of the pipeline records the trace: its rows are the pipeline ranks
        self.trace = trace if trace is not None and all(
            grid.coords(grid.rank)[a] == 0 for a in ("tp", "cp", "dp")) else None
        self.step = 1 + trace[-1]["step"] if self.trace else 0
        self.t0 = self.clock_origin()

    def clock_origin(self) -> float:
        """Time 0 of this step's trace: when the last pipeline rank is ready to start, so
        that the ranks' events line up (one machine's monotonic clock is shared by its
        processes; across nodes, clocks agree only roughly)."""
        t0 = torch.tensor(time.perf_counter(), dtype=torch.float64)
        if self.trace is not None:
            with comm.paused():
                comm.all_reduce(t0, self.grid.pp, op="max")
        return t0.item()

    # -- tokens, positions and buffers ------------------------------------------------
    def tokens(self, mb: int):
        """Inputs, targets and positions of micro-batch `mb`, CP-local (every stage needs
        the positions for RoPE and the shapes; the first the inputs, the last the targets)."""
        if mb not in self._tokens:
            batch = self.micro[mb]
            x, y, pos = shard_sequence(batch[:, :-1], batch[:, 1:], self.grid.cp)
            self._tokens[mb] = (x.to(self.device), y.to(self.device), pos.to(self.device))
        return self._tokens[mb]

    def shape(self, mb: int) -> tuple[int, int, int]:
        rows, seq = self.micro[mb].shape[0], self.tokens(mb)[0].shape[1]
        return boundary_shape(rows, seq, self.chunks[0].cfg.dim, self.pcfg)

    def peer(self, stage: int) -> int:
        return self.grid.pp.global_rank(stage % self.p)

    # -- p2p ----------------------------------------------------------------------------
    def post_recv(self, msg: Message):
        buf = torch.empty(self.shape(msg.microbatch), dtype=self.dtype, device=self.device)
        self.received[msg] = comm.exchange_async(
            recvs=[(buf, self.peer(msg.src_stage), msg.tag(self.m))])

    def wait_for(self, msg: Message) -> torch.Tensor:
        """Block until a posted receive has arrived (the Handle waits only once)."""
        return self.received[msg].wait()[0]

    def receive(self, msg: Message) -> torch.Tensor:
        """The arrived tensor, taken out of the inbox."""
        buf = self.wait_for(msg)
        del self.received[msg]
        return buf

    def hold_for_send(self, msg: Message, t: torch.Tensor):
        """Hold an output until the program posts its send; check the receiver's shape."""
        t = t.detach().contiguous()
        if tuple(t.shape) != self.shape(msg.microbatch):
            raise RuntimeError(f"stage {msg.src_stage} sends {msg.kind} of shape {tuple(t.shape)},"
                               f" but stage {msg.dst_stage} expects {self.shape(msg.microbatch)}"
                               " (boundary_shape)")
        self.outbox[msg] = t

    def post_send(self, msg: Message):
        t = self.outbox.pop(msg)
        handle = comm.exchange_async(sends=[(t, self.peer(msg.dst_stage), msg.tag(self.m))])
        self.sent.append((t, handle))

    # -- the three actions ----------------------------------------------------------------
    def forward(self, a: Action):
        s = a.stage(self.r, self.p)
        x, y, pos = self.tokens(a.microbatch)
        chunk = self.chunks[a.chunk]
        if s > 0:
            x = self.receive(Message("act", a.microbatch, s - 1)).requires_grad_()
        seen = {}
        # zero-bubble's B differentiates the first stage w.r.t. the embedding's output
        hook = chunk.embed_tokens.register_forward_hook(
            lambda mod, args, out: seen.setdefault("emb", out)) if s == 0 and self.split else None
        with SavedBytes(enabled=self.trace is not None or profile.active()) as saved:
            out = chunk(x, pos)
            if s == self.n_stages - 1:
                out = self.loss_fn(out, y) / self.n_tokens
                self.loss += out.detach()
        if hook is not None:
            hook.remove()
        self.stash[(a.microbatch, a.chunk)] = Stashed(x if s > 0 else seen.get("emb"), out,
                                                    saved.nbytes)
        for msg in outputs_of(a, self.r, self.p, self.n_stages):
            self.hold_for_send(msg, out)

    def backward(self, a: Action):
        s = a.stage(self.r, self.p)
        key = (a.microbatch, a.chunk)
        dout = None
        if s < self.n_stages - 1:
            dout = self.receive(Message("grad", a.microbatch, s + 1))
        work = self.stash[key]
        if self.split:
            d_input, self.deferred[key] = backward_input(
                work.out, dout, work.boundary, list(self.chunks[a.chunk].parameters()))
        else:
            self.dp.set_last_microbatch(a.microbatch == self.m - 1)
            torch.autograd.backward(work.out, dout)
            d_input = work.boundary.grad if s > 0 else None
            del self.stash[key]
        for msg in outputs_of(a, self.r, self.p, self.n_stages):
            self.hold_for_send(msg, d_input)

    def weight(self, a: Action):
        key = (a.microbatch, a.chunk)
        self.dp.set_last_microbatch(a.microbatch == self.m - 1)
        self.dp.gather_module(self.chunks[a.chunk])     # ZeRO-3 may have freed them since B
        backward_weight(self.deferred.pop(key))
        del self.stash[key]          # the graph and its saved activations go with it

    # -- one step -----------------------------------------------------------------------
    def run(self, program):
        act = {"F": self.forward, "B": self.backward, "W": self.weight}
        for kind, item in program:
            if kind == "recv":
                self.post_recv(item)
            elif kind == "send":
                self.post_send(item)
            else:
                self.record(item, act[item.kind])
        for _, handle in self.sent:
            handle.wait()
        if self.stash or self.received or self.outbox:
            raise RuntimeError(f"pipeline rank {self.r}: step ended with {sorted(self.stash)} "
                               f"in flight, {sorted(self.received)} unread and "
                               f"{sorted(self.outbox)} unsent")
        return self.loss

    def record(self, a: Action, fn):
        # the wait for a message is idle time (the bubble), not part of the action
        for msg in inputs_of(a, self.r, self.p, self.n_stages):
            self.wait_for(msg)
        start = time.perf_counter() - self.t0
        name = f"{a.kind} mb{a.microbatch}" + (f" c{a.chunk}" if len(self.chunks) > 1 else "")
        with profile.span(name, kind=a.kind, microbatch=a.microbatch, chunk=a.chunk,
                          stage=a.stage(self.r, self.p)) as args:
            fn(a)
            args.update(in_flight=len(self.stash),
                        activation_bytes=sum(w.nbytes for w in self.stash.values()))
        end = time.perf_counter() - self.t0
        if self.trace is not None:
            self.trace.append({
                "rank": self.r, "kind": a.kind, "microbatch": a.microbatch, "chunk": a.chunk,
                "start": start, "end": end, "step": self.step, "global_rank": self.grid.rank,
                "in_flight": len(self.stash),
                "activation_bytes": sum(w.nbytes for w in self.stash.values())})


def pipeline_forward_backward(chunks, micro, loss_fn, n_tokens, dp, pcfg, grid, trace=None):
    """Run this rank's actions of one step; return its share of the loss (0-dim tensor):
    the sum over micro-batches of loss / n_tokens on the last stage, zero elsewhere.

    `micro`: this DP rank's micro-batches of tokens [b, s+1]. `trace`: a list to which one
    pipeline replica (tp = cp = dp = 0) appends an event per action: {rank (the pipeline
    rank), kind, microbatch, chunk, start, end (seconds since this rank's step began), step,
    global_rank, in_flight (micro-batch x chunk pairs whose activations are held after it),
    activation_bytes (what autograd saved for them)}.
    """
    program = _plan(pcfg.schedule, pcfg.pp, len(micro), pcfg.virtual_stages)[grid.pp.rank]
    return _Pipeline(chunks, micro, loss_fn, n_tokens, dp, pcfg, grid, trace).run(program)


@functools.lru_cache(maxsize=64)
def _plan(name: str, p: int, m: int, v: int):
    return p2p_plan(make_schedule(name, p, m, v))


# ================================================================= the trace file
def write_trace(path: str, events: list[dict] | None, grid) -> None:
    """`--trace PATH`: gather every rank's pipeline events to rank 0 and write them as one
    JSON list (collective: every rank calls it)."""
    gathered = [None] * grid.world_size
    with comm.paused():
        dist.all_gather_object(gathered, events or [])
    if grid.rank == 0:
        with open(path, "w") as f:
            json.dump([e for evs in gathered for e in evs], f)


def load_trace(paths) -> list[dict]:
    """Events of a `--trace` file, or of several: one JSON list of events, JSON lines, a JSON
    list of per-rank lists (the rank is the position), or one file per rank; or of a
    `--profile` trace (a directory, or its trace.json[.gz]): its pipeline actions
    (`profile.pipeline_events`). Each event is a dict with rank, kind, microbatch, chunk,
    start, end."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    events = []
    for i, path in enumerate(paths):
        if Path(path).is_dir() or str(path).endswith(".gz"):
            events += profile.pipeline_events(profile.load(path))
            continue
        text = Path(path).read_text().strip()
        try:
            data = json.loads(text)
            if isinstance(data, dict) and "traceEvents" in data:
                events += profile.pipeline_events(data)
                continue
            records = data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if records and all(isinstance(r, list) for r in records):
            for rank, evs in enumerate(records):
                events += [e if "rank" in e else dict(e, rank=rank) for e in evs]
        else:
            events += [e if "rank" in e else dict(e, rank=i) for e in records]
    return events
