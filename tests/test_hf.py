"""Hugging Face directories in and out: `--init-hf DIR` in any layout starts from DIR's
weights (each rank reading its slices), `--export-hf` / `python -m minipar.export` write a
directory `LlamaForCausalLM.from_pretrained` loads with the same logits, and bad input is
one line and exit 2 before any rank starts.

The Llama is built offline with transformers (tests/hf_llama.py): GQA, tied and untied
embeddings, saved in many safetensors shards with a tokenizer.json learnt from the book.
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from hf_llama import CORPUS, make_hf_llama
from helpers import assert_same_losses, losses, run_layout
from minipar.runtime import export, hf
from minipar.plan import traces
from minipar.plan.config import ConfigError, ModelConfig
from minipar.trainer.tokens import TokenizedText, make_source
from minipar.runtime.generate import load_hf_state_dict, load_model
from minipar.runtime.hf import hf_name
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer
from minipar.trainer.placement import Shard, local_index
from minipar.runtime.run import main

transformers = pytest.importorskip("transformers")

RUN = dict(global_batch=4, seq_len=32, data=str(CORPUS), lr=1e-3, capture_grads=False)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def hf_dir(request, tmp_path_factory):
    path = make_hf_llama(tmp_path_factory.mktemp("hf") / "llama", tie=request.param)
    assert len(list(path.glob("*.safetensors"))) > 1          # sharded, with an index
    return path


def hf_model(path):
    return transformers.LlamaForCausalLM.from_pretrained(str(path)).eval()


def test_reads_the_same_model_transformers_reads(hf_dir):
    ours = load_model(str(hf_dir)).eval()
    x = torch.randint(0, 320, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf_model(hf_dir)(x).logits, rtol=1e-5, atol=1e-5)


def test_read_piece_is_the_slice_a_tp_and_zero_rank_holds(hf_dir):
    """read_piece: a TP rank's columns (`local_index`) and of them a flat range, as
    get_slice reads them."""
    from safetensors import safe_open
    name = "model.layers.1.mlp.down_proj.weight"          # row-parallel: TP splits dim 1
    with safe_open(str(hf_dir / json.loads((hf_dir / hf.INDEX).read_text())["weight_map"][name]),
                   "pt") as f:
        full = f.get_tensor(name)
        local = full.chunk(2, dim=1)[1]
        index = local_index(full.shape, {"tp": Shard(1)}, ProcessGrid(tp=2, rank=1).axes)
        piece = hf.read_piece(f.get_slice(name), index, 70, 333)
    torch.testing.assert_close(piece, local.reshape(-1)[70:333])


def test_tokenizer_json_tokenizes_data(hf_dir):
    src = make_source(str(CORPUS), 320, 0, hf.tokenizer_file(str(hf_dir)))
    assert isinstance(src, TokenizedText)
    ids = src.tokenizer.encode(CORPUS.read_text(), add_special_tokens=False).ids
    assert src.data.tolist() == ids and len(ids) < CORPUS.stat().st_size     # merges: fewer than bytes


@pytest.mark.slow
def test_init_hf_in_every_layout_gives_the_single_device_loss(hf_dir):
    path = str(hf_dir)
    ref = run_layout(steps=2, init_hf=path, **RUN)
    # step 0's loss is the Hugging Face model's own loss on the same tokens
    batch = make_source(RUN["data"], 320, 0, hf.tokenizer_file(path)).batch(0, 4, 32)
    with torch.no_grad():
        logits = hf_model(hf_dir)(batch[:, :-1]).logits
    want = F.cross_entropy(logits.reshape(-1, 320), batch[:, 1:].reshape(-1)).item()
    assert losses(ref)[0] == pytest.approx(want, rel=1e-5)
    layouts = [dict(tp=2), dict(pp=2), dict(cp=2), dict(dp=2, zero=3)]
    if hf.read_config(path).tie_embeddings:   # the tied head: last stage, TP-split
        layouts = [dict(tp=2, pp=2)]
    for layout in layouts:
        assert_same_losses(run_layout(steps=2, init_hf=path, **layout, **RUN), ref)


@pytest.mark.slow
def test_export_round_trip_same_logits(hf_dir, tmp_path):
    """Train in a layout, export at the end (--export-hf) and from the checkpoint
    (python -m minipar.export): transformers reads both with minipar's logits."""
    out, ckpt, out2 = tmp_path / "out", tmp_path / "ckpt", tmp_path / "out2"
    run_layout(steps=2, init_hf=str(hf_dir), export_hf=str(out), save=str(ckpt), tp=2, pp=2,
               profile=str(tmp_path / "prof"), **RUN)
    assert (out / "tokenizer.json").is_file()
    trace = json.loads(traces.trace_path(str(tmp_path / "prof")).read_text())
    assert trace["otherData"]["minipar"]["model"] == f"--init-hf {hf_dir}"   # not the preset
    mcfg, state, _ = export.checkpoint_state(str(ckpt))
    ours = Transformer(mcfg, seed=None).eval()
    load_hf_state_dict(ours, {hf_name(k): v for k, v in state.items()})
    start = load_model(str(hf_dir))
    assert not torch.equal(ours.layers["0"].mlp.up_proj.weight, start.layers["0"].mlp.up_proj.weight)
    assert export.main(["--resume", str(ckpt), "--out", str(out2)]) == 0
    x = torch.randint(0, 320, (2, 16))
    with torch.no_grad():
        want = ours(x)
        for d in (out, out2):
            got = hf_model(d)(x).logits
            assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5


