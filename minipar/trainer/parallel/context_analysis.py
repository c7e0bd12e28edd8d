"""The ring's schedule examined rather than run: how much attention each rank computes
under a layout of the sequence, the load-balanced one or the naive one.

Chapter "Context parallelism". The trainer needs none of this (`python -m minipar.train`
does not import this file): the book, the notebook and the tests compare the zigzag layout
the trainer uses (`context.zigzag_chunks`) with the naive split it replaces.

    contiguous_chunks  the naive split: rank i holds the i-th 1/cp of the sequence
    attention_work     the query-key scores each rank computes under a layout
"""
from __future__ import annotations

from .context import ring_steps, zigzag_chunks


def contiguous_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The naive split, for comparison: rank i holds the i-th 1/cp of the sequence."""
    return 2 * rank, 2 * rank + 1


def attention_work(seq_len: int, cp: int, layout=zigzag_chunks) -> list[int]:
    """Query-key scores each rank computes under the ring schedule (its attention FLOPs
    are proportional). Every score under the causal mask is computed once, by one rank."""
    c = seq_len // (2 * cp)
    return [sum(c * (c + 1) // 2 if diag else c * c
                for _, pairs in ring_steps(r, cp, layout) for _, _, diag in pairs)
            for r in range(cp)]
