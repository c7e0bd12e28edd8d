"""Figures of the data-parallel chapter: overlap, ZeRO's memory and traffic, equal losses.

The timeline of one step (each bucket's all-reduce launched during the backward, waited for
at its end; read from a `--profile` trace by `overlap_from_trace`), what one rank holds under ZeRO-0/1/2/3, the bytes each stage sends per step,
and the loss curves that show every layout trains the same model. Each takes plain numbers
(DataParallel.timeline, memory_bytes, CommLog, train()'s records): the notebook measures,
these only draw.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from ...plan import traces
from ...plan.config import ModelConfig
from ...plan.formulas.data_parallel import bucket_timeline
from ...plan.formulas.memory import zero_bytes_per_param, zero_shards
from ...trainer.model import Transformer
from ...trainer.parallel.data import make_buckets
from .. import replays
from .replayed import plot_replayed
from ..style import COLORS, MEMORY_PARTS, PAGE_WIDTH, formula_marks, stacked_bars


def overlap_from_trace(trace: dict, pid: int = 0, step: int | None = None) -> list:
    """One step of rank `pid` in a `--profile` trace, as `overlap_rows` takes it: the
    forward, backward, backward-end and synced marks, and per data-parallel collective
    ("bucket", in launch order) its launch, completion and the return of the wait that
    found it. Times in seconds from the forward's start. Pure."""
    windows = traces.step_windows(trace, pid)
    a, b = windows[max(windows) if step is None else step]
    inside = lambda cat: [e for e in traces.spans(trace, cat, pid) if a <= e["ts"] <= b]  # noqa: E731
    passes = {k: [e for e in inside("compute") if e["args"].get("kind") == k] for k in "FB"}
    t0 = min(e["ts"] for e in passes["F"])
    sec = lambda t: (t - t0) / 1e6  # noqa: E731
    dp = sorted((e for e in inside("comm") if e["args"]["axis"] == "dp"), key=lambda e: e["ts"])
    waited = {i: w["ts"] + w["dur"] for w in inside("wait") for i in w["args"]["ids"]}
    events = [("forward", None, 0.0),
              ("backward", None, sec(min(e["ts"] for e in passes["B"]))),
              ("backward end", None, sec(max(e["ts"] + e["dur"] for e in passes["B"]))),
              ("synced", None, sec(max(waited.get(e["args"]["id"], e["ts"] + e["dur"])
                                       for e in dp)))]
    for i, e in enumerate(dp):
        events += [("launch", i, sec(e["ts"])), ("complete", i, sec(e["ts"] + e["dur"]))]
        if e["args"]["id"] in waited:
            events.append(("done", i, sec(waited[e["args"]["id"]])))
    return events


def overlap_rows(events):
    """From a DataParallel timeline [(event, bucket, t)] (plus the caller's forward /
    backward / end marks with bucket None): the compute spans and, per bucket, when its
    collective was launched, completed and waited for. Pure; the plot draws what it returns."""
    marks = {e: t for e, i, t in events if i is None}
    buckets: dict[int, dict] = {}
    for e, i, t in events:
        if i is not None:
            buckets.setdefault(i, {})[e] = t
    compute = [("forward", marks["forward"], marks["backward"]),
               ("backward", marks["backward"], marks["backward end"])]
    return compute, dict(sorted(buckets.items())), marks


def plot_overlap_timeline(runs: dict, ax=None):
    """One panel per run: forward and backward on the top row, then each bucket's
    collective as a bar from launch to completion (a tick where the wait returned), and a
    dashed line where every gradient is summed and the optimizer may step.

    runs: {title: events}, events as `overlap_rows` takes them (times in seconds).
    """
    if ax is None:
        _, ax = plt.subplots(len(runs), 1, figsize=(PAGE_WIDTH, 2.4 * len(runs)), sharex=True,
                             squeeze=False)
        ax = ax[:, 0]
    axes = list(ax) if hasattr(ax, "__len__") else [ax]
    for a, (title, events) in zip(axes, runs.items()):
        _draw_overlap(a, title, *overlap_rows(events))
    axes[-1].set_xlabel("time since the forward pass began (s)")
    return axes


