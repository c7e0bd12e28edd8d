"""The Python half of benchmarks/gpu_check.sh: which Python to use, and the one JSON summary.

    python benchmarks/gpu_check.py probe              # prints "cuda <name>" or "cpu"
    python benchmarks/gpu_check.py summary DIR MODE   # DIR/summary.json from DIR's files

The summary reads what the script's steps left in DIR: `tests.xml` (pytest's JUnit report of
tests/test_device.py), `train.jsonl` (`--log-json` of the training run), `mfu.json`
(`benchmarks/gpu_mfu.py --json`) and `steps.tsv` (each step's name, exit status and
seconds). A step that did not run or failed is reported as such, never filled in.
Throughput is the median over the steps after the first `WARMUP` (compilation, allocator
warm-up); MFU uses PaLM's convention (6N + 12·L·h·s FLOPs per token, see minipar.plan.flops).
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

WARMUP = 3
KEYS = ("mode", "machine", "steps", "tests", "train", "gpu_mfu", "total_s", "ok")


def probe() -> str:
    """'cuda <device name>' when this Python's torch sees a GPU, else 'cpu'."""
    import torch
    if torch.cuda.is_available():
        return f"cuda {torch.cuda.get_device_name()}"
    return "cpu"


def machine() -> dict:
    import torch
    cuda = torch.cuda.is_available()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None,
            "gpu": torch.cuda.get_device_name() if cuda else None,
            "gpu_count": torch.cuda.device_count() if cuda else 0,
            "cpu": platform.processor() or platform.machine()}


def read_steps(path: Path) -> dict:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            name, status, seconds = line.split("\t")
            out[name] = {"exit_status": int(status), "seconds": float(seconds)}
    return out


def read_tests(path: Path) -> dict | None:
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"] + n["errors"], "skipped": n["skipped"], "failed_names": failed}


def read_train(path: Path) -> dict | None:
    if not path.exists() or not path.read_text().strip():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = rows[WARMUP:] or rows
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    return {"steps": len(rows), "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "step_time_s": statistics.median(r["step_time_s"] for r in timed),
            "mfu": statistics.median(mfus) if mfus else None,
            "memory": rows[-1].get("memory"), "mfu_convention": "PaLM: 6N + 12*L*h*s per token"}


def summary(out: Path, mode: str) -> dict:
    steps = read_steps(out / "steps.tsv")
    mfu = json.loads((out / "mfu.json").read_text()) if (out / "mfu.json").exists() else None
    res = {"mode": mode, "machine": machine(), "steps": steps,
           "tests": read_tests(out / "tests.xml"), "train": read_train(out / "train.jsonl"),
           "gpu_mfu": mfu}
    res["total_s"] = sum(s["seconds"] for s in steps.values())
    res["ok"] = bool(steps) and all(s["exit_status"] == 0 for s in steps.values())
    (out / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        print(probe())
        return 0
    if argv[:1] == ["summary"] and len(argv) == 3:
        res = summary(Path(argv[1]), argv[2])
        t, tr = res["tests"] or {}, res["train"] or {}
        mfu = f"{tr['mfu']:.1%}" if tr.get("mfu") is not None else "n/a"
        print(f"gpu_check ({res['mode']}, {res['total_s']:.0f} s): tests {t.get('passed', 0)} "
              f"passed, {t.get('failed', 0)} failed; train {tr.get('tokens_per_s') or 0:.0f} "
              f"tokens/s, MFU {mfu}; {'all steps ok' if res['ok'] else 'SOME STEPS FAILED'} "
              f"-> {argv[1]}/summary.json")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
