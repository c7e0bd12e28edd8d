"""The numbers the mfu chapter states (book/mfu.md), computed once.

The cost model's prediction of each row of Llama 3's Table 4 (`costmodel.table4`) lives
here under `row<i>_...` keys, and every chapter that states one of them (the TP time per
step of row 1, a row's step time, bubble or MFU) uses these keys: one estimate, one value.
The published side of the table is `numbers.llama3`'s (`row<i>_mfu`, `row<i>_tflops`).
"""
from __future__ import annotations

from dataclasses import replace
from functools import cache

from ...plan import costmodel as cm
from ...plan.config import ModelConfig, ParallelConfig
from ...plan.costmodel.scenario import Scenario
from ...plan.costmodel.table4 import TOLERANCE, nic_sensitivity, nic_window
from ...plan.costmodel.time import dp_terms, microbatch_seconds
from ...plan.datasheets import SHEETS
from ...plan.costmodel.constants import CAUSAL_FRACTION
from ...plan.flops import attention_flops_per_token, dense_flops_per_token, flops_per_token
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...runtime.topology import straddling_replicas
from .. import replays
from .core import ROW1_STACKS, Number, derived, in_scenario, measured, predicted
from .fourd import cp_by_hand, reduce_scatter_by_hand, speeds, tp_by_hand

_CM = "cost model (costmodel.table4), Table 4 row {}"
_PARTS = ("compute", "tp", "cp", "bubble", "pp", "dp", "optimizer")
L405 = "llama3-405b"


@cache
def _table4(framework: str = "llama3"):
    return cm.table4(framework)


def _row(i: int, row, e) -> dict[str, Number]:
    """The cost model's estimate of Table 4 row i: step time and where it goes, MFU, bytes."""
    src, p = _CM.format(i), f"row{i}_"
    m = ModelConfig.preset(L405)
    out = {p + f"{part}_s": derived(e.time_breakdown_s[part], "{:.2f} s", src) for part in _PARTS}
    published_step = cm.TABLE4_BATCH_TOKENS * flops_per_token(m, row.seq_len) / (
        row.gpus * row.tflops_per_gpu * 1e12)
    out.update({
        p + "step_s": derived(e.step_time_s, "{:.2f} s", src),
        p + "mfu_model": predicted(e.mfu, "llama3", src + ", PaLM's convention", "derived"),
        p + "tflops_model": derived(e.tflops_per_gpu, "{:.0f} TFLOP/s", src),
        p + "bubble_frac": derived(e.bubble_fraction, "{:.1%}", src + ", formulas.pipeline_parallel.bubble_fraction"),
        p + "microbatches": derived(e.microbatches, "{:,}", "16M tokens / (DP x seq)"),
        p + "tokens_per_s": derived(e.tokens_per_s, "{:,.0f}", src),
        p + "gap_pts": derived(100 * abs(e.mfu - row.mfu), "{:.1f}", "|predicted - published| MFU"),
        p + "mfu_exact": derived(row.tflops_per_gpu / cm.LLAMA3_CLUSTER.peak_tflops, "{:.1%}",
                                 "published TFLOP/s / the H100's data-sheet peak"),
        p + "step_published_s": derived(published_step, "{:.1f} s",
                                        "16M tokens x FLOPs per token / (GPUs x TFLOP/s)"),
        p + "flops_per_token": derived(flops_per_token(m, row.seq_len), "{:.2e}", "6N + 12 L h s"),
    })
    for axis, nbytes in e.comm_bytes_per_gpu.items():
        out[p + f"{axis}_gb"] = derived(nbytes / 1e9, "{:.1f} GB", src + ", costmodel.wire")
    published = {p + k for k in ("mfu_exact", "step_published_s", "flops_per_token", "gap_pts")}
    model = in_scenario({k: v for k, v in out.items() if k not in published}, f"table4-row{i}",
                        {p + "dp_s": "dp_exposed_s", p + "dp_gb": "dp_bytes_step"})
    return {**out, **model}


