"""The bytes each GPU sends per step, by axis, as minipar's own CommLog would count them.

Chapter "MFU and communication volume" (each axis chapter derives its own part). The
per-axis formulas live in `minipar.plan.formulas`, where the axis files and their tests use them
too; this module evaluates them for one pipeline rank of a layout, so that a tiny gloo run's
`--log-json` can be compared with the prediction number for number.
"""
from __future__ import annotations

from ..config import ModelConfig, ParallelConfig
from .workload import Workload
from ..flops import local_expert_param_count, local_param_count
from ..formulas.experts import dispatch_bytes
from ..formulas.context_parallel import cp_wire_bytes_per_step
from ..formulas.data_parallel import dp_bytes
from ..formulas.pipeline_parallel import pp_bytes
from ..formulas.tensor_parallel import tp_wire_bytes_per_step
from ..memory import BF16_MIXED, Precision
from ..schedules import rank_layers, stage_layer_counts

# An EP rank's all-to-alls per block and micro-batch: dispatch and combine, forward and backward
ALL_TO_ALLS = 4


def pipeline_bytes(model: ModelConfig, pc: ParallelConfig, work: Workload,
                   precision: Precision, stage: int) -> int:
    """Pipeline bytes rank `stage` sends per step (`formulas.pp_bytes` for this layout)."""
    return pp_bytes(work.tokens_per_microbatch(pc), model.dim, pc.pp, work.microbatches(pc),
                    precision.act_bytes, stage, pc.virtual_stages, pc.tp if pc.sp else 1)


def comm_bytes_per_gpu(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                       precision: Precision = BF16_MIXED, stage: int = 0) -> dict[str, int]:
    """Wire bytes pipeline rank `stage` (default 0: rank 0, whose CommLog `--log-json`
    reports) sends per step on each axis: {"tp", "cp", "pp", "dp"}, and "ep" for a mixture of
    experts: its all-to-alls with uniform routing (`ALL_TO_ALLS` per block and micro-batch)."""
    pc = parallel
    m, b, s = work.microbatches(pc), work.microbatch_size, work.seq_len
    act = precision.act_bytes
    layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
    first, last = stage == 0, stage == pc.pp - 1
    def tp_bytes(n_layers, recompute):
        return tp_wire_bytes_per_step(model, b, s // pc.cp, pc.tp, pc.sp, m, layers=n_layers,
                                      first=first, last=last, act_bytes=act,
                                      param_bytes=precision.grad_bytes, recompute=recompute,
                                      norm_shards=pc.dp * pc.cp if pc.zero >= 1 else 1)

    def cp_bytes(n_layers, recompute):
        return cp_wire_bytes_per_step(model, b, s, pc.cp, pc.cp_impl, m, tp=pc.tp,
                                      n_layers=n_layers, dtype_bytes=act, recompute=recompute)
    tp, cp = tp_bytes(layers, work.recompute), cp_bytes(layers, work.recompute)
    if work.recompute_layers is not None:
        # only the first N layers of each chunk redo their forward: the none-recompute bytes,
        # and for those layers what the recomputed forward adds (the ends cancel)
        counts = stage_layer_counts(model.n_layers, pc.pp * pc.virtual_stages)
        redone = int(work.recomputed_layers([counts[c * pc.pp + stage]
                                             for c in range(pc.virtual_stages)]))
        tp = tp_bytes(layers, "none") + tp_bytes(redone, "full") - tp_bytes(redone, "none")
        cp = cp_bytes(layers, "none") + cp_bytes(redone, "full") - cp_bytes(redone, "none")
    pp = pipeline_bytes(model, pc, work, precision, stage)
    moes = rank_layers(model, pc.pp, pc.virtual_stages, stage, moe=True)
    params = local_param_count(model, pc.tp, layers, first, last, moes)
    dp = dp_bytes(params, pc.dp * pc.cp, pc.zero, m, precision.reduce_bytes, precision.param_bytes)
    if not model.is_moe:
        return {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    # the routed experts reduce over the dp x cp / ep ranks that hold the same ones; the
    # all-to-alls carry each token to its experts and back (`formulas.experts`)
    experts = local_expert_param_count(model, pc.tp, pc.ep, moes)
    dp += dp_bytes(experts, pc.dp * pc.cp // pc.ep, pc.zero, m, precision.reduce_bytes,
                   precision.param_bytes)
    calls = ALL_TO_ALLS + (2 if work.recompute == "full" else 0)
    ep = m * moes * calls * dispatch_bytes(work.tokens_per_microbatch(pc), model.moe_top_k,
                                           pc.ep, model.dim, act)
    return {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": int(ep)}
