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


# Peers are registered below, one section per axis: dp_vs_ddp, zero3_vs_fsdp2 (data),
# tp_vs_dtensor (tensor), pp_vs_torch_pipelining (pipeline).


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
