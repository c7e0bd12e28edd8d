"""One source for every number the book states.

Each chapter module defines `numbers() -> {key: Number}`, computed by the package's own
functions (formulas, the cost model, the paper's table); the book's prose shows them with
the `{n}` role (book/_ext/minipar_book.py), as `` {n}`llama3.gpus` ``: the module's name,
a dot, the key. A key the registry lacks fails the build, so two chapters cannot state two
values of one quantity, and a number that changes in the code changes on every page.

Facts about Llama 3 say where they come from (`evidence`): the paper reports it, the book
derives it from what the paper reports, or it is an assumption the book makes. The page
marks each such number, and the preface explains the marks.
"""
from __future__ import annotations

from dataclasses import dataclass

EVIDENCE = {
    "paper": "reported by the Llama 3 paper",
    "derived": "derived by this book from what the paper reports",
    "assumption": "an assumption of this book: the paper does not say",
    "measured": "measured on the hardware: a data sheet, a benchmark run here, nccl-tests or NCCL's own model",
}


@dataclass(frozen=True)
class Number:
    """A number the prose states: its value, how it is written, and where it comes from."""
    value: object
    fmt: str = "{:,}"            # str.format spec: "{:,}" 16,384; "{:.1f}" 38.1; "{:.0%}" 43%
    evidence: str | None = None  # a key of EVIDENCE, for facts about Llama 3
    source: str = ""             # the paper's table or section, or the function that computes it

    def __post_init__(self):
        if self.evidence is not None and self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r} is not one of {sorted(EVIDENCE)}")

    def text(self) -> str:
        return self.fmt.format(self.value)


def paper(value, fmt: str = "{:,}", source: str = "") -> Number:
    """A number the Llama 3 paper reports (say where: "Table 4", "Section 3.3.4")."""
    return Number(value, fmt, "paper", source)


def derived(value, fmt: str = "{:,}", source: str = "") -> Number:
    """A number this book derives from the paper's (say from what)."""
    return Number(value, fmt, "derived", source)


def measured(value, fmt: str = "{:,}", source: str = "") -> Number:
    """A hardware constant of the cost model and the measurement it comes from."""
    return Number(value, fmt, "measured", source)


def assumed(value, fmt: str = "{:,}", source: str = "") -> Number:
    """A number this book assumes where the paper is silent (say why)."""
    return Number(value, fmt, "assumption", source)


def merge(modules: dict[str, dict[str, Number]]) -> dict[str, Number]:
    """{"module.key": Number} from each module's numbers(); keys are unique by construction."""
    out = {}
    for module, numbers in modules.items():
        for key, number in numbers.items():
            if not isinstance(number, Number):
                raise TypeError(f"{module}.{key} is {type(number).__name__}, not a Number")
            out[f"{module}.{key}"] = number
    return out
