"""Where each parameter lies on the grid of ranks: one placement record per parameter.

Chapter "Tensor parallelism".

In the vocabulary of PyTorch's DTensor (which torchtitan builds on), along each axis of the
grid ("tp", "pp", ...) a parameter is one of

    Shard(dim)    cut into equal contiguous chunks along `dim`, rank r holding chunk r:
                  a column-parallel weight is Shard(0) on "tp", a row-parallel one Shard(1)
    Replicate()   whole, the same on every rank of the axis: a norm's gain on "tp", the
                  tied head's copy on "pp"
    Partial()     whole and the same too, but each rank's *gradient* is only its part of
                  the sum (DTensor's placement of that gradient): a norm's gain under
                  sequence parallelism, which meets 1/t of the tokens

Its record maps axis names to these; an axis it does not name leaves the parameter as the
reference model has it (the copies data parallelism makes are the wrapper's business:
`DataParallel.holds_replicas`). The layer that splits or copies a weight writes the record
(`place`: `tensor.py`, `pipeline.py`); whoever needs to know where a parameter's elements
are reads it (`placements`): the gradient norm and the checkpoint count a copy once
(`ProcessGrid.counts`), SP's partial gradients are summed (`tensor.sum_partial_grads`), and
the layers, the checkpoint and the Hugging Face reader all cut a full tensor with one rule,
`local_index`.
"""

import dataclasses

from torch.utils.weak import WeakIdKeyDictionary


@dataclasses.dataclass(frozen=True)
class Shard:
    """Cut into equal contiguous chunks along `dim`, one per rank of the axis."""
    dim: int


@dataclasses.dataclass(frozen=True)
class Replicate:
    """Whole and the same on every rank of the axis."""


@dataclasses.dataclass(frozen=True)
class Partial:
    """Whole and the same on every rank of the axis; each rank's gradient a part of the sum."""


# parameter -> {axis name: Shard | Replicate | Partial}. Keyed by identity, weakly: a record
# goes when its parameter does (weakref.WeakKeyDictionary would compare tensors with ==).
_RECORDS = WeakIdKeyDictionary()


def place(p, axis: str, how):
    """Record that parameter `p` lies on grid axis `axis` as `how`; returns `p`."""
    _RECORDS[p] = {**_RECORDS.get(p, {}), axis: how}
    return p


def placements(p) -> dict:
    """`p`'s record, {axis name: Shard | Replicate | Partial}; {} if nothing split or copied it."""
    return dict(_RECORDS.get(p, {}))


def local_index(shape, record: dict, axes) -> tuple[slice, ...]:
    """Where this rank's part of a full tensor of `shape` lies in it, one slice per
    dimension: `full[local_index(...)]`, for a torch tensor as for a safetensors slice.
    `axes`: this rank's `comm.Axis` of each axis the record names (`grid.axes`). Along an
    axis it is Shard(dim) on, `dim` is cut into `size` equal chunks and the rank keeps chunk
    `rank` (torch.chunk's cut: the layout's rules make `size` divide the dimension)."""
    index = [slice(0, n) for n in shape]
    for name, how in record.items():
        if isinstance(how, Shard):
            cut, axis = index[how.dim], axes[name]
            n = (cut.stop - cut.start) // axis.size
            index[how.dim] = slice(cut.start + axis.rank * n, cut.start + (axis.rank + 1) * n)
    return tuple(index)
