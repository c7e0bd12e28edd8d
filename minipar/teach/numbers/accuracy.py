"""The numbers of Chapter "How good is the cost model" (the appendix, book/accuracy.md),
computed once.

Everything here is `python -m minipar.costmodel.evaluate`'s: every row of both evaluation
sets (Llama 3's Table 4 and the Ultra-Scale Playbook's, `published_runs.csv`; NVIDIA's NeMo
recipes, `nemo_recipes.csv`) predicted under its own stack, its error in MFU points
(predicted minus published, in minipar's FLOP count), each source's summary, the heatmap's
other cells, the layouts' order, and the memory model beside every published peak. Nothing
is fitted: the constants are the hardware's (`costmodel.constants`). The 4D and MFU chapters
state each source's errors (`src_*`) before their first prediction.
"""
from __future__ import annotations

from functools import cache

from ...plan.costmodel.calibration import (MFU_FLOOR, PLAYBOOK_MODELS, flop_count_agreement,
                                           heatmap_cells, held_out_runs, nemo_runs,
                                           playbook_flops_ratio, playbook_mfu_ratios,
                                           playbook_runs)
from ...plan.costmodel.evaluate import (BIAS_TARGET, MEAN_TARGET, WORST_TARGET, by_source,
                                        evaluated_runs, layout_order, memory_bound,
                                        memory_comparison, memory_summary, order_kept,
                                        residuals, summary)
from ...plan.flops import flops_per_token
from .core import Number, derived

_EVAL = "python -m minipar.costmodel.evaluate"
_HELD = "evaluate.residuals of calibration.held_out_runs()"
# The evaluation's sources (`PublishedRun.source`), by the short name their keys use.
SOURCES = {"llama3-paper-table4": "table4", "ultrascale-playbook-heatmap": "playbook",
           "nvidia-dgxc-benchmarking": "nemo"}
# The memory figures' sources (`evaluate.memory_summary`), by the short name their keys use
# (pairs: the heatmap is a source of both tables).
MEMORY_SOURCES = (("ultrascale-playbook-heatmap", "heatmap"), ("torchtitan-performance", "titan"),
                  ("torchtitan-performance (float8)", "titan_fp8"), ("playbook-bench-allocated", "allocated"))
NEAR = 4.0                  # MFU points: "within four points", the per-row reading


@cache
def evaluation() -> tuple[list, list[float]]:
    """(every evaluated run, its error in points): Table 4 and the Playbook's, then NeMo's."""
    runs = evaluated_runs()
    return runs, residuals(runs)


def numbers() -> dict[str, Number]:
    return {**_rows(), **_sources(), **_worst(), **_flop_count(), **_same_layout_gap(),
            **_held_out(), **_layout_order(), **_memory()}


def _layout(run) -> str:
    pc = run.parallel
    return " ".join(f"{a.upper()}{getattr(pc, a)}" for a in ("tp", "cp", "pp", "dp") if getattr(pc, a) > 1)


def run_name(run) -> str:
    """How the book names a published run: model, GPUs, layout, a long sequence."""
    name = "Llama 3 405B" if run.source.startswith("llama3") else run.model.name
    seq = f", {run.work.seq_len // 1024}K" if run.work.seq_len > 8192 else ""
    return f"{name}, {run.parallel.world_size:,} GPUs, {_layout(run)}{seq}"


def _rows() -> dict[str, Number]:
    """Every evaluation row (1 to 27, in `evaluated_runs`' order): name, stack, MFU as
    published and in minipar's count, predicted, error; and the row's model, GPUs and DP."""
    runs, res = evaluation()
    src, csv = _EVAL, "published_runs.csv / nemo_recipes.csv"
    out = {}
    for i, (run, r) in enumerate(zip(runs, res), 1):
        out.update({f"run_{i}": Number(run_name(run), "{}", source=csv),
                    f"fw_{i}": Number(run.framework, "{}", source=csv),
                    f"gpus_{i}": Number(run.parallel.world_size, source=csv),
                    f"model_{i}": Number(run.model.name, "{}", source=csv),
                    f"dp_{i}": Number(run.parallel.dp, source=csv),
                    f"pub_{i}": Number(100 * run.printed_mfu, "{:.1f}", source=csv),
                    f"ours_{i}": Number(100 * run.mfu, "{:.1f}", source=csv + " in minipar's FLOP count"),
                    f"pred_{i}": Number(100 * run.mfu + r, "{:.1f}", source=src),
                    f"res_{i}": Number(r, "{:+.1f}", source=src)})
    kept = [r for run, r in zip(runs, res) if not memory_bound(run)]
    out.update({"n_rows": Number(len(runs), source=src),
                "n_kept": Number(len(kept), source=src + ": the rows not memory-bound"),
                "n_nemo": Number(len(nemo_runs()), source="data/nemo_recipes.csv, calibration.nemo_runs"),
                "near": Number(NEAR, "{:g}", source="the reading of a row as close"),
                "n_near": Number(sum(abs(r) <= NEAR for r in kept), source=src),
                "n_over": Number(sum(r > 0 for r in kept), source=src + ": predicted above published"),
                "mean_target": Number(MEAN_TARGET, "{:g}", source="issue 39's target"),
                "bias_target": Number(BIAS_TARGET, "{:g}", source="issue 39's target"),
                "worst_target": Number(WORST_TARGET, "{:g}", source="issue 39's target")})
    return out


