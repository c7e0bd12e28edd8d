"""The numbers the experts chapter states (book/experts.md), computed once.

Chapter "Experts: the fifth axis". DeepSeek-V3's facts come from the `deepseek-v3` preset
and its published layout (`costmodel.defaults.PRESET_LAYOUTS`), each marked with the section
of the DeepSeek-V3 technical report (arXiv 2412.19437) that states it; the parameter counts
and bytes from `plan.flops` and `plan.formulas`; the prediction from the cost model exactly
as `python -m minipar.costmodel --preset deepseek-v3 --json` prints it, with its band.

Also the one routing experiment the figures and the prose share: the tiny mixture of experts
trained on one device, its router's load read after every backward (`routing_loads`).
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import statistics

from ...plan.config import ModelConfig, TrainConfig
from ...plan.costmodel.cli import main as costmodel_main
from ...plan.costmodel.defaults import PRESET_LAYOUTS
from ...plan.costmodel.experts import busiest_rank_load, nic_copies
from ...plan.costmodel.frameworks import DEEPSEEK
from ...plan.costmodel.gpus import GPU_SHEETS, gpu_cluster
from ...plan.flops import flops_per_token, param_count
from ...plan.formulas.experts import dispatch_bytes
from ...plan.formulas.tensor_parallel import tp_layer_bytes
from ...runtime.run import train
from ...trainer.model import MoE
from .core import Number, in_scenario, measured, predicted

PRESET = "deepseek-v3"
REPORT = "the DeepSeek-V3 technical report (DeepSeek-AI 2024, arXiv 2412.19437)"

# The tiny mixture of experts the chapter and its notebook run: `tiny` with 8 SwiGLU experts,
# 2 per token (Mixtral's shape, scaled down). Routing: ROUTING_STEPS steps of one device,
# without and with DeepSeek-V3's bias balancing at BIAS_RATE per step.
TINY_MOE = dict(moe_experts=8, moe_top_k=2)
ROUTING_STEPS = 30
BIAS_RATE = 0.002
# DeepSeek-V3's pre-training as the report states it (abstract; Section 1, Table 1).
PRETRAIN_GPU_HOURS, PRETRAIN_TOKENS = 2_664_000, 14.8e12
# The what-if the chapter prices: one expert of every layer at twice the mean load.
HOT_EXPERT = 2.0


def reported(value, fmt: str = "{:,}", section: str = "") -> Number:
    """A fact DeepSeek-V3's report (`REPORT`, the mark's own words) states; say where:
    "Section 3.2"."""
    return Number(value, fmt, "deepseek", section)


# ---------------------------------------------------------------- the routing experiment
def _loads(step, chunks, dp, grid) -> dict:
    """`after_backward`: each MoE layer's load of this step (copies routed to each expert),
    counted by the block's backward, before the bias update reads and clears it."""
    return {"load": [m.load.tolist() for c in chunks for m in c.modules() if isinstance(m, MoE)]}


@functools.cache
def routing_loads(bias_rate: float = 0.0, steps: int = ROUTING_STEPS) -> tuple:
    """Per step, per MoE layer, the copies the tiny MoE's router sent to each expert, in a
    real single-device training run (`--moe-experts 8 --moe-top-k 2`, `--moe-bias-rate`)."""
    out = train(TrainConfig(steps=steps, progress=False, moe_bias_rate=bias_rate, **TINY_MOE),
                after_backward=_loads)
    return tuple(tuple(tuple(layer) for layer in out["probes"][s]["load"]) for s in range(steps))


def imbalance(load) -> float:
    """The busiest expert's load over the mean: the cost model's `--moe-imbalance`."""
    return max(load) / (sum(load) / len(load))


def mean_imbalance(loads, last: int) -> float:
    """`imbalance` averaged over the layers and the `last` steps of a run."""
    return statistics.mean(imbalance(layer) for step in loads[-last:] for layer in step)


