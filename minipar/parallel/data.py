"""Data parallelism: every rank holds the model, sees different tokens, and they agree on the
gradient. Then ZeRO: stop holding what you don't have to.

    zero=0   all-reduce the gradients (2(n-1)/n of their bytes on the wire per rank)
    zero=1   optimizer state sharded: reduce-scatter gradients, update my shard, all-gather
             parameters. Same bytes as all-reduce (an all-reduce *is* those two halves).
    zero=2   + gradients sharded: each bucket is reduce-scattered as soon as its gradients
             exist, and the full gradient is dropped.
    zero=3   + parameters sharded: a layer's weights are all-gathered just before its forward
             and again before its backward, and freed after each: 3(n-1)/n.

`bucket_mb=0` is the naive version: wait for the whole backward, then one collective per
gradient. Otherwise gradients are grouped into buckets (in the reverse order of the forward,
the order backward produces them) and each bucket's collective is launched asynchronously
from a hook the moment its last gradient is ready, overlapping with the rest of the backward.

The group is dp x cp: context-parallel ranks hold the same weights and see different tokens,
so for gradients they are data-parallel ranks too. Every reduction is a SUM; the loss is
already divided by the global token count.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from ..grid import Axis


# ---------------------------------------------------------------- sharding layout
class FlatShards:
    """A group of tensors laid out "rank-major" so one collective serves all of them.

    Each tensor is flattened and padded to a multiple of n; rank r owns the r-th n-th of every
    tensor. Packing puts rank 0's pieces of all tensors first, then rank 1's, ...: a
    reduce-scatter of the packed buffer leaves each rank exactly its pieces, and an
    all-gather of the pieces rebuilds the packed buffer.
    """

    def __init__(self, shapes: list[torch.Size], n: int):
        self.shapes, self.n = shapes, n
        self.numels = [math.prod(s) for s in shapes]
        self.piece_numels = [math.ceil(k / n) for k in self.numels]
        self.shard_size = sum(self.piece_numels)

    def piece_range(self, i: int, rank: int) -> tuple[int, int]:
        """Where rank's piece of tensor i lies in that tensor, flattened (without padding)."""
        k, pk = self.numels[i], self.piece_numels[i]
        return min(rank * pk, k), min((rank + 1) * pk, k)

    def pack(self, tensors) -> torch.Tensor:
        pieces = [[] for _ in range(self.n)]
        for t, k, pk in zip(tensors, self.numels, self.piece_numels):
            flat = F.pad(t.reshape(-1), (0, pk * self.n - k))
            for r, piece in enumerate(flat.split(pk)):
                pieces[r].append(piece)
        return torch.cat([torch.cat(p) for p in pieces])

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        per_rank = [p.split(self.piece_numels) for p in packed.split(self.shard_size)]
        return [torch.cat([per_rank[r][i] for r in range(self.n)])[:k].view(shape)
                for i, (k, shape) in enumerate(zip(self.numels, self.shapes))]

    def pad_pieces(self, pieces) -> torch.Tensor:
        """This rank's (unpadded) pieces -> its padded slot of the packed buffer."""
        return torch.cat([F.pad(x.reshape(-1), (0, pk - x.numel()))
                          for x, pk in zip(pieces, self.piece_numels)])

    def unpad_pieces(self, slot: torch.Tensor, rank: int) -> list[torch.Tensor]:
        out = []
        for i, x in enumerate(slot.split(self.piece_numels)):
            a, b = self.piece_range(i, rank)
            out.append(x[:b - a])
        return out


class Bucket:
    """Parameters whose gradients travel together in one collective."""

    def __init__(self, params: list[nn.Parameter], n: int):
        self.params = params
        self.layout = FlatShards([p.shape for p in params], n)
        self.ready = 0
        self.pending = None       # the async collective in flight
        self.flat = None          # ZeRO-0: gradients live here, as views (no copies)
        self.gathering = None     # ZeRO-3: a prefetch all-gather in flight
        self.neighbours = (None, None)   # ZeRO-3: the units run before and after this one
        self.pieces = None        # ZeRO >= 1: this rank's piece of each parameter
        self.piece_grads = None   # ... and of each gradient, once reduce-scattered


