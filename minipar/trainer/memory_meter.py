"""Every byte of a rank, measured: parameters, gradients, optimizer state, activations.

Chapter "Memory: where every byte goes". The cost model *predicts* these parts
(`costmodel.memory`); this module *measures* them from the tensors, so that the two can be
checked against each other.

Parameters, gradients and optimizer state are counted from the tensors a rank holds
(`state_bytes`). Activations are harder: they are whatever autograd keeps for the backward,
and they come and go. `ActivationMeter` sees each of them pass:
`torch.autograd.graph.saved_tensors_hooks` hands every tensor an operation saves to our
`pack`, and autograd keeps what `pack` returns until it is done with it. We return a small
`Held` box around the tensor; when autograd drops the box (after that node's backward, or
when the graph is freed), the box's `__del__` tells the meter. So the meter knows, at every
moment, which storages are alive for the backward, and keeps the peak.

Three rules make the count honest:
* a storage is counted once, however many operations save it or a view of it (the norm's
  input is saved by `pow` and by `mul`; q, k and v projections all save the same input);
* parameters are not activations (a linear layer saves its weight, which exists anyway);
* recomputation (`minipar.trainer.recompute`) keeps tensors of its own, outside autograd's
  saved tensors: the inputs it will run again from, and what it recomputes in the backward.
  It holds them through `hold`, so the meter counts them too.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm, events

_ACTIVE: list["ActivationMeter"] = []     # the meters counting now (innermost last)


class Held:
    """A tensor kept for the backward. Dropping the box releases its count."""

    __slots__ = ("tensor", "_release")

    def __init__(self, tensor: torch.Tensor, release=lambda: None):
        self.tensor, self._release = tensor, release

    def __del__(self):
        self._release()


class ActivationMeter:
    """`with ActivationMeter() as m:` ... `m.peak`: the most bytes of activations alive
    for the backward at any moment inside the block (and `m.current` now)."""

    def __init__(self):
        self.live: dict[tuple, list[int]] = {}     # storage -> [bytes, boxes holding it]
        self.current = self.peak = 0

    def hold(self, t: torch.Tensor) -> Held:
        if isinstance(t if t._base is None else t._base, nn.Parameter):
            return Held(t)          # a weight (or a view of one) exists anyway
        st = t.untyped_storage()
        key = (t.device, st.data_ptr())
        entry = self.live.setdefault(key, [st.nbytes(), 0])
        if entry[1] == 0:           # the storage's first holder: count its bytes, once
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        # detached: the box must not reach back into the graph. A saved *output* (exp saves
        # its result) carries its grad_fn, whose saved tensor is this box: a cycle through
        # C++ that Python's collector cannot see, and the graph would never be freed
        return Held(t.detach(), lambda: self._release(key))

    def _release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def __enter__(self):
        _ACTIVE.append(self)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.hold, lambda h: h.tensor)
        self._hooks.__enter__()
        # a trace's compute spans record the bytes alive after each action (`events.probe`)
        self._probe = events.probe("activation_bytes", lambda: self.current)
        self._probe.__enter__()
        return self

    def __exit__(self, *exc):
        self._probe.__exit__(*exc)
        self._hooks.__exit__(*exc)
        _ACTIVE.remove(self)


def hold(t: torch.Tensor) -> Held:
    """Keep `t` for the backward outside autograd's saved tensors, counted by the meter
    that is measuring now (if any). Recomputation keeps its inputs this way."""
    return _ACTIVE[-1].hold(t) if _ACTIVE else Held(t.detach())


def state_bytes(dp, optimizer: torch.optim.Optimizer, device=None) -> dict[str, int]:
    """What this rank holds between steps: {"params", "grads", "optimizer"}, from the
    tensors (`dp.memory_bytes()` knows what ZeRO has sharded or freed). On CUDA also
    "cuda_max_allocated", since the previous call: all the allocator held at its peak,
    activations, workspaces and fragments included."""
    moments = [v for st in optimizer.state.values() for v in st.values()
               if torch.is_tensor(v) and v.dim() > 0]      # Adam's m and v, not its step count
    out = {**dp.memory_bytes(), "optimizer": comm.nbytes(*moments)}
    if device is not None and device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    return out


PARTS = ("params", "grads", "optimizer", "activations")


def fullest_rank(mine: dict[str, int], grid) -> dict[str, int]:
    """The `memory` record of a step: the parts of the rank whose total is largest, and
    its `rank`. Collective (not counted in CommLog: it is bookkeeping, not training)."""
    everyone = [None] * grid.world_size
    with comm.paused():
        dist.all_gather_object(everyone, {**mine, "rank": grid.rank})
    return max(everyone, key=lambda m: (sum(m[k] for k in PARTS), -m["rank"]))
