"""ZeRO: data parallelism that stops every rank holding what only one of them needs.

Chapter "Data parallelism", its last three stages, one class each, each a subclass of the
one before (`DataParallel`, in `data.py`, is stage 0):

    ZeRO1   optimizer state sharded: reduce-scatter the gradients after the step's last
            micro-batch, update only this rank's piece of each parameter, all-gather the
            updated parameters. The bytes of an all-reduce (it *is* those two halves).
    ZeRO2   + gradients sharded: each bucket is reduce-scattered as soon as its gradients
            exist, every micro-batch, and the full gradient is dropped.
    ZeRO3   + parameters sharded: a unit's weights are all-gathered just before its forward
            and again before its backward, and freed after each: 3(n-1)/n of the bytes.

Every piece of state is cut with one layout, `FlatShards`. The optimizer sees only this
rank's pieces (`optimizer_params`): that is all "sharding the optimizer state" means.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm, events
from .data import DataParallel, Piece


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
        # each tensor padded and cut into n pieces, one row per rank: [n, piece]; side by
        # side, [n, shard_size], row r is rank r's pieces of every tensor
        rows = [F.pad(t.reshape(-1), (0, pk * self.n - k)).view(self.n, pk)
                for t, k, pk in zip(tensors, self.numels, self.piece_numels)]
        return torch.cat(rows, dim=1).reshape(-1)

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        columns = packed.view(self.n, self.shard_size).split(self.piece_numels, dim=1)
        return [col.reshape(-1)[:k].view(shape)
                for col, k, shape in zip(columns, self.numels, self.shapes)]

    def pad_pieces(self, pieces) -> torch.Tensor:
        """This rank's (unpadded) pieces -> its padded slot of the packed buffer."""
        return torch.cat([F.pad(x.reshape(-1), (0, pk - x.numel()))
                          for x, pk in zip(pieces, self.piece_numels)])

    def unpad_pieces(self, slot: torch.Tensor, rank: int) -> list[torch.Tensor]:
        ranges = [self.piece_range(i, rank) for i in range(len(self.shapes))]
        return [x[:b - a] for x, (a, b) in zip(slot.split(self.piece_numels), ranges)]


class ShardedBucket:
    """Parameters whose gradients are reduce-scattered together, and this rank's piece of
    each. A piece is a 1-D tensor; its `.grad`, once reduce-scattered, is this rank's piece
    of the summed gradient."""

    def __init__(self, params: list[nn.Parameter], axis: comm.Axis):
        self.params, self.axis, rank = params, axis, axis.rank
        self.layout = FlatShards([p.shape for p in params], axis.size)
        self.ready = 0            # gradients accumulated so far in this backward
        self.pending = None       # the reduce-scatter in flight: a comm.Handle
        # views of the parameters: ZeRO-1/2 update the full parameter in place
        self.pieces = [p.data.view(-1)[slice(*self.layout.piece_range(i, rank))]
                       for i, p in enumerate(params)]
        self.gathering = None     # ZeRO-3: a prefetch all-gather in flight
        self.prev = self.next = None   # ZeRO-3: the units run just before and after this one

    def start_step(self):
        self.ready, self.pending = 0, None
        for p, x in zip(self.params, self.pieces):
            p.grad = x.grad = None


