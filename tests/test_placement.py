"""The placement record: Shard/Replicate/Partial per parameter, and the one rule that cuts a
full tensor into a rank's part (the layers', the checkpoint's and the Hugging Face reader's)."""
import gc

import torch
import torch.nn as nn

from minipar.trainer.comm import Axis
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.parallel.tensor import replica_over_tp, shard_param
from minipar.trainer.placement import (_RECORDS, Partial, Replicate, Shard, local_index, place,
                                       placements)


def test_local_index_is_torch_chunk():
    full = torch.randn(8, 6)
    tp = lambda rank, size: ProcessGrid(tp=size, rank=rank).axes      # noqa: E731
    assert torch.equal(full[local_index(full.shape, {"tp": Shard(0)}, tp(1, 2))], full[4:])
    assert torch.equal(full[local_index(full.shape, {"tp": Shard(1)}, tp(2, 3))], full[:, 4:])
    for how in ({}, {"tp": Replicate()}, {"tp": Partial(), "pp": Replicate()}):
        assert torch.equal(full[local_index(full.shape, how, tp(1, 2))], full)
    # two axes sharding one dim: the second cuts the first one's chunk (DTensor's order)
    axes = ProcessGrid(tp=2, pp=2, rank=3).axes                       # tp rank 1, pp rank 1
    got = full[local_index(full.shape, {"pp": Shard(0), "tp": Shard(0)}, axes)]
    assert torch.equal(got, full.chunk(2)[1].chunk(2)[1])


def test_the_layers_cut_and_record_what_the_checkpoint_cuts():
    full = torch.randn(8, 6)
    axis = Axis("tp", (0, 1), 1)
    for dim in (0, 1):
        p = shard_param(full, axis, dim)
        assert placements(p) == {"tp": Shard(dim)}
        assert torch.equal(full[local_index(full.shape, placements(p), {"tp": axis})], p.data)
    for sp, how in ((False, Replicate()), (True, Partial())):
        norm = replica_over_tp(nn.Parameter(torch.ones(6)), axis, sp)
        assert placements(place(norm, "pp", Replicate())) == {"tp": how, "pp": Replicate()}


def test_counts_once_along_the_axes_a_parameter_is_copied_on():
    p = place(place(nn.Parameter(torch.ones(4)), "tp", Shard(0)), "pp", Replicate())
    counted = [ProcessGrid(tp=2, pp=2, dp=2, rank=r).counts(p, replicated_over_dp=False)
               for r in range(8)]
    assert counted == [True, True, False, False] * 2       # pp rank 0 only; every tp shard
    assert [ProcessGrid(tp=2, pp=2, dp=2, rank=r).counts(p, True) for r in range(8)] \
        == [True, True, False, False, False, False, False, False]


def test_a_record_goes_with_its_parameter():
    p = place(nn.Parameter(torch.ones(3, 2)), "tp", Shard(1))   # equal tensors: still two keys
    q = place(nn.Parameter(torch.ones(3, 2)), "tp", Replicate())
    assert placements(p) != placements(q)
    n = len(_RECORDS)
    del p, q
    gc.collect()
    assert len(_RECORDS) == n - 2
