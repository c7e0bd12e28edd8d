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

One scenario, one estimate. A cost-model number names the scenario it was computed for
(`SCENARIOS`, `in_scenario`: its `scenario` and the end of its source say which): Table 4's
row 1 under Llama 3's stack is one scenario, row 1 with whole gradients (ZeRO-1) a what-if,
another. A quantity is then one key per scenario: `merge` refuses two keys that state the
same quantity of the same scenario (row 1's exposed DP time as 0.8 s in one chapter and
0.73 s in another), and the prose may state the quantity only through one of its keys.

Facts about Llama 3 say where they come from (`evidence`): the paper reports it, the book
derives it from what the paper reports, or it is an assumption the book makes. The page
marks each such number, and the preface explains the marks.

A cost model's MFU is never stated alone: `predicted` writes it to the whole percent with
its band, the range published runs of the same stack fell in around such predictions
(`costmodel.band`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...plan.costmodel.band import band_note, mfu_band

EVIDENCE = {
    "paper": "reported by the Llama 3 paper",
    "deepseek": "reported by the DeepSeek-V3 technical report (DeepSeek-AI 2024, arXiv 2412.19437)",
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
    # cost-model quantities: one key per scenario
    "dp_exposed_s": r"(?:of )?(?:data-parallel|DP) time (?:left )?exposed|exposed DP time|"
                    r"(?:of )?DP (?:time )?(?:is )?left exposed",
    "dp_bytes_step": r"(?:per GPU and|a GPU per|per) step (?:of|in) (?:DP|data-parallel)|"
                     r"of (?:DP|data-parallel) traffic per (?:GPU and )?step",
}


# The software stacks besides Llama 3's under which the MFU chapter predicts Table 4's row 1
# (a stack added to the cost model for another chapter is not one of them until it says so).
ROW1_STACKS = ("deepspeed", "megatron", "nanotron", "nemo", "torchtitan")

# The scenarios cost-model numbers are computed for: a name, and what it is. A what-if
# (a configuration the book shows on purpose, not the run it reads Llama 3 as) says so.
SCENARIOS = {
    "table4-row1": "Table 4 row 1 (8,192 GPUs, TP8 PP16 DP64, 8K) under Llama 3's stack "
                   "(costmodel.table4('llama3'): ZeRO-2, the paper's stage split, fused kernels)",
    "table4-row2": "Table 4 row 2 (16,384 GPUs, TP8 PP16 DP128, 8K) under Llama 3's stack",
    "table4-row3": "Table 4 row 3 (16,384 GPUs, TP8 CP16 PP16 DP8, 128K) under Llama 3's stack",
    "row1-zero1": "what-if: Table 4 row 1 under Llama 3's stack but with whole fp32 gradients "
                  "(ZeRO-1), which does not fit in an H100",
    "row1-replayed-program": "the cost model given the program of the Llama 3 replay "
                             "(replays.estimated('llama3'): ZeRO-1, the replay's stage split)",
    "row1-no-stack": "what-if: Table 4 row 1 without a named stack (costmodel.estimate's "
                     "defaults, ZeRO-1), for the recomputation comparison",
    "search-8k": "costmodel.best_configs: every layout of 8,192 GPUs at 8K under Llama 3's "
                 "stack that fits the whole HBM",
    "planner": "costmodel.planner.plan: no named stack, 10% of the HBM left free",
    "row1-tp-across-servers": "what-if: Table 4 row 1 under Llama 3's stack with TP's ring "
                              "across servers (one GPU per server)",
    "table4-nic-sweep": "what-if: Table 4 under Llama 3's stack at each NIC bus bandwidth "
                        "(costmodel.table4.nic_sensitivity)",
    "pp-replay-8b": "the cost model given the 8B pipeline replays' layouts (replays.estimated)",
    "deepseek-v3": "DeepSeek-V3's published run under its own stack (python -m minipar.costmodel "
                   "--preset deepseek-v3: H800s, PP16 EP64 DP128 ZeRO-1, 4K tokens, DualPipe priced as zb)",
    "deepseek-v3-hot-expert": "what-if: DeepSeek-V3's published run with one expert of every layer "
                              "at twice the mean load (--moe-imbalance 2)",
    **{f"row1-stack-{fw}": f"what-if: Table 4 row 1 under {fw}'s stack (costmodel.table4('{fw}'))"
       for fw in ROW1_STACKS},
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
    scenario: str = ""           # a key of SCENARIOS, for a cost-model number

    def __post_init__(self):
        if self.evidence is not None and self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r} is not one of {sorted(EVIDENCE)}")
        if self.quantity and self.quantity not in QUANTITIES:
            raise ValueError(f"quantity {self.quantity!r} is not one of {sorted(QUANTITIES)}")
        if self.scenario and self.scenario not in SCENARIOS:
            raise ValueError(f"scenario {self.scenario!r} is not one of {sorted(SCENARIOS)}")

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


def in_scenario(numbers: dict[str, Number], scenario: str, quantities=()) -> dict[str, Number]:
    """`numbers` (cost-model numbers) tagged with the scenario they were computed for: its
    name in `scenario` and at the end of each source; `quantities`, (key, quantity) pairs or
    a dict, names the quantities among them (one key per quantity and scenario, `merge`)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario {scenario!r} is not one of {sorted(SCENARIOS)}")
    quantities = dict(quantities)
    return {k: replace(n, scenario=scenario, quantity=quantities.get(k, n.quantity),
                       source=f"{n.source}; scenario {scenario}: {SCENARIOS[scenario]}")
            for k, n in numbers.items()}


def merge(modules: dict[str, dict[str, Number]]) -> dict[str, Number]:
    """{"module.key": Number} from each module's numbers(). Keys are unique by construction;
    a quantity named by two keys of one scenario is an error that names both."""
    out, owner = {}, {}
    for module, numbers in modules.items():
        for key, number in numbers.items():
            if not isinstance(number, Number):
                raise TypeError(f"{module}.{key} is {type(number).__name__}, not a Number")
            name = f"{module}.{key}"
            which = (number.quantity, number.scenario)
            if number.quantity and which in owner:
                where = f" of scenario {number.scenario!r}" if number.scenario else ""
                raise ValueError(f"{name} and {owner[which]} both state the quantity "
                                 f"{number.quantity!r}{where}: one key per quantity, refer to the first")
            if number.quantity:
                owner[which] = name
            out[name] = number
    return out


def quantity_keys(numbers: dict[str, Number]) -> dict[str, set[str]]:
    """{quantity: the keys that state it, one per scenario}."""
    out: dict[str, set[str]] = {}
    for key, n in numbers.items():
        if n.quantity:
            out.setdefault(n.quantity, set()).add(key)
    return out
