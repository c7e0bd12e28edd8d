"""Figures of the chapter "Memory: where every byte goes".

Each draws from plain numbers: bytes measured by the trainer (`--log-json`'s `memory`),
bytes predicted by `minipar.plan.costmodel.memory`, elements per token from `minipar.plan.formulas`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.formulas.memory import layer_saved_breakdown
from ...plan.formulas.memory import in_flight_chunks
from ...plan.memory import BF16_MIXED, FP32
from ..numbers.memory import budgets
from ..style import BLUE, COLORS, GREEN, ORANGE, PAGE_WIDTH, PURPLE, lighter, stacked_bars

PARTS = ("params", "grads", "optimizer", "activations")
LAYER_PART_COLORS = {"norms": BLUE, "attention": ORANGE, "mlp": GREEN, "input": PURPLE}
GIB = 2**30


def plot_layer_breakdown(breakdowns: dict, ax=None, unit: str = "elements per token"):
    """What one layer keeps, by part, for each of `breakdowns` ({label: {part: value}},
    e.g. one per recompute mode): horizontal stacked bars, totals at their ends."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 * len(breakdowns) + 1.4))
    labels = list(breakdowns)
    seen = set()
    for y, label in enumerate(labels):
        left = 0.0
        for part, value in breakdowns[label].items():
            ax.barh(y, value, left=left, color=LAYER_PART_COLORS[part],
                    label=None if part in seen else part)
            seen.add(part)
            left += value
        ax.text(left, y, f" {left:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("what one transformer layer keeps for the backward", fontsize=10)
    return ax


def plot_measured_vs_predicted(rows: list[tuple[str, dict, dict]], ax=None):
    """For each (label, measured, predicted) — dicts of bytes by part — two stacked bars
    side by side: measured (solid) and predicted (pale). Bytes in MB."""
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.8))
    n = len(rows)
    for offset, which, amount in ((-0.2, 1, 0.0), (0.2, 2, 0.45)):
        bottom = [0.0] * n
        for part in PARTS:
            values = [r[which][part] / 1e6 for r in rows]
            label = f"{part} ({'measured' if which == 1 else 'predicted'})" if part == "activations" or which == 1 else None
            ax.bar([i + offset for i in range(n)], values, width=0.38, bottom=bottom,
                   color=lighter(COLORS[part], amount), label=label,
                   edgecolor="black" if which == 2 else None, linewidth=0.3)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(n))
    ax.set_xticklabels([r[0] for r in rows], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("MB on the fullest rank")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("measured (left bar) vs predicted (right bar), tiny, fp32", fontsize=9)
    return ax


def plot_recompute_tradeoff(results: dict, axes=None):
    """What recomputation buys and costs. `results`: {mode: {"activations": bytes,
    "step_time_s": seconds, "flops": relative FLOPs per step}}."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3))
    modes = list(results)
    a, b = axes
    a.bar(modes, [results[m]["activations"] / 1e6 for m in modes], color=COLORS["activations"])
    a.set_ylabel("peak activations, MB")
    a.set_title("bytes kept (measured)", fontsize=10)
    base = results[modes[0]]["step_time_s"]
    b.bar(modes, [results[m]["step_time_s"] / base for m in modes], color=COLORS["compute"],
          label="step time (measured)")
    b.plot(modes, [results[m]["flops"] for m in modes], "k_", markersize=30, mew=2,
           label="FLOPs (formula)")
    b.set_ylabel(f"relative to {modes[0]}")
    b.set_title("time paid", fontsize=10)
    b.legend(fontsize=7, loc="lower right")
    return axes


def plot_table4_budget(budgets: dict, hbm_gib: float = 80.0, ax=None):
    """Bytes per GPU of each `budgets` entry ({label: {part: GB}}), stacked, against the
    H100's HBM: 80 GiB (dashed) = 85.9 GB, labelled in the right margin, clear of the bars'
    totals."""
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.7, 3.6))
    labels = list(budgets)
    totals = stacked_bars(ax, {p: [budgets[k][p] for k in labels] for p in PARTS})
    for i, total in enumerate(totals):      # inside the bar's top: clear of the HBM line
        ax.text(i, total - 1.5, f"{total:.1f}", ha="center", va="top", fontsize=8,
                color="white", weight="bold", zorder=3,
                bbox=dict(facecolor=COLORS["activations"], edgecolor="none", pad=1))
    hbm_gb = hbm_gib * GIB / 1e9
    ax.axhline(hbm_gb, ls="--", color="black", lw=1)
    ax.text(1.01, hbm_gb, f"H100:\n{hbm_gib:g} GiB\n= {hbm_gb:.1f} GB", va="center",
            fontsize=7.5, transform=ax.get_yaxis_transform())
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("GB per GPU (fullest)")
    ax.set_ylim(0, max(max(totals), hbm_gb) * 1.18)
    ax.legend(fontsize=7, loc="upper left", ncol=4)
    ax.set_title("Llama 3 405B, Table 4 layouts: the most loaded GPU", fontsize=9)
    return ax


# ------------------------------------------------------------------ on the chapter's page
WHO = {"params": "TP, PP split them; ZeRO-3 shards", "grads": "ZeRO-2 shards them",
       "optimizer": "ZeRO-1 shards it", "activations": "batch, s, TP+SP, CP, schedule, recompute"}


def plot_four_parts(row: int = 0, zero: int = 2):
    """The four parts of the fullest GPU of one Table 4 row (the cost model's bf16 count),
    one bar each, with what decides its size."""
    entry = budgets()[row]
    parts = entry[zero]
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    for y, part in enumerate(PARTS):
        gb = parts[part] / 1e9
        ax.barh(y, gb, color=COLORS[part])
        ax.text(gb + 0.8, y, f"{gb:.1f} GB   ({WHO[part]})", va="center", fontsize=8)
    ax.set_yticks(range(len(PARTS)))
    ax.set_yticklabels(["parameters", "gradients", "optimizer state", "activations"])
    ax.invert_yaxis()
    ax.set_xlim(0, max(parts[p] for p in PARTS) / 1e9 * 2.3)
    ax.set_xlabel("GB on the fullest GPU (cost model, bf16 mixed precision)")
    r = entry["row"]
    ax.set_title(f"Llama 3 405B, Table 4 row {row + 1} (TP{r.tp} CP{r.cp} PP{r.pp} DP{r.dp}), "
                 f"pipeline rank {entry['stage']}, ZeRO-{zero}: {parts['total'] / 1e9:.1f} GB",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_in_flight(pp: int = 4, microbatches: int = 8, virtual_stages: int = 2):
    """Micro-batches whose activations each pipeline rank holds at its peak, by schedule
    (`formulas.in_flight_chunks`, summed over the rank's chunks; interleaved counts
    chunk-forwards, each 1/v of a stage)."""
    schedules = {"afab": 1, "1f1b": 1, "zb": 1, "interleaved": virtual_stages}
    fig, ax = plt.subplots(figsize=(6.5, 3))
    width = 0.8 / len(schedules)
    for i, (name, v) in enumerate(schedules.items()):
        counts = [sum(in_flight_chunks(name, pp, microbatches, r, v)) / v for r in range(pp)]
        ax.bar([r + (i - 1.5) * width for r in range(pp)], counts, width, label=name,
               color=COLORS.get({"afab": "contiguous", "1f1b": "F", "zb": "W",
                                 "interleaved": "B"}[name]))
    ax.set_xticks(range(pp))
    ax.set_xticklabels([f"rank {r}" for r in range(pp)])
    ax.set_ylabel("micro-batches in flight\n(stage-equivalents)")
    ax.set_title(f"activations held at the peak: p={pp}, m={microbatches}, "
                 f"interleaved v={virtual_stages}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def layer_breakdown_figure(model: str = "tiny", modes=("none", "selective", "full")):
    """`plot_layer_breakdown` of one preset's layer, for each recompute mode of `modes`."""
    cfg = ModelConfig.preset(model)
    ax = plot_layer_breakdown({f"{model}, {m}": layer_saved_breakdown(cfg, recompute=m)
                               for m in modes})
    ax.figure.tight_layout()
    return ax.figure


def table4_budget_figure():
    """`plot_table4_budget` of the three Table 4 rows, gradients whole and sharded."""
    data = {}
    for i, entry in enumerate(budgets(), 1):
        r = entry["row"]
        for zero in (1, 2):
            data[f"row {i}\nCP{r.cp} DP{r.dp}\nZeRO-{zero}"] = {
                p: entry[zero][p] / 1e9 for p in PARTS}
    ax = plot_table4_budget(data)
    ax.figure.tight_layout()
    return ax.figure


def plot_precision_bytes():
    """Bytes per parameter of the model state, by part: minipar on a CPU (fp32, Adam) and
    Llama 3's mixed precision (bf16 weights, fp32 gradients, fp32 master weights + m + v)."""
    rows = {"fp32 (minipar on CPU)": FP32, "bf16 mixed (Llama 3)": BF16_MIXED}
    fig, ax = plt.subplots(figsize=(7, 2.2))
    for y, (label, p) in enumerate(rows.items()):
        left = 0
        pieces = [("params", p.param_bytes, "weights"), ("grads", p.grad_bytes, "grads")]
        if p.optimizer_bytes > 8:
            pieces.append(("optimizer", p.optimizer_bytes - 8, "master"))
        pieces += [("optimizer", 4, "m"), ("optimizer", 4, "v")]
        for part, nbytes, name in pieces:
            ax.barh(y, nbytes, left=left, color=COLORS[part], edgecolor="white")
            ax.text(left + nbytes / 2, y, f"{name}\n{nbytes}", ha="center", va="center",
                    fontsize=7, color="white")
            left += nbytes
        ax.text(left + 0.2, y, f"{left} bytes", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows))
    ax.invert_yaxis()
    ax.set_xlim(0, 22)
    ax.set_xlabel("bytes per parameter (before any sharding)")
    fig.tight_layout()
    return fig
