"""Every number the book's prose states, computed once (see core.py).

`all_numbers()` gathers each chapter module's `numbers()` under "chapter.key"; the book's
`{n}` role and the tests read it. A chapter module computes its numbers with the package's
functions; one that another chapter also states is taken from the module that owns it.
"""
from __future__ import annotations

from functools import cache

from . import (accuracy, cluster, collectives, context_parallel, data_parallel, experts, failures,
               fourd, hf, intro, llama3, memory, mfu, pipeline_parallel, tensor_parallel)
from .core import EVIDENCE, Number, merge

CHAPTERS = {m.__name__.rsplit(".", 1)[1]: m for m in (
    intro, llama3, collectives, data_parallel, tensor_parallel, pipeline_parallel,
    context_parallel, experts, memory, fourd, mfu, failures, cluster, hf, accuracy)}


@cache
def all_numbers() -> dict[str, Number]:
    return merge({name: module.numbers() for name, module in CHAPTERS.items()})


def text(key: str) -> str:
    """How the book writes the number `key` ("llama3.gpus" -> "16,384")."""
    numbers = all_numbers()
    if key not in numbers:
        raise KeyError(f"no number {key!r} in minipar.teach.numbers")
    return numbers[key].text()
