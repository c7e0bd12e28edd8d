"""Data parallelism: every rank holds the whole model, reads different tokens, and the
ranks agree on the gradient before they step.

Chapter "Data parallelism", its first two stages (ZeRO, the third, is `zero.py`):

    naive     `bucket_mb=0`: wait for the whole backward, then one all-reduce per gradient.
    buckets   gradients grouped, in the order backward produces them (the reverse of the
              forward), into buckets of about `bucket_mb` MB. Each bucket's all-reduce is
              launched asynchronously by a hook the moment its last gradient is ready, and
              travels while the rest of the backward computes.

Either way each rank sends 2(n-1)/n of the gradient bytes. The group is dp x cp:
context-parallel ranks hold the same weights and see different tokens, so for gradients
they are data-parallel ranks too. Every reduction is a SUM; the loss is already divided by
the global token count.

The optimizer is the training loop's: it updates `optimizer_params()`, and the loop calls
`start_step()`, the backward passes, `finish_backward()`, its clipping and
`optimizer.step()`, then `after_optimizer_step()`.
"""

from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from .. import comm, events


# ------------------------------------------------------------------------ buckets
class Bucket:
    """Parameters whose gradients travel together in one all-reduce.

    Their gradients live in one flat buffer, each parameter's `.grad` a view of it
    (PyTorch's `gradient_as_bucket_view`): autograd accumulates straight into the buffer
    that is all-reduced in place, with no copy in or out.
    """

    def __init__(self, params: list[nn.Parameter], axis: comm.Axis):
        self.params, self.axis = params, axis
        self.numels = [p.numel() for p in params]
        self.flat = torch.zeros(sum(self.numels), dtype=params[0].dtype, device=params[0].device)
        self.ready = 0            # gradients accumulated so far in this backward
        self.pending = None       # the collective in flight: a comm.Handle

    def grad_views(self) -> list[torch.Tensor]:
        """Each parameter's gradient, as a view of the flat buffer."""
        return [g.view_as(p) for p, g in zip(self.params, self.flat.split(self.numels))]

    def start_step(self):
        self.ready, self.pending = 0, None
        self.flat.zero_()
        for p, g in zip(self.params, self.grad_views()):
            p.grad = g


FIRST_BUCKET_MB = 1.0


def make_buckets(params: list[nn.Parameter], bucket_mb: float) -> list[list[nn.Parameter]]:
    """Group parameters, last-used first, into buckets of about `bucket_mb` megabytes.
    The first bucket is at most 1 MB (as in DDP): the output layer's gradients arrive
    first, and a small bucket starts the communication while most of backward remains.
    bucket_mb = 0: one bucket per parameter (the naive version)."""
    buckets, size, limit = [[]], 0, min(bucket_mb, FIRST_BUCKET_MB) * 2**20
    for p in reversed(params):
        if buckets[-1] and size >= limit:       # this one is full: the next holds bucket_mb
            buckets.append([])
            size, limit = 0, bucket_mb * 2**20
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
    return buckets if params else []            # no parameters, no bucket


class Piece(NamedTuple):
    """What one rank holds of a parameter: elements `start:stop` of it flattened (its
    TP-local `shape`), in `data`; `key` is the tensor the optimizer's state is keyed by.
    (Where the TP-local tensor lies in the full one is the parameter's placement record:
    `placement.py`.)"""

    shape: torch.Size
    start: int
    stop: int
    data: torch.Tensor
    key: torch.Tensor


