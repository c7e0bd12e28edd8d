"""The numbers the llama3 chapter states (book/llama3.md), computed once: the case study's
facts, each with where it comes from (see core.py)."""
from __future__ import annotations

from .core import Number, paper


def numbers() -> dict[str, Number]:
    return {
        "gpus": paper(16384, source="Table 4"),
    }
