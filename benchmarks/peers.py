"""minipar against PyTorch's own implementation of the same idea, in the same gloo world.

    python benchmarks/peers.py [--quick] [--json OUT] [--only NAME ...]

Each peer trains the same model on the same batch, on the same number of forked ranks, in
the same run, and reports minipar's step time divided by the peer's (median over steps,
after warm-up). Below 1.0 means minipar is faster. gloo on a shared 2-core CPU is not NCCL on
GPUs: these ratios say whether minipar's code adds overhead, not how a cluster behaves.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# run as a script from the repository root or anywhere: find the package next to us
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEERS = {}   # name -> function(quick: bool) -> {"minipar_s": ..., "peer_s": ..., "ratio": ...}


def peer(name):
    def register(fn):
        PEERS[name] = fn
        return fn
    return register


def median_step_time(times: list[float], warmup: int = 2) -> float:
    return statistics.median(times[warmup:] if len(times) > warmup else times)


def result(minipar_s: float, peer_s: float, **extra) -> dict:
    return {"minipar_s": minipar_s, "peer_s": peer_s, "ratio": minipar_s / peer_s, **extra}


def time_alternating(ours, theirs, n_steps: int) -> tuple[float, float]:
    """Median step time of each, running them in turns (ours, theirs, ours, ...) so that a
    change in the machine's load hits both alike. Each step starts at a barrier; CommLog
    is paused so counting costs neither side anything."""
    import time
    import torch.distributed as dist
    from minipar.trainer import comm

    times = {ours: [], theirs: []}
    with comm.paused():
        for _ in range(n_steps):
            for step in (ours, theirs):
                dist.barrier()
                t0 = time.perf_counter()
                step()
                times[step].append(time.perf_counter() - t0)
    return median_step_time(times[ours]), median_step_time(times[theirs])


# Peers are registered below, one section per axis: dp_vs_ddp, zero3_vs_fsdp2 (data),
# tp_vs_dtensor (tensor), pp_vs_torch_pipelining (pipeline).


# ---------------------------------------------------------------- data parallel peers
BENCH_MODEL = dict(n_layers=4, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=768, vocab_size=1024)


def _bench_data(batch, seq):
    import torch
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, BENCH_MODEL["vocab_size"], (batch, seq + 1), generator=g)


def _dp_rank(zero: int, n_steps: int, batch: int, seq: int):
    """On each rank: time minipar's DataParallel (ZeRO `zero`) and PyTorch's peer (DDP for
    zero 0, FSDP2 for zero 3) on the same model, data and world, steps alternating ours / theirs."""
    import torch
    import torch.distributed as dist
    from minipar.plan.config import ModelConfig, ParallelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer, cross_entropy_sum
    from minipar.trainer.parallel.zero import zero3_units
    from minipar.trainer.parallelize import data_parallel
    from minipar.trainer.step import adamw

    cfg = ModelConfig(**BENCH_MODEL)
    n = dist.get_world_size()
    grid = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    tokens = _bench_data(batch, seq).chunk(n)[dist.get_rank()]
    x, y = tokens[:, :-1], tokens[:, 1:]
    n_tokens = batch * seq

    model = Transformer(cfg, seed=0)
    dp = data_parallel([model], grid, ParallelConfig(dp=n, zero=zero))
    optimizer = adamw(dp.optimizer_params(), lr=1e-4, weight_decay=0.1)

    def ours():
        dp.start_step()
        (cross_entropy_sum(model(x), y) / n_tokens).backward()
        dp.finish_backward()
        optimizer.step()
        dp.after_optimizer_step()

    peer_model = Transformer(cfg, seed=0)
    if zero == 0:
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(peer_model)
    else:
        from torch.distributed.fsdp import fully_shard
        for unit in zero3_units([peer_model]):
            fully_shard(unit)
        wrapped = fully_shard(peer_model)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)

    def theirs():
        opt.zero_grad(set_to_none=True)
        # DDP averages; scale the loss so both compute the same update
        (cross_entropy_sum(wrapped(x), y) / n_tokens * n).backward()
        opt.step()

    return time_alternating(ours, theirs, n_steps)


def _dp_peer(zero, quick):
    from minipar.runtime import launch
    n_steps, batch, seq = (6, 8, 64) if quick else (20, 16, 128)
    res = launch.run_local(_dp_rank, 2, zero, n_steps, batch, seq, timeout_s=300)
    ours = max(r[0] for r in res)        # a step is as slow as its slowest rank
    theirs = max(r[1] for r in res)
    return result(ours, theirs, ranks=2, model=BENCH_MODEL, batch=batch, seq=seq)


@peer("dp_vs_ddp")
def dp_vs_ddp(quick):
    """minipar's bucketed, overlapped all-reduce vs torch.nn.parallel.DistributedDataParallel."""
    return _dp_peer(0, quick)