# ------------------------------------------------------------------------ ZeRO-1
class ZeRO1(DataParallel):
    """Optimizer state sharded: the optimizer updates only this rank's pieces."""

    holds_replicas, bucket_type = False, ShardedBucket

    def _launch(self, b: ShardedBucket):
        grads = [p.grad if p.grad is not None else torch.zeros(s, dtype=p.dtype, device=p.device)
                 for p, s in zip(b.params, b.layout.shapes)]
        with events.inside(bucket=self.buckets.index(b)):
            b.pending = comm.reduce_scatter(b.layout.pack(grads), b.axis, async_op=True)

    def _finish(self, b: ShardedBucket):
        summed = super()._finish(b)
        if summed is not None:      # my slot of the sum: my piece of every gradient
            for x, g in zip(b.pieces, b.layout.unpad_pieces(summed, b.axis.rank)):
                x.grad = g if x.grad is None else x.grad + g    # ZeRO-2: every micro-batch

    def finish_backward(self):
        """After it, each piece's `.grad` is this rank's piece of the summed gradient
        (zeros where none arrived), ready for clipping and a plain optimizer step."""
        super().finish_backward()
        for x in (x for b in self.buckets for x in b.pieces if x.grad is None):
            x.grad = torch.zeros_like(x)

    def optimizer_params(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """(this rank's piece, its parameter): each piece, and so its gradient (`grads()`),
        held by one rank only."""
        return [(x, p) for b in self.buckets for p, x in zip(b.params, b.pieces)]

    def shard_of(self, p: nn.Parameter) -> Piece:
        """This rank's piece of `p`: a view of it (ZeRO-1/2), or its only copy (ZeRO-3)."""
        b = self.bucket_of[p]
        i = next(i for i, q in enumerate(b.params) if q is p)
        start, stop = b.layout.piece_range(i, b.axis.rank)
        return Piece(b.layout.shapes[i], start, stop, b.pieces[i], b.pieces[i])

    def after_optimizer_step(self):
        """Each rank updated its pieces in place; everyone needs the whole model again."""
        for b in self.buckets:
            packed = comm.all_gather(b.layout.pad_pieces(b.pieces), b.axis)
            for p, full in zip(b.params, b.layout.unpack(packed)):
                p.data.copy_(full)


# ------------------------------------------------------------------------ ZeRO-2
class ZeRO2(ZeRO1):
    """+ gradients sharded: no full gradient outlives its bucket's reduce-scatter."""

    # Keep at most this many buckets' packed copies in flight, so that they do not add up
    # to a full gradient again.
    MAX_IN_FLIGHT = 2

    def start_step(self):
        super().start_step()
        self.in_flight: list[ShardedBucket] = []    # launched, oldest first

    def set_last_microbatch(self, last: bool):
        """No full gradient is left to accumulate into over micro-batches: every
        micro-batch's backward reduce-scatters, whatever `last` says."""
        self.sync = True

    def _launch(self, b: ShardedBucket):
        self._finish(b)             # its previous micro-batch's reduce-scatter first
        super()._launch(b)
        # the packed copy is in flight; the full gradient can go now
        for p in b.params:
            p.grad = None
        self.in_flight.append(b)
        while len(self.in_flight) > self.MAX_IN_FLIGHT:
            self._finish(self.in_flight.pop(0))

    def memory_bytes(self) -> dict[str, int]:
        return {**super().memory_bytes(),
                "grads": comm.nbytes(*(x.grad for b in self.buckets for x in b.pieces))}


# ------------------------------------------------------------------------ ZeRO-3
def zero3_units(modules: list[nn.Module]) -> list[nn.Module]:
    """The modules ZeRO-3 gathers one at a time: the embedding, each block, norm, head (of
    each pipeline chunk, those it holds)."""
    return [u for m in modules for u in (m.embed_tokens, *m.layers.values(), m.norm, m.lm_head)
            if u is not None]


class ZeRO3(ZeRO2):
    """+ parameters sharded: a unit's weights exist only while it runs.

    Its units (`zero3_units`) are the modules whose weights are gathered together; each is
    one bucket, whatever `bucket_mb` says, reduce-scattered as soon as its backward is done
    (never naive).
    """

    def __init__(self, modules: list[nn.Module], axis: comm.Axis, bucket_mb: float = 25.0,
                 axis_of=None):
        # units, not megabytes; every unit over `axis` (--zero 3 does not take --ep)
        super().__init__(modules, axis, bucket_mb=None)
        for b in self.buckets:
            # the pieces become the only copy: the full parameters exist only while a unit runs
            b.pieces = [x.clone() for x in b.pieces]
            self._free_params(b)
        for u in zero3_units(modules):
            b = self.bucket_of[next(u.parameters())]   # a tied head: the embedding's bucket
            u.register_forward_pre_hook(lambda m, a, b=b: self._gather_unit(b, prefetch=b.next))
            u.register_forward_hook(lambda m, a, out, b=b: self._after_forward(b, out))

    def _make_buckets(self, modules, bucket_mb) -> list[ShardedBucket]:
        """One bucket per unit, each linked to the unit that runs next in forward (and so,
        previous in backward): the next in the list, within the same module. A prefetch
        never crosses into another pipeline chunk, whose turn may come much later."""
        buckets = []
        for m in modules:
            # a parameter belongs to the first unit that uses it: a head tied to the
            # embedding of the same chunk gathers the embedding's bucket, it has none
            seen, chunk = set(), []
            for u in zero3_units([m]):
                mine = [p for p in u.parameters() if id(p) not in seen]
                seen.update(map(id, mine))
                chunk += [self.bucket_type(mine, self.axis)] if mine else []
            for a, b in zip(chunk, chunk[1:]):
                a.next, b.prev = b, a
            buckets += chunk
        return buckets

    # -- gathering and freeing ------------------------------------------------------------
    def _gathered(self, b: ShardedBucket) -> bool:
        return b.params[0].shape == b.layout.shapes[0]

    def _gather_unit(self, b: ShardedBucket, prefetch: ShardedBucket | None = None):
        """Make this unit's weights whole, then start gathering `prefetch`, the unit that
        runs after it (the next in forward, the previous in backward), so that its
        all-gather overlaps with this unit's compute: FSDP's prefetch."""
        if not self._gathered(b):  # (it may be whole: forward and backward back to back)
            prefetched, b.gathering = b.gathering, None     # in flight already, or None
            packed = (prefetched.wait() if prefetched is not None
                      else comm.all_gather(b.layout.pad_pieces(b.pieces), b.axis))
            for p, full in zip(b.params, b.layout.unpack(packed)):
                p.data = full
        if prefetch is not None and prefetch.gathering is None and not self._gathered(prefetch):
            prefetch.gathering = comm.all_gather(prefetch.layout.pad_pieces(prefetch.pieces),
                                                 prefetch.axis, async_op=True)

    def _after_forward(self, b: ShardedBucket, out):
        self._free_params(b)
        # gather again just before this unit's backward: when its output's gradient arrives
        if torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda g, b=b: self._gather_unit(b, prefetch=b.prev))

    def _free_params(self, b: ShardedBucket):
        for p in b.params:
            # no elements, but as many dims: whoever asks p.dim() (weight decay goes to
            # matrices only) gets the same answer whether the unit is gathered or not
            p.data = torch.empty((0,) * p.dim(), dtype=p.dtype, device=p.device)

    def gather_module(self, module: nn.Module):
        """Make every unit inside `module` whole again. Zero-bubble's W computes weight
        gradients long after B, and a forward of another micro-batch in between has freed
        the weights W needs."""
        mine = {id(p) for p in module.parameters()}
        for b in [b for b in self.buckets if id(b.params[0]) in mine]:
            self._gather_unit(b)

    # -- the step ----------------------------------------------------------------------
    def _launch(self, b: ShardedBucket):
        super()._launch(b)
        self._free_params(b)        # the unit's backward is done

    def after_optimizer_step(self):
        """The pieces, updated in place, are the only copy: nothing to gather until a unit
        runs. A prefetch still in flight carries the weights from before the update: drop it."""
        for b in self.buckets:
            if b.gathering is not None:
                b.gathering.wait()
                b.gathering = None

    def memory_bytes(self) -> dict[str, int]:
        return {**super().memory_bytes(),
                "params": comm.nbytes(*(x for b in self.buckets for x in b.pieces))}


ZERO_STAGES = {0: DataParallel, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}
