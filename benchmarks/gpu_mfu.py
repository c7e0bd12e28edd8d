"""MFU of minipar on the GPUs of this machine: one table, 1..N GPUs, data parallel.

    python benchmarks/gpu_mfu.py [--gpus N] [--steps 20] [--batch 8] [--seq-len 2048] [--no-compile]
                                 [--json PATH]

A ~1B Llama (the `llama3.2-1b` preset: Llama 3.2 1B's shape), bf16 autocast with fp32 master weights, PyTorch SDPA
(flash attention on Hopper), NCCL. MFU uses PaLM's convention, as Llama 3 and torchtitan do:
6N + 12·L·h·s FLOPs per token, no discount for the causal mask, against the GPU's dense bf16
peak. Without a GPU it says so and exits 0. `--json PATH` also writes the table as JSON
(benchmarks/gpu_check.sh reads it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from minipar.plan.config import ModelConfig

# Llama 3.2 1B: 16 layers, 2048 wide, 32 heads of 64, 8 KV heads, FFN 8192, 128K vocabulary
MODEL_1B = ModelConfig.preset("llama3.2-1b")


def top_costs(step, device_type: str, k: int = 5) -> list[dict]:
    """Run `step()` once under torch.profiler: the `k` operators that took the most time on
    the device (self time: a kernel inside an operator is not counted twice), each with its
    share of the step's device time."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        if device_type == "cuda":
            torch.cuda.synchronize()

    def self_us(e):
        if device_type != "cuda":
            return e.self_cpu_time_total
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    events = sorted((e for e in prof.key_averages() if self_us(e) > 0), key=self_us, reverse=True)
    total = sum(self_us(e) for e in events) or 1
    return [{"op": e.key, "ms": self_us(e) / 1e3, "share": self_us(e) / total, "calls": e.count}
            for e in events[:k]]


def rank_main(steps: int, batch: int, seq_len: int, compile_blocks: bool, profile: bool = False):
    import torch.distributed as dist
    from minipar.trainer import comm
    from minipar.runtime import launch
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer, cross_entropy_sum
    from minipar.trainer.parallel.data import DataParallel
    from minipar.trainer.step import adamw

    n = dist.get_world_size()
    grid = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    device = comm.device()
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
    def step():
        dp.start_step()
        (cross_entropy_sum(model(x), y) / (batch * seq_len)).backward()
        dp.finish_backward()
        optimizer.step()
        dp.after_optimizer_step()

    times = []
    with comm.paused():
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        try:       # where the time goes, after the timed steps (never instead of them)
            costs = top_costs(step, "cuda") if profile else None
        except Exception as e:  # noqa: BLE001 - a profiler problem must not lose the MFU
            costs = [{"error": f"{type(e).__name__}: {e}"}]
    warm = times[min(3, len(times) - 1):]
    return {"step_s": statistics.median(warm), "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
            "device": torch.cuda.get_device_name(), "top_costs": costs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_mfu.py")
    ap.add_argument("--gpus", type=int, default=None, help="largest world to try (default: all)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--no-compile", action="store_true", help="eager blocks (no torch.compile)")
    ap.add_argument("--json", help="also write the table here as JSON")
    ap.add_argument("--profile", action="store_true",
                    help="profile one more step and list the top operators by device time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mfu.py: no CUDA GPU is present on this machine; this benchmark measures MFU "
              "on GPUs only, so there is nothing to measure.")
        write_json(args.json, {"gpu": None, "rows": []})
        return 0
    from minipar.plan import flops
    from minipar.runtime import launch
    from minipar.runtime.peak import peak_flops
    available = torch.cuda.device_count()
    top = min(args.gpus or available, available, 8)
    worlds = [n for n in (1, 2, 4, 8) if n <= top]
    peak = peak_flops(torch.device("cuda"))
    print(f"model: {MODEL_1B.name}, {flops.param_count(MODEL_1B) / 1e9:.2f}B parameters; "
          f"batch {args.batch} x {args.seq_len} tokens per GPU; bf16 autocast; "
          f"peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s per GPU (dense bf16)")
    print(f"{'gpus':>4} {'step s':>8} {'tokens/s':>12} {'TFLOP/s/GPU':>12} {'MFU':>7} {'mem GB':>7}")
    rows = []
    for n in worlds:
        res = launch.run_local(rank_main, n, args.steps, args.batch, args.seq_len,
                               not args.no_compile, args.profile, backend="nccl", timeout_s=600)
        step = max(r["step_s"] for r in res)
        tps = n * args.batch * args.seq_len / step
        per_gpu = tps / n * flops.flops_per_token(MODEL_1B, args.seq_len)
        mfu = flops.mfu(tps, MODEL_1B, args.seq_len, peak, n_devices=n) if peak else float("nan")
        print(f"{n:>4} {step:>8.3f} {tps:>12.0f} {per_gpu / 1e12:>12.1f} {mfu:>7.1%} "
              f"{max(r['peak_mem_gb'] for r in res):>7.1f}", flush=True)
        rows.append({"gpus": n, "step_s": step, "tokens_per_s": tps, "tflops_per_gpu": per_gpu / 1e12,
                     "mfu": mfu if peak else None, "peak_mem_gb": max(r["peak_mem_gb"] for r in res),
                     "top_costs": res[0]["top_costs"]})
        for c in res[0]["top_costs"] or []:
            print(f"       {c.get('share', 0):6.1%} {c.get('ms', 0):8.2f} ms  {c.get('op', c.get('error'))}")
    print(f"device: {res[0]['device']}")
    write_json(args.json, {"gpu": res[0]["device"], "peak_flops": peak, "batch": args.batch,
                           "seq_len": args.seq_len, "compile": not args.no_compile, "rows": rows})
    return 0


def write_json(path, obj):
    if path:
        Path(path).write_text(json.dumps(obj, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