@peer("zero3_vs_fsdp2")
def zero3_vs_fsdp2(quick):
    """minipar's ZeRO-3 vs FSDP2 (`fully_shard` per block and on the root)."""
    return _dp_peer(3, quick)


# ---------------------------------------------------------------- tensor parallel peers
def _dtensor_plan(cfg):
    """PyTorch's own tensor parallelism for the same layout as minipar's `TP_PLAN`: q, k, v,
    gate, up column-wise, o and down row-wise, the embedding split over the vocabulary
    (row-wise, replicated tokens in) and the head column-wise with its logits left sharded
    for `loss_parallel`, PyTorch's vocab-parallel cross-entropy."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(cfg.n_layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "mlp.gate_proj", "mlp.up_proj"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        plan[f"layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"layers.{i}.mlp.down_proj"] = RowwiseParallel()
    return plan


def _tp_rank(n_steps: int, batch: int, seq: int):
    """On each rank: minipar's `apply_tensor_parallel` against `parallelize_module` on a
    DeviceMesh, the same model and tokens, forward + backward + AdamW. Steps alternate
    (ours, theirs, ours, ...) so that load from elsewhere on the machine hits both alike."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
    from minipar.plan.config import ModelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer
    from minipar.trainer.parallel.tensor import (apply_tensor_parallel,
                                                 vocab_parallel_cross_entropy_sum)

    cfg = ModelConfig(**BENCH_MODEL)
    n = dist.get_world_size()
    grid = ProcessGrid(tp=n, rank=dist.get_rank()).init_groups()
    tokens = _bench_data(batch, seq)
    x, y = tokens[:, :-1], tokens[:, 1:]
    n_tokens = batch * seq

    model = apply_tensor_parallel(Transformer(cfg, seed=0), grid.tp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def ours():
        opt.zero_grad(set_to_none=True)
        (vocab_parallel_cross_entropy_sum(model(x), y, grid.tp) / n_tokens).backward()
        opt.step()

    mesh = init_device_mesh("cpu", (n,))
    peer_model = parallelize_module(Transformer(cfg, seed=0), mesh, _dtensor_plan(cfg))
    peer_opt = torch.optim.AdamW(peer_model.parameters(), lr=1e-4)

    def theirs():
        peer_opt.zero_grad(set_to_none=True)
        with loss_parallel():
            logits = peer_model(x).reshape(-1, cfg.vocab_size)
            (F.cross_entropy(logits, y.reshape(-1), reduction="sum") / n_tokens).backward()
        peer_opt.step()

    return time_alternating(ours, theirs, n_steps)


@peer("tp_vs_dtensor")
def tp_vs_dtensor(quick):
    """minipar's tensor parallelism vs torch.distributed.tensor.parallel (DTensor), TP=2."""
    from minipar.runtime import launch
    n_steps, batch, seq = (6, 8, 64) if quick else (20, 16, 128)
    res = launch.run_local(_tp_rank, 2, n_steps, batch, seq, timeout_s=300)
    ours = max(r[0] for r in res)        # a step is as slow as its slowest rank
    theirs = max(r[1] for r in res)
    return result(ours, theirs, ranks=2, model=BENCH_MODEL, batch=batch, seq=seq)


# ---------------------------------------------------------------- pipeline parallel peers
class _NoDataParallel:
    """The executor tells data parallelism when the last micro-batch comes; with one
    pipeline and no DP there is nobody to tell."""

    def set_last_microbatch(self, last: bool):
        pass


def _pp_rank(n_steps: int, batch: int, seq: int, n_micro: int):
    """On each rank: minipar's executor running 1F1B against torch.distributed.pipelining
    (`PipelineStage` + `Schedule1F1B`) on the same stage modules (same layers, weights and
    micro-batches), forward + backward + AdamW, steps alternating ours / theirs."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from minipar.plan.config import ModelConfig, ParallelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import cross_entropy_sum
    from minipar.trainer.parallel.pipeline import build_stage_modules, pipeline_forward_backward

    cfg = ModelConfig(**BENCH_MODEL)
    p, r = dist.get_world_size(), dist.get_rank()
    grid = ProcessGrid(pp=p, rank=r).init_groups()
    pcfg = ParallelConfig(pp=p, schedule="1f1b", microbatches=n_micro)
    tokens = _bench_data(batch, seq)
    x, y = tokens[:, :-1], tokens[:, 1:]
    n_tokens = batch * seq

    def loss_fn(logits, targets):        # the executor divides the sum by n_tokens itself
        return cross_entropy_sum(logits, targets) / n_tokens

    parts = build_stage_modules(cfg, pcfg, grid, seed=0)
    opt = torch.optim.AdamW([w for m in parts for w in m.parameters()], lr=1e-4)
    # the executor takes (tokens, targets, positions) per micro-batch, as the training loop cuts them
    micro = [(t[:, :-1], t[:, 1:], torch.arange(seq)) for t in tokens.chunk(n_micro)]

    def ours():
        opt.zero_grad(set_to_none=True)
        pipeline_forward_backward(parts, micro, cross_entropy_sum, n_tokens, _NoDataParallel(),
                                  pcfg, grid)
        opt.step()

    (peer_module,) = build_stage_modules(cfg, pcfg, grid, seed=0)
    stage = PipelineStage(peer_module, r, p, torch.device("cpu"), group=grid.pp.group)
    schedule = Schedule1F1B(stage, n_micro, loss_fn=loss_fn, scale_grads=False)
    peer_opt = torch.optim.AdamW(peer_module.parameters(), lr=1e-4)

    def theirs():
        peer_opt.zero_grad(set_to_none=True)
        if r == 0:
            schedule.step(x)
        elif r == p - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        peer_opt.step()

    ours_s, theirs_s = time_alternating(ours, theirs, n_steps)
    # both trained the same steps on the same data: a check that they did the same work
    diff = max((a - b).abs().max().item()
               for a, b in zip(parts[0].parameters(), peer_module.parameters()))
    return ours_s, theirs_s, diff


@peer("pp_vs_torch_pipelining")
def pp_vs_torch_pipelining(quick):
    """minipar's pipeline executor (1F1B) vs torch.distributed.pipelining's Schedule1F1B."""
    from minipar.runtime import launch
    ranks, n_micro = (2, 4) if quick else (4, 8)
    n_steps, batch, seq = (6, 8, 64) if quick else (20, 16, 128)
    res = launch.run_local(_pp_rank, ranks, n_steps, batch, seq, n_micro, timeout_s=300)
    ours = max(r[0] for r in res)        # a step is as slow as its slowest rank
    theirs = max(r[1] for r in res)
    return result(ours, theirs, ranks=ranks, microbatches=n_micro, schedule="1f1b",
                  model=BENCH_MODEL, batch=batch, seq=seq,
                  weights_max_abs_diff=max(r[2] for r in res))


# ---------------------------------------------------------------- activation recomputation
def _recompute_rank(n_steps: int, batch: int, seq: int):
    """On each rank: the same model and DataParallel, every block recomputed in the
    backward, once by minipar's `recompute.apply_recompute(..., "full")` and once by
    `torch.utils.checkpoint(use_reentrant=False)` per block; steps alternating."""
    import functools

    import torch
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint
    from minipar.plan.config import ModelConfig, ParallelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer, cross_entropy_sum
    from minipar.trainer.parallelize import data_parallel
    from minipar.trainer.recompute import apply_recompute

    cfg = ModelConfig(**BENCH_MODEL)
    n = dist.get_world_size()
    grid = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    tokens = _bench_data(batch, seq).chunk(n)[dist.get_rank()]
    x, y = tokens[:, :-1], tokens[:, 1:]

    def trainer(model):
        dp = data_parallel([model], grid, ParallelConfig(dp=n))

        def step():
            dp.start_step()
            for p in model.parameters():
                p.grad = None
            (cross_entropy_sum(model(x), y) / (batch * seq)).backward()
            dp.finish_backward()
        return step, model

    ours, mine = trainer(apply_recompute(Transformer(cfg, seed=0), "full"))
    peer_model = Transformer(cfg, seed=0)
    for block in peer_model.layers.values():
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    theirs, peer_model = trainer(peer_model)
    times = time_alternating(ours, theirs, n_steps)
    diff = max((a.grad - b.grad).abs().max().item()
               for a, b in zip(mine.parameters(), peer_model.parameters()))
    return (*times, diff)


@peer("recompute_vs_torch_checkpoint")
def recompute_vs_torch_checkpoint(quick):
    """minipar's full recompute vs torch.utils.checkpoint per block (forward + backward)."""
    from minipar.runtime import launch
    n_steps, batch, seq = (6, 8, 64) if quick else (20, 16, 128)
    res = launch.run_local(_recompute_rank, 2, n_steps, batch, seq, timeout_s=300)
    return result(max(r[0] for r in res), max(r[1] for r in res), ranks=2, model=BENCH_MODEL,
                  batch=batch, seq=seq, grads_max_abs_diff=max(r[2] for r in res))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/peers.py")
    ap.add_argument("--quick", action="store_true", help="fewer steps (CI-sized)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--only", nargs="*", default=None, help=f"a subset of {sorted(PEERS)}")
    args = ap.parse_args(argv)
    names = args.only or list(PEERS)
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        ap.exit(2, f"peers.py: error: --only {unknown[0]!r} is unknown; choose from {sorted(PEERS)}\n")
    out = {}
    for name in names:
        t0 = time.perf_counter()
        out[name] = PEERS[name](args.quick)
        r = out[name]
        print(f"{name:24s} minipar {r['minipar_s'] * 1e3:8.1f} ms  peer {r['peer_s'] * 1e3:8.1f} ms"
              f"  ratio {r['ratio']:.2f}   ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