# ------------------------------------------------------------------- the wrapper
class DataParallel:
    """Sums the gradients of `modules` over `axis`: every rank ends up with the same
    gradient, so the same update keeps the replicas identical without comparing them.

    Per step: start_step(); for each micro-batch: set_last_microbatch(...) and backward;
    finish_backward(); grads() to clip; the optimizer's step; after_optimizer_step().
    """

    # every rank of the group holds whole parameters and whole, equal gradients
    holds_replicas, bucket_type = True, Bucket

    def __init__(self, modules: list[nn.Module], axis: comm.Axis, bucket_mb: float = 25.0,
                 axis_of=None):
        self.axis, self.n, self.rank = axis, axis.size, axis.rank
        # the group each parameter's gradient is summed over: `axis`, but an expert's over
        # the ranks holding the same experts (`parallelize.data_parallel`)
        self.axis_of = axis_of or (lambda p: axis)
        self.params = [p for m in modules for p in m.parameters() if p.requires_grad]
        self.naive = bucket_mb == 0    # no hooks: every collective launched after the backward
        self.sync = True
        # what completes the gradients after the reduction (`parallelize` assembles it: the
        # TP-partial gradients of norms under SP, a tied embedding's two copies)
        self.after_reduce: list[Callable[[list], None]] = []
        self.buckets = self._make_buckets(modules, bucket_mb)
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        if not self.naive:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _make_buckets(self, modules, bucket_mb) -> list:
        # buckets never span two modules (pipeline chunks): each chunk's last backward
        # comes at its own time, and a bucket must be complete when it is launched; nor two
        # groups (experts' and the rest's), which reduce over different ranks
        return [self.bucket_type(group, axis) for m in modules for axis, params in self._by_axis(m)
                for group in make_buckets(params, bucket_mb)]

    def _by_axis(self, module: nn.Module) -> list[tuple[comm.Axis, list[nn.Parameter]]]:
        params = [p for p in module.parameters() if p.requires_grad]
        axes = {self.axis_of(p).name: self.axis_of(p) for p in params}     # in order of use
        return [(a, [p for p in params if self.axis_of(p) is a]) for a in axes.values()]

    # -- gradient synchronisation --------------------------------------------------------
    def start_step(self):
        for b in self.buckets:
            b.start_step()

    def set_last_microbatch(self, last: bool):
        """Gradients accumulate over the micro-batches of a step and are reduced once,
        after the last one's backward: summing partial sums over ranks once is enough."""
        self.sync = last

    def _grad_ready(self, p):
        b = self.bucket_of[p]
        b.ready += 1
        if b.ready == len(b.params):
            b.ready = 0
            if self.sync:
                self._launch(b)

    def _launch(self, b: Bucket):
        for p, g in zip(b.params, b.grad_views()):
            if p.grad is not None and p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)         # someone replaced .grad: take it back
            p.grad = g
        with events.inside(bucket=self.buckets.index(b)):
            b.pending = comm.all_reduce(b.flat, b.axis, async_op=True)

    def _finish(self, b: Bucket) -> torch.Tensor | None:
        """Wait for bucket b's collective, if one is in flight; return its result (the
        all-reduce sums into the bucket in place)."""
        handle, b.pending = b.pending, None
        return None if handle is None else handle.wait()

    def finish_backward(self):
        """After the last backward of the step: every gradient summed over the group, then
        completed by the `after_reduce` steps (once for the step: sums commute)."""
        if self.naive:
            for b in self.buckets:
                self._launch(b)
        for b in self.buckets:
            self._finish(b)
        for complete in self.after_reduce:
            complete(self.grads())

    # -- what the loop, the optimizer and checkpoints see --------------------------------
    def grads(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """(gradient this rank holds, its parameter): the gradients of what the optimizer
        updates, here whole and the same on every rank of the group (ZeRO: this rank's
        pieces)."""
        return [(x.grad, p) for x, p in self.optimizer_params() if x.grad is not None]

    def optimizer_params(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """(tensor the optimizer updates, its parameter): here the parameter itself."""
        return [(p, p) for p in self.params]

    def shard_of(self, p: nn.Parameter) -> Piece:
        """What this rank holds of `p`: all of it."""
        return Piece(p.shape, 0, p.numel(), p.data.view(-1), p)

    def after_optimizer_step(self):
        """Every rank applied the same update to the same weights: nothing to do."""

    def gather_module(self, module: nn.Module):
        """Make `module`'s weights whole: they always are."""

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in parameters and gradients, counted from the tensors
        themselves (not from a formula), between steps."""
        return {"params": comm.nbytes(*(p.data for p in self.params)),
                "grads": comm.nbytes(*(p.grad for p in self.params))}
