"""The numbers the tensor_parallel chapter states (book/tensor_parallel.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
