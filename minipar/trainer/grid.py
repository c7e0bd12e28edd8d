"""The layout of ranks: which process holds which piece of the model.

A rank's coordinates are (dp, pp, cp, tp). TP varies fastest, then CP, then PP, then DP:
Llama 3's order [TP, CP, PP, DP], innermost first. The innermost axis communicates the most,
so its ranks are neighbours (the same 8-GPU NVLink server); DP, which communicates least and
can overlap with compute, spans the whole cluster.

`ProcessGrid` is the only object that knows this layout. Everything else asks it: "which
group do I reduce gradients over?", "who is my next pipeline stage?", "of the copies of
this replicated tensor, does mine count?".

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

    def __init__(self, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0):
        self.sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
        self.world_size = tp * cp * pp * dp
        self.rank = rank            # 0 <= rank < world_size: launch and preflight see to it
        groups = {name: self.group_ranks(name, rank) for name in (*AXES, "dp_cp")}
        # the whole world, for the few scalars every rank must agree on (loss, grad norm)
        groups["world"] = tuple(range(self.world_size))
        # gradients reduced over dp x cp are data-parallel traffic: logged as "dp"
        self.axes = {name: Axis(name, g, g.index(rank), log_as="dp" if name == "dp_cp" else "")
                     for name, g in groups.items()}
        # grid.tp, grid.cp, grid.pp, grid.dp, grid.dp_cp, grid.world: this rank's Axis of each
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
        free = ("dp", "cp") if name == "dp_cp" else (name,)
        c = self.coords(rank)
        # every value of the free coordinates, the others kept as they are
        return tuple(sorted(self.rank_of(**{**c, **dict(zip(free, vals))})
                            for vals in itertools.product(*(range(self.sizes[a]) for a in free))))

    def all_groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group of axis `name`, each once, ordered by its lowest rank."""
        return sorted({self.group_ranks(name, r) for r in range(self.world_size)})

    # -- this rank ---------------------------------------------------------------------
    def counts(self, p, replicated_over_dp: bool) -> bool:
        """Does this rank's copy of `p` count (in the gradient norm, in a checkpoint)?
        Copies along an axis (placed `Replicate()` or `Partial()` there; dp x cp too when
        every data-parallel rank holds the whole tensor, i.e. without ZeRO) count once: on
        the rank with index 0 on each axis the tensor is copied along."""
        copied = [a for a, how in placements(p).items() if not isinstance(how, Shard)]
        return all(self.axes[a].rank == 0 for a in copied + ["dp_cp"] * replicated_over_dp)

    def init_groups(self, backend: str | None = None) -> "ProcessGrid":
        """Create one process group per axis. Collective: every rank calls it, in the same order.

        `new_group` must be called by all ranks for every group, even those they are not in.
        """
        for name in (*AXES, "dp_cp"):
            for ranks in self.all_groups(name):
                g = dist.new_group(list(ranks), backend=backend)
                if self.rank in ranks:
                    self.axes[name].group = g
        return self
