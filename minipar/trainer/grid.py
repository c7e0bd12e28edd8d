"""The layout of ranks: which process holds which piece of the model.

A rank's coordinates are (dp, pp, cp, tp). TP varies fastest, then CP, then PP, then DP:
Llama 3's order [TP, CP, PP, DP], innermost first. The innermost axis communicates the most,
so its ranks are neighbours (the same 8-GPU NVLink server); DP, which communicates least and
can overlap with compute, spans the whole cluster.

`ProcessGrid` is the only object that knows this layout. Everything else asks it: "which
group do I reduce gradients over?", "who is my next pipeline stage?", "of the copies of
this replicated tensor, does mine count?".

Expert parallelism (chapter "Experts: the fifth axis") is no fifth coordinate: as in
Megatron and torchtitan, its ranks are carved from the dp x cp ranks, which hold the same
weights and see different tokens. Number the dp x cp group's ranks 0.. (CP fastest); each
run of `ep` consecutive ones is an EP group, which splits the experts, and the ranks at the
same place of every run are an expert-data-parallel group ("edp"), which holds the same
experts and reduces their gradients.

Chapter "Four dimensions at once".
"""

import itertools

import torch.distributed as dist

from .comm import Axis
from .placement import Shard, placements

AXES = ("tp", "cp", "pp", "dp")   # innermost first


class ProcessGrid:
    """rank <-> (dp, pp, cp, tp) coordinates and one process group per axis.

    Pure until `init_groups()` is called: `coords`, `rank_of` and `all_groups` work without any
    process, so the book can draw a 16 000-GPU layout on a laptop.
    """

    def __init__(self, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0,
                 ep: int = 1):
        self.sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
        self.world_size, self.ep_size = tp * cp * pp * dp, ep
        self.rank = rank            # 0 <= rank < world_size: launch and preflight see to it
        self.names = (*AXES, "dp_cp") + (("ep", "edp") if ep > 1 else ())
        groups = {name: self.group_ranks(name, rank) for name in (*AXES, "dp_cp", "ep", "edp")}
        # the whole world, for the few scalars every rank must agree on (loss, grad norm)
        groups["world"] = tuple(range(self.world_size))
        # gradients reduced over dp x cp (or edp) are data-parallel traffic: logged as "dp"
        self.axes = {name: Axis(name, g, g.index(rank), log_as="dp" if name in ("dp_cp", "edp")
                                else "") for name, g in groups.items()}
        if ep == 1:     # every expert here: its gradients go with the others, over dp x cp
            self.axes["edp"] = self.axes["dp_cp"]
        # grid.tp, grid.cp, grid.pp, grid.dp, grid.dp_cp, grid.ep, grid.edp, grid.world
        vars(self).update(self.axes)

    # -- pure layout -------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of `rank`: peel off TP (fastest), then CP, PP, DP."""
        out = {}
        for a in AXES:
            rank, out[a] = divmod(rank, self.sizes[a])
        return out

    def rank_of(self, tp: int = 0, cp: int = 0, pp: int = 0, dp: int = 0) -> int:
        """The rank at these coordinates (`coords` undone): ((dp p + pp) c + cp) t + tp."""
        s = self.sizes
        return ((dp * s["pp"] + pp) * s["cp"] + cp) * s["tp"] + tp

    def group_ranks(self, name: str, rank: int) -> tuple[int, ...]:
        """Ranks sharing every coordinate with `rank` except those of axis `name`.

        `dp_cp` is the group gradients are reduced over: CP ranks hold the same weights and
        see different tokens, exactly like DP ranks.
        """
        free = ("dp", "cp") if name in ("dp_cp", "ep", "edp") else (name,)
        c = self.coords(rank)
        # every value of the free coordinates, the others kept as they are
        group = tuple(sorted(self.rank_of(**{**c, **dict(zip(free, vals))})
                             for vals in itertools.product(*(range(self.sizes[a]) for a in free))))
        i, n = group.index(rank), self.ep_size
        # EP: my run of ep consecutive dp x cp ranks; edp: my place in every run
        return {"ep": group[i - i % n:i - i % n + n], "edp": group[i % n::n]}.get(name, group)

    def all_groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group of axis `name`, each once, ordered by its lowest rank."""
        return sorted({self.group_ranks(name, r) for r in range(self.world_size)})

    # -- this rank ---------------------------------------------------------------------
    def counts(self, p, replicated_over_dp: bool) -> bool:
        """Does this rank's copy of `p` count (in the gradient norm, in a checkpoint)?
        Copies along an axis (placed `Replicate()` or `Partial()` there; dp x cp too when
        every data-parallel rank holds the whole tensor, i.e. without ZeRO) count once: on
        the rank with index 0 on each axis the tensor is copied along."""
        copied = [self.axes[a] for a, how in placements(p).items() if not isinstance(how, Shard)]
        return all(axis.rank == 0 for axis in copied + [self.data_axis(p)] * replicated_over_dp)

    def data_axis(self, p) -> Axis:
        """The ranks that hold `p` alike and see other tokens, its gradient summed over them:
        dp x cp, or for an expert's weight the ranks holding the same experts (edp)."""
        return self.axes["edp" if "ep" in placements(p) else "dp_cp"]

    def init_groups(self, backend: str | None = None) -> "ProcessGrid":
        """Create one process group per axis. Collective: every rank calls it, in the same order.

        `new_group` must be called by all ranks for every group, even those they are not in.
        """
        for name in self.names:
            for ranks in self.all_groups(name):
                g = dist.new_group(list(ranks), backend=backend)
                if self.rank in ranks:
                    self.axes[name].group = g
        return self
