"""Activation recomputation changes what is kept, never what is computed: each mode's loss
and every gradient equal recompute none's (<= 1e-5), on every axis and pipeline schedule."""
import pytest
import torch

from minipar.plan.config import ModelConfig
from minipar.trainer.memory_meter import ActivationMeter
from minipar.trainer.model import Transformer, cross_entropy_sum
from minipar.trainer.recompute import apply_recompute
from variants import run_variants

MODES = ("none", "selective", "full")

# Each world is started once; each layout in it runs once per mode.
WORLDS = {
    "tp2-cp2-pp2": (dict(tp=2, cp=2, pp=2), [
        dict(sp=True, cp_impl="ring", schedule="1f1b", microbatches=2),
        dict(cp_impl="allgather", schedule="afab", microbatches=2),
        dict(sp=True, cp_impl="allgather", schedule="interleaved", virtual_stages=2, microbatches=2),
        dict(cp_impl="ring", schedule="zb", microbatches=2),
    ]),
    "dp2-pp2": (dict(dp=2, pp=2), [
        dict(zero=0, schedule="zb", microbatches=2),
        dict(zero=1, schedule="interleaved", virtual_stages=2, microbatches=2),
        dict(zero=2, schedule="1f1b", microbatches=2),
        dict(zero=3, schedule="zb", microbatches=2),
        dict(zero=3, schedule="afab", microbatches=2),
    ]),
}


def with_modes(layouts):
    return [dict(layout, recompute=mode) for layout in layouts for mode in MODES]


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_recompute_matches_none_on_every_axis(world):
    grid, layouts = WORLDS[world]
    results = run_variants(grid, with_modes(layouts))
    for rank_results in results:
        for i, layout in enumerate(layouts):
            none, *others = rank_results[3 * i: 3 * i + 3]
            for mode, got in zip(MODES[1:], others):
                where = f"{world} {layout} recompute={mode}"
                assert abs(got["loss"] - none["loss"]) <= 1e-5 * abs(none["loss"]), where
                assert got["grads"].keys() == none["grads"].keys(), where
                for name, g in none["grads"].items():
                    torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-7,
                                               msg=lambda m: f"{where} {name}: {m}")


def test_recompute_keeps_less_on_one_device():
    """One process: full keeps each block's input; selective drops what the core saves
    beyond its inputs; the gradients are the same."""
    cfg = ModelConfig(name="tiny")
    x, y = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    peaks, grads = {}, {}
    for mode in MODES:
        m = apply_recompute(Transformer(cfg, seed=0), mode)
        with ActivationMeter() as meter:
            cross_entropy_sum(m(x), y).backward()
        peaks[mode] = meter.peak
        grads[mode] = {n: p.grad for n, p in m.named_parameters()}
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    for mode in MODES[1:]:
        for name, g in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], g, rtol=1e-5, atol=1e-7)


def test_unknown_recompute_mode_exits_2(capsys):
    from minipar.runtime.run import main
    with pytest.raises(SystemExit) as e:
        main(["--recompute", "sometimes"])
    assert e.value.code == 2
    assert "--recompute" in capsys.readouterr().err