# ---------------------------------------------------------------- the cost model's DeepSeek-V3
@functools.cache
def costmodel_json(*flags: str) -> dict:
    """What `python -m minipar.costmodel --preset deepseek-v3 --json [flags]` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = costmodel_main(["--preset", PRESET, "--json", *flags])
    if status != 0:
        raise RuntimeError(f"the cost model refused --preset {PRESET} {' '.join(flags)}")
    return json.loads(out.getvalue())


def _prediction(e: dict, what: str) -> dict[str, Number]:
    src = f"python -m minipar.costmodel --preset {PRESET}{what} --json"
    ep = e["ep"]
    return {
        "mfu": predicted(e["mfu"], DEEPSEEK.name, src),
        "step_s": Number(e["step_time_s"], "{:.1f} s", source=src),
        "tflops": Number(e["tflops_per_gpu"], "{:.0f} TFLOP/s", source=src),
        "ep_s": Number(ep["all_to_all_s"], "{:.1f} s", source=src),
        "ep_exposed_s": Number(ep["exposed_s"], "{:.2f} s", source=src),
        "ep_share": Number(ep["exposed_s"] / e["step_time_s"], "{:.0%}", source=src),
        "ep_tb": Number(ep["all_to_all_bytes"] / 1e12, "{:.2f} TB", source=src),
        "nic_tb": Number(ep["nic_bytes"] / 1e12, "{:.2f} TB", source=src),
        "memory_gb": Number(e["memory_gb_per_gpu"], "{:.0f} GB", source=src),
        "activations_gb": Number(e["memory_breakdown_gb"]["activations"], "{:.0f} GB", source=src),
    }


def _cost_model() -> dict[str, Number]:
    base = _prediction(costmodel_json(), "")
    hot = _prediction(costmodel_json("--moe-imbalance", str(HOT_EXPERT)),
                      f" --moe-imbalance {HOT_EXPERT:g}")
    out = {f"dsv3_{k}": n for k, n in base.items()}
    hot_keys = {f"hot_{k}": hot[k] for k in ("mfu", "step_s", "ep_exposed_s")}
    return {**in_scenario(out, "deepseek-v3"), **in_scenario(hot_keys, "deepseek-v3-hot-expert"),
            "hot_imbalance": Number(HOT_EXPERT, "{:g}", source="the what-if's --moe-imbalance")}


# ---------------------------------------------------------------- DeepSeek-V3, as reported
def _reported() -> dict[str, Number]:
    m, lay = ModelConfig.preset(PRESET), PRESET_LAYOUTS[PRESET]
    per_node = gpu_cluster(lay["gpu"]).gpus_per_node
    return {
        "ds_gpus": reported(lay["pp"] * lay["dp"], section="Section 3.1"),
        "ds_gpus_per_server": reported(per_node, section="Section 3.1"),
        "ds_pp": reported(lay["pp"], section="Section 3.2"),
        "ds_ep": reported(lay["ep"], section="Section 3.2"),
        "ds_ep_servers": reported(lay["ep"] // per_node, section="Section 3.2"),
        "ds_zero": reported(lay["zero"], section="Section 3.2"),
        "ds_layers": reported(m.n_layers, section="Section 4.2"),
        "ds_dense_layers": reported(m.moe_first_layer, section="Section 4.2"),
        "ds_routed": reported(m.moe_experts, section="Section 4.2"),
        "ds_shared": reported(m.moe_shared_experts, section="Section 4.2"),
        "ds_active": reported(m.moe_top_k, section="Section 4.2"),
        "ds_max_servers": reported(m.moe_max_nodes, section="Section 4.2"),
        "ds_expert_ffn": reported(m.moe_ffn_dim, section="Section 4.2"),
        "ds_dim": reported(m.dim, section="Section 4.2"),
        "ds_gamma": reported(m.moe_bias_rate, "{:g}", section="Section 4.2"),
        "ds_alpha": reported(m.moe_aux_loss, "{:g}", section="Section 4.2"),
        "ds_seq": reported(lay["seq_len"], section="Section 4.2"),
        "ds_batch": reported(lay["global_batch"], section="Section 4.2"),
        # stated by the report, not read from the preset
        "ds_total_b": reported(671, "{:,}B", section="abstract and Section 4.2"),
        "ds_active_b": reported(37, "{:,}B", section="abstract and Section 4.2"),
        "ds_gpu_hours_m": reported(2.788, "{:.3f}M", section="abstract"),
        "ds_pretrain_gpu_hours_k": reported(PRETRAIN_GPU_HOURS / 1e3, "{:,.0f}K", section="Section 1, Table 1"),
        "ds_tokens_t": reported(PRETRAIN_TOKENS / 1e12, "{:.1f}T", section="abstract"),
        "ds_nvlink_GBps": reported(160, "{:,} GB/s", section="Section 3.2.2"),
        "ds_nvlink_over_ib": reported(3.2, "{:.1f}", section="Section 3.2.2"),
        "ds_comm_sms": reported(DEEPSEEK.kernels.ep_comm_sms, section="Section 3.2.2"),
        "ds_sms": reported(gpu_cluster(lay["gpu"]).sms, section="Section 3.5.1"),
        "ds_experts_per_server": reported(3.2, "{:.1f}", section="Section 3.2.2"),
    }


def _derived() -> dict[str, Number]:
    m, lay = ModelConfig.preset(PRESET), PRESET_LAYOUTS[PRESET]
    sheet = GPU_SHEETS[lay["gpu"]]
    why = "the deepseek-v3 preset, multi-head latent attention priced as 128 full heads"
    return {
        "ds_dp": Number(lay["dp"], source="2,048 GPUs / PP16"),
        "ds_edp": Number(lay["dp"] // lay["ep"], source="DP128 / EP64: expert-data-parallel ranks"),
        "ds_experts_per_gpu": Number(m.moe_experts // lay["ep"], source="256 experts / EP64"),
        "ds_moe_layers": Number(m.n_layers - m.moe_first_layer, source="61 layers less 3 dense"),
        "ds_servers": Number(lay["pp"] * lay["dp"] // gpu_cluster(lay["gpu"]).gpus_per_node),
        "book_total_b": Number(param_count(m) / 1e9, "{:.0f}B", source=f"flops.param_count, {why}"),
        "book_active_b": Number(param_count(m, active=True) / 1e9, "{:.1f}B",
                                source=f"flops.param_count(active=True), {why}"),
        "implied_mfu": Number(implied_mfu(), "{:.0%}", source="14.8T tokens x flops.flops_per_token "
                              "(6 N_active + 12 L h s, 4K) / (2,664K H800 hours x 989.4 TFLOP/s)"),
        "h800_bf16": measured(sheet.bf16_tflops, "{:,.1f} TFLOP/s", source=f"datasheets: {sheet.source}"),
        # FP8's dense tensor-core peak is twice bf16's on the H100 SXM die the H800 shares
        # (NVIDIA's H100 data sheet: 3,958 TFLOP/s FP8 with sparsity, 1,979 dense)
        "h800_fp8": measured(2 * sheet.bf16_tflops, "{:,.0f} TFLOP/s",
                             source="NVIDIA H100 SXM data sheet: FP8 3,958 TFLOP/s with sparsity, "
                                    "half of it dense; the H800 has the same compute"),
    }


def implied_mfu() -> float:
    """The MFU the report's pre-training implies, against the H800's dense bf16 peak: its
    tokens' model FLOPs (PaLM's count, the preset's active weights) over its GPU hours. Every
    hour counts, whatever it was spent on: a lower bound on the steps' own MFU."""
    m, sheet = ModelConfig.preset(PRESET), GPU_SHEETS[PRESET_LAYOUTS[PRESET]["gpu"]]
    work = PRETRAIN_TOKENS * flops_per_token(m, PRESET_LAYOUTS[PRESET]["seq_len"])
    return work / (PRETRAIN_GPU_HOURS * 3600 * sheet.peak_flops("bf16"))


