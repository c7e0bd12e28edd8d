"""The code a GPU runs, at world size 1, on the device MINIPAR_DEVICE names (default: cpu).

`benchmarks/gpu_check.sh` runs this file with MINIPAR_DEVICE=cuda on a one-GPU machine: the
reference model, the tensor-parallel layers and context parallelism's attention at one rank (over NCCL, a world of
one), and bf16 autocast against float32. One GPU cannot test several ranks over NCCL; the
multi-rank tests prove the parallel arithmetic on gloo. On the CPU this file runs in `make
test` too, minus the GPU-against-CPU comparison.

Tolerances. float32 on a GPU (TF32 off) against float32 on the CPU, or one layer against
another: relative 1e-4 (other kernels sum in another order). bf16 autocast against float32,
the same weights and tokens: the loss within 2 %, and each weight's gradient pointing the
same way (cosine >= 0.99), as mixed precision with float32 master weights should.
"""
import functools
import os

import pytest
import torch

from minipar.runtime import launch
from minipar.trainer import comm
from minipar.plan.config import ModelConfig
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer, cross_entropy_sum
from minipar.trainer.parallel import context
from minipar.trainer.parallel.context import shard_sequence
from minipar.trainer.parallel.tensor import (apply_tensor_parallel,
                                             vocab_parallel_cross_entropy_sum)

DEVICE = os.environ.get("MINIPAR_DEVICE", "cpu")
KINDS = ("model", "tp", "cp")
TINY = ModelConfig.preset("tiny")

if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"MINIPAR_DEVICE={DEVICE!r}: use cpu or cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("MINIPAR_DEVICE=cuda, but torch sees no CUDA device")


# Context parallelism's attention at one rank. The public `ring_attention` takes a shortcut
# to plain attention at cp=1 (gloo cannot send a rank to itself); `allgather_attention` runs
# the arithmetic both share: online softmax over the causal blocks of the zigzag layout,
# merged by log-sum-exp, with the hand-written backward. That is what a GPU has to get
# right. Ulysses at one rank *is* plain attention.
CP_CORES = {"cp": context.allgather_attention}


def loss_and_grads(kind: str, bf16: bool, grid: ProcessGrid, device: torch.device) -> dict:
    """One forward and backward of `tiny` with one parallel layer applied at degree 1."""
    model, loss_fn = Transformer(TINY, seed=0), cross_entropy_sum
    if kind == "tp":
        model = apply_tensor_parallel(model, grid.tp)
        loss_fn = functools.partial(vocab_parallel_cross_entropy_sum, tp_axis=grid.tp)
    elif kind in CP_CORES:
        for layer in model.layers.values():
            layer.self_attn.core = functools.partial(CP_CORES[kind], axis=grid.cp)
    model = model.to(device)
    tokens = torch.randint(0, TINY.vocab_size, (4, 65), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    x, y, pos = shard_sequence(tokens[:, :-1], tokens[:, 1:], grid.cp)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(x, pos)
    loss = loss_fn(logits, y) / y.numel()
    loss.backward()
    return {"loss": loss.item(), "device": str(device),
            "modules": {type(m).__name__ for m in model.modules()},
            "grads": {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}}


def every_kind_on_one_rank() -> dict:
    """Runs as the only rank of a world (NCCL on a GPU, gloo on the CPU)."""
    grid = ProcessGrid().init_groups()
    device = comm.device()
    if device.type == "cuda":        # float32 means float32: no TF32 matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return {(kind, bf16): loss_and_grads(kind, bf16, grid, device)
            for kind in KINDS for bf16 in (False, True)}


@pytest.fixture(scope="module")
def runs() -> dict:
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    return launch.run_local(every_kind_on_one_rank, 1, backend=backend, timeout_s=300)[0]


def assert_close(got: dict, want: dict, rtol: float):
    assert got["loss"] == pytest.approx(want["loss"], rel=rtol)
    assert got["grads"].keys() == want["grads"].keys()
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=rtol, atol=rtol * g.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


def test_runs_on_the_requested_device(runs):
    assert {r["device"].split(":")[0] for r in runs.values()} == {DEVICE}


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "model"])
def test_each_parallel_layer_at_one_rank_is_the_model(runs, kind):
    if kind == "tp":
        assert {"ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding"} <= runs[kind, False]["modules"]
    assert_close(runs[kind, False], runs["model", False], rtol=1e-4)


@pytest.mark.skipif(DEVICE == "cpu", reason="the device is the CPU itself")
def test_the_device_computes_what_the_cpu_computes(runs):
    grid = ProcessGrid()     # world of one, no groups needed by the plain model
    on_cpu = loss_and_grads("model", False, grid, torch.device("cpu"))
    assert_close(runs["model", False], on_cpu, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_stays_within_its_tolerance_of_fp32(runs, kind):
    fp32, bf16 = runs[kind, False], runs[kind, True]
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=2e-2)
    for name, g in fp32["grads"].items():
        cos = torch.nn.functional.cosine_similarity(bf16["grads"][name].flatten(), g.flatten(), dim=0)
        assert cos >= 0.99, f"{name}: bf16 gradient at cosine {cos:.4f} from fp32's"
    # and bf16 is really used: the results are not bit-identical to fp32's
    assert bf16["loss"] != fp32["loss"]
