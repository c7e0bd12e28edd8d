"""Measure the kernels a training step is made of on one GPU: the cost model's constants.

    python benchmarks/kernels/measure.py OUT.json      (needs a CUDA GPU; minutes)

What it times, each with CUDA events after warm-up, median of the timed repeats:
* every GEMM shape the published runs' layers and LM heads use (`shapes.json`, written by
  `python benchmarks/kernels/shapes.py`), forward and both backward products, bf16 on
  random data; and the square sweep 1024..16384 (the "maximum achievable matmul FLOPS");
* flash attention through PyTorch's SDPA (its FlashAttention-2 backend and cuDNN's), causal,
  head dim 128, sequence 512..32768, forward and forward + backward;
* HBM: a copy and an add of 2 GiB tensors (bytes read + written per second);
* cross-entropy over a vocabulary shard, fp32 as nanotron computes it, forward + backward;
* one transformer block of each published run's shape, as one TP rank runs it in eager
  PyTorch (bf16; RMSNorm, RoPE and SwiGLU unfused, attention by SDPA): the whole layer,
  to compare with the sum of its kernels.
Nothing here reads an MFU: the cost model takes these numbers as its hardware constants.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEV = "cuda"
BF16 = torch.bfloat16


def clocks() -> dict:
    """SM clock (MHz) and power (W) now, as nvidia-smi reads them."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout.split(",")
        return {"sm_mhz": float(out[0]), "power_w": float(out[1]), "temp_c": float(out[2])}
    except Exception as e:       # a missing nvidia-smi must not lose the run's other numbers
        return {"error": repr(e)}


