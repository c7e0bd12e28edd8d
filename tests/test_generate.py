"""`python -m minipar.generate`: the KV cache gives the logits of a full forward, greedy
decoding equals transformers' `generate` token for token, sampling is seeded, and the text
streams without splitting a character."""
from __future__ import annotations

import pytest
import torch

from hf_llama import make_hf_llama
from minipar.plan.config import ModelConfig
from minipar.runtime.generate import Codec, generate, main, pick, stream
from minipar.runtime.generate import KVCache, load_model
from minipar.trainer.model import Transformer, causal_attention

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_hf_llama(tmp_path_factory.mktemp("gen") / "llama")


def test_cache_gives_the_full_forward_logits():
    model = Transformer(ModelConfig(n_layers=2), seed=3).eval()
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        with KVCache(model) as cache:
            steps = [cache(x[:, :5])] + [cache(x[:, t:t + 1]) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(x), rtol=1e-5, atol=1e-5)
    assert cache.length == 12 and cache.layers["1"].k.shape[1] == 12
    assert all(b.self_attn.core is causal_attention for b in model.layers.values())


def test_greedy_equals_transformers_generate(hf_dir):
    ours = load_model(str(hf_dir)).eval()
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(hf_dir)).eval()
    prompt = [5, 17, 200, 3, 99]
    got = list(generate(ours, prompt, max_new_tokens=20, temperature=0))
    with torch.no_grad():
        want = theirs.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                               min_new_tokens=20)[0, len(prompt):].tolist()
    assert got == want


def test_sampling_is_seeded_and_top_k_1_is_greedy(hf_dir):
    model = load_model(str(hf_dir)).eval()
    prompt = [1, 2, 3]
    a = list(generate(model, prompt, 15, temperature=1.0, seed=4))
    assert a == list(generate(model, prompt, 15, temperature=1.0, seed=4))
    assert a != list(generate(model, prompt, 15, temperature=1.0, seed=5))
    assert list(generate(model, prompt, 15, temperature=0.7, top_k=1)) == \
        list(generate(model, prompt, 15, temperature=0))


def test_top_k_samples_only_the_k_most_likely():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    seen = {int(pick(logits, 5.0, 2, g)) for _ in range(200)}
    assert seen == {1, 3}


def test_stream_holds_back_half_a_character():
    codec = Codec()
    ids = list("héllo ✓".encode())
    pieces = list(stream(codec, iter(ids)))
    assert "".join(pieces) == "héllo ✓"
    assert all("\ufffd" not in p for p in pieces)


def test_command_streams_text_and_bad_input_exits_2(hf_dir, capsys):
    assert main(["--init-hf", str(hf_dir), "--prompt", "Pipeline", "--max-new-tokens", "8",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Pipeline") and len(out) > len("Pipeline\n")
    for argv, message in [(["--init-hf", "/no/such/dir"], "--init-hf /no/such/dir: no such directory"),
                          (["--init-hf", str(hf_dir), "--temperature", "-1"], "--temperature -1.0 must be >= 0"),
                          (["--resume", "/no/such/ckpt"], "--resume /no/such/ckpt: no such directory")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
