"""The hardware the cost model runs on: a cluster's GPUs and how they are wired.

Chapter "MFU and communication volume". A `Cluster` says what one GPU computes and stores
and how fast it can send, inside a server, inside a pod and between pods;
`group_bandwidth_GBps` turns that into the bandwidth one process group's ring gets, given
where its members sit in the [TP, CP, PP, DP] numbering (`axis_group`). A collective's time
is the alpha-beta model at that bandwidth (`axis_seconds`), or, on a fabric whose nccl-tests
are on file (`Cluster.fabric`, AWS's EFA), read off those measurements
(`measured_collective_seconds`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ParallelConfig
from .constants import FABRIC_FILES, NCCL_LATENCY_US, fabric_busbw_GBps, fabric_smallest
from ..datasheets import H100


FABRICS = ("infiniband", *FABRIC_FILES)


@dataclass(frozen=True)
class Cluster:
    """What one GPU can do and how the GPUs are wired.

    Bandwidths are per GPU and per direction, as the data sheets give them (NVLink 4: 900
    GB/s bidirectional = 450 each way; one 400 Gb/s NIC per GPU = 50 GB/s). The network is a
    hierarchy: GPUs in a server (NVLink), servers in a rack (one switch), racks in a pod
    (full bisection), pods in the cluster (the pod's uplinks are 1/`pod_oversubscription`
    of what its GPUs could send).
    """

    name: str = "custom"
    peak_tflops: float = H100.bf16_tflops          # dense bf16 per GPU (a GPU: its data sheet's)
    hbm_gb: float = H100.hbm_gb                    # GB (1e9 bytes): an "80 GB" H100 holds 80 GiB
    hbm_TBps: float = H100.hbm_TBps                # HBM bandwidth: what memory-bound kernels run at
    gpus_per_node: int = H100.gpus_per_server
    sms: int = H100.sms                            # streaming multiprocessors per GPU
    intra_node_GBps: float = H100.nvlink_GBps      # NVLink, per GPU per direction
    inter_node_Gbps: float = H100.nic_Gbps         # RoCE / InfiniBand NIC, per GPU
    gpus_per_rack: int = 16
    pod_size: int = 3072
    pod_oversubscription: float = 7.0
    n_gpus: int = 24576
    nvlink_latency_us: float = NCCL_LATENCY_US["nvlink_step"]   # one ring step inside a server
    nic_latency_us: float = NCCL_LATENCY_US["net_step"]         # one ring step across servers
    fabric: str = "infiniband"          # or "efa": collectives across servers read off its nccl-tests

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def inter_node_GBps(self) -> float:
        return self.inter_node_Gbps / 8

    @property
    def hbm_Bps(self) -> float:
        return self.hbm_TBps * 1e12

    def problems(self) -> list[str]:
        out = []
        for flag, value in (("--peak-tflops", self.peak_tflops), ("--hbm-gb", self.hbm_gb),
                            ("--hbm-TBps", self.hbm_TBps),
                            ("--gpus-per-node", self.gpus_per_node),
                            ("--intra-node-GBps", self.intra_node_GBps),
                            ("--inter-node-Gbps", self.inter_node_Gbps)):
            if not value > 0:
                out.append(f"{flag} {value} must be positive")
        if self.fabric not in FABRICS:
            out.append(f"--fabric {self.fabric!r} must be one of {', '.join(FABRICS)}")
        return out


# Llama 3 (Dubey et al. 2024, section 3.3.1): H100 SXM at 700 W with 80 GB HBM3, 8 per
# server on NVLink, one 400 Gb/s RoCE NIC per GPU, racks of 16 GPUs (two servers), pods of
# 3,072 GPUs with full bisection bandwidth, 1:7 oversubscription between the 8 pods.
# The GPU, its memory, NVLink and NIC are the H100's data sheet (`Cluster`'s defaults).
LLAMA3_CLUSTER = Cluster(name="llama3 (H100 SXM, 24K)", gpus_per_rack=16, pod_size=3072,
                         pod_oversubscription=7.0, n_gpus=24576)


def group_bandwidth_GBps(cluster: Cluster, stride: int, size: int, world: int,
                         span: int | None = None) -> float:
    """Bandwidth per GPU (GB/s, before `Efficiency.network`) of one group's ring.

    Ranks are numbered in the [TP, CP, PP, DP] order and laid out on consecutive GPUs, so a
    group of `size` ranks `stride` apart covers `span` = stride * size GPUs. Inside one
    server: NVLink. Otherwise the NIC. If the group spans pods, each of its rings leaves a pod
    once; the pod's uplink (pod_size * NIC / oversubscription) is shared by the rings of all
    the world / size groups that run at once (those with a member in the pod).
    """
    span = stride * size if span is None else span
    if span <= cluster.gpus_per_node:
        return cluster.intra_node_GBps
    # Rails: NCCL runs one ring (channel) per NIC, so a group with g members in each server
    # crosses servers on g NICs at once: g x NIC per ring member, never more than NVLink.
    nic = min(cluster.intra_node_GBps, rail_members(cluster, stride, size) * cluster.inter_node_GBps)
    if span <= cluster.pod_size:
        return nic
    rings = min(world // size, cluster.pod_size)
    uplink = cluster.pod_size * nic / cluster.pod_oversubscription
    return min(nic, uplink / rings)


def rail_members(cluster: Cluster, stride: int, size: int) -> int:
    """Members of one group (`size` ranks `stride` apart) inside each server: 8 for a TP16
    group of consecutive GPUs, 2 for a DP group of TP4 replicas, 1 for Llama 3's DP."""
    if stride >= cluster.gpus_per_node:
        return 1
    return max(1, min(size, cluster.gpus_per_node // stride))


def dp_group_span(pc: ParallelConfig) -> int:
    """GPUs between the first and the last member of a dp x cp group, plus its CP block: the
    CP ranks of a model copy are tp apart, the copies tp*cp*pp apart."""
    block = pc.tp * pc.cp
    return block * pc.pp * (pc.dp - 1) + block if pc.dp > 1 else block


def axis_group(pc: ParallelConfig, axis: str) -> tuple[int, int, int | None]:
    """(stride, size, span) of one process group of `axis` ("tp", "cp", "pp" or "dp", the
    last being the dp x cp group ZeRO and the gradient sync use), as `group_bandwidth_GBps`
    takes them."""
    if axis == "dp":
        return pc.tp, pc.dp * pc.cp, dp_group_span(pc)
    stride, size = {"tp": (1, pc.tp), "cp": (pc.tp, pc.cp), "pp": (pc.tp * pc.cp, pc.pp)}[axis]
    return stride, size, None


def collective_latency_s(op: str, n: int, nodes: int, cluster: Cluster,
                         algorithm: str | None = None) -> float:
    """Latency of one collective over n ranks on `nodes` servers, as NCCL's tuning model
    counts it (src/graph/tuning.cc, Ring/Simple): a base latency, then each of the ring's
    steps its link's latency; only the steps that cross servers pay the network's
    (nodes - 1 for an all-gather or reduce-scatter, 2 nodes for an all-reduce), the others
    NVLink's, but no less than the network's posting overhead once the ring leaves a server.
    Across many servers NCCL runs an all-reduce as a tree, 2 log2(nodes) network steps:
    rings of n - 1 round trips would be latency-bound. All-gather and reduce-scatter have no
    tree in NCCL: rings at any scale. A send: one step. `algorithm` ("ring" or "tree")
    forces NCCL's choice, to compare the two."""
    if n <= 1:
        return 0.0
    lat = NCCL_LATENCY_US
    step = cluster.nvlink_latency_us
    intra = step if nodes <= 1 else max(step, lat["net_overhead"])
    inter = cluster.nic_latency_us
    if op == "send":
        return 1e-6 * (inter if nodes > 1 else intra)
    if op == "all_reduce" and (algorithm or ("tree" if nodes > 2 else "ring")) == "tree":
        per_node = n // nodes
        return 1e-6 * (lat["base"] + 2 * ((per_node - 1) * intra + math.ceil(math.log2(nodes)) * inter))
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter_steps = (2 * nodes if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    return 1e-6 * (lat["base"] + (steps - inter_steps) * intra + inter_steps * inter)


MEASURED_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def measured_collective_seconds(wire: float, op: str, n: int, nodes: int, rail: int,
                                cluster: Cluster) -> float:
    """One collective of `wire` bytes per rank over n ranks on `nodes` servers (`rail` of them
    in each, one NIC each), read off the fabric's nccl-tests, which ran every GPU of each
    server: the same bytes through each NIC are a message gpus_per_node / rail times larger
    there, at rail / gpus_per_node of its bus bandwidth. Below the smallest message measured,
    NCCL's latency plus the bytes at that message's rate."""
    per_rank = wire / (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)
    size = per_rank * cluster.gpus_per_node / rail
    busbw = fabric_busbw_GBps(cluster.fabric, op, nodes, size) * 1e9 * rail / cluster.gpus_per_node
    smallest = fabric_smallest(cluster.fabric)
    if size >= smallest:
        return wire / busbw
    # a smaller message: from NCCL's latency (nothing sent) to the smallest one measured
    at_smallest = wire * smallest / size / busbw
    latency = collective_latency_s(op, n, nodes, cluster)
    return min(at_smallest, latency + (at_smallest - latency) * size / smallest)


def axis_seconds(nbytes: float, axis: str, pc: ParallelConfig, cluster: Cluster,
                 network: float | tuple[float, float], op: str | None = None,
                 calls: float = 0) -> float:
    """Seconds `nbytes` (wire bytes, all `calls` together) take through one group of `axis`:
    the alpha-beta model, bytes / (`network` x the group's bandwidth) plus `calls`
    collectives `op`, each paying NCCL's latency (`collective_latency_s`; `network`: one
    bus-bandwidth fraction, or (inside a server, across servers) as `Efficiency.links`)."""
    stride, size, span = axis_group(pc, axis)
    if size <= 1 or nbytes == 0:
        return 0.0
    span = stride * size if span is None else span
    inter = span > cluster.gpus_per_node
    nodes = max(1, min(size, math.ceil(span / cluster.gpus_per_node))) if inter else 1
    if inter and op in MEASURED_OPS and cluster.fabric in FABRIC_FILES and calls >= 1:
        rail = rail_members(cluster, stride, size)
        return calls * measured_collective_seconds(nbytes / calls, op, size, nodes, rail, cluster)
    intra_eff, inter_eff = network if isinstance(network, tuple) else (network, network)
    bw = group_bandwidth_GBps(cluster, stride, size, pc.world_size, span) * (inter_eff if inter else intra_eff)
    latency = calls * collective_latency_s(op, size, nodes, cluster) if op else 0.0
    return nbytes / (bw * 1e9) + latency
