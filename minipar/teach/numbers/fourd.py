"""The numbers the fourd chapter states (book/fourd.md), computed once.

The evaluation's errors are `python -m minipar.costmodel.evaluate`'s (nothing is fitted:
the constants are the hardware's, `costmodel.constants`). The rules' numbers are
`costmodel.rules`' and the worked examples the planner's. Table 4's rows as the cost model
predicts them are `numbers.mfu`'s, the paper's facts `numbers.llama3`'s.
"""
from __future__ import annotations

from functools import cache

from ...plan import costmodel as cm
from ...plan.config import ModelConfig, ParallelConfig
from ...plan.costmodel import rules
from ...plan.costmodel.band import MIN_ROWS, band_errors
from ...plan.costmodel.calibration import (MFU_FLOOR, PLAYBOOK_MODELS, flop_count_agreement,
                                           heatmap_cells, held_out_runs, nemo_runs,
                                           playbook_flops_ratio, playbook_mfu_ratios,
                                           playbook_runs)
from ...plan.costmodel.evaluate import (MEAN_TARGET, WORST_TARGET, by_source, evaluated_runs,
                                        layout_order, order_kept, residuals,
                                        summary as evaluate_summary)
from ...plan.costmodel.planner import (MEMORY_HEADROOM, MIN_TOKENS_PER_CP_RANK, describe,
                                       memory_budget_gb, plan)
from ...plan.flops import flops_per_token, param_count
from ...plan.memory import BF16_MIXED
from .core import Number, assumed, derived, in_scenario, predicted
from .llama3 import HBM_BYTES

_EVAL = "python -m minipar.costmodel.evaluate"
_RULES = "costmodel.rules on Llama 3's cluster"
_HELD = "evaluate.residuals of calibration.held_out_runs()"
_PLAN = "costmodel.planner.plan"
L405 = "llama3-405b"
# The notebook's planning exercise (`exercises.fourd.check_plan` takes these as its defaults):
# the chapter states its cluster, batch and margin.
# The chapter's three worked model/cluster pairs (model, GPU, GPUs, tokens per step, sequence):
# each rule's threshold plot places them, at the layout the planner chose for them.
WORKED = {"405B": ("llama3-405b", "llama3", 8192, 16 * 2**20, 8192),
          "70B": ("llama3-70b", "h100", 1024, 4 * 2**20, 8192),
          "8B": ("llama3-8b", "a100", 64, 4 * 2**20, 8192)}


def worked_cluster(gpu: str):
    return cm.LLAMA3_CLUSTER if gpu == "llama3" else cm.gpu_cluster(gpu)


@cache
def worked_plan(key: str):
    """The planner's best layout for one worked pair (`WORKED`): an `Estimate`."""
    name, gpu, gpus, tokens, seq = WORKED[key]
    return plan(ModelConfig.preset(name), worked_cluster(gpu), gpus, seq, tokens, top=1).ranked[0]


PLAN_EXERCISE = dict(model="llama3-70b", gpu="h100", gpus=256, seq_len=8192,
                     batch_tokens=2 * 2**20, points=2.0)


def numbers() -> dict[str, Number]:
    return {**_fit(), **_sources(), **_band(), **_held_out(), **_layout_order(), **_rule1(),
            **_headroom(), **_rules(), **_plans(), **_exercise()}