def _table4_numbers() -> dict[str, Number]:
    out = {}
    for i, (row, e) in enumerate(_table4(), start=1):
        out.update(_row(i, row, e))
    rows = _table4()
    (row1, e1), (_, e2), (_, e3) = rows
    b1, b2 = e1.bubble_fraction, e2.bubble_fraction
    row1 = {
        "bubble_only_mfu": predicted(e1.mfu * (1 - b2) / (1 - b1), "llama3",
                                     "row 1's MFU with row 2's bubble", "derived"),
        "tp_over_dp": derived(e1.comm_bytes_per_gpu["tp"] / e1.comm_bytes_per_gpu["dp"], "{:.1f}",
                              "row 1: TP bytes / DP bytes"),
        "row1_dp_wire_s": derived(cm.wire_seconds(e1, "dp", cm.LLAMA3_CLUSTER), "{:.2f} s",
                                  "row 1's DP bytes at the DP ring's bandwidth"),
    }
    out.update(in_scenario(row1, "table4-row1"))
    out.update({
        "rows_within": derived(sum(100 * abs(e.mfu - r.mfu) <= TOLERANCE for r, e in rows), "{}",
                               "rows predicted within table4.TOLERANCE points"),
        "max_gap_pts": derived(max(100 * abs(e.mfu - r.mfu) for r, e in rows), "{:.1f}", "worst row"),
        "gaps_signed": derived(", ".join(f"{100 * (e.mfu - r.mfu):+.1f}" for r, e in rows), "{}",
                               "predicted - published, rows 1-3"),
        "row3_tp_share": derived(e3.time_breakdown_s["tp"] / e3.step_time_s, "{:.0%}", "row 3: TP / step"),
        "row2_tp_share": derived(e2.time_breakdown_s["tp"] / e2.step_time_s, "{:.0%}", "row 2: TP / step"),
    })
    return out


def _dp_reductions() -> dict[str, Number]:
    """Llama 3's FSDP reduce-scatters every micro-batch's fp32 gradients: how much network
    time that is per step, how late the first backward comes, what the pipeline's sends add
    on the same NIC, and what sticks out (`costmodel.time.dp_terms`), rows 1 and 2."""
    out = {}
    model = ModelConfig.preset(L405)
    for i, (row, e) in enumerate(_table4()[:2], start=1):
        _, precision, eff = cm.frameworks.apply(cm.frameworks.LLAMA3, model, row.parallel())
        s = Scenario(model, e.parallel, cm.LLAMA3_CLUSTER, e.workload, precision, eff)
        t_mb = microbatch_seconds(s).critical
        dp = dp_terms(s, t_mb)
        src = _CM.format(i) + ", costmodel.time.dp_terms"
        out.update(in_scenario({
            f"row{i}_rs_total_s": derived(e.microbatches * dp.reduce_scatter, "{:.1f} s", src),
            f"row{i}_late_s": derived(dp.late, "{:.1f} s", src),
            f"row{i}_pp_nic_s": derived(dp.pp_nic, "{:.2f} s", src),
            f"row{i}_mb_s": derived(t_mb, "{:.2f} s", src)}, f"table4-row{i}"))
    return out


def _flops() -> dict[str, Number]:
    m = ModelConfig.preset(L405)
    dense = dense_flops_per_token(m)
    out = {"six_n": derived(dense, "{:.2e}", "6 N")}
    for name, s in (("8k", 8192), ("128k", 131072)):
        att = attention_flops_per_token(m, s)
        out[f"att_{name}"] = derived(att, "{:.2e}", f"12 L h s at s = {s:,}")
        out[f"att_share_{name}"] = derived(att / (dense + att), "{:.0%}", "12 L h s / (6N + 12 L h s)")
    out["a100_peak"] = Number(SHEETS["A100"].bf16_tflops, "{:.0f}", source="datasheets.SHEETS")
    return out


