"""The numbers the failures chapter states (book/failures.md), computed once.

The paper's Table 5 (what interrupted 54 days of Llama 3 405B's pre-training) is here as
printed, and every share, rate and checkpoint interval the chapter quotes is computed from
it with `minipar.plan.formulas.failures` (`young_interval`, `expected_waste`). Last, a checkpoint
commit crashed at every moment (`crash_table`): what the chapter's figure draws and its
`check_commit` exercise runs.
"""
from __future__ import annotations

import signal

from ...plan.config import ModelConfig
from ...plan.flops import param_count
from ...plan.formulas.failures import expected_waste, young_interval
from .core import Number, assumed, derived, paper

# Table 5: component, category, unexpected interruptions, share as printed (%)
TABLE5 = [
    ("Faulty GPU", "GPU", 148, 30.1),
    ("GPU HBM3 Memory", "GPU", 72, 17.2),
    ("Software Bug", "Dependency", 54, 12.9),
    ("Network Switch/Cable", "Network", 35, 8.4),
    ("Host Maintenance", "Unplanned Maintenance", 32, 7.6),
    ("GPU SRAM Memory", "GPU", 19, 4.5),
    ("GPU System Processor", "GPU", 17, 4.1),
    ("NIC", "Host", 7, 1.7),
    ("NCCL Watchdog Timeouts", "Unknown", 7, 1.7),
    ("Silent Data Corruption", "GPU", 6, 1.4),
    ("GPU Thermal Interface + Sensor", "GPU", 6, 1.4),
    ("SSD", "Host", 3, 0.7),
    ("Power Supply", "Host", 3, 0.7),
    ("Server Chassis", "Host", 2, 0.5),
    ("IO Expansion Board", "Host", 2, 0.5),
    ("Dependency", "Dependency", 2, 0.5),
    ("CPU", "Host", 2, 0.5),
    ("System Memory", "Host", 2, 0.5),
]
DAYS, INTERRUPTIONS, PLANNED, MANUAL = 54, 466, 47, 3     # Section 3.3.4
EFFECTIVE = 0.90                     # "higher than 90% effective training time"
GPUS = 16384                         # the snapshot ran on up to this many (Table 4)
TECTONIC_TBps, TECTONIC_PEAK_TBps = 2.0, 7.0               # Section 3.3.1
STATE_BYTES_PER_PARAM = 12           # fp32 master weights + Adam's m and v
HARDWARE = ("GPU", "Host", "Network")                     # the table's hardware categories


def unexpected() -> int:
    return sum(r[2] for r in TABLE5)


def share(categories, printed: bool = False) -> float:
    """Fraction of the unexpected interruptions in `categories`: by the counts, or by
    adding the printed percentages."""
    rows = [r for r in TABLE5 if r[1] in categories]
    return sum(r[3] for r in rows) / 100 if printed else sum(r[2] for r in rows) / unexpected()


def mtbf_s() -> float:
    """The job's mean time between unexpected interruptions."""
    return DAYS * 86400 / unexpected()


def checkpoint_bytes() -> float:
    return STATE_BYTES_PER_PARAM * param_count(ModelConfig.preset("llama3-405b"))


