"""The numbers the fourd chapter states (book/fourd.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