def _fit() -> dict[str, Number]:
    """Every evaluation row's error, row by row (1-15): `python -m minipar.costmodel.evaluate`."""
    runs = cm.published_runs()
    res = residuals(runs)
    summary = evaluate_summary(runs, res)
    out = {"n_runs": Number(len(res), source=_EVAL),
           "mean_target": Number(MEAN_TARGET, "{:g}", source="issue 26's target"),
           "worst_target": Number(WORST_TARGET, "{:g}", source="issue 26's target"),
           "n_constants": Number(len(cm.all_constants()), source="python -m minipar.costmodel constants"),

           "within5": Number(sum(abs(r) <= 5 for r in res), source=_EVAL),
           "mean_res": Number(summary["mean_abs_error"], "{:.1f}", source=_EVAL),
           "worst_res": Number(summary["worst_abs_error"], "{:.1f}", source=_EVAL),
           "worst_res_kept": Number(summary["worst_abs_error_not_memory_bound"], "{:.1f}", source=_EVAL)}
    out.update(_flop_count())
    out.update(_same_layout_gap())
    for i, (run, r) in enumerate(zip(runs, res), 1):
        pc = run.parallel
        layout = " ".join(f"{a.upper()}{getattr(pc, a)}" for a in ("tp", "cp", "pp", "dp")
                          if getattr(pc, a) > 1)
        name = "Llama 3 405B" if run.source.startswith("llama3") else run.model.name
        seq = f", {run.work.seq_len // 1024}K" if run.work.seq_len > 8192 else ""
        out[f"run_{i}"] = Number(f"{name}, {pc.world_size:,} GPUs, {layout}{seq}", "{}",
                                 source="published_runs.csv")
        out[f"gpus_{i}"] = Number(pc.world_size, source="published_runs.csv")
        out[f"model_{i}"] = Number(run.model.name, "{}", source="published_runs.csv")
        out[f"dp_{i}"] = Number(pc.dp, source="published_runs.csv")
        out[f"pub_{i}"] = Number(100 * run.printed_mfu, "{:.1f}", source="published_runs.csv")
        out[f"ours_{i}"] = Number(100 * run.mfu, "{:.1f}",
                                  source="published_runs.csv / calibration.playbook_flops_ratio")
        out[f"res_{i}"] = Number(r, "{:+.1f}", source=_EVAL)
    return out


# The evaluation's sources (`PublishedRun.source`), by the short name their keys use.
SOURCES = {"llama3-paper-table4": "table4", "ultrascale-playbook-heatmap": "playbook",
           "nvidia-dgxc-benchmarking": "nemo"}
BAND_KINDS = ("llama3", "nanotron", "nemo", "all")     # the stacks the chapter states, and all


def _sources() -> dict[str, Number]:
    """Each evaluation source's summary (`evaluate.evaluation()["sources"]`: `by_source` of
    every row, NeMo's recipes included), over the rows that are not memory-bound."""
    runs = evaluated_runs()
    src = _EVAL + ": evaluation()['sources']"
    out = {"n_nemo": Number(len(nemo_runs()), source="data/nemo_recipes.csv, calibration.nemo_runs"),
           "n_evaluated": Number(len(runs), source="evaluate.evaluated_runs")}
    for source, s in by_source(runs, residuals(runs)).items():
        name = SOURCES.get(source, source.split("-")[0])
        out.update({f"src_{name}_rows": Number(s["rows_not_memory_bound"], source=src),
                    f"src_{name}_mean": Number(s["mean_abs_error"], "{:.1f}", source=src),
                    f"src_{name}_bias": Number(s["mean_signed_error"], "{:+.1f}", source=src),
                    f"src_{name}_worst": Number(s["worst_abs_error_not_memory_bound"], "{:.1f}",
                                                source=src)})
    return out


def _band() -> dict[str, Number]:
    """The rows and the signed errors (MFU points) each stack's band is made of
    (`costmodel.band.band_errors`; "all": every row's, for a prediction without a stack)."""
    out = {"band_min_rows": Number(MIN_ROWS, source="costmodel.band.MIN_ROWS")}
    for kind in BAND_KINDS:
        # a stack with fewer than MIN_ROWS rows would take every row's: the source says so
        used, errors = band_errors(None if kind == "all" else kind)
        src = f"costmodel.band.band_errors({kind!r}): {used}'s rows"
        out.update({f"band_{kind}_rows": Number(len(errors), source=src),
                    f"band_{kind}_min": Number(min(errors), "{:+.1f}", source=src),
                    f"band_{kind}_max": Number(max(errors), "{:+.1f}", source=src)})
    return out


