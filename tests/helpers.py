"""Shared by the multi-process tests: run a layout, compare it with the single device."""
from __future__ import annotations

import functools

import torch

from minipar.trainer import comm
from minipar.runtime import testing
from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.trainer.parallel.tensor import TP_PLAN, style_of
from minipar.runtime.run import train

STEPS = 5


def run_layout(steps: int = STEPS, capture_grads: bool = True, **kw) -> dict:
    """Train `tiny` for `steps` with this layout (ParallelConfig fields; model/batch fields
    of TrainConfig may be given too) and return rank 0's result plus every rank's."""
    train_fields = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(parallel=ParallelConfig(**kw), steps=steps, progress=False, **train_fields)
    out = train(cfg, after_backward=testing.capture_grads if capture_grads else None)
    # each rank's gradients after the first step (testing.capture_grads), as result["grads"]
    for r in (out, *out["all"]):
        r["grads"] = r["probes"].get(0)
    return out


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


# The dimension each TP_PLAN style splits its weight along (colwise: output features,
# rowwise: input features, the vocabulary: rows). Biases of row-parallel layers are replicated.
SHARD_DIM = {"vocab_embedding": 0, "colwise": 0, "head": 0, "rowwise": 1}


def shard_dim(param_name: str, plan=TP_PLAN) -> int | None:
    """Along which dim `apply_tensor_parallel` splits the parameter of this (reference)
    name; None: replicated on every TP rank. Tests compare a shard's gradient with this
    slice of the reference gradient."""
    module, _, leaf = param_name.rpartition(".")
    dim = SHARD_DIM.get(style_of(module, plan))
    return None if (leaf == "bias" and dim == 1) else dim


def wire_bytes_of(axis: str) -> int:
    """The bytes `comm.LOG` counted on the wire for `axis` since its last reset, every op."""
    return sum(op["wire_bytes"] for op in comm.LOG.summary().get(axis, {}).values())


# ---------------------------------------------------------------- expert parallelism
from minipar.trainer.placement import Shard, placements  # noqa: E402


def capture_placed_grads(step: int, chunks, dp, grid) -> dict | None:
    """An `after_backward` hook for layouts with experts: after step 0, each parameter's
    gradient whole over its data-parallel group (ZeRO pieces summed over the group its
    bucket reduces over: dp x cp, or edp for an expert) with its cuts, {axis: (dim, rank,
    size)} from its placement record; and after every step each MoE layer's routing bias."""
    out = {"bias": {n: b.clone() for c in chunks for n, b in c.named_buffers()
                    if n.endswith("expert_bias")}}
    if step != 0:
        return out
    held, grads = {id(p): g for g, p in dp.grads()}, {}
    with comm.paused():
        for m in chunks:
            for name, p in m.named_parameters():
                if id(p) not in held:
                    continue
                g, piece = held[id(p)].detach(), dp.shard_of(p)
                if not dp.holds_replicas:
                    flat = g.new_zeros(piece.shape.numel())
                    flat[piece.start:piece.stop] = g.reshape(-1)
                    g = comm.all_reduce(flat, dp.bucket_of[p].axis).view(piece.shape)
                cuts = {a: (how.dim, grid.axes[a].rank, grid.axes[a].size)
                        for a, how in placements(p).items() if isinstance(how, Shard)}
                grads[name] = (g.clone(), cuts)
    return {**out, "grads": grads}


def cut(full: torch.Tensor, cuts: dict) -> torch.Tensor:
    """The slice of `full` that a rank holds, from `capture_placed_grads`' cuts."""
    for dim, rank, size in cuts.values():
        full = full.chunk(size, dim=dim)[rank]
    return full
