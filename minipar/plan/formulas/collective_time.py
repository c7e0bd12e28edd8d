"""What a collective costs in time: the alpha-beta model of an all-reduce, and the
algorithms NCCL and the network choose between, priced by it.

Chapter "Collectives", section "Time: the alpha-beta model". Every message pays a latency
alpha plus its bytes over the link's bandwidth; the bytes themselves are
`collectives.wire_bytes`. Torch-free, like every file of `minipar.plan.formulas`; the trainer
never needs a time (the cost model, the figures and the tests do).
"""
from __future__ import annotations

import math


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
