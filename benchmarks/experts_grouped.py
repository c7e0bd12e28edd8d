"""Grouped GEMM or a loop over experts: which runs a MoE layer's experts faster, here.

    python benchmarks/experts_grouped.py [--quick] [--json OUT]

Chapter "Experts: the fifth axis". `model.Experts` runs each expert on its rows in a Python
loop; `torch._grouped_mm` runs all of them in one call on the rows grouped by expert (the
offsets of each group). Both compute forward and backward of the SwiGLU experts on the same
rows (uneven counts, one expert empty) and must agree; the script prints the median time of
each and loop / grouped (above 1.0: the grouped GEMM is faster). The experts' layout was
chosen on this ratio for the CPU; on a GPU with many experts the grouped GEMM wins.
`torch._grouped_mm`'s CPU backward fails on a broadcast gradient (stride 0, as `y.sum()`
gives), so the gradient here is a real tensor, as a combine's is.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minipar.trainer.model import Experts  # noqa: E402


def grouped(experts: Experts, x, counts):
    """The same SwiGLU experts as `Experts.forward`, each matmul one grouped GEMM."""
    offs = counts.cumsum(0).to(torch.int32)
    gate = torch._grouped_mm(x, experts.gate_proj.transpose(-2, -1), offs=offs)
    up = torch._grouped_mm(x, experts.up_proj.transpose(-2, -1), offs=offs)
    return torch._grouped_mm(F.silu(gate) * up, experts.down_proj.transpose(-2, -1), offs=offs)


def timed(fn, experts, x, counts, grad, repeats: int) -> tuple[float, list]:
    """Median seconds of forward + backward; the output and gradients of the last one."""
    times = []
    for _ in range(repeats):
        experts.zero_grad()
        t0 = time.perf_counter()
        y = fn(experts, x, counts)
        y.backward(grad)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), [y.detach(), *(p.grad.clone() for p in experts.parameters())]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n, dim, ffn, tokens = (8, 64, 128, 512) if args.quick else (16, 512, 1024, 4096)
    experts = Experts(n, dim, ffn)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.02)
    counts = torch.randint(1, 2 * tokens // n, (n,))
    counts[1] = 0                                       # an expert with no token
    x = torch.randn(int(counts.sum()), dim)
    grad = torch.randn(x.shape[0], dim)
    repeats = 7 if args.quick else 15
    loop = lambda e, x, c: e(x, c)      # noqa: E731
    for fn in (loop, grouped):          # warm-up: first calls allocate and pick kernels
        timed(fn, experts, x, counts, grad, 2)
    loop_s, loop_out = timed(loop, experts, x, counts, grad, repeats)
    grouped_s, grouped_out = timed(grouped, experts, x, counts, grad, repeats)
    diff = max((a - b).abs().max().item() for a, b in zip(loop_out, grouped_out))
    result = {"experts": n, "dim": dim, "ffn": ffn, "rows": x.shape[0], "loop_s": loop_s,
              "grouped_s": grouped_s, "ratio": loop_s / grouped_s, "max_abs_diff": diff}
    print(f"{n} experts, {x.shape[0]} rows, dim {dim}, ffn {ffn}: loop {loop_s * 1e3:.2f} ms, "
          f"grouped GEMM {grouped_s * 1e3:.2f} ms, loop/grouped = {result['ratio']:.2f} "
          f"(max |difference| {diff:.1e})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