def timed(fn, repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() over `repeats` calls, after `warmup`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def gemm(m: int, n: int, k: int) -> float:
    a = torch.randn(m, k, device=DEV, dtype=BF16)
    b = torch.randn(k, n, device=DEV, dtype=BF16)
    return timed(lambda: a @ b)


def attention(seq: int, backend, tokens: int = 32768, heads: int = 16, d: int = 128) -> dict:
    b = max(1, tokens // seq)
    q, k, v = (torch.randn(b, heads, seq, d, device=DEV, dtype=BF16, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel(backend):
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(out)

        def both():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(g)
        fwd_bwd = timed(both)
    # causal: half of the 4 b h s^2 d FLOPs of the forward's two products; the backward's
    # model FLOPs are twice the forward's
    flops_fwd = 4 * b * heads * seq * seq * d / 2
    return {"seq": seq, "batch": b, "heads": heads, "head_dim": d, "fwd_s": fwd,
            "fwd_bwd_s": fwd_bwd, "flops_fwd": flops_fwd}


def hbm() -> dict:
    n = 2**30                  # 2 GiB of bf16 each: far beyond the 50 MB of L2
    x, y = torch.randn(n, device=DEV, dtype=BF16), torch.randn(n, device=DEV, dtype=BF16)
    z = torch.empty_like(x)
    copy = timed(lambda: z.copy_(x))
    add = timed(lambda: torch.add(x, y, out=z))
    return {"copy_Bps": 2 * 2 * n / copy, "add_Bps": 3 * 2 * n / add}


def cross_entropy(tokens: int, vocab: int) -> dict:
    """Logits [tokens, vocab] in bf16 -> fp32 loss, forward + backward (no GEMM)."""
    logits = torch.randn(tokens, vocab, device=DEV, dtype=BF16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device=DEV)

    def fused():
        F.cross_entropy(logits.float(), target).backward()

    def eager():            # nanotron's sharded cross-entropy, op by op, on one shard
        z = logits.float()
        z = z - z.max(dim=-1, keepdim=True).values
        e = z.exp()
        s = e.sum(dim=-1, keepdim=True)
        loss = (s.log() - z.gather(1, target[:, None])).mean()
        loss.backward()
    return {"tokens": tokens, "vocab": vocab, "fused_s": timed(fused, 5, 2),
            "eager_s": timed(eager, 5, 2)}


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def layer(spec: dict, variant: str = "eager", repeats: int = 10) -> dict:
    """One transformer block as one TP rank computes it (no collectives), forward + backward.
    variant "eager": every pointwise op its own kernel; "compiled": torch.compile fuses them
    (what Megatron's and Transformer Engine's fused norm, RoPE and SwiGLU kernels do)."""
    tp, h, d = spec["tp"], spec["dim"], spec["head_dim"]
    q_heads, kv_heads = spec["heads"] // tp, max(1, spec["kv"] // tp)
    f, b, s = spec["ffn"] // tp, spec["mbs"], spec["seq"]

    def w(*shape):
        return (torch.randn(*shape, device=DEV, dtype=BF16) * 0.02).requires_grad_()
    wqkv, wo = w(h, (q_heads + 2 * kv_heads) * d), w(q_heads * d, h)
    wgu, wd = w(h, 2 * f), w(f, h)
    n1, n2 = torch.ones(h, device=DEV, dtype=BF16), torch.ones(h, device=DEV, dtype=BF16)
    pos = torch.arange(s, device=DEV)[:, None] / 10000 ** (torch.arange(d // 2, device=DEV) / (d // 2))
    cos, sin = pos.cos().to(BF16), pos.sin().to(BF16)
    x = torch.randn(b, s, h, device=DEV, dtype=BF16, requires_grad=True)

    def block():
        qkv = rms_norm(x, n1) @ wqkv
        q, k, v = qkv.split([q_heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q = rope(q.view(b, s, q_heads, d), cos[:, None], sin[:, None]).transpose(1, 2)
        k = rope(k.view(b, s, kv_heads, d), cos[:, None], sin[:, None]).transpose(1, 2)
        v = v.view(b, s, kv_heads, d).transpose(1, 2)
        if kv_heads != q_heads:
            k = k.repeat_interleave(q_heads // kv_heads, dim=1)
            v = v.repeat_interleave(q_heads // kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = x + a.transpose(1, 2).reshape(b, s, q_heads * d) @ wo
        gate, up = (rms_norm(y, n2) @ wgu).chunk(2, dim=-1)
        return y + (F.silu(gate) * up) @ wd
    g = torch.randn(b, s, h, device=DEV, dtype=BF16)

    run = torch.compile(block) if variant == "compiled" else block

    def step():
        run().backward(g)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t = timed(step, repeats, 3)
    return {**spec, "variant": variant, "repeats": repeats, "fwd_bwd_s": t, "clocks": clocks()}


def main(out: Path) -> None:
    shapes = json.loads((Path(__file__).parent / "shapes.json").read_text())
    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "clocks_idle": clocks()}
    t0 = time.time()
    result["square"] = [{"m": n, "n": n, "k": n, "s": gemm(n, n, n)}
                        for n in (1024, 2048, 4096, 6144, 8192, 12288, 16384)]
    result["clocks_after_square"] = clocks()
    print("square", [round(2 * r["m"] ** 3 / r["s"] / 1e12) for r in result["square"]], flush=True)
    result["gemms"] = [{"m": m, "n": n, "k": k, "s": gemm(m, n, k)} for m, n, k in shapes["gemms"]]
    print(f"gemms {len(result['gemms'])} in {time.time() - t0:.0f}s", flush=True)
    result["hbm"] = hbm()
    print("hbm", result["hbm"], flush=True)
    result["attention"] = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            result["attention"][name] = [attention(s, backend) for s in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
        except Exception as e:      # a backend this build lacks: say so, keep the rest
            print(name, "failed:", repr(e)[:300], flush=True)
    for name, rows in result["attention"].items():
        print(name, [(r["seq"], round(3 * r["flops_fwd"] / r["fwd_bwd_s"] / 1e12)) for r in rows], flush=True)
    ce = {(sp["tokens"], sp["vocab"] // sp["tp"]) for sp in shapes["layers"]}
    result["cross_entropy"] = [cross_entropy(t, v) for t, v in sorted(ce)]
    print("ce", len(ce), f"{time.time() - t0:.0f}s", flush=True)
    result["layers"] = []
    for spec in shapes["layers"]:
        try:
            result["layers"].append(layer(spec))
        except Exception as e:
            print("layer", spec, "failed:", repr(e)[:300], flush=True)
        torch.cuda.empty_cache()
    print("layers", f"{time.time() - t0:.0f}s", flush=True)
    # A long run of the biggest block: does the clock settle lower over seconds of load?
    big = max(shapes["layers"], key=lambda sp: sp["dim"])
    result["sustained"] = [layer(big, "eager", 100) for _ in range(3)]
    print("sustained", [round(r["fwd_bwd_s"] * 1e3, 2) for r in result["sustained"]], flush=True)
    # Fused pointwise kernels: a few shapes compiled (compiling takes tens of seconds each)
    result["fused_layers"] = []
    for name, tp, tokens in (("llama3-405b", 8, 8192), ("8.86B", 1, 4096), ("80B", 4, 4096),
                             ("1.34B", 1, 16384), ("3.57B", 1, 8192)):
        spec = next(sp for sp in shapes["layers"] if (sp["model"], sp["tp"], sp["tokens"]) == (name, tp, tokens))
        try:
            result["fused_layers"].append(layer(spec, "compiled"))
            print("compiled", name, round(result["fused_layers"][-1]["fwd_bwd_s"] * 1e3, 2), f"{time.time() - t0:.0f}s", flush=True)
        except Exception as e:
            print("compiled", name, "failed:", repr(e)[:300], flush=True)
        out.write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()
    result["seconds"] = time.time() - t0
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
