"""Time the attention of one all-gather context-parallel rank: Llama 3's 131K row.

    python benchmarks/kernels/cp_attention.py OUT.json      (needs a CUDA GPU; a minute)

With CP, a rank holds two chunks of s / (2 cp) queries (the load-balanced zigzag: chunks i
and 2 cp - 1 - i) and, after the all-gather, every key up to each chunk's end. Each chunk
is one attention call: its queries against keys [0, end), causal with the diagonal at the
bottom right. This times that, forward + backward, for every rank of CP16 at s = 131,072
(Llama 3's Table 4 row 3: TP8 leaves 16 query heads and 1 KV head per rank), with the
FlashAttention-2 and cuDNN backends, and the same FLOPs as one 8K-token causal call for
comparison. The cost model's CP time comes from this measurement's TFLOP/s.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

DEV, BF16 = "cuda", torch.bfloat16


def timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(repeats):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / repeats


def chunk_call(q_len: int, k_len: int, heads: int, d: int, backend) -> float:
    """Forward + backward seconds of q_len queries against k_len keys, lower-right causal."""
    q = torch.randn(1, heads, q_len, d, device=DEV, dtype=BF16, requires_grad=True)
    k = torch.randn(1, heads, k_len, d, device=DEV, dtype=BF16, requires_grad=True)
    v = torch.randn(1, heads, k_len, d, device=DEV, dtype=BF16, requires_grad=True)
    mask = causal_lower_right(q_len, k_len)
    g = torch.randn(1, heads, q_len, d, device=DEV, dtype=BF16)

    def step():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(g)
    with sdpa_kernel(backend):
        return timed(step)


def main(out: Path, seq: int = 131072, cp: int = 16, heads: int = 16, d: int = 128) -> None:
    chunk = seq // (2 * cp)
    result = {"seq": seq, "cp": cp, "heads": heads, "head_dim": d, "ranks": {}}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        rows = []
        try:
            for rank in range(cp):
                t, flops = 0.0, 0.0
                for c in (rank, 2 * cp - 1 - rank):
                    end = (c + 1) * chunk
                    t += chunk_call(chunk, end, heads, d, backend)
                    # model FLOPs of the causal part: 4 d heads per (query, key) pair, x3 fwd+bwd
                    flops += 3 * 4 * d * heads * (chunk * (end - chunk) + chunk * chunk / 2)
                rows.append({"rank": rank, "fwd_bwd_s": t, "flops": flops})
                print(name, rank, f"{t * 1e3:.1f} ms", f"{flops / t / 1e12:.0f} TFLOP/s", flush=True)
        except Exception as e:          # a backend without lower-right causal masks: say so
            print(name, "failed:", repr(e)[:300], flush=True)
        result["ranks"][name] = rows
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