def _table5() -> dict[str, Number]:
    count = {r[0]: r[2] for r in TABLE5}
    rows = {"faulty_gpu": "Faulty GPU", "hbm": "GPU HBM3 Memory", "sram": "GPU SRAM Memory",
            "gsp": "GPU System Processor", "sdc": "Silent Data Corruption",
            "thermal": "GPU Thermal Interface + Sensor", "software": "Software Bug",
            "network": "Network Switch/Cable", "maintenance": "Host Maintenance"}
    out = {key: paper(count[name], source="Table 5") for key, name in rows.items()}
    pct = lambda v, how: derived(v, "{:.1%}", source=how)  # noqa: E731
    first = TABLE5[0]
    out.update({
        "days": paper(DAYS, source="Section 3.3.4"),
        "interruptions": paper(INTERRUPTIONS, source="Section 3.3.4"),
        "planned": paper(PLANNED, source="Section 3.3.4"),
        "unexpected": paper(unexpected(), source="Table 5, its counts' sum"),
        "manual": paper(MANUAL, "{:,}", source="Section 3.3.4"),
        "effective": paper(EFFECTIVE, "{:.0%}", source="Section 3.3.4: 'higher than 90%'"),
        "gpu_share_text": paper(0.587, "{:.1%}", source="Section 3.3.4"),
        "hardware_text": paper(0.78, "{:.0%}", source="Section 3.3.4: 'about 78%'"),
        "faulty_gpu_printed": paper(first[3] / 100, "{:.1%}", source="Table 5"),
        "faulty_gpu_implied": pct(first[2] / unexpected(), "148 / 419"),
        "printed_sum": pct(sum(r[3] for r in TABLE5) / 100, "Table 5's printed column"),
        "gpu_by_counts": pct(share(("GPU",)), "GPU rows by count"),
        "hardware_by_counts": pct(share(HARDWARE), "GPU, Host, Network rows by count"),
        "hardware_printed": pct(share(HARDWARE, True), "GPU, Host, Network rows as printed"),
        "with_maintenance_by_counts": pct(share(HARDWARE + ("Unplanned Maintenance",)),
                                          "+ Unplanned Maintenance, by count"),
        "with_maintenance_printed": pct(share(HARDWARE + ("Unplanned Maintenance",), True),
                                        "+ Unplanned Maintenance, as printed"),
    })
    return out


def _rates() -> dict[str, Number]:
    per_gpu_h = mtbf_s() * GPUS / 3600
    budget_min = (1 - EFFECTIVE) * DAYS * 24 * 60 / INTERRUPTIONS
    return {
        "mtbf_h": derived(mtbf_s() / 3600, "{:.1f}", source="54 days / 419"),
        "gpus_assumed": assumed(GPUS, source="all of Table 4's 16,384 GPUs ran throughout"),
        "per_gpu_h": derived(round(per_gpu_h, -2), "{:,.0f}", source="job MTBF x 16,384"),
        "per_gpu_years": derived(per_gpu_h / (365.25 * 24), "{:.1f}", source="in years"),
        "big_job_gpus": Number(100_000, source="a what-if"),
        "big_job_mtbf_min": derived(per_gpu_h / 100_000 * 60, "{:.0f}",
                                    source="per-GPU MTBF / 100,000"),
        "budget_min": derived(budget_min, "{:.0f}", source="10% of 54 days / 466"),
    }


def _young() -> dict[str, Number]:
    m = mtbf_s()
    fast = checkpoint_bytes() / (TECTONIC_TBps * 1e12)
    slow = 10 * fast
    tf, ts = young_interval(fast, m), young_interval(slow, m)
    return {
        "bytes_per_param": Number(STATE_BYTES_PER_PARAM),
        "state_TB": derived(checkpoint_bytes() / 1e12, "{:.1f} TB", source="12 B x 405.9e9"),
        "tectonic_TBps": paper(TECTONIC_TBps, "{:.0f} TB/s", source="Section 3.3.1"),
        "tectonic_peak_TBps": paper(TECTONIC_PEAK_TBps, "{:.0f} TB/s", source="Section 3.3.1"),
        "per_gpu_min": paper("1 MB", "{}", source="Section 3.3.1"),
        "per_gpu_max": paper("4 GB", "{}", source="Section 3.3.1"),
        "write_fast_s": derived(fast, "{:.1f} s", source="state / 2 TB/s"),
        "young_fast_min": derived(tf / 60, "{:.1f} minutes", source="sqrt(2 C M)"),
        "waste_fast": derived(expected_waste(tf, fast, m), "{:.0%}", source="expected_waste"),
        "write_slow_s": derived(slow, "{:.0f} s", source="state / 200 GB/s (a tenth)"),
        "young_slow_min": derived(ts / 60, "{:.0f} minutes", source="sqrt(2 C M)"),
        "waste_slow": derived(expected_waste(ts, slow, m), "{:.0%}", source="expected_waste"),
    }


def numbers() -> dict[str, Number]:
    return {
        **_table5(), **_rates(), **_young(),
        "grace_s": Number(30, "{} s", source="Slurm KillWait, Kubernetes "
                          "terminationGracePeriodSeconds: their defaults"),
        "exit_sigterm": Number(128 + signal.SIGTERM),
        "exit_sigint": Number(128 + signal.SIGINT),
    }