def _draw_overlap(a, title: str, compute, buckets: dict, marks: dict):
    """One run's panel of `plot_overlap_timeline`."""
    for name, t0, t1 in compute:
        a.barh(0, t1 - t0, left=t0, height=0.8, color=COLORS[name], edgecolor="black",
               linewidth=0.5, label=name)
    # buckets share rows 1..6 however many there are (naive: one per parameter)
    pitch = 6 / max(len(buckets), 6)
    ys = [1 + k * pitch for k in range(len(buckets))]
    for y, ev in zip(ys, buckets.values()):
        end = ev.get("complete", ev.get("done", ev["launch"]))
        a.barh(y, end - ev["launch"], left=ev["launch"], height=0.8 * pitch,
               color=COLORS["sync"], edgecolor="black" if pitch > 0.5 else "none",
               linewidth=0.5, label="all-reduce, launch to complete" if y == 1 else None)
        if "done" in ev:
            a.plot([ev["done"]] * 2, [y - 0.4 * pitch, y + 0.4 * pitch], color="black",
                   linewidth=1, label="wait returned" if y == 1 else None)
    a.axvline(marks["synced"], color="black", linestyle="--", linewidth=1,
              label="gradients summed")
    a.set_ylim(1 + (len(buckets) - 1) * pitch + 0.5 * max(pitch, 1), -0.5)
    shown = list(zip(ys, buckets)) if len(buckets) <= 12 else \
        [(ys[0], next(iter(buckets))), (ys[-1], list(buckets)[-1])]
    a.set_yticks([0] + [y for y, _ in shown])
    a.set_yticklabels(["compute"] + [f"bucket {i}" for _, i in shown], fontsize=8)
    a.set_title(f"{title}: gradients summed at {marks['synced'] - marks['forward']:.3f} s",
                fontsize=10)
    a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def plot_zero_memory(per_stage: dict, unit: float = 1e6, unit_name: str = "MB",
                     title: str = "", limit: float | None = None, limit_label: str = "",
                     ax=None):
    """Stacked bars of what one rank holds, per ZeRO stage: {stage: {params, grads,
    optimizer}} in bytes. `limit` draws a horizontal line (e.g. a GPU's memory)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    stages = list(per_stage)
    totals = stacked_bars(ax, {part: [per_stage[s][part] / unit for s in stages]
                               for part in MEMORY_PARTS}, edgecolor="black", linewidth=0.5)
    for x, total in enumerate(totals):
        ax.text(x, total, f"{total:,.0f}" if total >= 100 else f"{total:.3g}", ha="center",
                va="bottom", fontsize=8)
    top = max(totals)
    if limit is not None:
        ax.axhline(limit / unit, color="red", linestyle="--", linewidth=1,
                   label=limit_label or None)
        top = max(top, limit / unit)
    ax.set_xticks(range(len(stages)))
    ax.set_xticklabels([f"ZeRO-{s}" if isinstance(s, int) else str(s) for s in stages])
    ax.set_ylabel(f"per rank ({unit_name})")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=8)
    return ax


def plot_comm_per_stage(comm_by_run: dict, grad_bytes: int, formulas: dict | None = None,
                        ax=None):
    """Data-parallel bytes sent per rank and step, by op, over the gradient bytes G:
    {label: {op: wire_bytes}}; `formulas` {label: value} marks the expected multiple of G."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    labels = list(comm_by_run)
    per_op = {op: [comm_by_run[k].get(op, 0) / grad_bytes for k in labels]
              for op in ("all_reduce", "reduce_scatter", "all_gather")}
    stacked_bars(ax, {op: v for op, v in per_op.items() if any(v)},
                 labels={op: op.replace("_", "-") for op in per_op},
                 edgecolor="black", linewidth=0.5)
    formula_marks(ax, {x: formulas[k] for x, k in enumerate(labels) if k in (formulas or {})})
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([k.replace(", ", "\n") for k in labels], fontsize=8)
    ax.set_ylabel("bytes sent per rank / G")
    ax.set_title("data-parallel traffic per step (G = gradient bytes)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_loss_curves(curves: dict, reference: str, ax=None):
    """Loss per step of several layouts over the reference's; the reference is drawn wide
    underneath so that coinciding curves are visible as coinciding."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    ref = curves[reference]
    ax.plot(range(len(ref)), ref, color="lightgrey", linewidth=6, label=reference, zorder=1)
    markers = "os^vD<>p*h"
    for k, (label, losses) in enumerate((l, c) for l, c in curves.items() if l != reference):
        ax.plot(range(len(losses)), losses, marker=markers[k % len(markers)], markersize=4,
                linewidth=1, label=label, zorder=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return ax


def plot_zero_shards(n: int = 4, param: float = 2, grad: float = 2, optimizer: float = 12):
    """What each rank holds under ZeRO-0..3, from `formulas.zero_shards` and
    `zero_bytes_per_param`: one panel per stage, one row per rank, each part a bar as long
    as its bytes per parameter; a sharded part is cut in n pieces and rank r keeps the r-th
    (solid), the rest it does not hold (hatched outline). Two stages per row."""
    fig, axes = plt.subplots(2, 2, figsize=(PAGE_WIDTH, 2 * (0.8 + 0.3 * n)), sharey=True)
    for stage, a in enumerate(axes.flat):
        shards = zero_shards(stage, n)
        held = zero_bytes_per_param(stage, n, param, grad, optimizer)
        full = {"params": param, "grads": grad, "optimizer": optimizer}
        for r in range(n):
            left = 0.0
            for part in MEMORY_PARTS:
                width, k = full[part], shards[part]
                a.add_patch(Rectangle((left, r + 0.1), width, 0.8, fill=False, hatch="///",
                                      edgecolor=COLORS[part], linewidth=0.5))
                piece = width / k
                start = left + (r % k) * piece if k > 1 else left
                a.add_patch(Rectangle((start, r + 0.1), piece, 0.8, color=COLORS[part],
                                      label=part if (r == 0 and stage == 0) else None))
                left += width
        total = sum(held.values())
        a.set_title(f"ZeRO-{stage}: {total:.3g} bytes/param per rank", fontsize=8)
        a.set_xlim(0, param + grad + optimizer)
        a.set_ylim(n, 0)
        a.set_yticks([r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=8)
        a.set_xlabel("bytes per parameter" if stage >= 2 else "", fontsize=8)
    fig.legend(loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 1.06),
               frameon=False)
    fig.tight_layout()
    return fig


def model_buckets(model: ModelConfig, bucket_mb: float) -> list[tuple[int, int]]:
    """(bytes, parameters before it is complete) of each bucket `make_buckets` gives the
    float32 `model`, in backward order. Built on the meta device: shapes, no memory."""
    with torch.device("meta"):
        params = list(Transformer(model, seed=None).parameters())
    out, done = [], 0
    for bucket in make_buckets(params, bucket_mb):
        done += sum(p.numel() for p in bucket)
        out.append((sum(p.numel() * p.element_size() for p in bucket), done))
    return out


def plot_bucket_overlap(model: str = "tiny", n: int = 8, bucket_mbs=(0, 0.25),
                        backward_s: float = 0.02, alpha: float = 20e-6,
                        bandwidth: float = 1e9, ax=None):
    """Modelled, not measured: one step's backward (gradients produced at a constant rate
    per parameter, last layer first) and each bucket's all-reduce on one link
    (`formulas.bucket_timeline`), for each bucket size (0: naive, every parameter its own
    all-reduce, all after the backward). The dashed line: every gradient summed."""
    cfg = ModelConfig.preset(model)
    if ax is None:
        _, ax = plt.subplots(len(bucket_mbs), 1, figsize=(PAGE_WIDTH, 1.6 * len(bucket_mbs) + 0.6),
                             sharex=True, squeeze=False)
        ax = ax[:, 0]
    for a, mb in zip(ax, bucket_mbs):
        buckets = model_buckets(cfg, mb)
        total = buckets[-1][1]
        ready = [backward_s * (done / total if mb else 1.0) for _, done in buckets]
        spans = bucket_timeline([b for b, _ in buckets], ready, n, alpha, bandwidth)
        a.barh(0, backward_s, color=COLORS["backward"], edgecolor="black", linewidth=0.5,
               label="backward")
        for i, (t0, t1) in enumerate(spans):
            a.barh(1, t1 - t0, left=t0, color=COLORS["sync"],
                   edgecolor="black" if len(spans) < 30 else "none", linewidth=0.5,
                   label="all-reduce" if i == 0 else None)
        end = spans[-1][1]
        a.axvline(end, color="black", linestyle="--", linewidth=1)
        name = "naive: one all-reduce per parameter" if mb == 0 else f"{mb:g} MB buckets"
        a.set_title(f"{name}: {len(spans)} all-reduces, gradients summed at "
                    f"{end * 1e3:.1f} ms (backward ends at {backward_s * 1e3:.0f} ms)", fontsize=9)
        a.set_yticks([0, 1], ["compute", "link"], fontsize=8)
        a.set_ylim(1.6, -0.6)
    ax[0].legend(fontsize=8, loc="upper right")
    ax[-1].set_xlabel("seconds into the backward pass (model: alpha-beta, one link)")
    return ax


# ------------------------------------------------------------------ at H100 speed
def plot_replayed_dp():
    """Bucketed and naive DP, recorded on two gloo ranks and replayed at Llama 3 8B's shapes
    on H100s (`teach.replays`): rank 0's compute and its DP communication, hidden or
    exposed. The buckets ride under the backward; the naive all-reduces all wait for it."""
    return plot_replayed({"bucketed": replays.replayed("data_parallel"),
                          "naive (--bucket-mb 0)": replays.replayed("data_parallel_naive")}, "dp")
