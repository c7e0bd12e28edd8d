"""What a collective costs: the bytes each rank puts on the wire, and the alpha-beta time.

Chapter "Collectives". Bytes convention (as `minipar.comm` counts them): what one rank puts
on the wire under the ring algorithm, rounded down once per collective call: all-reduce
2(n-1)/n S, all-gather, reduce-scatter, all-to-all and broadcast (n-1)/n S (S = the full
tensor), send S on the sender, recv nothing.

Every closed form of the book lives once, in this package (one file per chapter, torch-free):
the axis files, the cost model, the figures and the tests call it, so that the number a
chapter derives, the number `CommLog` counts and the number the cost model predicts cannot
drift apart.
"""
from __future__ import annotations

import math


def wire_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks on a message of `size` bytes (ring)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * size // n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * size // n
    if op == "send":
        return size
    if op == "recv":
        return 0
    if op == "broadcast":   # pipelined ring broadcast: every rank but the last forwards S
        return (n - 1) * size // n
    raise ValueError(f"unknown collective {op!r}")


def all_reduce_time(size: float, n: int, alpha: float, bandwidth: float) -> float:
    """The alpha-beta model of a ring all-reduce of `size` bytes over n ranks: 2(n-1) steps,
    each paying the latency alpha, and 2(n-1)/n * size bytes through one link."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth


ALL_REDUCE_ALGORITHMS = ("ring", "tree", "in-network", "root")


def all_reduce_cost(algorithm: str, n: int, size: float, alpha: float = 0.0,
                    bandwidth: float = float("inf")) -> tuple[float, float]:
    """(bytes the busiest rank sends, seconds) of an all-reduce of `size` bytes over n ranks.

    ring        2(n-1) steps; 2(n-1)/n S per rank: the least any rank-to-rank algorithm sends.
    tree        NCCL's double binary tree: each rank is inside one tree and a leaf of the
                other, so it sends about 2S, pipelined; only 2 log2(n) steps of latency.
    in-network  the switch sums (NVLS on NVSwitch, SHARP on InfiniBand): each rank sends its
                S once and receives the sum once; two steps of latency.
    root        everyone sends to rank 0, which sums and sends back: (n-1) S through its link.
    """
    if n <= 1:
        return 0.0, 0.0
    if algorithm == "ring":
        sent, steps = 2 * (n - 1) / n * size, 2 * (n - 1)
    elif algorithm == "tree":
        sent, steps = 2.0 * size, 2 * math.ceil(math.log2(n))
    elif algorithm == "in-network":
        sent, steps = float(size), 2
    elif algorithm == "root":
        sent, steps = (n - 1) * float(size), 2
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {ALL_REDUCE_ALGORITHMS}")
    return sent, steps * alpha + sent / bandwidth
