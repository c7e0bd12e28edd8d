"""MFU of minipar on the GPUs of this machine: one table, 1..N GPUs, data parallel.

    python benchmarks/gpu_mfu.py [--gpus N] [--steps 20] [--batch 8] [--seq-len 2048] [--no-compile]

A ~1B Llama (Llama 3.2 1B's shape), bf16 autocast with fp32 master weights, PyTorch SDPA
(flash attention on Hopper), NCCL. MFU uses PaLM's convention, as Llama 3 and torchtitan do:
6N + 12·L·h·s FLOPs per token, no discount for the causal mask, against the GPU's dense bf16
peak. Without a GPU it says so and exits 0.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from minipar.config import ModelConfig  # noqa: E402

# Llama 3.2 1B: 16 layers, 2048 wide, 32 heads of 64, 8 KV heads, FFN 8192, 128K vocabulary
MODEL_1B = ModelConfig(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                       vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
                       tie_embeddings=True, name="llama3.2-1b-shape")


def rank_main(steps: int, batch: int, seq_len: int, compile_blocks: bool):
    import torch.distributed as dist
    from minipar import comm, launch
    from minipar.grid import ProcessGrid
    from minipar.model import Transformer, cross_entropy_sum
    from minipar.parallel.data import DataParallel
    from minipar.train import adamw

    n = dist.get_world_size()
    grid = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    device = launch.device()
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Transformer(MODEL_1B, seed=0).to(device)
    if compile_blocks:
        for block in model.layers.values():
            block.compile()
    model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)
    dp = DataParallel([model], grid.dp_cp, bucket_mb=25)
    optimizer = adamw(dp.optimizer_params(), lr=1e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, MODEL_1B.vocab_size, (batch, seq_len + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    times = []
    with comm.paused():
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dp.start_step()
            (cross_entropy_sum(model(x), y) / (batch * seq_len)).backward()
            dp.finish_backward()
            optimizer.step()
            dp.after_optimizer_step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    warm = times[min(3, len(times) - 1):]
    return {"step_s": statistics.median(warm), "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
            "device": torch.cuda.get_device_name()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_mfu.py")
    ap.add_argument("--gpus", type=int, default=None, help="largest world to try (default: all)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--no-compile", action="store_true", help="eager blocks (no torch.compile)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mfu.py: no CUDA GPU is present on this machine; this benchmark measures MFU "
              "on GPUs only, so there is nothing to measure.")
        return 0
    from minipar import flops, launch
    from minipar.peak import peak_flops
    available = torch.cuda.device_count()
    top = min(args.gpus or available, available, 8)
    worlds = [n for n in (1, 2, 4, 8) if n <= top]
    peak = peak_flops(torch.device("cuda"))
    print(f"model: {MODEL_1B.name}, {flops.param_count(MODEL_1B) / 1e9:.2f}B parameters; "
          f"batch {args.batch} x {args.seq_len} tokens per GPU; bf16 autocast; "
          f"peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s per GPU (dense bf16)")
    print(f"{'gpus':>4} {'step s':>8} {'tokens/s':>12} {'TFLOP/s/GPU':>12} {'MFU':>7} {'mem GB':>7}")
    for n in worlds:
        res = launch.run_local(rank_main, n, args.steps, args.batch, args.seq_len,
                               not args.no_compile, backend="nccl", timeout_s=600)
        step = max(r["step_s"] for r in res)
        tps = n * args.batch * args.seq_len / step
        per_gpu = tps / n * flops.flops_per_token(MODEL_1B, args.seq_len)
        mfu = flops.mfu(tps, MODEL_1B, args.seq_len, peak, n_devices=n) if peak else float("nan")
        print(f"{n:>4} {step:>8.3f} {tps:>12.0f} {per_gpu / 1e12:>12.1f} {mfu:>7.1%} "
              f"{max(r['peak_mem_gb'] for r in res):>7.1f}", flush=True)
    print(f"device: {res[0]['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
