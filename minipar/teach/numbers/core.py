"""One source for every number the book states.

Each chapter module defines `numbers() -> {key: Number}`, computed by the package's own
functions (formulas, the cost model, the paper's table); the book's prose shows them with
the `{n}` role (book/_ext/minipar_book.py), as `` {n}`llama3.gpus` ``: the module's name,
a dot, the key. A key the registry lacks fails the build, and a number that changes in the
code changes on every page.

One quantity, one key. A key is one value, but two keys could still state one quantity
(16 bytes per parameter in one chapter, 18 in another). A number that more than one
chapter speaks of names its quantity (`QUANTITIES`); `merge` refuses a second key for it,
and tests/test_book.py reads every chapter for the quantity's words next to a number that
is not its key.

Facts about Llama 3 say where they come from (`evidence`): the paper reports it, the book
derives it from what the paper reports, or it is an assumption the book makes. The page
marks each such number, and the preface explains the marks.

A cost model's MFU is never stated alone: `predicted` writes it to the whole percent with
its band, the range published runs of the same stack fell in around such predictions
(`costmodel.band`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan.costmodel.band import band_note, mfu_band

EVIDENCE = {
    "paper": "reported by the Llama 3 paper",
    "derived": "derived by this book from what the paper reports",
    "assumption": "an assumption of this book: the paper does not say",
    "measured": "measured on the hardware: a data sheet, a benchmark run here, nccl-tests or NCCL's own model",
}


# The quantities more than one chapter states, and the words that state them in prose
# (a regular expression, matched after a number in the same sentence).
QUANTITIES = {
    "state_bytes_per_param": r"bytes of (?:model )?state (?:per|for every|a) param",
    "state_tb": r"(?:TB )?of model state",
    "seq_activations": r"(?:for|over) (?:the whole stack|all (?:its )?layers)",
    "tp_layer_network": r"on (?:a|the) network link|over (?:the network|RoCE)",
    "llama3_virtual_stages": r"chunks per rank",
}


@dataclass(frozen=True)
class Number:
    """A number the prose states: its value, how it is written, and where it comes from."""
    value: object
    fmt: str = "{:,}"            # str.format spec: "{:,}" 16,384; "{:.1f}" 38.1; "{:.0%}" 43%
    evidence: str | None = None  # a key of EVIDENCE, for facts about Llama 3
    source: str = ""             # the paper's table or section, or the function that computes it
    quantity: str = ""           # a key of QUANTITIES when other chapters state it too
    recorded: bool = False       # read off a replay of a recorded run: its last digit varies
    #                              between recordings, so it may meet another number by chance

    def __post_init__(self):
        if self.evidence is not None and self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r} is not one of {sorted(EVIDENCE)}")
        if self.quantity and self.quantity not in QUANTITIES:
            raise ValueError(f"quantity {self.quantity!r} is not one of {sorted(QUANTITIES)}")

    def text(self) -> str:
        return self.fmt.format(self.value)


@dataclass(frozen=True)
class Predicted(Number):
    """A cost-model MFU with its band: the prediction to the whole percent and the range
    published runs of the same stack fell in around such predictions, "68% (63 to 73%)".
    `value` stays the predicted MFU (a fraction), as any other Number's; `low` and `high` are
    the band's ends (`costmodel.band.mfu_band`)."""
    low: float = 0.0
    high: float = 0.0

    def text(self) -> str:
        return f"{self.fmt.format(self.value)} ({100 * self.low:.0f} to {self.high:.0%})"


def predicted(mfu: float, framework: str | None, source: str,
              evidence: str | None = None) -> Predicted:
    """A cost model's predicted MFU, never stated without its band: `framework` is the stack
    the estimate ran under (None: the default Llama 3 efficiency, no framework; the band is
    then every evaluation row's), `source` the function that predicted it."""
    low, high = mfu_band(mfu, framework)
    return Predicted(mfu, "{:.0%}", evidence, f"{source}; band: {band_note(framework)}",
                     low=low, high=high)


def paper(value, fmt: str = "{:,}", source: str = "", quantity: str = "") -> Number:
    """A number the Llama 3 paper reports (say where: "Table 4", "Section 3.3.4")."""
    return Number(value, fmt, "paper", source, quantity)


def derived(value, fmt: str = "{:,}", source: str = "", quantity: str = "") -> Number:
    """A number this book derives from the paper's (say from what)."""
    return Number(value, fmt, "derived", source, quantity)


def measured(value, fmt: str = "{:,}", source: str = "", quantity: str = "") -> Number:
    """A hardware constant of the cost model and the measurement it comes from."""
    return Number(value, fmt, "measured", source, quantity)


def assumed(value, fmt: str = "{:,}", source: str = "", quantity: str = "") -> Number:
    """A number this book assumes where the paper is silent (say why)."""
    return Number(value, fmt, "assumption", source, quantity)


def two_digits(x: float) -> float:
    """`x` rounded to two significant digits (write it with "{:g}"): what a replay states,
    whose split of a layer over its collectives follows the CPU's timing and varies by a few
    percent from run to run."""
    return float(f"{x:.2g}")


def from_replay(value, fmt: str, source: str) -> Number:
    """A number read off a replay of a recorded run (`teach.replays`), derived: `recorded`."""
    return Number(value, fmt, "derived", source, recorded=True)


def replayed_ms(seconds: float, source: str) -> Number:
    """A replayed time in ms, two significant digits (`two_digits`), from a replay."""
    return from_replay(two_digits(seconds * 1e3), "{:,g} ms", source)


def merge(modules: dict[str, dict[str, Number]]) -> dict[str, Number]:
    """{"module.key": Number} from each module's numbers(). Keys are unique by construction;
    a quantity named by two keys is an error that names both."""
    out, owner = {}, {}
    for module, numbers in modules.items():
        for key, number in numbers.items():
            if not isinstance(number, Number):
                raise TypeError(f"{module}.{key} is {type(number).__name__}, not a Number")
            name = f"{module}.{key}"
            if number.quantity in owner:
                raise ValueError(f"{name} and {owner[number.quantity]} both state the quantity "
                                 f"{number.quantity!r}: one key per quantity, refer to the first")
            if number.quantity:
                owner[number.quantity] = name
            out[name] = number
    return out


def quantity_keys(numbers: dict[str, Number]) -> dict[str, str]:
    """{quantity: the one key that states it}."""
    return {n.quantity: key for key, n in numbers.items() if n.quantity}