FIRST_BUCKET_MB = 1.0


def make_buckets(params: list[nn.Parameter], bucket_mb: float, n: int) -> list[Bucket]:
    """Group parameters, last-used first, into buckets of about `bucket_mb` megabytes.
    The first bucket is at most 1 MB (as in DDP): the output layer's gradients arrive
    first, and a small bucket starts the communication while most of backward remains.
    bucket_mb = 0: one bucket per parameter (the naive version)."""
    if bucket_mb == 0:
        return [Bucket([p], n) for p in reversed(params)]
    limit = min(bucket_mb, FIRST_BUCKET_MB) * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= limit:
            buckets.append(Bucket(current, n))
            current, size, limit = [], 0, bucket_mb * 2**20
    if current:
        buckets.append(Bucket(current, n))
    return buckets


# ------------------------------------------------------------------- the wrapper
class DataParallel:
    """Synchronises the gradients of `modules` over `axis` and owns their optimizer.

    Per step:  start_step(); for each micro-batch: set_last_microbatch(...) and backward;
    finish_backward(); grads() for the norm; step(lr, grad_scale).
    `units` (ZeRO-3): the modules whose weights are gathered together before they run.
    """

    def __init__(self, modules: list[nn.Module], axis: Axis, zero: int = 0, bucket_mb: float = 25.0,
                 units: list[nn.Module] | None = None, lr: float = 1e-3, betas=(0.9, 0.95),
                 weight_decay: float = 0.1):
        self.axis, self.zero, self.n, self.rank = axis, zero, axis.size, axis.rank
        self.params = [p for m in modules for p in m.parameters() if p.requires_grad]
        self.naive = bucket_mb == 0 and zero < 3
        self.sync = True
        # Set to a list to record when each bucket's collective is launched, completes and
        # is waited for (the book's overlap timeline); None, the default, records nothing.
        self.timeline: list | None = None
        self.in_flight: list[Bucket] = []
        if zero == 3:
            units = [u for u in (units or modules) if any(True for _ in u.parameters())]
            self.buckets = [Bucket(list(u.parameters()), self.n) for u in units]
            self._link_neighbours(modules, units)
        else:
            # buckets never span two modules (pipeline chunks): each chunk's last backward
            # comes at its own time, and a bucket must be complete when it is launched
            self.buckets = [b for m in modules for b in
                            make_buckets([p for p in m.parameters() if p.requires_grad], bucket_mb, self.n)]
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        if zero:
            self._make_pieces()
        else:
            for b in self.buckets:
                b.flat = torch.zeros(sum(b.layout.numels), dtype=b.params[0].dtype,
                                     device=b.params[0].device)
        self._make_optimizer(lr, betas, weight_decay)
        if not self.naive:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)
        if zero == 3:
            for b, u in zip(self.buckets, units):
                self._free_params(b)
                u.register_forward_pre_hook(lambda m, a, b=b: self._gather_params(b, +1))
                u.register_forward_hook(lambda m, a, out, b=b: self._after_forward(b, out))

    def _link_neighbours(self, modules, units):
        """Which unit runs next in forward (and so, previous in backward): the next in the
        list, within the same module. A prefetch never crosses into another pipeline chunk,
        whose turn may come much later."""
        owner = [next(i for i, m in enumerate(modules) if any(u is x for x in m.modules()))
                 for u in units]
        for i, b in enumerate(self.buckets):
            prev = self.buckets[i - 1] if i > 0 and owner[i - 1] == owner[i] else None
            nxt = self.buckets[i + 1] if i + 1 < len(units) and owner[i + 1] == owner[i] else None
            b.neighbours = (prev, nxt)

    # -- who owns what ---------------------------------------------------------------
    def _make_pieces(self):
        for b in self.buckets:
            b.pieces = []
            for i, p in enumerate(b.params):
                a, e = b.layout.piece_range(i, self.rank)
                piece = p.data.view(-1)[a:e]
                # ZeRO 1/2 update a view of the full parameter in place; ZeRO-3 keeps the
                # piece alone, since the full parameter exists only while a unit runs.
                b.pieces.append(piece.clone() if self.zero == 3 else piece)

    def _make_optimizer(self, lr, betas, weight_decay):
        # AdamW, decay on matrices only (not norms), as in Llama. With ZeRO the optimizer sees
        # only this rank's pieces: that is all "sharding the optimizer state" means.
        pairs = [(p, p) for p in self.params] if not self.zero else \
            [(p, x) for b in self.buckets for p, x in zip(b.params, b.pieces)]
        decay = [x for p, x in pairs if p.dim() >= 2]
        no_decay = [x for p, x in pairs if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=1e-8)

    # -- ZeRO-3: a unit's weights exist only while it runs --------------------------------
    def _gathered(self, b: Bucket) -> bool:
        return b.params[0].shape == b.layout.shapes[0]

    def _gather_params(self, b: Bucket, direction: int):
        """Make this unit's weights whole, then start gathering the one that runs after it
        (direction +1 in forward, -1 in backward) so that its all-gather overlaps with this
        unit's compute: FSDP's prefetch."""
        if b.gathering is not None:
            packed, b.gathering = b.gathering.wait(), None
        elif not self._gathered(b):
            packed = comm.all_gather(b.layout.pad_pieces(b.pieces), self.axis)
        else:
            packed = None          # already whole (e.g. forward and backward back to back)
        if packed is not None:
            for p, f in zip(b.params, b.layout.unpack(packed)):
                p.data = f
        nxt = b.neighbours[1 if direction > 0 else 0] if direction else None
        if nxt is not None and nxt.gathering is None and not self._gathered(nxt):
            nxt.gathering = comm.all_gather(nxt.layout.pad_pieces(nxt.pieces), self.axis, async_op=True)

    def gather_module(self, module: nn.Module):
        """ZeRO-3: make every unit inside `module` whole again. Zero-bubble's W computes
        weight gradients long after B, and a forward of another micro-batch in between
        has freed the weights W needs."""
        if self.zero != 3:
            return
        mine = {id(p) for p in module.parameters()}
        for b in self.buckets:
            if id(b.params[0]) in mine:
                self._gather_params(b, 0)

    def _after_forward(self, b: Bucket, out):
        self._free_params(b)
        # gather again just before this unit's backward: when its output's gradient arrives
        if torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda g, b=b: self._gather_params(b, -1))

    def _free_params(self, b: Bucket):
        for p in b.params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    # -- gradient synchronisation --------------------------------------------------------
    def start_step(self):
        for p in self.params:
            p.grad = None
        for b in self.buckets:
            b.ready, b.pending, b.piece_grads = 0, None, None
            if b.flat is not None:
                # ZeRO-0: autograd accumulates straight into the bucket (DDP's
                # gradient_as_bucket_view), so the all-reduce needs no copy in or out
                b.flat.zero_()
                for p, g in zip(b.params, b.flat.split(b.layout.numels)):
                    p.grad = g.view_as(p)

    def set_last_microbatch(self, last: bool):
        """ZeRO 0/1 accumulate full gradients over micro-batches and reduce once, after the
        last; ZeRO 2/3 reduce-scatter every micro-batch (they keep no full gradient)."""
        self.sync = last

    def _grad_ready(self, p):
        b = self.bucket_of[p]
        b.ready += 1
        if b.ready == len(b.params):
            b.ready = 0
            if self.zero >= 2 or self.sync:
                self._launch(b)

    def _launch(self, b: Bucket):
        if b.pending is not None:
            self._finish(b)        # its previous micro-batch's piece first
        if self.zero == 0:
            for p, g in zip(b.params, b.flat.split(b.layout.numels)):
                if p.grad is not None and p.grad.data_ptr() != g.data_ptr():
                    g.copy_(p.grad.reshape(-1))     # someone replaced .grad: take it back
                p.grad = g.view_as(p)
            b.pending = (b.flat, comm.all_reduce(b.flat, self.axis, async_op=True))
        else:
            grads = [p.grad if p.grad is not None else torch.zeros(s, dtype=p.dtype)
                     for p, s in zip(b.params, b.layout.shapes)]
            b.pending = (None, comm.reduce_scatter(b.layout.pack(grads), self.axis, async_op=True))
        if self.timeline is not None:
            self._mark_launch(b)
        if self.zero >= 2:
            # the packed copy is in flight; the full gradient can go now. Keep at most two
            # buckets in flight, so the copies do not add up to a full gradient again.
            for p in b.params:
                p.grad = None
            self.in_flight.append(b)
            while len(self.in_flight) > 2:
                self._finish(self.in_flight.pop(0))
        if self.zero == 3:
            self._free_params(b)

    def _finish(self, b: Bucket):
        if b.pending is None:
            return
        flat, work = b.pending
        b.pending = None
        if flat is not None:                     # all-reduce: the sum lands in place
            if work is not None:
                work.wait()
        else:                                    # reduce-scatter: my piece of the sum
            mine = b.layout.unpad_pieces(work.wait(), self.rank)
            b.piece_grads = mine if b.piece_grads is None else \
                [a + m for a, m in zip(b.piece_grads, mine)]
        if self.timeline is not None:
            self.timeline.append(("done", self.buckets.index(b), time.perf_counter()))

    def _mark_launch(self, b: Bucket):
        """Timeline: "launch" now, "complete" when the collective has finished (its future's
        callback, which may run long before anyone waits), "done" in _finish (wait returned)."""
        i, work = self.buckets.index(b), b.pending[1]
        work = getattr(work, "work", work)          # reduce-scatter comes wrapped in _Deferred
        self.timeline.append(("launch", i, time.perf_counter()))
        try:
            future = work.get_future()
        except (AttributeError, RuntimeError):   # gloo's reduce-scatter has none: no "complete"
            return
        future.add_done_callback(
            lambda _, i=i: self.timeline.append(("complete", i, time.perf_counter())))

    def finish_backward(self):
        """After the last backward of the step: every gradient (or my piece of it) summed."""
        if self.naive:
            for b in self.buckets:
                self._launch(b)
        for b in self.buckets:
            self._finish(b)
        self.in_flight.clear()

    def grads(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """(gradient this rank holds, its parameter). ZeRO 0: full gradients, the same on
        every rank of the group; ZeRO >= 1: pieces, each held by one rank only."""
        if self.zero == 0:
            return [(p.grad, p) for p in self.params if p.grad is not None]
        return [(g, p) for b in self.buckets if b.piece_grads for g, p in zip(b.piece_grads, b.params)]

    # -- the update ---------------------------------------------------------------------
    @torch.no_grad()
    def step(self, lr: float, grad_scale: float = 1.0):
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.zero == 0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
            self.optimizer.step()
            return
        for b in self.buckets:
            grads = b.piece_grads or [torch.zeros_like(x) for x in b.pieces]
            for x, g in zip(b.pieces, grads):
                x.grad = g * grad_scale
        self.optimizer.step()
        for b in self.buckets:
            if b.gathering is not None:
                # a prefetch still in flight carries the weights from before this update
                b.gathering.wait()
                b.gathering = None
        if self.zero < 3:
            # each rank updated its pieces in place; everyone needs the whole model again
            for b in self.buckets:
                slot = b.layout.pad_pieces(b.pieces)
                for p, full in zip(b.params, b.layout.unpack(comm.all_gather(slot, self.axis))):
                    p.copy_(full)

    # -- what this rank holds -----------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in parameters, gradients and optimizer state, counted from
        the tensors themselves (not from a formula), between steps."""
        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        pieces = [x for b in self.buckets for x in (b.pieces or [])]
        params = nbytes(pieces) if self.zero == 3 else nbytes(p.data for p in self.params)
        if self.zero < 2:
            grads = nbytes(p.grad for p in self.params)
        else:
            grads = nbytes(g for b in self.buckets for g in (b.piece_grads or []))
        state = nbytes(v for st in self.optimizer.state.values() for v in st.values()
                       if torch.is_tensor(v) and v.dim() > 0)
        return {"params": params, "grads": grads, "optimizer": state}
