"""How a check reads the reader's number, in every chapter's exercises: a plain number is
taken in the unit the check asks for; a string may carry its own unit ("50.7 GB", "3.2TB",
"12 ms", "43%"), which is converted to the check's; a unit of another kind is refused with
a sentence that names the unit the check wants.

Bytes come in decimal (kB, MB, GB, TB: powers of 1000, as the book counts them) and binary
(KiB, MiB, GiB, TiB: powers of 1024) units; time in ns, us, ms, s, min and h; a plain
number (a fraction, a ratio, a count) may be written as a percentage.
"""
from __future__ import annotations

import re

# unit -> (what it measures, its size in the base unit of that kind)
UNITS = {
    "B": ("bytes", 1), "kB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12), "PB": ("bytes", 1e15), "KiB": ("bytes", 2**10),
    "MiB": ("bytes", 2**20), "GiB": ("bytes", 2**30), "TiB": ("bytes", 2**40),
    "ns": ("seconds", 1e-9), "us": ("seconds", 1e-6), "µs": ("seconds", 1e-6),
    "ms": ("seconds", 1e-3), "s": ("seconds", 1), "min": ("seconds", 60), "h": ("seconds", 3600),
    "": ("a plain number", 1), "%": ("a plain number", 0.01),
}
SPELLED = {"byte": "B", "bytes": "B", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
           "mins": "min", "minute": "min", "minutes": "min", "hour": "h", "hours": "h"}
EXAMPLE = {"bytes": '"50.7 GB" or "47.2 GiB"', "seconds": '"12 ms" or "9.5 min"'}

# a number (thousands may be separated by commas: 1,048,576), then whatever follows
QUANTITY = re.compile(r"\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(\S*)\s*")


def unit_of(text: str) -> str | None:
    """The unit `text` names (case aside: "gb" is GB), or None."""
    text = SPELLED.get(text.lower(), text)
    if text in UNITS:
        return text
    same = [u for u in UNITS if u.lower() == text.lower()]
    return same[0] if len(same) == 1 else None


def wanted(unit: str) -> str:
    """How a verdict names what a check asks for: "a number in GB (or ...)"."""
    if not unit:
        return 'a plain number (such as 0.43, or "43%")'
    name = {"B": "a number of bytes", "s": "a number of seconds"}.get(unit, f"a number in {unit}")
    return f"{name} (or a string with its unit, such as {EXAMPLE[UNITS[unit][0]]})"


def read(answer, unit: str = "") -> float:
    """`answer` as a number in `unit` (a key of UNITS); ValueError with a sentence for the
    reader (naming the unit wanted) when it is not a number, or carries a unit of another kind."""
    if isinstance(answer, bool):
        raise ValueError(f"give {wanted(unit)}, not {answer!r}.")
    if not isinstance(answer, str):
        try:
            return float(answer)
        except (TypeError, ValueError):
            raise ValueError(f"give {wanted(unit)}, not {answer!r}.") from None
    match = QUANTITY.fullmatch(answer)
    if not match or not re.search(r"\d", match.group(1)):
        raise ValueError(f"give {wanted(unit)}, not {answer!r}.")
    if re.match(r",\d", match.group(2)):
        raise ValueError(f"write the decimals after a point ({answer.replace(',', '.')!r}), not a comma.")
    given = unit_of(match.group(2)) if match.group(2) else unit
    if given is None:
        raise ValueError(f"{match.group(2)!r} is not a unit this check knows: give {wanted(unit)}.")
    if UNITS[given][0] != UNITS[unit][0]:
        raise ValueError(f"this is measured in {UNITS[unit][0]}, and {answer!r} is not: give "
                         f"{wanted(unit)}." if unit else
                         f"this is a plain number, without a unit (a percentage is fine), not {answer!r}.")
    return float(match.group(1).replace(",", "")) * UNITS[given][1] / UNITS[unit][1]


def shown(value: float, unit: str = "") -> str:
    """A number as a verdict writes it: whole numbers with thousands separators."""
    text = f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e18 else f"{value:.6g}"
    return f"{text} {unit}" if unit and unit != "%" else text