# ---------------------------------------------------------------- bytes: EP against TP
def layer_bytes(tokens: int, model: ModelConfig, degree: int, act_bytes: int = 2,
                dispatch_act_bytes: int | None = None) -> dict[str, float]:
    """Bytes one GPU sends for one MoE layer and one micro-batch of `tokens` tokens, forward
    and backward: expert parallelism's four all-to-alls (dispatch and combine, each again in
    the backward; uniform routing) against tensor parallelism's four all-reduces at the same
    degree. `dispatch_act_bytes`: DeepSeek-V3 sends the dispatch in FP8 (1 byte)."""
    k, d = model.moe_top_k, model.dim
    dispatch = dispatch_bytes(tokens, k, degree, d, dispatch_act_bytes or act_bytes)
    combine = dispatch_bytes(tokens, k, degree, d, act_bytes)
    return {"ep": 2 * (dispatch + combine), "tp": tp_layer_bytes(tokens, d, degree, act_bytes)}


def _bytes() -> dict[str, Number]:
    m, lay = ModelConfig.preset(PRESET), PRESET_LAYOUTS[PRESET]
    tokens, ep = lay["seq_len"], lay["ep"]
    bf16, fp8 = layer_bytes(tokens, m, ep), layer_bytes(tokens, m, ep, dispatch_act_bytes=1)
    tp8 = layer_bytes(tokens, m, 8)["tp"]
    src = "formulas.experts.dispatch_bytes and formulas.tensor_parallel.tp_layer_bytes"
    servers = ep // gpu_cluster(lay["gpu"]).gpus_per_node
    return {
        "layer_ep_mb": Number(bf16["ep"] / 1e6, "{:,.0f} MB", source=src),
        "layer_ep_fp8_mb": Number(fp8["ep"] / 1e6, "{:,.0f} MB", source=src),
        "layer_tp8_mb": Number(tp8 / 1e6, "{:,.0f} MB", source=src),
        "ep_over_tp": Number(bf16["ep"] / layer_bytes(tokens, m, ep)["tp"], "{:.1f}",
                             source=f"{src}: k/2 at any degree"),
        "nic_copies_free": Number(nic_copies(m.moe_top_k, servers, 0), "{:.1f}",
                                  source="costmodel.experts.nic_copies, uniform routing"),
        "nic_copies_limited": Number(nic_copies(m.moe_top_k, servers, m.moe_max_nodes), "{:.1f}",
                                     source="costmodel.experts.nic_copies, at most 4 servers"),
    }


