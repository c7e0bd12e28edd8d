"""ProcessGrid: the layout of ranks, checked without processes (and its groups with them)."""
import torch.distributed as dist

from minipar.runtime import launch
from minipar.trainer.grid import ProcessGrid


def test_sixteen_ranks_match_llama3_figure():
    g = ProcessGrid(tp=2, cp=2, pp=2, dp=2)
    # ranks 0-1 share TP, 0 and 2 CP, 0 and 4 PP, 0 and 8 DP
    assert g.group_ranks("tp", 0) == (0, 1)
    assert g.group_ranks("cp", 0) == (0, 2)
    assert g.group_ranks("pp", 0) == (0, 4)
    assert g.group_ranks("dp", 0) == (0, 8)
    assert g.group_ranks("dp_cp", 0) == (0, 2, 8, 10)
    assert g.coords(13) == {"tp": 1, "cp": 0, "pp": 1, "dp": 1}
    from minipar.teach.figures import describe_grid
    text = describe_grid(g)
    assert "tp    groups of 2: [0,1] [2,3]" in text
    assert "dp    groups of 2: [0,8] [1,9]" in text


def test_coords_round_trip_and_groups_partition_the_world():
    g = ProcessGrid(tp=4, cp=1, pp=2, dp=2)
    for r in range(g.world_size):
        assert g.rank_of(**g.coords(r)) == r
    for axis in ("tp", "cp", "pp", "dp", "dp_cp"):
        groups = g.all_groups(axis)
        members = sorted(r for grp in groups for r in grp)
        assert members == list(range(g.world_size)), axis
        size = {"tp": 4, "cp": 1, "pp": 2, "dp": 2, "dp_cp": 2}[axis]
        assert all(len(grp) == size for grp in groups)


def _groups_on_rank():
    g = ProcessGrid(2, 2, 1, 2, dist.get_rank()).init_groups()
    # each group really connects the ranks it names: sum of their ranks
    import torch
    out = {}
    for axis in ("tp", "cp", "dp", "dp_cp"):
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t, group=getattr(g, axis).group)
        out[axis] = (t.item(), sum(getattr(g, axis).ranks))
    return out


def test_process_groups_connect_the_named_ranks():
    for res in launch.run_local(_groups_on_rank, 8):
        for axis, (got, want) in res.items():
            assert got == want, axis
