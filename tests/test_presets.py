"""Model presets are the published models' shapes (torch-free: config and formulas only)."""
import dataclasses
import subprocess
import sys

import pytest

from minipar.plan.flops import param_count
from minipar.plan.config import ModelConfig

# The fields of meta-llama/Llama-3.2-1B's config.json that describe the shape.
LLAMA32_1B_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def test_llama32_1b_preset_is_its_config_json():
    from minipar.runtime import hf
    want = dataclasses.replace(hf.model_config(LLAMA32_1B_CONFIG_JSON), name="llama3.2-1b")
    assert ModelConfig.preset("llama3.2-1b") == want
    assert want.llama3_rope == (32.0, 1.0, 4.0, 8192)     # the long-context RoPE, not plain


def test_llama32_1b_has_1_24_billion_parameters():
    m = ModelConfig.preset("llama3.2-1b")
    hd = m.dim // m.n_heads
    by_hand = (m.vocab_size * m.dim                                 # one table: tied
               + m.n_layers * (2 * m.dim * m.n_heads * hd          # q, o
                               + 2 * m.dim * m.n_kv_heads * hd     # k, v
                               + 3 * m.dim * m.ffn_dim             # gate, up, down
                               + 2 * m.dim)                        # two RMSNorm gains
               + m.dim)                                            # final norm
    assert param_count(m) == by_hand
    # Meta's model card: 1.23B; its safetensors hold 1,235,814,400 numbers
    assert by_hand == pytest.approx(1.2358e9, rel=1e-4)
    # the N of 6N keeps the tied table (it is the output head's matmul)
    assert param_count(m, embeddings=False) == by_hand


def test_the_count_needs_no_torch(repo_root):
    code = ("import sys; from minipar.plan import flops; from minipar.plan.config import ModelConfig; "
            "n = flops.param_count(ModelConfig.preset('llama3.2-1b')); "
            "assert 'torch' not in sys.modules; print(n)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == param_count(ModelConfig.preset("llama3.2-1b"))