# ------------------------------------------------------------- a commit, crashed at every moment
# The chapter's figure (figures.failures.plot_commit_protocol) draws it for the protocol and a
# broken commit; exercises.failures.check_commit runs the reader's commit through it.
class RecordingFS:
    """A file system a commit can be crashed in at any moment: files are {path: text}, a directory
    is every path under it. `write` is NOT atomic (a crash during it leaves a prefix of the
    text); `rename` and `replace` are (POSIX rename(2))."""

    def __init__(self, files: dict[str, str]):
        self.files, self.ops = dict(files), []

    def write(self, path: str, text: str):
        self.ops.append(("write", path, text))
        self.files[path] = text

    def rename(self, src: str, dst: str):
        self.ops.append(("rename", src, dst))
        self.files = _renamed(self.files, src, dst)

    replace = rename

    def exists(self, path: str) -> bool:
        return path in self.files or any(p.startswith(path + "/") for p in self.files)


def _renamed(files: dict, src: str, dst: str) -> dict:
    out = {}
    for p, text in files.items():
        if p == src or p.startswith(src + "/"):
            p = dst + p[len(src):]
        out[p] = text
    return out


RANK_FILES = ("rank_00000.pt", "rank_00001.pt")
CUT = "<cut>"     # how a write interrupted by a crash ends: half its text, then nothing


def before_commit(root: str, step: str) -> dict:
    """An older complete checkpoint named by `latest`, and the new one's rank files in .tmp."""
    old = {f"{root}/step_000004/{f}": "tensors" for f in (*RANK_FILES, "manifest.json")}
    new = {f"{root}/{step}.tmp/{f}": "tensors" for f in RANK_FILES}
    return {**old, **new, f"{root}/latest": "step_000004"}


def broken_invariant(files: dict, root: str) -> str | None:
    """What a reader of `root` would find wrong after a crash, or None."""
    dirs = {p.rsplit("/", 1)[0] for p in files if p.count("/") == root.count("/") + 2}
    for d in sorted(dirs):
        if not d.endswith(".tmp") and f"{d}/manifest.json" not in files:
            return f"{d} looks like a checkpoint but has no manifest.json"
        if not d.endswith(".tmp") and files[f"{d}/manifest.json"].endswith(CUT):
            return f"{d}/manifest.json is half-written"
    if f"{root}/latest" in files:
        name = files[f"{root}/latest"].strip()
        target = f"{root}/{name}"
        if not all(f"{target}/{f}" in files for f in (*RANK_FILES, "manifest.json")):
            return f"latest names {name!r}, which is not a complete checkpoint"
    return None


def crash_states(start: dict, ops: list):
    """(when, files) after a crash at every moment: between operations, and in the middle
    of each write (half its text written)."""
    fs = RecordingFS(start)
    yield "before any operation", dict(fs.files)
    for i, (op, a, b) in enumerate(ops, 1):
        if op == "write":
            yield f"during operation {i} (write {a})", {**fs.files, a: b[:len(b) // 2] + CUT}
            fs.files[a] = b
        else:
            fs.files = _renamed(fs.files, a, b)
        yield f"after operation {i} ({op} {a})", dict(fs.files)


def safe_commit(fs, root: str, step: str):
    """The protocol of `checkpoint._commit`: the manifest last inside .tmp, one atomic rename,
    then `latest` through a temporary file and an atomic replace."""
    fs.write(f"{root}/{step}.tmp/manifest.json", "{...}")
    fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
    fs.write(f"{root}/latest.tmp", step)
    fs.replace(f"{root}/latest.tmp", f"{root}/latest")


def broken_commit(fs, root: str, step: str):
    """The notebook's broken version: rename before the manifest, `latest` written in place."""
    fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
    fs.write(f"{root}/{step}/manifest.json", "{...}")
    fs.write(f"{root}/latest", step)


def crash_table(commit, root: str = "ckpt", step: str = "step_000008"):
    """[(moment, files, what is wrong or None)] for a crash at every moment of `commit`."""
    fs = RecordingFS(before_commit(root, step))
    commit(fs, root, step)
    return [(when, files, broken_invariant(files, root))
            for when, files in crash_states(before_commit(root, step), fs.ops)]
