"""What a collective costs on the wire: the bytes each rank sends.

Chapter "Collectives". Bytes convention (as `minipar.trainer.comm` counts them): what one rank puts
on the wire under the ring algorithm, rounded down once per collective call: all-reduce
2(n-1)/n S, all-gather, reduce-scatter, all-to-all and broadcast (n-1)/n S (S = the full
tensor), send S on the sender, recv nothing. What that takes in time (the alpha-beta model,
and the all-reduce algorithms it prices) is `collective_time`, the chapter's second file:
`comm` counts bytes on every call, and only the cost model and the book need times.

Every closed form of the book lives once, in this package (torch-free): the axis files, the
cost model, the figures and the tests call it, so that the number a chapter derives, the
number `CommLog` counts and the number the cost model predicts cannot drift apart.
"""
from __future__ import annotations


def wire_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks on a message of `size` bytes (ring)."""
    if n <= 1 or op == "recv":
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * size // n
    # broadcast: a pipelined ring, where every rank but the last forwards S
    if op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        return (n - 1) * size // n
    if op == "send":
        return size
    raise ValueError(f"unknown collective {op!r}")
