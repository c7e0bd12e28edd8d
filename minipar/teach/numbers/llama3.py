"""The numbers the llama3 chapter states (book/llama3.md), computed once: the case study's
facts, each with where it comes from (see core.py)."""
from __future__ import annotations


from ...plan.config import ModelConfig
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.table4 import TABLE4
from ...plan.flops import layer_param_count, param_count
from ...plan.formulas.collectives import wire_bytes
from ...plan.formulas.context_parallel import cp_kv_bytes
from ...plan.formulas.memory import activation_elements
from ...plan.formulas.tensor_parallel import tp_layer_bytes
from ...plan.memory import BF16_MIXED
from .core import Number, assumed, derived, paper


def _layer_flops_per_gpu(m: ModelConfig, seq: int, tp: int) -> float:
    """One block, one sequence, one of tp GPUs: (6 N_layer + 12 h s) FLOPs per token (PaLM's)."""
    return (6 * layer_param_count(m) + 12 * m.dim * seq) * seq / tp


def _facts() -> dict[str, Number]:
    """Llama 3 405B's facts the parallelism chapters share (added by the TP/PP chapters)."""
    m, row1, row2 = ModelConfig.preset("llama3-405b"), TABLE4[0], TABLE4[1]
    flops = _layer_flops_per_gpu(m, row1.seq_len, row1.tp)
    return {
        "layers": paper(m.n_layers, source="Table 3"),
        "dim": paper(m.dim, source="Table 3"),
        "heads": paper(m.n_heads, source="Table 3"),
        "kv_heads": paper(m.n_kv_heads, source="Table 3"),
        "vocab": Number(m.vocab_size, source="the released tokenizer (Hugging Face config.json "
                        "vocab_size): the paper's 128,000 tokens and 256 special tokens"),
        "vocab_paper": paper(128_000, source="Table 3: vocabulary size 128,000"),
        "seq": paper(row1.seq_len, source="Table 4"),
        "tp": paper(row1.tp, source="Table 4"),
        "pp": paper(row1.pp, source="Table 4"),
        "row1_gpus": paper(row1.gpus, source="Table 4"),
        "row1_dp": paper(row1.dp, source="Table 4"),
        "row2_dp": paper(row2.dp, source="Table 4"),
        "row1_tflops": paper(row1.tflops_per_gpu, "{:,} TFLOP/s", source="Table 4"),
        "row2_tflops": paper(row2.tflops_per_gpu, "{:,} TFLOP/s", source="Table 4"),
        "batch_tokens": paper(TABLE4_BATCH_TOKENS / 2**20, "{:.0f}M", source="Section 3.4.1"),
        "batch_seqs": derived(TABLE4_BATCH_TOKENS // row1.seq_len, source="16M tokens / 8K"),
        "gpus_per_server": paper(LLAMA3_CLUSTER.gpus_per_node, source="Section 3.3.1"),
        "nic_Gbps": paper(LLAMA3_CLUSTER.inter_node_Gbps, "{:.0f} Gb/s", source="Section 3.3.1"),
        "nic_GBps": derived(LLAMA3_CLUSTER.inter_node_GBps, "{:.0f} GB/s", source="400 Gb/s / 8"),
        "pod_gpus": paper(LLAMA3_CLUSTER.pod_size, source="Section 3.3.1"),
        "pod_oversubscription": paper(LLAMA3_CLUSTER.pod_oversubscription, "1:{:.0f}",
                                      source="Section 3.3.1"),
        "row3_dp": paper(TABLE4[2].dp, source="Table 4"),
        "row3_cp": paper(TABLE4[2].cp, source="Table 4"),
        "row3_seq": paper(TABLE4[2].seq_len, source="Table 4"),
        "gpus_per_rack": paper(LLAMA3_CLUSTER.gpus_per_rack, source="Section 3.3.1"),
        "cpus_per_server": paper(2, source="Section 3.3.1: eight GPUs and two CPUs per server"),
        "racks_per_pod": paper(LLAMA3_CLUSTER.pod_size // LLAMA3_CLUSTER.gpus_per_rack,
                               source="Section 3.3.1: 192 racks of 16 GPUs form a pod"),
        "cluster_gpus": paper(LLAMA3_CLUSTER.n_gpus, source="Section 3.3.1: 24K GPUs"),
        "nvlink_GBps": assumed(LLAMA3_CLUSTER.intra_node_GBps, "{:.0f} GB/s",
                               source="H100 SXM data sheet: NVLink 4, 900 GB/s both ways"),
        "layer_flops_per_gpu": derived(flops, "{:.1e}", source="(6 N_layer + 12 h s) s / tp"),
        "layer_compute_ms": derived(flops / (row1.tflops_per_gpu * 1e12) * 1e3, "{:.0f} ms",
                                    source="one layer and 8K sequence per GPU at row 1's 430 TFLOP/s"),
    }


SECONDS_PER_YEAR = 365.25 * 24 * 3600
HBM_GB = 80              # the paper's "80GB HBM3": the product's name; the divisor is
#                          what nvidia-smi reports (HBM_BYTES), the one HBM figure of the book
NVIDIA_SMI_MIB = 81_559  # nvidia-smi's total memory of an H100 SXM 80GB
HBM_BYTES = NVIDIA_SMI_MIB * 2**20
TYPICAL_MFU = 0.4
TRAIN_TOKENS = 15.6e12    # Section 3.1.1 ... "15.6T tokens"


def _layouts() -> dict[str, Number]:
    """Table 4, every row: the layout, the sequence, what it achieved."""
    out = {}
    for i, row in enumerate(TABLE4, start=1):
        p = f"row{i}_"
        for axis in ("gpus", "tp", "cp", "pp", "dp"):
            out[p + axis] = paper(getattr(row, axis), source="Table 4")
        out[p + "seq"] = paper(row.seq_len, source="Table 4")
        out[p + "tflops"] = paper(row.tflops_per_gpu, "{:,} TFLOP/s", source="Table 4")
        out[p + "mfu"] = paper(row.mfu, "{:.0%}", source="Table 4")
        out[p + "seqs_per_replica"] = derived(TABLE4_BATCH_TOKENS // (row.seq_len * row.dp),
                                              source="16M tokens / (seq x DP)")
        out[p + "replica_gpus"] = derived(row.tp * row.cp * row.pp, source="TP x CP x PP")
    return out


def _model_size(m: ModelConfig) -> dict[str, Number]:
    """Counting the 405B's weights from its shape (Table 3), and what they weigh."""
    h, kv = m.dim, m.n_kv_heads * m.head_dim
    n, layer = param_count(m), layer_param_count(m)
    return {
        "params_b": paper(405, source="Table 3: 405B"),
        "ffn": paper(m.ffn_dim, source="Table 3"),
        "head_dim": derived(m.head_dim, source="16,384 / 128 heads"),
        "layer_qo_b": derived(2 * h * h / 1e9, "{:.2f} billion", "2 h^2"),
        "layer_kv_b": derived(2 * h * kv / 1e9, "{:.2f} billion", "2 h x 8 x 128"),
        "layer_ffn_b": derived(3 * h * m.ffn_dim / 1e9, "{:.2f} billion", "3 h x ffn"),
        "layer_params_b": derived(layer / 1e9, "{:.2f} billion", "flops.layer_param_count"),
        "embed_b": derived(m.vocab_size * h / 1e9, "{:.1f} billion", "vocab x h"),
        "param_count": derived(n, source="flops.param_count"),
        "matmul_params_b": derived(param_count(m, embeddings=False) / 1e9, "{:.2f} billion",
                                   "flops.param_count(embeddings=False)"),
        "hbm_gb": paper(HBM_GB, "{} GB", source="Section 3.3.1: 80GB HBM3"),
        "gpu_watts": paper(700, "{} W", source="Section 3.3.1: 700W TDP"),
        "peak_tflops": assumed(LLAMA3_CLUSTER.peak_tflops, "{:,.0f} TFLOP/s",
                               source="H100 SXM data sheet, dense bf16 (the paper gives no peak)"),
    }


def _activations(m: ModelConfig, seq: int) -> dict[str, Number]:
    """One sequence's activations in bf16, no split of a layer, by the fused count the book
    uses for Llama 3 (flash attention, fused norms: `formulas.memory.activation_elements`,
    the cost model's count); the paper names no kernels, so the count is an assumption."""
    layer = activation_elements(m, 1, False, "none") * seq * BF16_MIXED.act_bytes
    total = layer * m.n_layers
    return {
        "act_layer_gb": assumed(layer / 1e9, "{:.2f} GB",
                                "formulas.memory.activation_elements (fused kernels), s = 8,192"),
        "act_seq_gb": assumed(total / 1e9, "{:,.0f} GB",
                              "formulas.memory.activation_elements (fused kernels) x 126 layers",
                              quantity="seq_activations"),
        "act_seq_gpus": derived(int(total / HBM_BYTES), source="/ nvidia-smi's 85.5 GB"),
        "act_per_sh": derived(activation_elements(m, 1, False, "none") * BF16_MIXED.act_bytes / m.dim,
                              "{:.1f}", "bytes per token and layer / h, fused count"),
    }


def _compute(m: ModelConfig) -> dict[str, Number]:
    """How long the run's arithmetic takes: 6 N D, on one GPU and on the cluster."""
    row2, peak = TABLE4[1], LLAMA3_CLUSTER.peak_flops
    total = 6 * param_count(m) * TRAIN_TOKENS
    return {
        "train_tokens_t": paper(TRAIN_TOKENS / 1e12, "{:.1f} trillion", "Section 3: 15.6T tokens"),
        "train_flops": paper(3.8e25, "{:.1e}", "Section 3.2.1: 3.8 x 10^25 FLOPs"),
        "six_nd": derived(total, "{:.1e}", "6 N D"),
        "one_gpu_years": derived(total / peak / SECONDS_PER_YEAR, "{:,.0f}", "6ND / peak"),
        "typical_mfu": assumed(TYPICAL_MFU, "{:.0%}", "about what large runs reach (Table 4: 38-43%)"),
        "one_gpu_years_40": derived(total / (TYPICAL_MFU * peak) / SECONDS_PER_YEAR, "{:,.0f}",
                                    "6ND / (40% of peak)"),
        "cluster_days": derived(total / (row2.gpus * row2.tflops_per_gpu * 1e12) / 86400, "{:.0f}",
                                "6ND / (16,384 GPUs x 400 TFLOP/s)"),
    }


def _axes(m: ModelConfig) -> dict[str, Number]:
    """What one GPU sends per layer (TP, CP), per chunk boundary (PP) and per step (DP):
    the four axes' table, from the formulas the axis files are tested against."""
    row2, row3, act = TABLE4[1], TABLE4[2], BF16_MIXED.act_bytes
    seq = row2.seq_len
    a = seq * m.dim * act                                   # one [s, h] activation in bf16
    tp_layer = tp_layer_bytes(seq, m.dim, row2.tp, act)
    kv_heads = m.n_kv_heads // row3.tp
    kv_all = cp_kv_bytes(row3.seq_len, m.n_kv_heads, m.head_dim, act)
    kv_gpu = cp_kv_bytes(row3.seq_len // row3.cp, kv_heads, m.head_dim, act)
    local = param_count(m) / (row2.tp * row2.pp)
    return {
        "act_gb": derived(a / 1e9, "{:.2f} GB", "[8192, 16384] in bf16"),
        "tp_layer_gb": derived(tp_layer / 1e9, "{:.1f} GB", "formulas.tensor_parallel.tp_layer_bytes, TP8"),
        "kv_seq_gb": derived(kv_all / 1e9, "{:.2f} GB", "K and V of all 131,072 tokens, 8 KV heads"),
        "kv_gpu_mb": derived(kv_gpu / 1e6, "{:.1f} MB", "one GPU's K, V: s/16 tokens, 8/8 KV heads"),
        "pp_send_gb": derived(a / 1e9, "{:.2f} GB", "one boundary, one micro-batch, no SP"),
        "pp_send_sp_mb": derived(a / row2.tp / 1e6, "{:.0f} MB", "with SP: each TP rank its 1/8"),
        "layers_per_stage": derived(m.n_layers / row2.pp, "{:.1f}", "126 / 16"),
        "dp_local_b": derived(local / 1e9, "{:.1f} billion", "N / (TP x PP)"),
        "weights_per_gpu_gb": derived(local * 2 / 1e9, "{:.1f} GB", "bf16, N / (TP x PP)"),
    }


def _expert_parallel(m: ModelConfig) -> dict[str, Number]:
    """What a fifth axis would send: an MoE layer's token all-to-alls (dispatch and
    combine, forward and backward) for one 8K sequence with top-k routing over EP GPUs."""
    top_k, ep, act = 2, 8, BF16_MIXED.act_bytes
    routed = top_k * TABLE4[0].seq_len * m.dim * act
    sent = 4 * wire_bytes("all_to_all", ep, routed)
    return {
        "ep_top_k": assumed(top_k, source="a typical MoE's top-2 routing"),
        "ep_degree": assumed(ep, source="one server of experts"),
        "ep_layer_gb": derived(sent / 1e9, "{:.1f} GB", "4 all-to-alls of k s h bf16, (EP-1)/EP each"),
    }


def _case_study() -> dict[str, Number]:
    m = ModelConfig.preset("llama3-405b")
    return {**_layouts(), **_model_size(m), **_activations(m, TABLE4[0].seq_len), **_compute(m),
            **_axes(m), **_expert_parallel(m),
            "diurnal": paper("1–2%", "{}", "Section 3.3.4"),
            "layout_order": paper("[TP, CP, PP, DP]", "{}", "Section 3.3.2")}


def numbers() -> dict[str, Number]:
    """The case study's facts and what the book derives from them; `_facts()` holds the keys
    other chapters added (one key per quantity: reuse before adding)."""
    facts, case = _facts(), _case_study()
    clash = [k for k in case if k in facts and case[k] != facts[k]]
    assert not clash, f"numbers.llama3: two values for {clash}"
    return {**case, **facts, "gpus": paper(TABLE4[1].gpus, source="Table 4")}
