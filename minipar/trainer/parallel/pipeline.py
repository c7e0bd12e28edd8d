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
  (`schedule_analysis.check_p2p_plan` runs that argument as a test). Messages carry a tag,
  so a pair of ranks that exchanges activations *and* gradients (p = 2 with chunks) never
  confuses them.
* The loss. Each micro-batch's loss is loss_fn(logits, y) / n_tokens, the token count of the
  whole global batch, exactly as on one device, and backward starts from it: summing the
  micro-batches' gradients gives the single-device gradient.
* Data parallelism. `dp.set_last_microbatch(mb == m - 1)` before every backward: the last
  micro-batch's backward of each chunk launches that chunk's gradient buckets (buckets never
  span chunks), and their all-reduce overlaps with the rest of the pipeline's work.

How B computes its gradients is a strategy: `Backward` (input and weight gradients in one
pass) for every schedule but zero-bubble, whose `SplitBackward` (`zero_bubble.py`) computes
the input gradient in B and leaves the weight gradients to W.

Tied embeddings (`tie_embeddings`, input embedding = output head) live on the first and the
last stage: each computes its own gradient, and `tied_gradient_sync` (a step `parallelize`
adds after the data-parallel reduction, before clipping) sums the two over a group of those
two ranks; the head's copy is placed `Replicate()` on "pp" (`placement.py`) so the gradient
norm counts the shared matrix once.
"""

import functools
from typing import NamedTuple

import torch
import torch.distributed as dist

from ...plan.schedules import (Action, Message, inputs_of, make_schedule, outputs_of, p2p_plan,
                               split_layers, stage_of)
from .. import comm, events
from ..comm import Axis
from ..model import Transformer
from .zero_bubble import SplitBackward
from ..placement import Replicate, place


# ===================================================================== the stages
def build_stage_modules(mcfg, pcfg, grid, seed) -> list[Transformer]:
    """This rank's chunks, one per virtual stage: chunk c holds global stage c*p + rank.

    The layers are split evenly over the p*v stages (`split_layers`); the first stage alone
    holds the embedding, the last alone the final norm and head. Weights are initialised by
    name and seed, so every chunk holds exactly the single-device model's weights.
    Collective (creates the tied-embedding groups): every rank calls it.
    """
    p, v, r = pcfg.pp, pcfg.virtual_stages, grid.pp.rank
    layers = split_layers(mcfg.n_layers, p * v)
    chunks = [Transformer(mcfg, layer_ids=layers[s], first=s == 0, last=s == p * v - 1, seed=seed)
              for s in (stage_of(r, c, p) for c in range(v))]
    if mcfg.tie_embeddings:
        _tie_group(chunks, grid)
    return chunks


def _tie_group(chunks, grid):
    # One group per (tp, cp, dp) position: {its first stage, its last stage}. new_group is
    # collective, so every rank creates every group, in the same order.
    for ranks in sorted({(grid.rank_of(**{**grid.coords(q), "pp": 0}),
                          grid.rank_of(**{**grid.coords(q), "pp": grid.pp.size - 1}))
                         for q in range(grid.world_size)}):
        g = dist.new_group(list(ranks))
        if grid.rank in ranks:
            axis = Axis("pp_tie", ranks, ranks.index(grid.rank), group=g, log_as="pp")
            for m in chunks:
                m.tie_axis = axis


def tied_gradient_sync(chunks):
    """The step that sums the gradients of the tied embedding (first stage) and head (last
    stage), for `DataParallel.after_reduce`; None where this rank holds neither. Call it
    after tensor parallelism has made the chunks' final modules.

    After the data-parallel reduction the sum over the tie group commutes with it, and with
    ZeRO both copies are sharded identically (same shape, same dp rank), so summing this
    rank's pieces is summing the whole. The head's copy is placed Replicate() on "pp" so the
    global gradient norm counts the matrix once."""
    owners = [m for m in chunks if getattr(m, "tie_axis", None) is not None]   # end ranks only
    if not owners:
        return None
    tied = {id(x.weight) for m in owners for x in (m.embed_tokens, m.lm_head) if x is not None}
    for head in (m.lm_head for m in owners if m.lm_head is not None):
        place(head.weight, "pp", Replicate())

    def sync(grads):
        for g, p in grads:
            if id(p) in tied:
                comm.all_reduce(g, owners[0].tie_axis)
    return sync


def boundary_shape(rows: int, seq_local: int, dim: int, pcfg) -> tuple[int, int, int]:
    """Shape of the hidden states between two stages: [b, s, dim] for this rank's tokens
    (CP-local s). Under sequence parallelism they stay split along the sequence over TP."""
    return (rows, seq_local // pcfg.tp if pcfg.sp else seq_local, dim)


# ================================================================= the executor
class Stashed(NamedTuple):
    """What a micro-batch leaves on a chunk between its F and its B (or W)."""

    boundary: torch.Tensor | None     # the stage input (or embedding output) to differentiate
    out: torch.Tensor                 # the stage output, or the loss on the last stage


class Backward:
    """B computes the input and the weight gradients in one pass: every schedule but
    zero-bubble (`zero_bubble.SplitBackward`). There is no W."""

    def b(self, pipe, a: Action, work: Stashed, dout):
        pipe.dp.set_last_microbatch(a.microbatch == pipe.m - 1)
        torch.autograd.backward(work.out, dout)
        del pipe.stash[(a.microbatch, a.chunk)]       # the graph and its activations go
        return work.boundary.grad if a.stage(pipe.r, pipe.p) > 0 else None


class _Pipeline:
    """One step of one rank: the state the actions share."""

    def __init__(self, chunks, micro, loss_fn, n_tokens, dp, pcfg, grid, backward):
        self.chunks, self.micro, self.loss_fn, self.n_tokens = chunks, micro, loss_fn, n_tokens
        self.dp, self.pcfg, self.grid, self.backward_pass = dp, pcfg, grid, backward
        self.p, self.r, self.m = pcfg.pp, grid.pp.rank, len(micro)
        self.n_stages = self.p * len(chunks)
        self.stash: dict[tuple[int, int], Stashed] = {}   # (mb, chunk) in flight
        self.received: dict[Message, comm.Handle] = {}  # posted, not yet used
        self.outbox: dict[Message, torch.Tensor] = {}   # computed, not yet posted
        self.sent: list = []                            # (tensor, handle): alive until done
        self.loss = torch.zeros(())
        self.like = next(chunks[0].parameters())       # receive buffers take its dtype, device

    def shape(self, mb: int) -> tuple[int, int, int]:
        x = self.micro[mb][0]
        return boundary_shape(x.shape[0], x.shape[1], self.chunks[0].cfg.dim, self.pcfg)

    def peer(self, stage: int) -> int:
        return self.grid.pp.global_rank(stage % self.p)

    # -- the three actions: computation only; `compute` hands them their messages --------
    def forward(self, a: Action, x: torch.Tensor | None = None) -> torch.Tensor:
        """F on the activation `x` received from the stage before (the first stage reads the
        tokens); return what goes on: the output, or on the last stage the loss."""
        s = a.stage(self.r, self.p)
        tokens, y, pos = self.micro[a.microbatch]
        chunk = self.chunks[a.chunk]
        seen = {}
        # the first stage's "input" is the embedding's output (zero-bubble's B stops there)
        hook = chunk.embed_tokens.register_forward_hook(
            lambda mod, args, out: seen.setdefault("emb", out)) if s == 0 else None
        out = chunk(tokens if s == 0 else x.requires_grad_(), pos)
        if hook is not None:
            hook.remove()
        if s == self.n_stages - 1:
            out = self.loss_fn(out, y) / self.n_tokens
            self.loss += out.detach()
        self.stash[(a.microbatch, a.chunk)] = Stashed(x if s > 0 else seen.get("emb"), out)
        return out

    def backward(self, a: Action, dout: torch.Tensor | None = None) -> torch.Tensor | None:
        """B from the gradient `dout` received from the stage after (the last stage starts
        from its loss); return the gradient w.r.t. the stage's input, to send back."""
        return self.backward_pass.b(self, a, self.stash[(a.microbatch, a.chunk)], dout)

    def weight(self, a: Action):
        self.backward_pass.w(self, a)

    # -- one step -----------------------------------------------------------------------
    def run(self, program):
        step = {"recv": self.post_recv, "compute": self.compute, "send": self.post_send}
        for kind, item in program:
            step[kind](item)
        for _, handle in self.sent:
            handle.wait()
        if self.stash or self.received or self.outbox:
            raise RuntimeError(f"pipeline rank {self.r}: step ended with {sorted(self.stash)} "
                               f"in flight, {sorted(self.received)} unread and "
                               f"{sorted(self.outbox)} unsent")
        return self.loss

    def post_recv(self, msg: Message):
        buf = self.like.new_empty(self.shape(msg.microbatch))
        self.received[msg] = comm.exchange_async(
            recvs=[(buf, self.peer(msg.src_stage), msg.tag(self.m))])

    def compute(self, a: Action):
        """Run action `a`: hand it the messages it waits for, time it as a span, and keep
        what it passes on in the outbox until the program posts the send."""
        # the wait for a message is idle time (the bubble), not part of the action
        inputs = [self.received.pop(msg).wait()[0]
                  for msg in inputs_of(a, self.r, self.p, self.n_stages)]
        name = f"{a.kind} mb{a.microbatch}" + (f" c{a.chunk}" if len(self.chunks) > 1 else "")
        with events.span(name, kind=a.kind, microbatch=a.microbatch, chunk=a.chunk,
                         stage=a.stage(self.r, self.p)) as args:
            out = {"F": self.forward, "B": self.backward, "W": self.weight}[a.kind](a, *inputs)
            args["in_flight"] = len(self.stash)     # (micro-batch, chunk) pairs still held
        for msg in outputs_of(a, self.r, self.p, self.n_stages):
            if tuple(out.shape) != self.shape(msg.microbatch):
                raise RuntimeError(f"stage {msg.src_stage} sends {msg.kind} of shape "
                                   f"{tuple(out.shape)}, but stage {msg.dst_stage} expects "
                                   f"{self.shape(msg.microbatch)} (boundary_shape)")
            self.outbox[msg] = out.detach().contiguous()

    def post_send(self, msg: Message):
        t = self.outbox.pop(msg)
        handle = comm.exchange_async(sends=[(t, self.peer(msg.dst_stage), msg.tag(self.m))])
        self.sent.append((t, handle))


def pipeline_forward_backward(chunks, micro, loss_fn, n_tokens, dp, pcfg, grid):
    """Run this rank's actions of one step; return its share of the loss (0-dim tensor):
    the sum over micro-batches of loss / n_tokens on the last stage, zero elsewhere.

    `micro`: this rank's micro-batches as (tokens, targets, positions), already cut for
    data and context parallelism (the first stage reads the tokens, the last the targets,
    every stage the positions). A trace of the step (`--profile`) records each action as a
    compute span: kind, micro-batch, chunk, stage, and `in_flight` after it.
    """
    program = plan_of(pcfg.schedule, pcfg.pp, len(micro), pcfg.virtual_stages,
                      pcfg.consecutive_microbatches)[grid.pp.rank]
    backward = SplitBackward() if pcfg.schedule == "zb" else Backward()
    return _Pipeline(chunks, micro, loss_fn, n_tokens, dp, pcfg, grid, backward).run(program)


@functools.lru_cache(maxsize=64)
def plan_of(name: str, p: int, m: int, v: int, consecutive: int | None = None):
    """Every rank's program of sends, receives and computations for schedule `name`."""
    return p2p_plan(make_schedule(name, p, m, v, consecutive))
