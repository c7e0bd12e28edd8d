"""FLOP counts, parameter counts, MFU and the data sheets' peaks, against numbers worked out by hand."""
from __future__ import annotations

import json
import math

import pytest

from minipar.plan import costmodel as cm
from minipar.plan import datasheets, flops
from minipar.runtime import peak
from minipar.plan.config import ModelConfig, ParallelConfig

L405 = ModelConfig.preset("llama3-405b")


def test_405b_parameter_count_by_hand():
    # 126 layers of: q and o 16384 x 16384, k and v 16384 x (8 x 128), three 16384 x 53248
    # SwiGLU matrices, two norm gains; plus the 128256 x 16384 embedding and (untied) head.
    layer = 2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384
    total = 126 * layer + 16384 + 2 * 128256 * 16384
    assert flops.param_count(L405) == total == 405_853_388_800        # "405B"
    assert flops.param_count(L405, embeddings=False) == total - 128256 * 16384


def test_published_sizes_of_the_smaller_llamas():
    # Meta's model cards: 8.03B and 70.6B parameters.
    assert flops.param_count(ModelConfig.preset("llama3-8b")) == pytest.approx(8.03e9, rel=2e-3)
    assert flops.param_count(ModelConfig.preset("llama3-70b")) == pytest.approx(70.6e9, rel=2e-3)


def test_param_count_matches_the_reference_model():
    # The independent reference: count the tensors minipar's model actually allocates.
    from minipar.trainer.model import Transformer

    for cfg in (ModelConfig.preset("tiny"), ModelConfig(n_layers=2, tie_embeddings=True)):
        model = Transformer(cfg, seed=None)
        held = sum(p.numel() for p in model.parameters())    # a tied weight is yielded once
        assert flops.param_count(cfg) == held
        table = cfg.vocab_size * cfg.dim
        expected_n = held if cfg.tie_embeddings else held - table
        assert flops.param_count(cfg, embeddings=False) == expected_n


def test_405b_flops_per_token_at_8k():
    # The hand numbers: ~2.43e12 for 6N (6 x 405e9) + 12 x 126 x 16384 x 8192 = 2.03e11.
    dense = flops.dense_flops_per_token(L405)
    attention = flops.attention_flops_per_token(L405, 8192)
    assert dense == pytest.approx(2.43e12, rel=0.01)
    assert attention == 12 * 126 * 16384 * 8192 == pytest.approx(2.0e11, rel=0.02)
    assert flops.flops_per_token(L405, 8192) == dense + attention
    # at 131,072 tokens the attention square dominates: 16x the 8K term
    assert flops.attention_flops_per_token(L405, 131072) == 16 * attention


def test_hardware_flops_with_recompute():
    s = 4096
    model_flops = flops.flops_per_token(L405, s)
    attention = flops.attention_flops_per_token(L405, s)
    assert flops.hardware_flops_per_token(L405, s, "none") == model_flops
    # selective: the attention core's forward again (a third of its forward + backward)
    assert flops.hardware_flops_per_token(L405, s, "selective") == pytest.approx(model_flops + attention / 3)
    # full: the whole forward again: fwd is 1/3 of fwd + bwd, so 4/3 of the model FLOPs
    assert flops.hardware_flops_per_token(L405, s, "full") == pytest.approx(model_flops * 4 / 3)
    # an unknown mode: `ParallelConfig` names the flag; a direct call, the key
    with pytest.raises(ValueError, match="--recompute 'some'"):
        ParallelConfig(recompute="some").validate(L405, s, 8)
    with pytest.raises(KeyError, match="some"):
        flops.hardware_flops_per_token(L405, s, "some")