# ---------------------------------------------------------------- the tiny MoE
def _tiny() -> dict[str, Number]:
    tiny = ModelConfig(**TINY_MOE)
    off, on = routing_loads(0.0), routing_loads(BIAS_RATE)
    half = ROUTING_STEPS // 2
    src = f"numbers.experts.routing_loads: {ROUTING_STEPS} steps of the tiny MoE on one device"
    copies = sum(off[0][0])
    return {
        "tiny_experts": Number(tiny.moe_experts),
        "tiny_top_k": Number(tiny.moe_top_k),
        "tiny_params": Number(param_count(tiny), source="flops.param_count"),
        "tiny_active": Number(param_count(tiny, active=True), source="flops.param_count(active=True)"),
        "routing_steps": Number(ROUTING_STEPS),
        "routing_half": Number(half),
        "bias_rate": Number(BIAS_RATE, "{:g}"),
        "copies_per_layer": Number(copies, source=src),
        "imbalance_off": Number(mean_imbalance(off, half), "{:.2f}", source=src),
        "imbalance_on": Number(mean_imbalance(on, half), "{:.2f}", source=src),
        "imbalance_worst": Number(max(imbalance(layer) for step in off for layer in step),
                                  "{:.2f}", source=src),
        "hot_rank_load": Number(busiest_rank_load(tiny.moe_experts, 4, HOT_EXPERT), "{:.2f}",
                                source="costmodel.experts.busiest_rank_load(8, 4, 2)"),
    }


def numbers() -> dict[str, Number]:
    return {**_reported(), **_derived(), **_bytes(), **_tiny(), **_cost_model()}
