"""The numbers the cluster chapter states (book/cluster.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
