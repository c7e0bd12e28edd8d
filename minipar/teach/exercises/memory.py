"""The exercises of the memory chapter, checked (see core.py for how)."""
from __future__ import annotations

from .core import Verdict, exercise, number  # noqa: F401 - the chapter's checks use these


__all__ = [n for n in dir() if n.startswith("check_")]
