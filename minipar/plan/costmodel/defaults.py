"""Defaults that depend on the layout: chosen for the layout the user gave, never imposed.

Chapter "Four dimensions at once". A flag the user did not pass must never be the reason a
layout is refused: `--pp 1` with no schedule named gets a schedule that needs no pipeline,
not Llama 3's interleaved one. `resolve_layout` fills each unset knob with the best choice
for the set ones and says which it chose and why (`notes`); only a flag the user passed
can then break a rule, and the error names it.
"""
from __future__ import annotations

from ..config import ModelConfig
from .search import chunk_counts, largest_tp

# Llama 3's Table 4, row 1: what `python -m minipar.costmodel` predicts with no flags.
TABLE4_LAYOUT = {"tp": 8, "cp": 1, "pp": 16, "dp": 64}
# Llama 3's habit, not a rule: the most chunks per rank the CLI picks unasked (405B: 16 x 8
# stages for 126 layers and the two ends). The search tries every count the rules allow.
DEFAULT_MAX_CHUNKS = 8


def default_degrees(given: dict, gpus: int | None, model: ModelConfig,
                    gpus_per_node: int) -> tuple[dict, list[str]]:
    """tp, cp, pp, dp: those given; the rest Table 4's if they fit `gpus`, else TP as wide
    as one server and the model allow, no CP or PP, and DP for the rest."""
    out, notes = dict(given), []
    missing = [k for k in ("tp", "cp", "pp", "dp") if out.get(k) is None]
    if not missing:
        return out, notes
    trial = {**TABLE4_LAYOUT, **{k: v for k, v in out.items() if v is not None}}
    if gpus is None:
        gpus = trial["tp"] * trial["cp"] * trial["pp"] * trial["dp"] if "dp" in missing else None
    inner = trial["tp"] * trial["cp"] * trial["pp"]
    fits = (gpus is not None and gpus % inner == 0 and largest_tp(model, trial["tp"]) == trial["tp"]
            and trial["pp"] <= model.n_layers)
    if not fits:
        trial = {"tp": largest_tp(model, min(gpus_per_node, gpus or gpus_per_node)), "cp": 1, "pp": 1,
                 **{k: v for k, v in out.items() if v is not None and k != "dp"}}
        inner = trial["tp"] * trial["cp"] * trial["pp"]
    trial["dp"] = out["dp"] if out.get("dp") is not None else max(1, (gpus or inner) // inner)
    chosen = ", ".join(f"{k} {trial[k]}" for k in missing)
    notes.append(f"chose {chosen} (not given; " + ("Llama 3's Table 4 layout)" if fits else
                                                    "TP inside one server, DP for the rest)"))
    return trial, notes


def default_schedule(pp: int, microbatches: int, n_layers: int, schedule: str | None,
                     virtual_stages: int | None) -> tuple[str, int, list[str]]:
    """The schedule and chunks per rank: interleaved with up to 8 chunks (Llama 3's) when
    there is a pipeline and the micro-batches come in multiples of pp, else 1F1B."""
    notes = []
    if schedule is None:
        if (virtual_stages or 1) > 1:               # chunks asked for: only one schedule has them
            schedule = "interleaved"
        elif pp > 1 and microbatches % pp == 0 and virtual_stages is None:
            schedule = "interleaved"
        else:
            schedule = "1f1b"
        why = ("--virtual-stages given" if (virtual_stages or 1) > 1 else "no pipeline" if pp == 1 else f"{microbatches} micro-batches, a multiple of pp {pp}"
               if schedule == "interleaved" else f"{microbatches} micro-batches, not a multiple of pp {pp}")
        notes.append(f"chose --schedule {schedule} ({why})")
    if virtual_stages is None:
        virtual_stages = max((v for v in chunk_counts(schedule, pp, n_layers)
                              if v <= DEFAULT_MAX_CHUNKS), default=1)
        if schedule == "interleaved" and pp > 1:
            notes.append(f"chose --virtual-stages {virtual_stages} (up to {DEFAULT_MAX_CHUNKS} "
                         f"chunks per rank, pp x v <= layers + 2)")
    return schedule, virtual_stages, notes


# A preset's published run: what `python -m minipar.costmodel --preset P` predicts with no
# other flags. DeepSeek-V3 (technical report, arXiv 2412.19437; each fact checked there):
# "2048 NVIDIA H800 GPUs" (3.1); "16-way Pipeline Parallelism (PP), 64-way Expert Parallelism
# (EP) spanning 8 nodes, and ZeRO-1 Data Parallelism (DP)" and no "costly Tensor Parallelism"
# (3.2): dp = 2,048 / 16 = 128, EP64 carved from it; "sequence length to 4K" and the batch
# "gradually increased from 3072 to 15360 ... then keeps 15360" (4.2). Its DualPipe is not a
# schedule the trainer runs (`dualpipe.py` simulates it): ZB-H1, its closest, prices the bubble.
PRESET_LAYOUTS = {
    "deepseek-v3": {"gpu": "h800", "tp": 1, "cp": 1, "pp": 16, "dp": 128, "ep": 64, "zero": 1,
                    "seq_len": 4096, "global_batch": 15360, "schedule": "zb"},
}


def apply_preset_layout(args, argv: list[str]) -> list[str]:
    """Fill each field of the preset's published layout (`PRESET_LAYOUTS`) that no flag of
    `argv` set, and say so; a flag given wins."""
    layout = PRESET_LAYOUTS.get(args.preset)
    if layout is None:
        return []
    def given(dest: str) -> bool:
        flag = "--" + dest.replace("_", "-")
        return any(a == flag or a.startswith(flag + "=") for a in argv)
    if given("global_batch_tokens") or given("gpus"):
        layout = {k: v for k, v in layout.items() if k not in ("global_batch", "dp")}
    chosen = {k: v for k, v in layout.items() if not given(k)}
    for k, v in chosen.items():
        setattr(args, k, v)
    if not chosen:
        return []
    return [f"chose {', '.join(f'{k} {v}' for k, v in chosen.items())} ({args.preset}'s published "
            "run: DeepSeek-V3 technical report, arXiv 2412.19437, sections 3.1, 3.2 and 4.2; "
            "DualPipe priced as zb)"]
