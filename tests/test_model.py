"""The single-device reference: Hugging Face compatible, seeded, layout-independent init."""
import pytest
import torch

from minipar.plan.config import ModelConfig
from minipar.runtime.generate import load_hf_state_dict
from minipar.runtime.hf import hf_name, model_config, to_hf
from minipar.trainer.model import Transformer, causal_attention


def test_stage_weights_equal_full_model_weights():
    cfg = ModelConfig.preset("tiny")
    full = Transformer(cfg, seed=3).state_dict()
    stage = Transformer(cfg, layer_ids=range(4, 8), first=False, last=True, seed=3).state_dict()
    assert set(stage) == {k for k in full if k.startswith(("layers.4.", "layers.5.", "layers.6.",
                                                             "layers.7.", "norm.", "lm_head."))}
    for k, v in stage.items():
        assert torch.equal(v, full[k]), k
    other = Transformer(cfg, seed=4).state_dict()
    assert not torch.equal(other["layers.0.mlp.up_proj.weight"], full["layers.0.mlp.up_proj.weight"])


def test_stages_chained_give_the_full_forward():
    cfg = ModelConfig.preset("tiny")
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    full = Transformer(cfg, seed=0)(x)
    a = Transformer(cfg, layer_ids=range(0, 3), first=True, last=False, seed=0)
    b = Transformer(cfg, layer_ids=range(3, 8), first=False, last=True, seed=0)
    torch.testing.assert_close(b(a(x)), full)


def test_gqa_attention_is_causal_softmax():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    out = causal_attention(q, k, v)
    kk, vv = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vv)
    torch.testing.assert_close(out, want)


def test_hf_model_config_keys():
    hf = {"num_hidden_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
          "num_key_value_heads": 8, "intermediate_size": 53248, "vocab_size": 128256,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072}
    cfg = model_config(hf)
    ref = ModelConfig.preset("llama3-405b")
    for f in ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "rope_theta"):
        assert getattr(cfg, f) == getattr(ref, f), f
    assert model_config(to_hf(ref)).dim == 16384


@pytest.mark.parametrize("tie", [False, True])
def test_hugging_face_round_trip_same_logits(tie):
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=100,
                      max_seq_len=64, rope_theta=10000.0, tie_embeddings=tie)
    hf_cfg = transformers.LlamaConfig(**to_hf(cfg))
    hf_model = transformers.LlamaForCausalLM(hf_cfg).eval()
    ours = Transformer(cfg, seed=None)
    load_hf_state_dict(ours, hf_model.state_dict())
    x = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf_model(x).logits, rtol=1e-5, atol=1e-5)
    # and back: our weights under HF names load into HF's model and give our logits
    mine = Transformer(cfg, seed=7)
    hf2 = transformers.LlamaForCausalLM(hf_cfg).eval()
    missing, unexpected = hf2.load_state_dict(
        {hf_name(k): v for k, v in mine.state_dict().items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    with torch.no_grad():
        torch.testing.assert_close(hf2(x).logits, mine(x), rtol=1e-5, atol=1e-5)