def test_llama3_rope_scaling_in_and_out(tmp_path):
    """Llama 3.1's RoPE scaling (`rope_type: llama3`): read, same logits, written back."""
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=16)
    path = make_hf_llama(tmp_path / "llama31", tokenizer=False, rope_scaling=rope, rope_theta=500.0)
    ours = load_model(str(path)).eval()
    assert ours.cfg.llama3_rope == (8.0, 1.0, 4.0, 16)
    out = hf.save_pretrained(ours.state_dict(), ours.cfg, str(tmp_path / "out"))
    x = torch.randint(0, 320, (1, 100))
    with torch.no_grad():
        want = hf_model(path)(x).logits
        torch.testing.assert_close(ours(x), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hf_model(out)(x).logits, want, rtol=1e-5, atol=1e-5)
        plain = Transformer(dataclasses.replace(ours.cfg, rope_factor=1.0), seed=None)
        plain.load_state_dict(ours.state_dict())
        assert not torch.allclose(plain(x), want, rtol=1e-3, atol=1e-3)   # the scaling matters


# ---------------------------------------------------------------- bad input
def _edit_config(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


def _drop_a_shard(path):
    files = sorted(path.glob("model-*.safetensors"))
    files[1].unlink()
    return files[1].name


def _wrong_shape(path):
    from safetensors.torch import load_file, save_file
    index = json.loads((path / hf.INDEX).read_text())["weight_map"]
    file = path / index["model.norm.weight"]
    tensors = load_file(str(file))
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return "model.norm.weight has shape [65]"


def _single_file(path):
    for f in path.glob("model*.safetensors*"):
        f.unlink()
    return "neither model.safetensors nor model.safetensors.index.json"


BAD = [
    ("no directory", lambda p: shutil.rmtree(p) or "no such directory"),
    ("no config.json", lambda p: (p / "config.json").unlink() or "no config.json"),
    ("no weights", _single_file),
    ("absent shard", lambda p: f"{_drop_a_shard(p)} is named by model.safetensors.index.json but absent"),
    ("wrong shape", _wrong_shape),
    ("architecture", lambda p: _edit_config(p, model_type="mistral") or "model_type='mistral' is not supported"),
    ("hidden_act", lambda p: _edit_config(p, hidden_act="gelu") or "hidden_act='gelu'"),
    ("rope scaling", lambda p: _edit_config(p, rope_parameters={"rope_type": "yarn", "factor": 8.0})
     or "rope_type='yarn' is not supported"),
    ("attention bias", lambda p: _edit_config(p, attention_bias=True) or "attention_bias=True"),
    ("head_dim", lambda p: _edit_config(p, head_dim=16) or "head_dim=16"),
]


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    return make_hf_llama(tmp_path_factory.mktemp("good") / "llama", tokenizer=False)


@pytest.mark.parametrize("case,breaks", BAD, ids=[c for c, _ in BAD])
def test_bad_directory_exits_2_with_one_line(case, breaks, good_dir, tmp_path, capsys):
    path = shutil.copytree(good_dir, tmp_path / "llama")
    message = breaks(path)
    code = main(["--init-hf", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "--init-hf" in err
    assert len(err.strip().splitlines()) == 1, err


def test_model_config_names_every_unsupported_field():
    cfg = hf.to_hf(ModelConfig())
    cfg.update(mlp_bias=True, architectures=["GemmaForCausalLM"], attention_dropout=0.1)
    with pytest.raises(ConfigError) as e:
        hf.model_config(cfg)
    for field in ("mlp_bias", "architectures", "attention_dropout"):
        assert field in str(e.value)
    assert hf.model_config(hf.to_hf(ModelConfig())) == ModelConfig(name="hf")
