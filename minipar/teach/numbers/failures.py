"""The numbers the failures chapter states (book/failures.md), computed once.

The paper's Table 5 (what interrupted 54 days of Llama 3 405B's pre-training) is here as
printed, and every share, rate and checkpoint interval the chapter quotes is computed from
it with `minipar.checkpoint`'s functions (`young_interval`, `expected_waste`).
"""
from __future__ import annotations

import signal

from ...formulas.failures import expected_waste, young_interval
from ...config import ModelConfig
from ...flops import param_count
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
