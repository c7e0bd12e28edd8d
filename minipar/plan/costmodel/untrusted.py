"""The cost model's package data (`data/`), read as untrusted: a damaged copy of a file
(truncated, edited, not the format it should be) is one line naming the file and what is
wrong with it, `DataError`, never a traceback from deep in the model. The commands print it
and exit 1: a broken installation, not a bad flag (exit 2 is the user's input).

Chapter "MFU and communication volume" (the measurements the model is built on)."""
from __future__ import annotations

import csv
import functools
import inspect
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path


class DataError(RuntimeError):
    """A file of the package data cannot be used: its message names the file."""


# What reading a damaged file, and building the model's objects from its rows, raises (a
# ConfigError is a ValueError: a row whose layout breaks a rule).
DAMAGE = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
          ZeroDivisionError, OverflowError, RecursionError, csv.Error)


@contextmanager
def reading(path: Path):
    """Inside, whatever a damaged `path` raises becomes a `DataError` naming it."""
    try:
        yield
    except DataError:
        raise
    except json.JSONDecodeError as e:
        raise DataError(damaged(path, f"not JSON, or truncated: {e.msg} (line {e.lineno})")) from None
    except DAMAGE as e:
        what = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise DataError(damaged(path, what)) from None


def damaged(path: Path, what: str) -> str:
    return (f"the cost model's data file {path} is damaged ({what}): reinstall minipar, or "
            "restore the file")


def read_json(path: Path, required: dict[str, tuple[str, ...]] | None = None) -> dict:
    """A JSON object from `path`; `required` {key: fields}: each key must hold a row, a list
    of rows or an object of lists of rows, each row with those fields, positive numbers."""
    with reading(path):
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        for key, names in (required or {}).items():
            if key not in data:
                raise KeyError(f"{key!r} is missing")
            value = data[key]
            lists = isinstance(value, dict) and all(isinstance(v, list) for v in value.values())
            for rows in value.values() if lists else [value]:
                rows = [rows] if isinstance(rows, dict) else rows
                if not (isinstance(rows, list) and rows):
                    raise ValueError(f"{key!r} must hold measurements")
                for i, row in enumerate(rows):
                    bad = [n for n in names if not _positive(row.get(n) if isinstance(row, dict) else None)]
                    if bad:
                        raise ValueError(f"{key}[{i}].{bad[0]} must be a positive number")
        return data


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def reads_data(loader):
    """A loader of a data file (its argument `path`, or its default): what a damaged file
    makes it raise, in the reading or in the objects built from its rows, is a `DataError`
    naming the file."""
    signature = inspect.signature(loader)

    @functools.wraps(loader)
    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        with reading(bound.arguments["path"]):
            return loader(*args, **kwargs)
    return wrapped


def exit_1_on_damaged_data(main):
    """A command's `main`: a damaged data file is its one line on stderr and exit 1 (a broken
    installation; exit 2 stays the user's bad input)."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return wrapped
