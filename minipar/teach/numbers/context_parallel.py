"""The numbers the context_parallel chapter states (book/context_parallel.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
