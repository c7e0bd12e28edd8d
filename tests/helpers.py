"""Shared by the multi-process tests: run a layout, compare it with the single device."""
from __future__ import annotations

import functools

import torch

from minipar.config import ParallelConfig
from minipar.train import TrainConfig, train

STEPS = 5


def run_layout(steps: int = STEPS, capture_grads: bool = True, **kw) -> dict:
    """Train `tiny` for `steps` with this layout (ParallelConfig fields; model/batch fields
    of TrainConfig may be given too) and return rank 0's result plus every rank's."""
    train_fields = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(parallel=ParallelConfig(**kw), steps=steps, progress=False,
                      capture_grads=capture_grads, **train_fields)
    return train(cfg)


@functools.lru_cache(maxsize=None)
def reference(steps: int = STEPS, **train_fields) -> dict:
    """The single-device run every layout is compared with (computed once per session)."""
    return run_layout(steps=steps, **dict(train_fields))


def losses(result: dict) -> list[float]:
    return [r["loss"] for r in result["records"]]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def assert_same_losses(result: dict, ref: dict, rtol: float = 1e-5):
    d = max_rel_diff(losses(result), losses(ref))
    assert d <= rtol, f"loss curves differ by {d:.2e} (relative) > {rtol}"


def assert_close_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol=1e-5, atol=1e-7):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
