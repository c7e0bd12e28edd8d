"""A Hugging Face Mixtral in and out: `--init-hf DIR` reads a `MixtralForCausalLM` directory
into minipar's mixture of experts with transformers' logits, in any layout (each EP and TP
rank reading its experts' slices); `--export-hf` and `python -m minipar.export` write one
transformers loads with the same logits; a tampered directory is one line and exit 2,
naming the file, before any rank starts.

The Mixtral is built offline with transformers (tests/hf_llama.py) and saved in many
shards, in the layout transformers writes and the Hub holds (`block_sparse_moe`, a tensor
per expert matrix). The gloo worlds are launched once, by the `runs` fixture.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from hf_llama import CORPUS, make_hf_mixtral
from helpers import assert_same_losses, losses, run_layout
from minipar.plan.config import ConfigError, ModelConfig
from minipar.runtime import export, generate, hf, preflight
from minipar.runtime.run import main
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer
from minipar.trainer.placement import Shard, local_index
from minipar.trainer.tokens import make_source

transformers = pytest.importorskip("transformers")

RUN = dict(global_batch=4, seq_len=32, data=str(CORPUS), lr=1e-3)
# EP carved from DP with ZeRO-1 (expert pieces reduced over their own group), and TP
# cutting every expert on top of EP
LAYOUTS = {"ep2_dp2_zero1": dict(ep=2, dp=2, zero=1), "tp2_ep2_dp2": dict(tp=2, ep=2, dp=2)}


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    path = make_hf_mixtral(tmp_path_factory.mktemp("hf") / "mixtral")
    assert len(list(path.glob("*.safetensors"))) > 1          # sharded, with an index
    return path


def hf_model(path):
    return transformers.MixtralForCausalLM.from_pretrained(str(path)).eval()


def read(path) -> Transformer:
    """The single-device model, each weight read by `hf.load_weights` as a rank reads it."""
    mcfg = hf.read_config(str(path))
    hf.check_dir(str(path), mcfg)
    model = Transformer(mcfg, seed=None)
    hf.load_weights(str(path), [model], mcfg, lambda p: p, ProcessGrid().axes)
    return model.eval()


def stored(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return {k: v for f in set(hf.weight_files(str(path)).values()) for k, v in load_file(f).items()}


def test_reads_the_same_model_transformers_reads(mixtral_dir):
    """Mixtral's routing (softmax over all E, top k, renormalised) is `MoE.route`'s."""
    mcfg = hf.read_config(str(mixtral_dir))
    assert (mcfg.moe_experts, mcfg.moe_top_k, mcfg.expert_ffn_dim, mcfg.rope_theta) == \
        (4, 2, 96, 10000.0) and mcfg.mixtral
    ours = read(mixtral_dir)
    x = torch.randint(0, 320, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf_model(mixtral_dir)(x).logits, rtol=1e-5, atol=1e-5)
    # the whole directory at once (generation's way) is the same model
    whole = Transformer(mcfg, seed=None)
    whole.load_state_dict(generate.minipar_state(stored(mixtral_dir), whole))
    generated = generate.load_model(str(mixtral_dir))          # python -m minipar.generate's
    for name, t in ours.state_dict().items():
        assert torch.equal(t, whole.state_dict()[name]), name
        assert torch.equal(t, generated.state_dict()[name]), name


def test_an_ep_and_tp_rank_reads_its_experts_slice(mixtral_dir):
    """`Stacked`: expert e's tensor is row e of minipar's stacked weight; EP rank 1 of 2 and
    TP rank 1 of 2 read their part, and of it a ZeRO-like flat range across both experts."""
    mcfg, name = hf.read_config(str(mixtral_dir)), "layers.1.mlp.experts.gate_proj"
    tensors = stored(mixtral_dir)
    full = torch.stack([tensors[f"model.layers.1.block_sparse_moe.experts.{e}.w1.weight"]
                        for e in range(4)])
    axes = ProcessGrid(tp=2, dp=2, ep=2, rank=3).axes
    assert (axes["ep"].rank, axes["tp"].rank) == (1, 1)
    files = hf.weight_files(str(mixtral_dir))
    with contextlib.ExitStack() as stack:
        opened = hf._open_all(stack, files.values())
        sl = hf.Stacked([opened[files[n]].get_slice(n) for n in hf.stored_names(name, mcfg)])
        assert sl.get_shape() == [4, 96, 64]
        index = local_index(full.shape, {"ep": Shard(0), "tp": Shard(1)}, axes)
        piece = hf.read_piece(sl, index, 3000, 3500)
    local = full.chunk(2, dim=0)[1].chunk(2, dim=1)[1]          # experts 2, 3; rows 48:96
    torch.testing.assert_close(piece, local.reshape(-1)[3000:3500])


def test_config_round_trip_and_what_is_no_mixtral(tmp_path):
    mcfg = ModelConfig(moe_experts=4, moe_top_k=2)
    assert hf.model_config(hf.to_hf(mcfg)) == dataclasses.replace(mcfg, name="hf")
    for other in (dict(moe_shared_experts=1), dict(moe_first_layer=1), dict(moe_score="sigmoid"),
                  dict(moe_bias_rate=0.01)):
        with pytest.raises(ConfigError, match="Mixtral"):
            hf.save_pretrained({}, dataclasses.replace(mcfg, **other), str(tmp_path / "out"))
    assert not list(tmp_path.iterdir())                          # refused before writing


# ---------------------------------------------------------------- the worlds, launched once
@pytest.fixture(scope="module")
def runs(mixtral_dir, tmp_path_factory):
    """The single-device run from the directory and each layout's, the last exporting at
    its end (--export-hf) and saving a checkpoint."""
    tmp = tmp_path_factory.mktemp("runs")
    out = {"ref": run_layout(steps=2, init_hf=str(mixtral_dir), **RUN), "tmp": tmp}
    for name, layout in LAYOUTS.items():
        extra = dict(export_hf=str(tmp / "out"), save=str(tmp / "ckpt")) \
            if name == "tp2_ep2_dp2" else {}
        out[name] = run_layout(steps=2, init_hf=str(mixtral_dir), **layout, **extra, **RUN)
    return out


@pytest.mark.slow
def test_init_hf_in_ep_and_tp_layouts_gives_the_single_device_run(runs, mixtral_dir):
    ref = runs["ref"]
    # step 0's loss is transformers' own on the same tokens
    batch = make_source(RUN["data"], 320, 0, None).batch(0, 4, 32)
    with torch.no_grad():
        logits = hf_model(mixtral_dir)(batch[:, :-1]).logits
    want = F.cross_entropy(logits.reshape(-1, 320), batch[:, 1:].reshape(-1)).item()
    assert losses(ref)[0] == pytest.approx(want, rel=1e-5)
    for name in LAYOUTS:
        assert_same_losses(runs[name], ref)
    # ZeRO-1 under EP: every rank's gradients whole over their own group (`testing._whole`
    # sums an expert's pieces over its edp group, the others' over dp x cp)
    for rank, result in enumerate(runs["ep2_dp2_zero1"]["all"]):
        ep = ProcessGrid(dp=2, ep=2, rank=rank).axes["ep"]
        for name, g in result["grads"].items():
            want = ref["grads"][name]
            want = want.chunk(ep.size)[ep.rank] if ".experts." in name else want
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
def test_export_round_trip_same_logits(runs, mixtral_dir):
    """The trained model out three ways (--export-hf; python -m minipar.export from the
    checkpoint; written in shards with an index): transformers reads each with minipar's
    logits."""
    tmp = runs["tmp"]
    mcfg, state, _ = export.checkpoint_state(str(tmp / "ckpt"))
    assert mcfg.mixtral
    ours = Transformer(mcfg, seed=None).eval()
    ours.load_state_dict(state)
    start = read(mixtral_dir)
    assert not torch.equal(ours.layers["1"].mlp.experts.up_proj,
                           start.layers["1"].mlp.experts.up_proj)
    assert export.main(["--resume", str(tmp / "ckpt"), "--out", str(tmp / "out2")]) == 0
    hf.save_pretrained(state, mcfg, str(tmp / "out3"), shard_bytes=50_000)
    assert len(list((tmp / "out3").glob("model-*.safetensors"))) > 1
    assert (tmp / "out3" / hf.INDEX).is_file()
    x = torch.randint(0, 320, (2, 16))
    with torch.no_grad():
        want = ours(x)
        for d in ("out", "out2", "out3"):
            got = hf_model(tmp / d)(x).logits
            assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5, d


# ---------------------------------------------------------------- a tampered directory
def _file_of(path, name):
    return path / json.loads((path / hf.INDEX).read_text())["weight_map"][name]


def _edit_tensors(path, name, edit):
    """Rewrite the file that holds tensor `name` with `edit(tensors)` applied."""
    from safetensors.torch import load_file, save_file
    file = _file_of(path, name)
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return file


def _edit_json(path, file, edit):
    content = json.loads((path / file).read_text())
    edit(content)
    (path / file).write_text(json.dumps(content))


EXPERT = "model.layers.0.block_sparse_moe.experts.1.w1.weight"


def _outside_index(path):
    _edit_json(path, hf.INDEX, lambda c: c["weight_map"].update({EXPERT: "../x.safetensors"}))
    return ["'../x.safetensors' is not a name inside the directory"]


def _linked_out(path):
    file = _file_of(path, EXPERT)
    far = path.parent / "elsewhere" / file.name
    far.parent.mkdir()
    shutil.move(file, far)
    file.symlink_to(far)
    return [f"--init-hf {file} is a link to {far}, outside the directory"]


def _oversize_expert(path):
    file = _edit_tensors(path, EXPERT, lambda t: t.update({EXPERT: torch.zeros(960, 64)}))
    return [f"--init-hf {file}: tensor {EXPERT} has shape [960, 64], config.json implies [96, 64]"]


def _extra_expert(path):
    extra = EXPERT.replace("experts.1.", "experts.4.")
    file = _edit_tensors(path, EXPERT, lambda t: t.update({extra: torch.zeros(96, 64)}))
    _edit_json(path, hf.INDEX, lambda c: c["weight_map"].update({extra: file.name}))
    return [f"--init-hf {file}: tensor {extra} is not a weight of this model"]


def _missing_expert(path):
    _edit_json(path, hf.INDEX, lambda c: c["weight_map"].pop(EXPERT))
    return [f"tensor {EXPERT} is in no file"]


def _oversize_config(path, monkeypatch):
    for module in (preflight, hf):        # a 4 GiB machine, whatever this one has
        monkeypatch.setattr(module, "available_ram", lambda: 4 * 2**30)
    _edit_json(path, hf.CONFIG, lambda c: c.update(num_local_experts=100_000))
    return [f"--init-hf {path / hf.CONFIG}: its model", "GiB of RAM to build"]


BAD = {
    "index names a file outside": _outside_index,
    "an expert's shard links out": _linked_out,
    "an expert oversize": _oversize_expert,
    "an expert too many": _extra_expert,
    "an expert missing": _missing_expert,
    "config.json oversize": _oversize_config,
    "sliding window": lambda p: _edit_json(p, hf.CONFIG, lambda c: c.update(sliding_window=16))
    or ["sliding_window=16 is not supported (minipar's Mixtral has None)"],
    "router noise": lambda p: _edit_json(p, hf.CONFIG, lambda c: c.update(router_jitter_noise=0.1))
    or ["router_jitter_noise=0.1 is not supported"],
}


@pytest.mark.parametrize("case", BAD)
def test_a_tampered_mixtral_is_refused_before_any_rank(case, mixtral_dir, tmp_path, capsys,
                                                       monkeypatch, no_rank_may_start):
    path = shutil.copytree(mixtral_dir, tmp_path / "mixtral")
    breaks = BAD[case]
    words = breaks(path, monkeypatch) if breaks is _oversize_config else breaks(path)
    code = main(["--init-hf", str(path), "--ep", "2", "--dp", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "--init-hf" in err, err
    for w in words:
        assert w in err, (w, err)
