"""The numbers the pipeline_parallel chapter states (book/pipeline_parallel.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
