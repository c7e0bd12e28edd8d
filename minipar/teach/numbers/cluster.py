"""The numbers the cluster chapter states (book/cluster.md), computed once from where ranks
land on the cluster (`minipar.runtime.topology`)."""
from __future__ import annotations

import math

from ...plan.config import ModelConfig
from ...plan.costmodel.hardware import LLAMA3_CLUSTER, collective_latency_s
from ...plan.costmodel.table4 import TABLE4
from ...plan.flops import param_count
from ...trainer.grid import ProcessGrid
from ...runtime.topology import groups, ring_links, straddling_replicas
from .core import Number, derived, paper

def _table4() -> dict[str, Number]:
    c, row1, row3 = LLAMA3_CLUSTER, TABLE4[0], TABLE4[2]
    model1 = row1.tp * row1.cp * row1.pp
    model3 = row3.tp * row3.cp * row3.pp
    grid1 = ProcessGrid(row1.tp, row1.cp, row1.pp, row1.dp)
    dp_pods = len({r // c.pod_size for r in groups(grid1, "dp")[0]})
    straddle = straddling_replicas(model3, row3.gpus, c.pod_size)
    return {
        "row1_replicas_per_pod": derived(c.pod_size // model1, source="3,072 / 128"),
        "row1_dp_pods": derived(dp_pods, source="pods one DP group of row 1 touches"),
        "row1_pp_servers": derived(row1.pp, source="one server per stage: TP 8 fills it"),
        "row3_straddling": derived(len(straddle), source="replicas crossing a pod boundary"),
    }


def _links() -> dict[str, Number]:
    """One TP all-reduce of Llama 3 405B's activation, inside a server and across one."""
    m, row1, c = ModelConfig.preset("llama3-405b"), TABLE4[0], LLAMA3_CLUSTER
    per_step = 4 * m.n_layers / row1.pp                      # 2 forward + 2 backward per layer
    tp4 = ProcessGrid(tp=4, pp=4, dp=2)
    cross = ring_links(tp4, "pp")
    return {
        "tp_per_stage": derived(per_step, "{:.0f}",
                                source="4 all-reduces x 126 layers / 16 stages, per micro-batch"),
        "tp4_pp_spine": Number(cross["spine"], source="tp 4 pp 4 dp 2: PP hops via the spine"),
        "tp4_pp_hops": Number(sum(cross.values()), source="all PP hops of that layout"),
        "rails": Number(c.gpus_per_node, source="one rail per GPU of a server"),
    }


def _nccl() -> dict[str, Number]:
    """Latency of one all-reduce over Table 4 row 1's DP group (one GPU in each of n
    servers), ring or tree, by NCCL's own model (`costmodel.hardware.collective_latency_s`)."""
    n, c = TABLE4[0].dp, LLAMA3_CLUSTER
    ring, tree = 2 * (n - 1), 2 * math.ceil(math.log2(n))
    ring_s, tree_s = (collective_latency_s("all_reduce", n, n, c, a) for a in ("ring", "tree"))
    return {
        "nccl_flows": paper(16, source="Section 3.3.1: 16 flows between two GPUs, not 1"),
        "dp_ring_steps": derived(ring, source="2(n-1), n = 64"),
        "dp_tree_steps": derived(int(tree), source="2 log2 n"),
        "dp_ring_latency_ms": derived(ring_s * 1e3, "{:.1f} ms", source="NCCL's base + steps x latency"),
        "dp_tree_latency_ms": derived(tree_s * 1e3, "{:.2f} ms", source="NCCL's base + steps x latency"),
        "bench_params": Number(param_count(ModelConfig.preset("llama3.2-1b")) / 1e9,
                               "{:.1f} billion", source="flops.param_count"),
    }


def numbers() -> dict[str, Number]:
    return {**_table4(), **_links(), **_nccl()}
