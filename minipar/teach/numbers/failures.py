"""The numbers the failures chapter states (book/failures.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