def test_mfu_definition():
    per_token = flops.flops_per_token(L405, 8192)
    # 8 GPUs doing exactly half their peak worth of model FLOPs
    tps = 0.5 * 8 * 989e12 / per_token
    assert flops.mfu(tps, L405, 8192, 989e12, n_devices=8) == pytest.approx(0.5)
    assert flops.mfu(tps, L405, 8192, None) is None
    assert flops.hfu(tps, L405, 8192, 989e12, 8, recompute="full") == pytest.approx(0.5 * 4 / 3)
    # Llama 3's Table 4, row 1 in its own units: 430 TFLOP/s per GPU on 989 = 43%
    assert 430 / 989 == pytest.approx(0.43, abs=0.005)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989.4e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA GH200 480GB", 989.4e12), ("Tesla V100-SXM2-16GB", 125e12),
])
def test_gpu_peak_table(name, peak):
    assert datasheets.find(name).peak_flops() == peak


def test_gpu_peak_table_unknown_and_fp32():
    assert datasheets.find("Imaginary GPU 9000") is None
    assert datasheets.find("NVIDIA A100-SXM4-40GB").peak_flops("fp32") == 19.5e12


def test_one_table_of_data_sheets():
    # the H100 SXM: 132 SMs x 4,096 dense bf16 FLOP per clock x 1,830 MHz = 989.4 TFLOP/s
    assert datasheets.H100.peak_flops() == pytest.approx(132 * 4096 * 1.83e9, rel=1e-4)
    # Llama 3's cluster, the cost model's `--gpu h100` and the measuring GPU (an H200, the
    # same die) all read their numbers off the one table
    for cluster in (cm.LLAMA3_CLUSTER, cm.gpu_cluster("h100")):
        assert cluster.peak_tflops == datasheets.H100.bf16_tflops
        assert (cluster.hbm_gb, cluster.hbm_TBps) == (datasheets.H100.hbm_gb, datasheets.H100.hbm_TBps)
        assert cluster.intra_node_GBps == datasheets.H100.nvlink_GBps
    assert cm.constants.MEASURED_PEAK_TFLOPS == datasheets.SHEETS["H200"].bf16_tflops
    assert set(cm.GPU_NAMES) == {k.lower() for k, s in datasheets.SHEETS.items() if s.gpus_per_server}


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_CPU_PEAK", {})
    calls = []
    monkeypatch.setattr(peak, "measure_matmul_flops", lambda seconds=0.5: calls.append(1) or 1.5e10)
    assert peak.peak_flops("cpu") == 1.5e10
    assert peak.peak_flops("cpu") == 1.5e10          # in-process cache
    assert len(calls) == 1
    cached = json.loads((tmp_path / "cpu_peak_flops.json").read_text())
    assert list(cached.values()) == [1.5e10]
    (key,) = cached
    assert "threads=" in key                           # keyed by CPU model and thread count
    monkeypatch.setattr(peak, "_CPU_PEAK", {})         # a new process: the file cache answers
    assert peak.peak_flops("cpu") == 1.5e10
    assert len(calls) == 1


def test_matmul_benchmark_is_plausible():
    # any CPU of the last decade does more than 0.1 GFLOP/s and less than 100 TFLOP/s in fp32
    rate = peak.measure_matmul_flops(seconds=0.05, n=256)
    assert 1e8 < rate < 1e14 and math.isfinite(rate)


def test_a_mixture_of_experts_split_over_ep_ranks_adds_up_to_the_whole():
    # DeepSeek-V3's 61 blocks, the first 3 dense: every weight once when the non-expert part
    # of all blocks and each of ep ranks' experts are added up
    m = ModelConfig.preset("deepseek-v3")
    assert flops.moe_layer_count(m, range(m.n_layers)) == 58
    assert flops.moe_layer_count(m, range(0, 4)) == 1
    rest = flops.local_param_count(m, 1, m.n_layers, True, True, moe_layers=58)
    for ep in (1, 8, 64, 256):
        assert rest + ep * flops.local_expert_param_count(m, 1, ep, 58) == flops.param_count(m)
    # a dense model is untouched by the expert arguments
    assert flops.local_param_count(L405, 8, 8, False, False, moe_layers=0) == \
        flops.local_param_count(L405, 8, 8, False, False)
