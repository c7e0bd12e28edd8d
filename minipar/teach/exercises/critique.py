"""Critique a layout: the design exercises of the memory, Llama 3 and cluster chapters.

The reader proposes a layout for a given model, cluster and batch; the check runs what the
book built on it and says what is wrong, never what is right instead: the memory model
(which part of the fullest GPU overflows the HBM less the planner's headroom, and what
shrinks that part), the placement on servers and pods (which axis' rings leave the
server's NVLink, which model replicas span two pods) and the planner (how far the layout's
predicted MFU is from the best the planner finds, and what the layout loses most to).
The planner's own best layout is shown only on the reveal rules of a prediction.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ...plan.config import ConfigError, ModelConfig, ParallelConfig
from ...plan.costmodel import estimate, limiting_term, memory_per_gpu, plan
from ...plan.costmodel.frameworks import fsdp_unit_mb
from ...plan.costmodel.hardware import LLAMA3_CLUSTER, Cluster
from ...plan.costmodel.planner import MEMORY_HEADROOM, REMEDIES, describe, memory_budget_gb
from ...plan.costmodel.workload import layout_problems, make_workload
from ...plan.memory import BF16_MIXED
from ...runtime import topology
from .core import NOT_ANSWERED, Verdict, reveals, right, wrong


@dataclass(frozen=True)
class Setting:
    """What the reader designs for: a model preset on `gpus` GPUs of `cluster`, sequences
    of `seq_len`, `batch_tokens` a step, bf16 mixed precision (Llama 3's). `points`: how
    many MFU points short of the planner's best still counts (None: not asked); `pods`:
    whether a model replica may span two pods."""
    model: str
    gpus: int
    seq_len: int
    batch_tokens: int
    cluster: Cluster = LLAMA3_CLUSTER
    points: float | None = None
    pods: bool = False


# The planner's defaults: its lowest ZeRO stage, and Llama 3's all-gather CP.
DEFAULTS = dict(cp=1, pp=1, zero=1, recompute="none", microbatch_size=1, schedule="1f1b",
                virtual_stages=1, cp_impl="allgather")
EXAMPLE = "dict(tp=8, pp=4, zero=1, recompute=\"selective\")"
# What shrinks each part of the fullest GPU's memory (the memory chapter's knobs).
SHRINKS = {"params": "more TP or PP splits the weights, ZeRO-3 shards them over DP",
           "grads": "ZeRO-2 or ZeRO-3 shards the gradients over DP",
           "optimizer": "ZeRO-1 shards Adam's state over DP",
           "activations": "recomputation, a smaller micro-batch, or more TP, CP or PP"}


def read_layout(layout, s: Setting):
    """(ParallelConfig, Workload) of the reader's dict, completed with DEFAULTS and DP the
    rest of the GPUs, gradients reduced one layer at a time as the planner does; or
    ValueError with a sentence naming the key and the rule."""
    if not isinstance(layout, dict):
        raise ValueError(f"give a dict such as {EXAMPLE}, not {layout!r}.")
    unknown = sorted(set(layout) - set(DEFAULTS) - {"tp", "dp"})
    if unknown or "tp" not in layout:
        raise ValueError(f"a layout has the keys tp (required), {', '.join(['dp', *DEFAULTS])}"
                         + (f"; {unknown} are not among them." if unknown else "."))
    kw = {**DEFAULTS, **layout}
    inner = kw["tp"] * kw["cp"] * kw["pp"]
    kw.setdefault("dp", s.gpus // inner if inner and s.gpus % inner == 0 else 0)
    if inner * kw["dp"] != s.gpus:
        raise ValueError(f"tp x cp x pp x dp = {inner * kw['dp']:,}, not the {s.gpus:,} GPUs.")
    model = ModelConfig.preset(s.model)
    pc = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp"], zero=kw["zero"],
                        sp=kw["tp"] > 1, schedule=kw["schedule"],
                        virtual_stages=kw["virtual_stages"], recompute=kw["recompute"],
                        cp_impl=kw["cp_impl"], bucket_mb=fsdp_unit_mb(model, kw["tp"]))
    work = make_workload(s.seq_len, s.batch_tokens, None, kw["microbatch_size"], kw["recompute"])
    return pc, work


def memory_findings(s: Setting, pc: ParallelConfig, work) -> tuple[list[str], list[str]]:
    """(problems, notes) of the fullest GPU against the HBM less the planner's headroom."""
    parts = memory_per_gpu(ModelConfig.preset(s.model), pc, work, BF16_MIXED)
    budget, total = memory_budget_gb(s.cluster), parts["total"] / 1e9
    if total <= budget:
        return [], [f"the fullest GPU holds {total:.1f} of the {budget:.1f} GB a layout may fill"]
    part = max(SHRINKS, key=parts.get)
    return [f"the fullest GPU needs {total:.1f} GB, over the {budget:.1f} GB a layout may fill "
            f"({s.cluster.hbm_gb:g} GB of HBM less the planner's {MEMORY_HEADROOM:.0%} "
            f"headroom); its largest part is the {part}, {parts[part] / 1e9:.1f} GB: "
            f"{SHRINKS[part]}"], []


def placement_findings(s: Setting, pc: ParallelConfig) -> tuple[list[str], list[str]]:
    """(problems, notes): TP's rings must stay on NVLink; with `s.pods`, no model replica
    may span two pods."""
    links = topology.placement(pc.tp, pc.cp, pc.pp, pc.dp, s.cluster)
    problems = []
    if links.get("tp", "NVLink") != "NVLink":
        problems.append(f"TP's rings cross the {links['tp']} (servers of "
                        f"{s.cluster.gpus_per_node} GPUs): every layer's TP collectives leave "
                        f"the server's NVLink")
    replica = pc.tp * pc.cp * pc.pp
    straddle = topology.straddling_replicas(replica, s.gpus, s.cluster.pod_size)
    if s.pods and straddle:
        problems.append(f"{len(straddle)} of the {pc.dp} model replicas ({replica:,} GPUs each) "
                        f"span two pods of {s.cluster.pod_size:,}: their TP, CP and PP traffic "
                        f"crosses the pods' uplinks")
    return problems, ["links " + ", ".join(f"{a} {link}" for a, link in links.items())]


@functools.cache
def planned(s: Setting) -> list:
    """Every layout the planner keeps for `s`, best first."""
    return plan(ModelConfig.preset(s.model), s.cluster, s.gpus, s.seq_len, s.batch_tokens,
                top=None).ranked


def planner_findings(s: Setting, pc: ParallelConfig, work, reveal: bool, layout) -> tuple[list[str], list[str]]:
    """(problems, notes): the layout's predicted MFU against the planner's best."""
    mine = estimate(ModelConfig.preset(s.model), pc, s.cluster, s.seq_len,
                    global_batch=work.global_batch, microbatch_size=work.microbatch_size,
                    recompute=work.recompute, precision=BF16_MIXED)
    best = planned(s)[0]
    gap = 100 * (best.mfu - mine.mfu)
    if s.points is None or gap <= s.points:
        return [], [f"predicted MFU {100 * mine.mfu:.1f}%, {max(gap, 0):.1f} points from the "
                    f"planner's best"]
    first, _, term, share, _ = limiting_term(mine)
    theirs = (f"the planner's {describe(best)}" if reveals(f"design {s}", repr(sorted(layout.items())), reveal)
              else "the planner's best")
    costly = (" (and its full recomputation or ZeRO-3 costs time too)"
              if first == "memory" else "")
    return [f"predicted MFU {100 * mine.mfu:.1f}%, {gap:.1f} points short of {theirs} (within "
            f"{s.points:g} is right); yours loses most to {term}, {share:.0%} of the step"
            f"{costly}: {REMEDIES[term]}"], []


def critique(s: Setting, layout, reveal: bool = False) -> tuple[list[str], list[str]]:
    """(problems, notes) of `layout` in setting `s`; the planner is asked only of a layout
    that runs, fits and keeps TP on NVLink."""
    try:
        pc, work = read_layout(layout, s)
    except (ValueError, TypeError) as e:
        return [str(e).rstrip(".")], []
    try:
        rules = layout_problems(ModelConfig.preset(s.model), pc, work)
    except ConfigError as e:
        rules = [str(e)]
    if rules:
        return ["this layout cannot run: " + "; ".join(r.rstrip(".") for r in rules)], []
    found = [memory_findings(s, pc, work), placement_findings(s, pc)]
    if not any(p for p, _ in found):
        found.append(planner_findings(s, pc, work, reveal, layout))
    return [x for p, _ in found for x in p], [x for _, n in found for x in n]


def critiqued(s: Setting, layout, reveal: bool = False) -> Verdict:
    """The verdict of a design exercise: every problem found, or right with the notes."""
    if layout is None:
        return Verdict(None, NOT_ANSWERED)
    problems, notes = critique(s, layout, reveal)
    if problems:
        return wrong("; ".join(problems) + ".")
    return right("; ".join(notes) + ".")


__all__ = ["Setting", "critique", "critiqued"]