def _summary_numbers(prefix: str, s: dict, src: str) -> dict[str, Number]:
    return {f"{prefix}_rows": Number(s["rows_not_memory_bound"], source=src),
            f"{prefix}_mean": Number(s["mean_abs_error"], "{:.1f}", source=src),
            f"{prefix}_bias": Number(s["mean_signed_error"], "{:+.1f}", source=src),
            f"{prefix}_worst": Number(s["worst_abs_error_not_memory_bound"], "{:.1f}", source=src)}


def _sources() -> dict[str, Number]:
    """Each source's summary and all of them together (`evaluate.summary`, `by_source`),
    over the rows that are not memory-bound; whether the targets hold."""
    runs, res = evaluation()
    src = _EVAL + ": evaluation()['sources']"
    out = {}
    for source, s in by_source(runs, res).items():
        out.update(_summary_numbers("src_" + SOURCES.get(source, source.split("-")[0]), s, src))
    s = summary(runs, res)
    out.update(_summary_numbers("all", s, _EVAL + ": evaluation()['summary']"))
    out["all_worst_with_mb"] = Number(s["worst_abs_error"], "{:.1f}", source=_EVAL + ", the memory-bound row too")
    out["targets"] = Number(targets_verdict(s), "{}", source=_EVAL)
    return out


def targets_verdict(s: dict) -> str:
    """Which of the evaluation's three targets a summary meets, in words."""
    held = {"the mean": s["mean_abs_error"] <= MEAN_TARGET,
            "the bias": abs(s["mean_signed_error"]) <= BIAS_TARGET,
            "the worst row": s["worst_abs_error_not_memory_bound"] <= WORST_TARGET}
    met, missed = [k for k, v in held.items() if v], [k for k, v in held.items() if not v]
    if not missed:
        return "all three hold"
    if not met:
        return "none holds"
    verb = "hold" if len(met) > 1 else "holds"
    return f"{' and '.join(met)} {verb}, {' and '.join(missed)} {'do' if len(missed) > 1 else 'does'} not"


def _worst() -> dict[str, Number]:
    """The three rows the targets count that the model misses most, worst first."""
    runs, res = evaluation()
    kept = [(run, r) for run, r in zip(runs, res) if not memory_bound(run)]
    out = {}
    for k, (run, r) in enumerate(sorted(kept, key=lambda t: -abs(t[1]))[:3], 1):
        out[f"worst_{k}"] = Number(run_name(run), "{}", source=_EVAL)
        out[f"worst_{k}_res"] = Number(r, "{:+.1f}", source=_EVAL)
    return out


def published_step_seconds(run) -> float:
    """A published run's step time, read back from its MFU (in minipar's FLOP count)."""
    tokens = run.work.global_batch * run.work.seq_len
    return tokens * flops_per_token(run.model, run.work.seq_len) / (
        run.parallel.world_size * run.mfu * run.cluster.peak_flops)


def _same_layout_gap() -> dict[str, Number]:
    """The 80B model's PP16 x TP4 replica, alone on 64 GPUs and four of them on 256: the
    published seconds per pipeline slot (m + p - 1 of them per step) of each."""
    runs = [r for r in playbook_evaluated() if r.model.name == "80B" and r.parallel.pp == 16]
    alone, four = sorted(runs, key=lambda r: r.parallel.dp)
    slot = [published_step_seconds(r) / (r.parallel.microbatches + r.parallel.pp - 1) for r in (alone, four)]
    src = "published_runs.csv: published step / (m + p - 1)"
    return {"slot_80b_alone_s": Number(slot[0], "{:.3f} s", source=src),
            "slot_80b_four_s": Number(slot[1], "{:.3f} s", source=src),
            "slot_80b_slower": Number(slot[0] / slot[1] - 1, "{:.0%}", source=src)}


