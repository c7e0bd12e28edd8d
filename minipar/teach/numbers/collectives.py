"""The numbers the collectives chapter states (book/collectives.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
