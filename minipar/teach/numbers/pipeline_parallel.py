"""The numbers the pipeline_parallel chapter states (book/pipeline_parallel.md), computed once
by the schedules' own functions (`make_schedule`, `simulate`), the stage split and the
bubble formulas; Llama 3's facts come from `numbers.llama3`."""
from __future__ import annotations

from dataclasses import replace

from ...plan.config import ModelConfig
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.table4 import TABLE4
from ...plan.dualpipe import comparison
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...plan.schedules import split_layers
from ...plan.schedules import Action, make_schedule, simulate
from .. import replays
from .core import Number, assumed, derived, from_replay, predicted, two_digits
from .core import in_scenario

P, M, V, T_COMM = 4, 8, 2, 0.2      # the chapter's interleaved example, with a transfer time


def rewarm(schedule, warmups) -> list[list[Action]]:
    """The same forwards and backwards in each rank's order, with `warmups[r]` forwards
    before rank r's first backward, then one forward, one backward, then the rest."""
    out = []
    for acts, w in zip(schedule, warmups):
        fwd, bwd = [a for a in acts if a.kind == "F"], [a for a in acts if a.kind == "B"]
        steady = [a for f, b in zip(fwd[w:], bwd) for a in (f, b)]
        out.append(fwd[:w] + steady + bwd[len(fwd) - w:])
    return out


def _warmup_numbers() -> dict[str, Number]:
    megatron = make_schedule("interleaved", P, M, V)
    shorter = rewarm(megatron, [P * (V - 1) + (P - 1 - r) for r in range(P)])
    step = lambda s: simulate(s, 1.0, 2.0, 0.0, T_COMM).makespan   # noqa: E731
    src = "simulate(interleaved p=4 m=8 v=2, t_f=1, t_b=2, t_comm=0.2)"
    return {"warmup_megatron": derived(step(megatron), "{:.1f}", src),
            "warmup_shorter": derived(step(shorter), "{:.1f}", src + ", warm-up p-1-r shorter")}


def _zb_numbers() -> dict[str, Number]:
    sim = lambda name: simulate(make_schedule(name, P, M), 1.0, 1.0, 1.0).bubble_fraction  # noqa: E731
    return {"zb_bubble": derived(sim("zb"), "{:.0%}", "simulate(zb, p=4, m=8, 1/1/1)"),
            "zb_1f1b_bubble": derived(sim("1f1b"), "{:.0%}", "simulate(1f1b, p=4, m=8, 1/1/1)")}


def _dualpipe_numbers() -> dict[str, Number]:
    """DualPipeV against 1F1B and ZB-H1 on the chapter's p = 4, m = 8, passes of equal time."""
    rows, src = comparison(P, M), "dualpipe.comparison(p=4, m=8, t_f=t_b=t_w=1)"
    out = {"dp_ranks": Number(P, source=src), "dp_stages": Number(2 * P, source=src),
           "dp_microbatches": Number(M, source=src)}
    for key, name in (("1f1b", "1F1B"), ("zb", "ZB-H1"), ("dualpipev", "DualPipeV")):
        bubble, acts = rows[name]
        out[f"dp_bubble_{key}"] = derived(bubble, "{:.1%}", src)
        out[f"dp_acts_{key}"] = derived(acts, "{:g}", src + ": peak chunks in flight x chunk share")
    return out


def _llama3_numbers() -> dict[str, Number]:
    row1, row2 = TABLE4[0], TABLE4[1]
    layers = ModelConfig.preset("llama3-405b").n_layers
    counts = sorted({len(r) for r in split_layers(layers, row1.pp)})
    v = (layers + 2) // row1.pp             # 126 + 2 = 128 layers in 16 x 8 chunks
    seqs = TABLE4_BATCH_TOKENS // row1.seq_len
    m1, m2 = seqs // row1.dp, seqs // row2.dp
    b1, b2 = (bubble_fraction("interleaved", row1.pp, m, v) for m in (m1, m2))
    return {
        "stage_layers": derived(" or ".join(map(str, counts)), "{}", "split_layers(126, 16)"),
        "llama_v": assumed(v, "{}", "(126 + 2) layers / 16 stages, reading a chunk as one layer: "
                           "the paper gives no v", quantity="llama3_virtual_stages"),
        "llama_m1": derived(m1, "{}", "2,048 sequences / DP 64, one per micro-batch"),
        "llama_m2": derived(m2, "{}", "2,048 sequences / DP 128"),
        "llama_bubble1": derived(b1, "{:.1%}", "(p-1)/(v m+p-1)"),
        "llama_bubble2": derived(b2, "{:.1%}", "(p-1)/(v m+p-1)"),
        "llama_bubble_cost": derived(1 - (1 - b2) / (1 - b1), "{:.0%}", "throughput lost"),
        "llama_tflops_drop": derived(1 - row2.tflops_per_gpu / row1.tflops_per_gpu, "{:.0%}",
                                     "Table 4: 430 -> 400 TFLOP/s"),
        "first_last_stages": derived(row1.pp * v, "{}", "16 x 8 chunks"),
    }


