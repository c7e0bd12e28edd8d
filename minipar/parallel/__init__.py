"""The four parallel axes, one file each: data.py, tensor.py, context.py, pipeline.py."""


def mark_replica(p, axis: str):
    """Declare that parameter `p` is an identical copy on every rank of `axis` (a norm
    weight under tensor parallelism, say). Global gradient-norm clipping then counts it once,
    and the checkpoint saves it once."""
    p._replica_axes = tuple(getattr(p, "_replica_axes", ())) + (axis,)
    return p