def published_step_seconds(run) -> float:
    """A published run's step time, read back from its MFU (in minipar's FLOP count)."""
    tokens = run.work.global_batch * run.work.seq_len
    return tokens * flops_per_token(run.model, run.work.seq_len) / (
        run.parallel.world_size * run.mfu * run.cluster.peak_flops)


def _same_layout_gap() -> dict[str, Number]:
    """The 80B model's PP16 x TP4 replica, alone on 64 GPUs and four of them on 256: the
    published seconds per pipeline slot (m + p - 1 of them per step) of each."""
    runs = [r for r in cm.published_runs() if r.model.name == "80B" and r.parallel.pp == 16]
    alone, four = sorted(runs, key=lambda r: r.parallel.dp)
    slot = [published_step_seconds(r) / (r.parallel.microbatches + r.parallel.pp - 1) for r in (alone, four)]
    src = "published_runs.csv: published step / (m + p - 1)"
    return {"slot_80b_alone_s": Number(slot[0], "{:.3f} s", source=src),
            "slot_80b_four_s": Number(slot[1], "{:.3f} s", source=src),
            "slot_80b_slower": Number(slot[0] / slot[1] - 1, "{:.0%}", source=src)}


def _flop_count() -> dict[str, Number]:
    """How the Playbook's printed MFU compares with minipar's count over all its runs."""
    src = "data/playbook_runs.csv: printed MFU over tokens/s x flops_per_token / 989.5 TFLOP/s"
    tol = 0.02
    return {"conv_runs": Number(len(playbook_mfu_ratios()), source=src),
            "conv_tol": Number(tol, "{:.0%}", source="the agreement asked for"),
            "conv_floor": Number(MFU_FLOOR, "{:.0%}",
                                 source="calibration.playbook_mfu_ratios' floor"),
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
    """The heatmap's cells the fit never reads: how far off, and in what order; the two
    worst; and the memory the 80B on 32 GPUs printed beside a cell that ran well."""
    held = held_out_runs()
    err = residuals(held)      # 14 estimates: as the notebook prints them
    order = order_kept(held, err)
    worst = sorted(range(len(held)), key=lambda i: -abs(err[i]))[:2]
    src = "playbook_heatmap.csv (nanotron's docs/benchmark_summary.svg)"
    cells = {(r.model.name, r.parallel.world_size): (r, gb) for r, gb in heatmap_cells()}
    out = {"n_held": Number(len(held), source=src),
           "n_cells": Number(len(cells), source=src),
           "held_mean": Number(sum(map(abs, err)) / len(err), "{:.1f}", source=_HELD),
           "held_worst": Number(max(map(abs, err)), "{:.1f}", source=_HELD),
           "held_order": Number(order, "{:.0%}", source=_HELD + ", evaluate.order_kept")}
    for k, i in enumerate(worst, 1):
        pc = held[i].parallel
        out[f"held_bad_{k}"] = Number(f"{held[i].model.name} on {pc.world_size} GPUs, "
                                      f"TP{pc.tp} DP{pc.dp}", "{}", source=src)
        out[f"held_bad_{k}_err"] = Number(err[i], "{:+.1f}", source=_HELD)
    top = max(cells, key=lambda k: cells[k][1])
    out.update({"mem_80b_32": Number(cells[("80B", 32)][1], "{:.1f} GB", source=src),
                "mem_top": Number(cells[top][1], "{:.1f} GB", source=src),
                "mem_top_run": Number(f"{top[0]} on {top[1]} GPUs", "{}", source=src),
                "mem_top_mfu": Number(100 * cells[top][0].mfu, "{:.1f}", source=src)})
    return out


def _rule1() -> dict[str, Number]:
    m, c = ModelConfig.preset(L405), cm.LLAMA3_CLUSTER
    state = BF16_MIXED.state_bytes_per_param * param_count(m)
    row = cm.TABLE4[0]
    return {"state_gpus": derived(-(-state // HBM_BYTES), "{:,.0f}",
                                  source="state / nvidia-smi's 85.5 GB, rounded up"),
            "state_per_gpu_gb": derived(state / (row.tp * row.pp) / 1e9, "{:.0f} GB", source="state / (TP8 x PP16)"),
            "ridge": Number(c.peak_flops / c.hbm_Bps, "{:.0f}", source="H100: peak FLOP/s / HBM bytes/s")}


def _rules() -> dict[str, Number]:
    c, m = cm.LLAMA3_CLUSTER, ModelConfig.preset(L405)
    narrow, wide = rules.llama_of_width(4096), rules.llama_of_width(16384)
    return {
        "tp8_wide": Number(rules.tp_ratio(wide, 8, c), "{:.0%}", source=_RULES),
        "tp8_narrow": Number(rules.tp_ratio(narrow, 8, c), "{:.0%}", source=_RULES),
        "tp16_wide": Number(rules.tp_ratio(wide, 16, c), "{:.1f}", source=_RULES),
        "att_8k": derived(rules.attention_share(m, 8192, c), "{:.0%}", source=_RULES + ": measured kernels' time"),
        "att_128k": derived(rules.attention_share(m, 131072, c), "{:.0%}", source=_RULES + ": measured kernels' time"),
        "cp16_8k": Number(rules.cp_ratio(m, 8192, 16, c), "{:.0%}", source=_RULES),
        "cp16_128k": Number(rules.cp_ratio(m, 131072, 16, c), "{:.1%}", source=_RULES),
        "min_cp_tokens": Number(MIN_TOKENS_PER_CP_RANK, source="planner.MIN_TOKENS_PER_CP_RANK"),
        "w_wide": Number(wide.dim, source="rules.llama_of_width"),
        "w_narrow": Number(narrow.dim, source="rules.llama_of_width; Llama 3 8B's width"),
        "w_70b": Number(ModelConfig.preset("llama3-70b").dim, source="Llama 3 70B's width"),
        "tp8_h_star": Number(_crossing(lambda h: rules.tp_ratio(rules.llama_of_width(h), 8, c), TP_BUDGET,
                                       range(1024, 65536, 128)), "{:,}", source=_RULES + ": the width where TP8 costs 20%"),
        "tp_budget": Number(TP_BUDGET, "{:.0%}", source="the TP rule's budget"),
        "cp16_s_star": Number(_crossing(lambda s: rules.cp_ratio(m, s, 16, c), 1.0, range(8192, 131073, 1024)),
                              "{:,}", source=_RULES + ": where CP16's all-gather equals its attention"),
        **_dp_by_framework(),
    }


TP_BUDGET = 0.2
DP_FRAMEWORKS = ("llama3", "megatron", "nanotron")
DP_RULE_BATCH = 1024             # sequences of 8K per step in the DP rule's plot


def _crossing(ratio, budget: float, xs) -> int:
    """The first x at which a falling `ratio(x)` is at or under `budget`."""
    return next(x for x in xs if ratio(x) <= budget)


def dp_rule_share(dp: int, framework: str) -> float:
    """Rule 5's ratio: exposed DP over the step of Llama 3 70B at TP8 with `dp` replicas and
    a batch of `DP_RULE_BATCH` sequences of 8K, under `framework`'s reduce
    (`figures.fourd.dp_rule` draws it; `_dp_by_framework` quotes it)."""
    pc = ParallelConfig(tp=8, sp=True, dp=dp, zero=1)
    return rules.dp_share(ModelConfig.preset("llama3-70b"), pc, cm.LLAMA3_CLUSTER, 8192, DP_RULE_BATCH,
                          framework=framework)


def _dp_by_framework(dp: int = 32) -> dict[str, Number]:
    """`dp_rule_share` at `dp` replicas under each framework."""
    out = {"dp_fw_tokens": Number(DP_RULE_BATCH * 8192 // dp, "{:,}", source="the batch's tokens over the replicas"),
           "dp_fw_batch": Number(DP_RULE_BATCH, "{:,}", source="figures.fourd.dp_rule's batch")}
    for fw in DP_FRAMEWORKS:
        out[f"dp_fw_{fw}"] = Number(dp_rule_share(dp, fw), "{:.1%}", source=_RULES + f", --framework {fw}")
    return out


@cache
def _plan405(gpus: int, headroom: float = MEMORY_HEADROOM):
    return plan(ModelConfig.preset(L405), cm.LLAMA3_CLUSTER, gpus, 8192, cm.TABLE4_BATCH_TOKENS,
                top=None, headroom=headroom)


def _headroom() -> dict[str, Number]:
    """Rule 1's headroom, and what the 8K-GPU plan would be without it."""
    full = _plan405(8192, 0.0).ranked[0]
    src = "planner.MEMORY_HEADROOM"
    return {"headroom": assumed(MEMORY_HEADROOM, "{:.0%}", source=src),
            "budget_gb": derived(memory_budget_gb(cm.LLAMA3_CLUSTER), "{:.1f} GB",
                                 source="planner.memory_budget_gb: the cost model's HBM x (1 - headroom)"),
            "planner_hbm_gib": assumed(cm.LLAMA3_CLUSTER.hbm_gb * 1e9 / 2**30, "{:.0f} GiB",
                                       source="costmodel.hardware.Cluster.hbm_gb (--hbm-gb): the "
                                              "planner's capacity of an H100, 80 GiB"),
            **in_scenario({"p8k_nohead_best": Number(describe(full), "{}", source=_PLAN + ", headroom 0"),
                           "p8k_nohead_gb": Number(full.memory_gb_per_gpu, "{:.0f} GB",
                                                   source=_PLAN + ", headroom 0")}, "planner")}


def _table4_rank(p, dp: int) -> int:
    return next(i for i, e in enumerate(p.ranked, 1)
                if (e.parallel.tp, e.parallel.cp, e.parallel.pp, e.parallel.dp) == (8, 1, 16, dp)
                and e.parallel.virtual_stages == 8)


def _plans() -> dict[str, Number]:
    out = {}
    for key, gpus, dp in (("p8k", 8192, 64), ("p16k", 16384, 128)):
        p = _plan405(gpus)
        rank = _table4_rank(p, dp)
        out.update({f"{key}_best": Number(describe(p.ranked[0]), "{}", source=_PLAN),
                    f"{key}_best_mfu": predicted(p.ranked[0].mfu, None, _PLAN),
                    f"{key}_fifth_mfu": predicted(p.ranked[4].mfu, None, _PLAN),
                    f"{key}_count": Number(len(p.ranked), source=_PLAN),
                    f"{key}_t4_rank": Number(rank, source=_PLAN),
                    f"{key}_t4": Number(describe(p.ranked[rank - 1]), "{}", source=_PLAN),
                    f"{key}_t4_mfu": predicted(p.ranked[rank - 1].mfu, None, _PLAN)})
    for key, pair in (("p70", "70B"), ("p8b", "8B")):
        best = worked_plan(pair)
        out.update({f"{key}_best": Number(describe(best), "{}", source=_PLAN),
                    f"{key}_mfu": predicted(best.mfu, None, _PLAN),
                    f"{key}_gpus": Number(WORKED[pair][2], source="the worked example")})
    return in_scenario(out, "planner")


def _exercise() -> dict[str, Number]:
    d, source = PLAN_EXERCISE, "exercises.fourd.check_plan's defaults"
    return {"ex_gpus": Number(d["gpus"], source=source),
            "ex_batch": Number(d["batch_tokens"] // 2**20, "{}M", source=source),
            "ex_points": Number(d["points"], "{:g}", source=source)}
