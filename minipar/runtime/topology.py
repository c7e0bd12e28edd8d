"""Where `ProcessGrid`'s ranks land on a cluster's servers, racks and pods, and which link
each axis' traffic crosses.

Chapter "From a laptop to a cluster" (the cost model's `Cluster` describes the machine).

Ranks are laid on consecutive GPUs (rank r is GPU r % gpus_per_node of server
r // gpus_per_node), as torchrun numbers them (`RANK = GROUP_RANK x nproc + LOCAL_RANK`).
"""

from collections import Counter

from ..plan.costmodel.hardware import LLAMA3_CLUSTER, Cluster
from ..trainer.grid import AXES, ProcessGrid

LINKS = ("NVLink", "rail", "spine", "across pods")   # fastest first


def groups(grid: ProcessGrid, axis: str) -> list[tuple[int, ...]]:
    """Every group of `axis`, each listed once in axis order, from the grid's own
    `coords` and `rank_of` (fast enough for 16,384 ranks, unlike `all_groups`)."""
    out = []
    for r in range(grid.world_size):
        c = grid.coords(r)
        if c[axis] == 0:
            out.append(tuple(grid.rank_of(**{**c, axis: i}) for i in range(grid.sizes[axis])))
    return out


def link(a: int, b: int, cluster: Cluster = LLAMA3_CLUSTER) -> str:
    """The link between GPUs a and b on a rail-optimized fabric: NVLink inside a server; one
    leaf switch when both are GPU i of their servers (the same rail); the spine when their
    local indices differ; the pods' uplinks when they are in different pods."""
    n = cluster.gpus_per_node
    if a // n == b // n:
        return "NVLink"
    if a // cluster.pod_size != b // cluster.pod_size:
        return "across pods"
    return "rail" if a % n == b % n else "spine"


def ring_links(grid: ProcessGrid, axis: str, cluster: Cluster = LLAMA3_CLUSTER) -> Counter:
    """How many hops of each link the rings of `axis` take: each group's ring, neighbour to
    neighbour (a ring of two is one hop)."""
    hops = Counter()
    for g in groups(grid, axis):
        pairs = list(zip(g, g[1:] + g[:1])) if len(g) > 2 else list(zip(g, g[1:]))
        hops.update(link(a, b, cluster) for a, b in pairs)
    return hops


def slowest_link(grid: ProcessGrid, axis: str, cluster: Cluster = LLAMA3_CLUSTER) -> str | None:
    """The slowest link any group of `axis` crosses (None: the axis has size one)."""
    hops = ring_links(grid, axis, cluster)
    return max(hops, key=LINKS.index) if hops else None


def placement(tp=1, cp=1, pp=1, dp=1, cluster: Cluster = LLAMA3_CLUSTER) -> dict:
    """{axis: slowest link} of a layout: what the chapter's explorer and exercise ask."""
    grid = ProcessGrid(tp, cp, pp, dp)
    return {a: slowest_link(grid, a, cluster) for a in AXES if grid.sizes[a] > 1}


def straddling_replicas(model_gpus: int, world: int, pod_size: int) -> list[int]:
    """Model replicas (index along DP) whose consecutive GPUs cross a pod boundary."""
    return [d for d in range(world // model_gpus)
            if d * model_gpus // pod_size != ((d + 1) * model_gpus - 1) // pod_size]
