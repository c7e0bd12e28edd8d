"""The numbers the mfu chapter states (book/mfu.md), computed once."""
from __future__ import annotations

from .core import Number


def numbers() -> dict[str, Number]:
    return {}