def playbook_evaluated() -> list:
    """The Playbook's rows of the evaluation."""
    return [r for r in evaluation()[0] if r.source == "ultrascale-playbook-heatmap"]


def _flop_count() -> dict[str, Number]:
    """How the Playbook's printed MFU compares with minipar's count over all its runs."""
    src = "data/playbook_runs.csv: printed MFU over tokens/s x flops_per_token / 989.5 TFLOP/s"
    tol = 0.02
    return {"conv_runs": Number(len(playbook_mfu_ratios()), source=src),
            "conv_tol": Number(tol, "{:.0%}", source="the agreement asked for"),
            "conv_floor": Number(MFU_FLOOR, "{:.0%}", source="calibration.playbook_mfu_ratios' floor"),
            "conv_within": derived(flop_count_agreement(tol), "{:.0%}", source=src),
            "conv_plain": derived(flop_count_agreement(tol, corrected=False), "{:.0%}", source=src),
            "conv_134_pp2": derived(playbook_flops_ratio(PLAYBOOK_MODELS["1.34B"], 2, 4096),
                                    "{:.2f}", source="calibration.playbook_flops_ratio")}


def _layout_order() -> dict[str, Number]:
    """The Playbook figure's layouts, ranked per model and cluster size by the model."""
    order = layout_order(playbook_runs())
    src = "evaluate.layout_order over calibration.playbook_runs()"
    return {"lo_runs": Number(order["runs"], source=src),
            "lo_groups": Number(order["groups"], source=src),
            "lo_pairs": Number(order["pairs_in_order"], "{:.0%}", source=src),
            "lo_best": Number(order["first_pick_best"], source=src),
            "lo_half": Number(order["first_pick_below_half"], source=src)}


def _held_out() -> dict[str, Number]:
    """The heatmap's cells the evaluation file does not hold: how far off, and in what order;
    and the memory the 80B on 32 GPUs printed beside the cell that printed the most."""
    held = held_out_runs()
    err = residuals(held)
    src = "playbook_heatmap.csv (nanotron's docs/benchmark_summary.svg)"
    cells = {(r.model.name, r.parallel.world_size): (r, gb) for r, gb in heatmap_cells()}
    top = max(cells, key=lambda k: cells[k][1])
    return {"n_held": Number(len(held), source=src),
            "n_cells": Number(len(cells), source=src),
            "held_mean": Number(sum(map(abs, err)) / len(err), "{:.1f}", source=_HELD),
            "held_worst": Number(max(map(abs, err)), "{:.1f}", source=_HELD),
            "held_order": Number(order_kept(held, err), "{:.0%}", source=_HELD + ", evaluate.order_kept"),
            "mem_80b_32": Number(cells[("80B", 32)][1], "{:.1f} GiB", source=src),
            "mem_top": Number(cells[top][1], "{:.1f} GiB", source=src),
            "mem_top_run": Number(f"{top[0]} on {top[1]} GPUs", "{}", source=src),
            "mem_top_mfu": Number(100 * cells[top][0].mfu, "{:.1f}", source=src)}


@cache
def memory_rows() -> tuple[dict, ...]:
    """Every published peak-memory figure beside the model's (`evaluate.memory_comparison`)."""
    return tuple(memory_comparison())


def _memory() -> dict[str, Number]:
    """The memory model beside every published peak (`evaluate.memory_summary`), per source:
    rows, the mean signed and the worst error in GB (predicted - published)."""
    src = _EVAL + ": memory_report"
    out = {"mem_rows": Number(len(memory_rows()), source=src)}
    for source, s in memory_summary(list(memory_rows())).items():
        name = dict(MEMORY_SOURCES).get(source, source.split("-")[0])
        out.update({f"mem_{name}_rows": Number(s["rows"], source=src),
                    f"mem_{name}_bias": Number(s["mean_signed_error_gb"], "{:+.1f} GB", source=src),
                    f"mem_{name}_worst": Number(s["worst_error_gb"], "{:+.1f} GB", source=src)})
    return out
