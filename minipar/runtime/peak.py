"""The peak FLOP/s of the device a rank runs on: the denominator of a measured MFU.

Chapter "MFU and communication volume". A GPU's peak is its data sheet's
(`minipar.plan.datasheets`). A CPU has no data sheet minipar can trust, so its peak is
*measured*: the best float32 matmul rate of a short benchmark, cached per CPU model and
thread count, so that `python -m minipar.train` reports an MFU on a laptop too. The
arithmetic of MFU itself is `minipar.plan.flops`, which needs no torch.
"""

import contextlib
import json
import os
import platform
import time
from pathlib import Path

import torch

from ..plan import datasheets

_CPU_PEAK: dict[str, float] = {}          # in-process cache, keyed like the file cache


def peak_flops(device=None, dtype: str = "bf16") -> float | None:
    """Peak FLOP/s of one device.

    CUDA: the data-sheet number for the GPU's name (None if it is not in the table).
    CPU: *measured*, the best float32 matmul rate of a short benchmark (about half a second),
    cached in-process and in ~/.cache/minipar/ (or $MINIPAR_CACHE_DIR) per CPU model and
    torch thread count, so calling it again, or from another process, is free. On a CPU the
    "peak" is thus what a large matmul reaches, not the vendor's theoretical number; `dtype`
    is ignored there (minipar computes in float32 on CPU). Another device: None.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        sheet = datasheets.find(torch.cuda.get_device_name(device))
        return sheet.peak_flops(dtype) if sheet else None
    return cpu_peak_flops() if device.type == "cpu" else None


def _cpu_key() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one), torch's thread count
    and version: what the measured rate depends on."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    name = names[0] if names else platform.processor() or platform.machine()
    return f"{name}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def cpu_peak_flops(seconds: float = 0.5) -> float:
    """The CPU's float32 matmul rate in FLOP/s (measured once, then cached)."""
    key = _cpu_key()
    if key in _CPU_PEAK:
        return _CPU_PEAK[key]
    path = Path(os.environ.get("MINIPAR_CACHE_DIR") or Path.home() / ".cache" / "minipar")
    path = path / "cpu_peak_flops.json"
    cached = {}
    with contextlib.suppress(OSError, ValueError):      # none yet, or unreadable: measure
        cached = json.loads(path.read_text())
    if key not in cached:
        cached[key] = measure_matmul_flops(seconds)
        with contextlib.suppress(OSError):   # a read-only home still gets the in-process cache
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cached, indent=1))
            tmp.replace(path)            # atomic: a concurrent reader sees old or new, whole
    _CPU_PEAK[key] = float(cached[key])
    return _CPU_PEAK[key]


def measure_matmul_flops(seconds: float = 0.5, n: int = 1024) -> float:
    """Best FLOP/s of repeated n x n float32 matmuls over about `seconds` (2 n^3 FLOPs each).

    The best, not the mean: the question is what the cores can do, and a shared machine
    only ever makes a run slower.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)                                   # warm-up: allocation, thread pool
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best
