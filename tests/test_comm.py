"""Every collective moves the bytes the ring formulas say, and computes what it should."""
import pytest
import torch
import torch.distributed as dist

from minipar.trainer import comm, ring
from minipar.runtime import launch
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.parallel import regions

from helpers import wire_bytes_of


def test_wire_formulas():
    S = 1200
    assert comm.wire_bytes("all_reduce", 4, S) == 2 * 3 * S // 4
    assert comm.wire_bytes("all_gather", 4, S) == 3 * S // 4
    assert comm.wire_bytes("reduce_scatter", 8, S) == 7 * S // 8
    assert comm.wire_bytes("send", 2, S) == S
    assert comm.wire_bytes("all_reduce", 1, S) == 0


def _collectives(n):
    g = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    r = dist.get_rank()
    comm.LOG.reset()
    x = torch.full((6, 10), float(r))                       # 240 bytes
    comm.all_reduce(x, g.dp)
    gathered = comm.all_gather(torch.full((2, 3), float(r)), g.dp, dim=1)
    scattered = comm.reduce_scatter(torch.arange(4.0 * n).reshape(1, -1), g.dp, dim=1)
    (buf,) = comm.ring_exchange(g.dp, torch.full((5,), float(r))).wait()
    # the autograd pair: f's backward sums gradients, g's forward sums values
    a = torch.ones(3, requires_grad=True)
    regions.copy_to_group(a, g.dp).mul(r + 1).sum().backward()
    return {"sum": x[0, 0].item(), "gathered": gathered, "scattered": scattered,
            "recv": buf[0].item(), "f_grad": a.grad[0].item(), "log": comm.LOG.summary()}


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_compute_and_count(n):
    res = launch.run_local(_collectives, n, n)
    for r, out in enumerate(res):
        assert out["sum"] == sum(range(n))
        assert out["gathered"].shape == (2, 3 * n)
        assert out["gathered"][0, ::3].tolist() == [float(i) for i in range(n)]
        full = torch.arange(4.0 * n) * n
        assert out["scattered"].flatten().tolist() == full.chunk(n)[r].tolist()
        assert out["recv"] == float((r - 1) % n)
        assert out["f_grad"] == sum(range(1, n + 1))
        log = out["log"]["dp"]
        ar = log["all_reduce"]
        # 240 bytes forward plus 12 bytes (copy_to_group's backward)
        assert ar["calls"] == 2 and ar["payload_bytes"] == 240 + 12
        assert ar["wire_bytes"] == 2 * (n - 1) * 240 // n + 2 * (n - 1) * 12 // n
        ag = log["all_gather"]
        assert ag["payload_bytes"] == 24 and ag["wire_bytes"] == (n - 1) * 24 * n // n
        rs = log["reduce_scatter"]
        assert rs["payload_bytes"] == 16 * n and rs["wire_bytes"] == (n - 1) * 16 * n // n
        assert log["send"] == {"calls": 1, "payload_bytes": 20, "wire_bytes": 20}
        assert log["recv"]["wire_bytes"] == 0


def _gather_scatter_autograd():
    g = ProcessGrid(tp=2, rank=dist.get_rank()).init_groups()
    r = dist.get_rank()
    x = torch.full((1, 2, 3), float(r + 1), requires_grad=True)
    y = regions.gather_from_group(x, g.tp, dim=1)          # [1, 4, 3]
    w = torch.arange(4.0).view(1, 4, 1)
    (y * w).sum().backward()
    z = torch.full((1, 4, 3), float(r + 1), requires_grad=True)
    s = regions.reduce_scatter_to_group(z, g.tp, dim=1)   # [1, 2, 3], sum over ranks
    s.sum().backward()
    return x.grad, s.detach(), z.grad


def test_sequence_parallel_pair_is_conjugate():
    for r, (xg, s, zg) in enumerate(launch.run_local(_gather_scatter_autograd, 2)):
        # the gathered tensor's gradient, summed over 2 ranks, sliced back to rank r
        want = 2 * torch.arange(4.0).view(1, 4, 1).expand(1, 4, 3)[:, 2 * r:2 * r + 2]
        torch.testing.assert_close(xg, want)
        assert torch.all(s == 3.0)
        assert torch.all(zg == 1.0)


def _dies(rank_to_die):
    import os
    if dist.get_rank() == rank_to_die:
        os._exit(7)
    x = torch.ones(1)
    for _ in range(100):
        dist.all_reduce(x)
    return x.item()


def _raises():
    if dist.get_rank() == 2:
        raise ValueError("bad shard")
    dist.barrier()


def test_a_dead_rank_is_named_not_a_hang():
    with pytest.raises(launch.RankFailed) as e:
        launch.run_local(_dies, 4, 3, timeout_s=20)
    assert e.value.rank == 3 and "rank 3" in str(e.value)
    with pytest.raises(launch.RankFailed) as e:
        launch.run_local(_raises, 4, timeout_s=20)
    assert e.value.rank == 2 and "bad shard" in str(e.value)


def _ring_and_handles(n):
    g = ProcessGrid(dp=n, rank=dist.get_rank()).init_groups()
    r = dist.get_rank()
    x = torch.arange(4.0 * n) * (r + 1)
    comm.LOG.reset()
    total, mine = ring.ring_all_reduce(x, g.dp, axis_name="dp")
    by_hand = wire_bytes_of("dp")
    want = comm.all_reduce(x.clone(), g.dp)
    # every async collective returns one Handle type; wait() gives its result, twice too
    h = comm.all_gather(torch.full((2,), float(r)), g.dp, async_op=True)
    gathered = h.wait()
    again = h.wait()
    h2 = comm.reduce_scatter(torch.ones(2 * n), g.dp, async_op=True)
    return {"equal": torch.equal(total, want), "mine": torch.equal(mine, want.chunk(n)[r]),
            "by_hand": by_hand, "gathered": gathered.tolist(), "again": again.tolist(),
            "scattered": h2.wait().tolist(), "types": {type(h).__name__, type(h2).__name__}}


@pytest.mark.parametrize("n", [2, 4])
def test_ring_all_reduce_by_hand_equals_all_reduce_and_its_bytes(n):
    for r, out in enumerate(launch.run_local(_ring_and_handles, n, n)):
        assert out["equal"] and out["mine"]
        assert out["by_hand"] == comm.wire_bytes("all_reduce", n, 4 * 4 * n)
        assert out["gathered"] == out["again"] == [float(q) for q in range(n) for _ in range(2)]
        assert out["scattered"] == [float(n), float(n)]
        assert out["types"] == {"Handle"}
