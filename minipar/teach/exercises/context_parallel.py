"""The exercises of the context parallelism chapter, checked (see core.py for how)."""
from __future__ import annotations

import torch

from ...grid import Axis
from ...parallel.context import attention_work, contiguous_chunks, shard_for_context_parallel
from .core import Verdict, exercise, function_given, number, right, wrong


@exercise("context_parallel", "number")
def check_contiguous_imbalance(seq_len: int, cp: int, answer) -> Verdict:
    """Busiest over least busy rank's attention work under the contiguous (naive) split."""
    work = attention_work(seq_len, cp, contiguous_chunks)
    want = max(work) / min(work)
    return number(answer, want, "the imbalance", rel=1e-3, hints=[
        (float(cp), "close, but the diagonal blocks are only half computed (a triangle "
                    "with its diagonal): count scores, c(c+1)/2 per diagonal block."),
        (2 * cp - 1.0, "count every rank's blocks, diagonal ones as c(c+1)/2 scores."),
    ])


@exercise("context_parallel", "implement")
def check_zigzag(fn) -> Verdict:
    """fn(seq_len, rank, cp) -> the positions this CP rank holds, in the order it holds them."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for seq_len, cp in [(8, 2), (16, 4), (24, 3)]:
        tokens = torch.arange(seq_len).unsqueeze(0)
        for rank in range(cp):
            axis = Axis("cp", tuple(range(cp)), rank)
            want = shard_for_context_parallel(tokens, tokens, axis)[2].tolist()
            try:
                got = [int(i) for i in fn(seq_len, rank, cp)]
            except Exception as e:   # noqa: BLE001
                return wrong(f"fn({seq_len}, {rank}, {cp}) raised {type(e).__name__}: {e}")
            if got != want:
                if sorted(got) == sorted(want):
                    return wrong(f"fn({seq_len}, {rank}, {cp}) has the right positions in the "
                                  f"wrong order: the early chunk comes first.")
                return wrong(f"fn({seq_len}, {rank}, {cp}) = {got}: not the two chunks of "
                              f"seq_len/(2 cp) tokens this rank should hold.")
    return right("your layout matches shard_for_context_parallel for every rank.")


__all__ = [n for n in dir() if n.startswith("check_")]