def _placement() -> dict[str, Number]:
    """Where the model replicas of each row sit among 3,072-GPU pods (rank order [TP, CP,
    PP, DP]), and what a pod's 1:7 uplink gives the DP rings that leave it."""
    c, row1, row3 = cm.LLAMA3_CLUSTER, cm.TABLE4[0], cm.TABLE4[2]
    straddle = straddling_replicas(row3.tp * row3.cp * row3.pp, row3.gpus, c.pod_size)
    names = ", ".join(map(str, straddle[:-1])) + " and " + str(straddle[-1])
    first = straddle[0] * row3.tp * row3.cp * row3.pp
    stage = ((first // c.pod_size + 1) * c.pod_size - first) // (row3.tp * row3.cp)
    uplink = c.pod_size * c.inter_node_GBps / c.pod_oversubscription
    rings = row1.tp * row1.cp * row1.pp
    return {
        "row3_straddlers": derived(names, "{}", "placement.straddling_replicas: replicas in two pods"),
        "row3_cross_stage": derived(stage, "{}", "first PP stage of replica 1 in the next pod"),
        "row3_tp_cp_gpus": derived(row3.tp * row3.cp, "{:,}", "TP x CP of row 3"),
        "pod_uplink_GBps": derived(uplink, "{:,.0f} GB/s", "3,072 x 50 GB/s / 7"),
        "dp_rings": derived(rings, "{}", "one DP ring per (TP, CP, PP) position, row 1"),
        "per_ring_GBps": derived(uplink / rings, "{:.0f} GB/s", "the uplink shared by the rings"),
        "per_gpu_cross_GBps": derived(c.inter_node_GBps / c.pod_oversubscription, "{:.1f} GB/s",
                                      "50 GB/s / 7"),
    }


def _tiny_bytes() -> dict[str, Number]:
    """What rank 0's CommLog counts in the chapter's 8-process run, as the formulas predict
    it (tests/test_costmodel.py checks the same world measures exactly this)."""
    pc = ParallelConfig(tp=2, cp=2, pp=2, dp=1, zero=1, sp=True, microbatches=4,
                        schedule="interleaved", virtual_stages=2, cp_impl="ring")
    pred = cm.comm_bytes_per_gpu(ModelConfig.preset("tiny"), pc,
                                 cm.Workload(seq_len=32, global_batch=8, microbatch_size=2), cm.FP32)
    return {f"tiny_{a}_bytes": Number(pred[a], "{:,}", source="costmodel.comm_bytes_per_gpu, tiny, fp32")
            for a in ("tp", "cp", "pp", "dp")}


def _constants() -> dict[str, Number]:
    """The measured constants the chapter quotes (`costmodel.constants`), each with its source;
    and what Table 4 row 1 becomes under each framework's stack."""
    c = cm.all_constants()
    formats = {"gemm.max_fraction": "{:.0%}", "attention.flash2_8k": "{:.0f} TFLOP/s",
               "attention.cudnn_8k": "{:.0f} TFLOP/s", "attention.flash2_cp_chunk": "{:.0f} TFLOP/s",
               "attention.cudnn_cp_chunk": "{:.0f} TFLOP/s", "hbm.stream_fraction": "{:.0%}",
               "elementwise.eager": "{:.1f}", "nvlink.busbw_fraction": "{:.0%}",
               "nic.busbw_fraction": "{:.0%}", "gemm.table": "{:.0f}",
               "nccl.base_latency": "{:g} µs", "efa.all_gather_32x32MiB": "{:.0%}",
               "efa.all_reduce_32x8GiB": "{:.0%}"}     # nccl's steps: collectives.alpha_*
    out = {name.replace(".", "_"): measured(c[name].value, fmt, c[name].source)
           for name, fmt in formats.items()}
    out["n_constants"] = Number(len(c), source="python -m minipar.costmodel constants")
    out["cp_chunk_peak_share"] = derived(c["attention.cudnn_cp_chunk"].value / cm.LLAMA3_CLUSTER.peak_tflops,
                                         "{:.0%}", "cuDNN's measured TFLOP/s on a CP16 rank's chunk / "
                                         "the H100's dense bf16 peak")
    out["nanotron_bucket_mb"] = Number(cm.FRAMEWORKS["nanotron"].bucket, "{:g} MB",
                                       source=cm.FRAMEWORKS["nanotron"].sources["bucket"])
    out["n_runs"] = Number(len(cm.published_runs()), "{}", source="costmodel/data/published_runs.csv")
    for name in ROW1_STACKS:     # Llama 3's own stack: row1_mfu_model, one estimate, one key
        e = _table4(name)[0][1]
        out.update(in_scenario({f"row1_mfu_{name}": predicted(e.mfu, name, f"costmodel.table4('{name}'), row 1",
                                                           "derived")}, f"row1-stack-{name}"))
    for i, (row, e) in enumerate(slowest_kernels_table4(), 1):
        out[f"slow_gap_{i}"] = derived(100 * (e.mfu - row.mfu), "{:.1f}",
                                       "Table 4 under the llama3 stack with the slowest kernels measured")
    return out


def _nic_window() -> dict[str, Number]:
    """Rows 1 and 2 are bound by the NIC: the bus bandwidths (fractions of line rate) at which
    both would land within table4.TOLERANCE points (`costmodel.table4.nic_window`)."""
    sweep = nic_sensitivity()
    lo, hi = nic_window(sweep)
    src = "costmodel.table4.nic_window over nic_sensitivity()"
    return in_scenario({"nic_window_lo": derived(lo, "{:.1%}", src),
                        "nic_window_hi": derived(hi, "{:.1%}", src)}, "table4-nic-sweep")


def slowest_kernels_table4():
    """Table 4 under Llama 3's stack but the slowest kernels measured: FlashAttention-2,
    eager pointwise ops and loss (what the paper's unnamed kernels could at worst be)."""
    return cm.table4(attention="flash2", elementwise="eager", cross_entropy="eager")


def _memory() -> dict[str, Number]:
    """Row 1's fullest GPU under each recomputation policy (ZeRO-2 and the HBM: numbers.memory)."""
    m, row1 = ModelConfig.preset(L405), cm.TABLE4[0]
    est = {r: cm.estimate(m, row1.parallel(), seq_len=row1.seq_len, recompute=r,
                          global_batch_tokens=cm.TABLE4_BATCH_TOKENS) for r in ("none", "selective", "full")}
    src = "costmodel.estimate, Table 4 row 1"
    out = {f"mem_{k}_gb": derived(v, "{:.1f} GB", src) for k, v in est["none"].memory_breakdown_gb.items()}
    for r in ("selective", "full"):
        out[f"{r}_gb"] = derived(est[r].memory_gb_per_gpu, "{:.1f} GB", src + f", recompute {r}")
        out[f"{r}_mfu"] = predicted(est[r].mfu, None, src + f", recompute {r}", "derived")
        out[f"{r}_hfu"] = derived(est[r].hfu, "{:.0%}", src + f", recompute {r}")
    out = in_scenario(out, "row1-no-stack")
    out.update({
        "in_flight": derived(cm.in_flight_microbatches("interleaved", row1.pp, est["none"].microbatches, 0, 8),
                             "{:.1f}", "formulas.memory.in_flight_microbatches"),
        "act_kb_token_layer": derived(cm.activation_elements(m, row1.tp, True, "none") * 2 / 1e3, "{:.0f} kB",
                                      "formulas.memory.activation_elements, TP8 + SP, bf16"),
    })
    return out


def layout_name(e) -> str:
    p = e.parallel
    return f"TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}" + (f" v={p.virtual_stages}" if p.virtual_stages > 1 else "")


@cache
def search_results():
    """Every layout of 8,192 GPUs at 8K that fits under Llama 3's stack, best first
    (`costmodel.best_configs`)."""
    return cm.best_configs(ModelConfig.preset(L405), gpus=8192, top=None, framework="llama3")


def _search() -> dict[str, Number]:
    found = search_results()
    best = found[0]
    llama = [i for i, e in enumerate(found)
             if (e.parallel.tp, e.parallel.cp, e.parallel.pp, e.parallel.dp) == (8, 1, 16, 64)]
    src = "costmodel.best_configs, 8,192 GPUs, 8K"
    out = {
        "search_fit": derived(len(found), "{:,}", src),
        "search_best": derived(layout_name(best), "{}", src),
        "search_best_mfu": predicted(best.mfu, "llama3", src, "derived"),
        "search_best_recompute": derived(best.workload.recompute, "{}", src),
        "search_best_mbs": derived(best.workload.microbatch_size, "{}", src),
    }
    if llama:
        e = found[llama[0]]
        out.update({"search_llama_rank": derived(llama[0] + 1, "{}", src),
                    "search_llama_recompute": derived(e.workload.recompute, "{}", src),
                    "search_llama_mfu": predicted(e.mfu, "llama3", src, "derived"),
                    "search_gap_pts": derived(100 * (best.mfu - e.mfu), "{:.1f}", src + ": best - Llama 3's")})
    none = [e for e in found if e.workload.recompute == "none"]
    if none:
        out.update({"search_none_best": derived(layout_name(none[0]), "{}", src + ", no recomputation"),
                    "search_none_mfu": predicted(none[0].mfu, "llama3", src + ", no recomputation", "derived"),
                    "search_none_rank": derived(found.index(none[0]) + 1, "{}", src)})
    return in_scenario(out, "search-8k")


def step_by_hand(row) -> tuple[float, float]:
    """(what the GPU must do, what its NIC must do) in seconds per step, for a row of Table 4
    by hand (the 4D chapter's inequalities, `numbers.fourd`): the matmuls at the GEMMs' best
    speed, the causal half of attention at the measured kernel's, TP's exposed time
    (`tp_by_hand`), the all-gather CP's (`cp_by_hand`), stretched by the bubble; and every
    micro-batch's fp32 reduce-scatter (`reduce_scatter_by_hand`)."""
    m, seq, t, c, p = ModelConfig.preset(L405), row.seq_len, row.tp, row.cp, row.pp
    v = speeds(attention="attention.cudnn_cp_chunk" if c > 1 else "attention.cudnn_8k")
    mb = cm.TABLE4_BATCH_TOKENS // (seq * row.dp)
    dense = dense_flops_per_token(m) * seq / (t * c * p) / v.flops
    att = CAUSAL_FRACTION * attention_flops_per_token(m, seq) * seq / (t * c * p) / v.attention
    exposed = tp_by_hand(m, t, v.nvlink, v) * dense + (cp_by_hand(m, seq, c, t, v) * att if c > 1 else 0.0)
    gpu = mb * (dense + att + exposed) / (1 - bubble_fraction("interleaved", p, mb, row.parallel().virtual_stages))
    return gpu, mb * reduce_scatter_by_hand(m, t, p, row.dp * c, v)


def _bound(gpu: float, nic: float) -> str:
    """Which resource sets a by-hand step: within 5% of each other, both."""
    if abs(gpu - nic) <= 0.05 * max(gpu, nic):
        return "the GPUs and the NICs alike"
    return "the NICs" if nic > gpu else "the GPUs"


def _by_hand() -> dict[str, Number]:
    """Table 4 by hand: each row's step is at least what its GPUs or its NICs must do
    (`step_by_hand`), and the MFU of that step is a ceiling, not a prediction."""
    m, out, src = ModelConfig.preset(L405), {}, "by hand: mfu.step_by_hand"
    for i, row in enumerate(cm.TABLE4, 1):
        gpu, nic = step_by_hand(row)
        mfu = cm.TABLE4_BATCH_TOKENS * flops_per_token(m, row.seq_len) / (
            row.gpus * cm.LLAMA3_CLUSTER.peak_flops * max(gpu, nic))
        out.update({f"hand_row{i}_gpu_s": Number(gpu, "{:.1f} s", source=src),
                    f"hand_row{i}_nic_s": Number(nic, "{:.1f} s", source=src),
                    f"hand_row{i}_bound": Number(_bound(gpu, nic), "{}", source=src),
                    f"hand_row{i}_mfu": Number(mfu, "{:.0%}", source=src + ": a ceiling")})
    return out


def _replayed() -> dict[str, Number]:
    """The replay's MFU of Table 4's first row (`teach.replays`, run "llama3"), quoted as a
    cost-model MFU is, with the llama3 stack's band: its physics is the cost model's."""
    mfu = predicted(replays.replayed("llama3").mfu, "llama3", "replays.replayed('llama3')", "derived")
    return {"l3_replayed_mfu": replace(mfu, recorded=True)}


def numbers() -> dict[str, Number]:
    return {**_by_hand(), **_replayed(), **_table4_numbers(), **_nic_window(), **_dp_reductions(), **_flops(), **_placement(),
            **_tiny_bytes(), **_constants(), **_memory(), **_search()}
