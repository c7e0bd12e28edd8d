"""Expert parallelism in the cost model: the routed experts' GEMMs, and the all-to-alls that
carry each token to its experts and back.

Chapter "Experts: the fifth axis". A mixture-of-experts block replaces the dense MLP by a
router, shared experts every token passes through and E routed experts of which each token
meets top_k. Expert parallelism splits the E experts over ep ranks carved from the dp x cp
ranks; a token is sent to the ranks holding its experts (dispatch) and its outputs come
back (combine), forward and again backward: four all-to-alls per block and micro-batch
(six when full recomputation redoes the forward). What this file adds to a step:

* the experts' GEMMs, at the kernel model's speed for their shapes (`kernels.linear_seconds`:
  the measured GEMMs and the kernel curve fitted to them). Each local expert multiplies
  only the tokens routed to it: small GEMMs, below the peak a dense MLP of the same FLOPs
  reaches. On the busiest rank: `--moe-imbalance` I is the busiest expert's load over the
  mean, an input (routing is data: the trainer's step record measures it);
* the all-to-alls' bytes (`formulas.experts.dispatch_bytes`, scaled to the busiest rank)
  and their time: over NVLink when the EP group sits in one server, else split between
  NVLink and the NIC. Node-limited routing (DeepSeek-V3: each token to at most M servers,
  sent once per server over InfiniBand and forwarded over NVLink) bounds the NIC's share;
* what overlaps: a stack that overlaps the all-to-alls with another micro-batch's compute
  (`Efficiency.ep_overlap`, DeepSeek's DualPipe) exposes only what outlasts that compute,
  and its communication kernels hold `Efficiency.ep_comm_sms` SMs meanwhile; others wait.

The EP group is placed on tp x ep consecutive GPUs: Megatron-core's rank order
(tp-cp-ep-dp-pp) and DeepSeek-V3's "64-way Expert Parallelism spanning 8 nodes", where the
cost model's [TP, CP, PP, DP] numbering would spread it over one GPU per server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ModelConfig, ParallelConfig
from . import kernels
from .hardware import collective_latency_s
from .scenario import Scenario
from .wire import ALL_TO_ALLS
from ..formulas.experts import dispatch_bytes


def busiest_rank_load(experts: int, ep: int, imbalance: float) -> float:
    """Routed tokens of the busiest EP rank over the mean rank's. One expert takes
    `imbalance` x the mean expert load, the other E - 1 share the rest evenly; the rank that
    holds it has E / ep - 1 of those besides. 1 when the experts are balanced or all local
    (ep = 1), `imbalance` with one expert per rank."""
    if experts <= 1:
        return 1.0
    local = experts / ep
    others = (experts - imbalance) / (experts - 1)
    return (imbalance + (local - 1) * others) / local


def expert_tokens(s: Scenario) -> tuple[float, float]:
    """(tokens of the hot expert, tokens of each other expert on its rank) per micro-batch:
    the EP group's ep x T x top_k routed copies over E experts, the busiest at the imbalance."""
    m, pc = s.model, s.parallel
    mean = pc.ep * s.tokens * m.moe_top_k / m.moe_experts
    imb = s.work.moe_imbalance
    return imb * mean, (m.moe_experts - imb) / max(1, m.moe_experts - 1) * mean


def mlp_seconds(tokens: float, model: ModelConfig, ffn: float, s: Scenario) -> float:
    """Forward and backward GEMMs of one MLP of width `ffn` (already split over tp) on
    `tokens` tokens: (gate,) up and down (`kernels.linear_seconds`)."""
    if tokens <= 0:
        return 0.0
    h, c = model.dim, s.cluster
    up = (model.mlp_matrices - 1) * ffn
    return sum(kernels.linear_seconds(tokens, h, up, c)) + sum(kernels.linear_seconds(tokens, ffn, h, c))


@dataclass(frozen=True)
class Block:
    """Seconds a mixture-of-experts block adds to a dense one, forward and backward of one
    micro-batch on the busiest EP rank: GEMMs and memory-bound kernels."""

    matmul: float
    elementwise: float