def stage_compute_s(trace: dict) -> dict[int, float]:
    """{pipeline rank: seconds of forwards and backwards} of a replayed run's first replica."""
    coords = {int(pid): c for pid, c in trace["otherData"]["minipar"]["ranks"].items()}
    out = {}
    for e in trace["traceEvents"]:
        c = coords.get(e["pid"], {})
        if e["ph"] == "X" and e["cat"] == "compute" and e["args"].get("kind") in ("F", "B") \
                and c.get("tp", 0) == c.get("dp", 0) == c.get("cp", 0) == 0:
            out[c["pp"]] = out.get(c["pp"], 0.0) + e["dur"] / 1e6
    return out


def _replayed() -> dict[str, Number]:
    """1F1B and interleaved 1F1B replayed at Llama 3 8B's shapes on H100s."""
    out, src = {}, "replays.replayed('{}')"
    for key, name in (("1f1b", "pipeline_parallel"), ("interleaved", "pipeline_parallel_interleaved")):
        run = replays.replayed(name)
        out[f"replay_bubble_{key}"] = from_replay(run.bubble_fraction, "{:.0%}", src.format(name))
        out.update(in_scenario({f"replay_formula_{key}": derived(
            replays.estimated(name).bubble_fraction, "{:.0%}", "(p-1)/(v m+p-1), replays.estimated")},
            "pp-replay-8b"))
    work = stage_compute_s(replays.replayed("pipeline_parallel").trace)
    out["replay_last_stage_extra"] = from_replay(work[max(work)] / work[0] - 1, "{:.0%}",
                                                 "last stage's F+B seconds / the first's - 1")
    return out


def _llama3_replayed() -> dict[str, Number]:
    """Table 4's first row as it runs (`replays.RUNS["llama3"]`), replayed on H100s, beside
    the cost model's estimate of the same step. The prose states them without ranking the
    parts: which one leads is the replay's finding, and the replay is still evolving."""
    run, est = replays.replayed("llama3"), replays.estimated("llama3")
    recorded = run.trace["otherData"]["minipar"]["replay"]["recorded"]["layout"]
    src, model = "replays.replayed('llama3')", "replays.estimated('llama3'): the cost model"
    estimated = in_scenario({
        "l3_model_step": derived(two_digits(est.step_time_s), "{:g} s", model),
        "l3_model_mfu": predicted(est.mfu, "llama3", model, "derived"),
        "l3_model_bubble": derived(est.bubble_fraction, "{:.0%}", model),
        "l3_model_dp": derived(two_digits(est.time_breakdown_s["dp"]), "{:g} s", model),
        "l3_model_tp": derived(two_digits(est.time_breakdown_s["tp"]), "{:g} s", model),
    }, "row1-replayed-program", [("l3_model_dp", "dp_exposed_s")])
    return {
        **estimated,
        "l3_ranks": Number(len(run.trace["otherData"]["minipar"]["ranks"]), source=src),
        "l3_recorded_tp": Number(recorded["tp"], source=src),
        "l3_recorded_dp": Number(recorded["dp"], source=src),
        "l3_zero": Number(recorded["zero"], "ZeRO-{}", source="replays.RUNS['llama3']"),
        "l3_step": from_replay(two_digits(run.step_time_s), "{:g} s", src),
        "l3_bubble": from_replay(run.bubble_fraction, "{:.0%}", src),
        # the replay's physics is the cost model's: its MFU carries the llama3 stack's band
        "l3_mfu": replace(predicted(run.mfu, "llama3", src, "derived"), recorded=True),
        "l3_dp_exposed": from_replay(two_digits(run.exposed_s["dp"]), "{:g} s", src),
        "l3_tp_exposed": from_replay(two_digits(run.exposed_s["tp"]), "{:g} s", src),
        "l3_pp_exposed": from_replay(two_digits(run.exposed_s["pp"]), "{:g} s", src),
    }


def numbers() -> dict[str, Number]:
    return {**_warmup_numbers(), **_zb_numbers(), **_dualpipe_numbers(), **_llama3_numbers(), **_replayed(),
            **_llama3_replayed()}