def block_seconds(s: Scenario) -> Block:
    """`Block`: the router's GEMM, the shared experts (one MLP of S x expert_ffn_dim), the
    rank's routed experts (the hot one and E / ep - 1 others, each its own GEMMs), less the
    dense MLP; and the memory-bound kernels: the tokens permuted into expert order and back
    (read and write k h each way), the experts' SwiGLU products instead of the dense one's."""
    m, pc, tp, t = s.model, s.parallel, s.parallel.tp, s.tokens
    if not m.is_moe:
        return Block(0.0, 0.0)
    f = m.expert_ffn_dim / tp
    hot, other = expert_tokens(s)
    routed = mlp_seconds(hot, m, f, s) + (m.moe_experts // pc.ep - 1) * mlp_seconds(other, m, f, s)
    shared = mlp_seconds(t, m, m.moe_shared_experts * f, s) if m.moe_shared_experts else 0.0
    router = sum(kernels.linear_seconds(t, m.dim, m.moe_experts, s.cluster))
    matmul = router + shared + routed - mlp_seconds(t, m, m.ffn_dim / tp, s)
    load = busiest_rank_load(m.moe_experts, pc.ep, s.work.moe_imbalance)
    copies = m.moe_top_k * load
    per_token = (4 * copies * m.dim + m.mlp_matrices * ((copies + m.moe_shared_experts) * f
                                                         - m.ffn_dim / tp)) * s.precision.act_bytes
    moved = kernels.elementwise_factor(s.efficiency.elementwise) * 3 * per_token * t
    return Block(matmul, kernels.stream_seconds(moved, s.cluster))


def ep_span(pc: ParallelConfig) -> int:
    """GPUs one EP group covers: tp x ep consecutive GPUs (the module's placement)."""
    return pc.tp * pc.ep


def nic_copies(top_k: int, servers: int, max_nodes: int) -> float:
    """Copies of one token that leave its server, with uniform routing over `servers`
    servers. Without node-limited routing each of its top_k copies goes on its own, and
    (servers - 1) / servers of them land elsewhere. With it (DeepSeek-V3: `max_nodes` M) a
    token is sent once to each target server over the NIC and forwarded there over NVLink:
    the distinct servers among its top_k experts, N (1 - (1 - 1/N)^k), at most M, less
    its own server's share."""
    if servers <= 1:
        return 0.0
    if max_nodes <= 0:
        return top_k * (servers - 1) / servers
    distinct = min(float(max_nodes), servers * (1 - (1 - 1 / servers) ** top_k))
    return distinct * (servers - 1) / servers


@dataclass(frozen=True)
class AllToAll:
    """One dispatch (or combine) of one micro-batch through one block, on the busiest EP
    rank: the bytes it sends (as `formulas.experts.dispatch_bytes` counts them, times that
    rank's load), those of them on the NIC, and its seconds."""

    wire_bytes: float
    nic_bytes: float
    seconds: float


def all_to_all(s: Scenario, element_bytes: int | None = None) -> AllToAll:
    """`AllToAll`. Inside one server: NVLink, at the stack's share of it. Across servers the
    NIC and NVLink work at once (DeepSeek: "communications via IB and NVLink are fully
    overlapped"): the slower of the two, plus NCCL's latency of one step over the group."""
    m, pc, c, eff = s.model, s.parallel, s.cluster, s.efficiency
    act = element_bytes or s.precision.act_bytes
    load = busiest_rank_load(m.moe_experts, pc.ep, s.work.moe_imbalance)
    wire = dispatch_bytes(s.tokens, m.moe_top_k, pc.ep, m.dim, act) * load
    span = ep_span(pc)
    intra, inter = eff.links
    if pc.ep <= 1:
        return AllToAll(0.0, 0.0, 0.0)
    servers = math.ceil(span / c.gpus_per_node)
    nic = s.tokens * nic_copies(m.moe_top_k, servers, m.moe_max_nodes) * m.dim * act * load
    # what travels by NVLink: the copies to peers in the server, and those a server receives
    # for its other GPUs (forwarded), about what the NIC brought in
    nvlink = wire - s.tokens * m.moe_top_k * (servers - 1) / servers * m.dim * act * load + nic
    seconds = max(nvlink / (c.intra_node_GBps * intra * 1e9),
                  nic / (c.inter_node_GBps * inter * 1e9) if servers > 1 else 0.0)
    return AllToAll(wire, nic, seconds + collective_latency_s("all_to_all", pc.ep, servers, c))


@dataclass(frozen=True)
class ExpertTraffic:
    """Expert parallelism's side of one micro-batch on the pace rank (`ep_terms`), and its
    bytes per step: what `--json` reports under "ep"."""

    calls: float             # all-to-alls per micro-batch (blocks x 4, or 6 with full recompute)
    dispatch: AllToAll
    combine: AllToAll
    exposed: float           # seconds per micro-batch on the critical path
    hidden: float            # seconds per micro-batch behind compute

    @property
    def seconds(self) -> float:
        return self.calls / 2 * (self.dispatch.seconds + self.combine.seconds)


def ep_terms(s: Scenario, moe_layers: float, compute: float) -> ExpertTraffic:
    """The all-to-alls of one micro-batch through `moe_layers` blocks. Dispatch sends the
    stack's dispatch dtype (DeepSeek: FP8), the combine the activations'. Without overlap all
    of it waits; with it (`Efficiency.ep_overlap`), what outlasts the micro-batch's
    `compute` waits, and while the rest runs the communication kernels hold
    `Efficiency.ep_comm_sms` of the SMs: that share of its time is lost to compute."""
    eff = s.efficiency
    calls = moe_layers * (ALL_TO_ALLS + (2 if s.work.recompute == "full" else 0))
    traffic = ExpertTraffic(calls, all_to_all(s, eff.dispatch_bytes), all_to_all(s), 0.0, 0.0)
    total = traffic.seconds
    if not eff.ep_overlap:
        return ExpertTraffic(calls, traffic.dispatch, traffic.combine, total, 0.0)
    exposed = max(0.0, total - compute)
    hidden = total - exposed
    lost = hidden * eff.ep_comm_sms / s.cluster.sms
    return ExpertTraffic(calls, traffic.dispatch, traffic.combine, exposed + lost, hidden - lost)


def ep_report(e: ExpertTraffic, s: Scenario, microbatches: int) -> dict:
    """The "ep" object of `--json`: bytes each GPU of the busiest EP rank sends per step in
    all-to-alls (on every link, and of them on the NIC) and their seconds, exposed and hidden."""
    pc, m = s.parallel, s.model
    per_call = (e.dispatch.wire_bytes + e.combine.wire_bytes) / 2
    nic = (e.dispatch.nic_bytes + e.combine.nic_bytes) / 2
    return {"ep": pc.ep, "span_gpus": ep_span(pc), "imbalance": s.work.moe_imbalance,
            "busiest_rank_load": busiest_rank_load(m.moe_experts, pc.ep, s.work.moe_imbalance),
            "all_to_alls": microbatches * e.calls,
            "all_to_all_bytes": microbatches * e.calls * per_call,
            "nic_bytes": microbatches * e.calls * nic,
            "all_to_all_s": microbatches * e.seconds,
            "exposed_s": microbatches * e.exposed, "hidden_s": microbatches * e.hidden}


def uneven_all_to_all_seconds(send: list[float], recv: list[float], me: int, s: Scenario) -> float:
    """One all-to-all as rank `me` of its EP group sees it, with the bytes it sends to and
    receives from each member (a recorded run's split sizes, scaled to the target): each
    direction of each link carries its own, the NIC what crosses servers (members tp x ep
    consecutive GPUs apart by `ep_span`'s placement), NVLink the rest; the slower link,
    plus NCCL's latency. The replay takes the slowest member's: a hot expert's rank."""
    c, pc = s.cluster, s.parallel
    intra, inter = s.efficiency.links
    per_server = max(1, c.gpus_per_node // pc.tp)
    server = [j // per_server for j in range(len(send))]
    def link(nbytes: list[float]) -> tuple[float, float]:
        remote = sum(b for j, b in enumerate(nbytes) if j != me and server[j] != server[me])
        local = sum(b for j, b in enumerate(nbytes) if j != me and server[j] == server[me])
        return local, remote
    (ls, rs), (lr, rr) = link(send), link(recv)
    seconds = max(max(ls, lr) / (c.intra_node_GBps * intra * 1e9),
                  max(rs, rr) / (c.inter_node_GBps * inter * 1e9))
    return seconds + collective_latency_s("all_to_all", len(send), len(set(server)), c)
