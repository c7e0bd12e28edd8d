"""Data parallelism and ZeRO against the single device: same losses, same gradients, the
bytes the formulas say, and the memory each stage promises."""
import functools

import pytest

from helpers import assert_close_grads, assert_same_losses, reference, run_layout

LAYOUTS = {
    "dp2": dict(dp=2),
    "dp2-naive": dict(dp=2, bucket_mb=0),
    "dp2-small-buckets": dict(dp=2, bucket_mb=0.1),
    "dp2-zero1": dict(dp=2, zero=1),
    "dp2-zero2": dict(dp=2, zero=2),
    "dp2-zero3": dict(dp=2, zero=3),
    "dp4": dict(dp=4),
    "dp4-zero1": dict(dp=4, zero=1),
    "dp4-zero2": dict(dp=4, zero=2),
    "dp4-zero3": dict(dp=4, zero=3),
    "dp2-zero2-micro2": dict(dp=2, zero=2, microbatches=2),
    "dp2-zero3-micro2": dict(dp=2, zero=3, microbatches=2),
    "dp1-micro4": dict(microbatches=4),
}


@functools.lru_cache(maxsize=None)
def result(name):
    return run_layout(**LAYOUTS[name])


@pytest.mark.parametrize("name", LAYOUTS)
def test_same_losses_and_gradients_as_single_device(name):
    out, ref = result(name), reference()
    assert_same_losses(out, ref)
    for rank_result in out["all"]:
        assert_close_grads(rank_result["grads"], ref["grads"])


@pytest.mark.parametrize("zero", [1, 3])
def test_tied_embeddings_on_one_stage_keep_one_copy_of_the_shared_matrix(zero):
    """With tied embeddings and no pipeline, the embedding and the head are one parameter
    in one chunk: ZeRO-3 gathers it for both uses and shards one copy of it (two units
    holding two copies used to train them apart, silently)."""
    from minipar.plan.config import ModelConfig
    tied = ModelConfig(tie_embeddings=True, name="tied")
    out, ref = run_layout(dp=2, zero=zero, init_model=tied), reference(init_model=tied)
    assert_same_losses(out, ref)
    for rank_result in out["all"]:
        assert_close_grads(rank_result["grads"], ref["grads"])


def param_bytes():
    return sum(v.numel() * 4 for v in reference()["grads"].values())


def dp_wire(name):
    comm = result(name)["records"][-1]["comm"]["dp"]
    return sum(op["wire_bytes"] for op in comm.values())


@pytest.mark.parametrize("name,n,factor", [
    ("dp2", 2, 2), ("dp4", 4, 2), ("dp2-naive", 2, 2),          # all-reduce: 2(n-1)/n
    ("dp4-zero1", 4, 2), ("dp4-zero2", 4, 2),                    # reduce-scatter + all-gather
    ("dp2-zero3", 2, 3), ("dp4-zero3", 4, 3),                    # + a second all-gather
])
def test_dp_wire_bytes_equal_the_ring_formula(name, n, factor):
    assert dp_wire(name) == factor * (n - 1) * param_bytes() // n


def test_naive_sends_one_all_reduce_per_gradient_and_buckets_fewer():
    n_params = len(reference()["grads"])
    assert result("dp2-naive")["records"][0]["comm"]["dp"]["all_reduce"]["calls"] == n_params
    small = result("dp2-small-buckets")["records"][0]["comm"]["dp"]["all_reduce"]["calls"]
    assert 1 < small < n_params
    # 1.3 MB of gradients: a first bucket of 1 MB (DDP's rule), then the rest (< 25 MB)
    assert result("dp2")["records"][0]["comm"]["dp"]["all_reduce"]["calls"] == 2


def test_zero2_with_microbatches_reduce_scatters_each_microbatch():
    rs = result("dp2-zero2-micro2")["records"][0]["comm"]["dp"]["reduce_scatter"]
    assert rs["wire_bytes"] == 2 * param_bytes() // 2


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_per_rank_follows_the_zero_stage(zero, n):
    P = param_bytes()
    mem = [r["memory"] for r in result(f"dp{n}" + (f"-zero{zero}" if zero else ""))["all"]]
    # what ZeRO promises, per rank: 1 shards the optimizer state (Adam's m and v, 2P),
    # 2 also the gradients, 3 also the parameters
    want = {"params": P / n if zero >= 3 else P, "grads": P / n if zero >= 2 else P,
            "optimizer": 2 * P / n if zero >= 1 else 2 * P}
    slack = 4 * 4 * 75          # padding: under one float per rank and parameter tensor
    for kind, w in want.items():
        for m in mem:
            assert abs(m[kind] - w) <= slack, (kind, m[kind], w)
        if w < P * (2 if kind == "optimizer" else 1):
            assert sum(m[kind] for m in mem) == (2 * P if kind == "optimizer" else P)


def _overlap_rank(zero):
    import torch
    import torch.distributed as dist
    from minipar.trainer import events
    from minipar.plan.config import ModelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer, cross_entropy_sum
    from minipar.trainer.parallel.zero import ZERO_STAGES
    grid = ProcessGrid(dp=2, rank=dist.get_rank()).init_groups()
    model = Transformer(ModelConfig.preset("tiny"), seed=0)
    dp = ZERO_STAGES[zero]([model], grid.dp_cp, bucket_mb=0.2)
    optimizer = torch.optim.AdamW([x for x, _ in dp.optimizer_params()], lr=1e-3)
    x = torch.randint(0, 256, (2, 17))

    def step():
        dp.start_step()
        with events.span("backward", kind="B"):
            cross_entropy_sum(model(x[:, :-1]), x[:, 1:]).backward()
            dp.finish_backward()
        optimizer.step()
        dp.after_optimizer_step()
    step()                      # not recorded: no recorder installed
    rec = events.start(grid.rank)
    step()
    events.stop()
    return rec.events, len(dp.buckets)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_overlap_picture_is_in_the_event_stream(zero):
    """Each bucket's gradient collective is one event of the one stream: launched inside the
    backward, tagged with its bucket, ended by the time the backward's last wait returns."""
    from minipar.runtime import launch
    for recorded, n_buckets in launch.run_local(_overlap_rank, 2, zero):
        op = "all_reduce" if zero == 0 else "reduce_scatter"
        buckets = [e for e in recorded if e["cat"] == "comm" and e["args"]["axis"] == "dp"
                   and e["args"]["op"] == op]
        assert sorted({e["args"]["bucket"] for e in buckets}) == list(range(n_buckets))
        (backward,) = [e for e in recorded if e["name"] == "backward"]
        assert all(backward["start"] <= e["start"] and e["end"] is not None
                   and e["end"] <= backward["end"] for e in buckets)
        assert all(not e["args"]["blocking"] for e in buckets)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_optimizer_sees_each_parameter_whole_or_this_ranks_piece(zero):
    """What the loop's AdamW is built from: (tensor it updates, its parameter). The
    parameter keeps its number of dims even while ZeRO-3 has freed it (weight decay goes
    to matrices only), and the pieces of all ranks cover each parameter exactly once."""
    from minipar.plan.config import ModelConfig, ParallelConfig
    from minipar.trainer.grid import ProcessGrid
    from minipar.trainer.model import Transformer
    from minipar.trainer.parallelize import data_parallel
    reference = dict(Transformer(ModelConfig.preset("tiny"), seed=0).named_parameters())
    covered = {name: 0 for name in reference}
    for rank in range(2):
        model = Transformer(ModelConfig.preset("tiny"), seed=0)
        dp = data_parallel([model], ProcessGrid(dp=2, rank=rank), ParallelConfig(dp=2, zero=zero))
        assert dp.holds_replicas == (zero == 0)
        names = {id(p): name for name, p in model.named_parameters()}
        pairs = dp.optimizer_params()
        assert sorted(names[id(p)] for _, p in pairs) == sorted(reference)
        for x, p in pairs:
            name, shard = names[id(p)], dp.shard_of(p)
            assert p.dim() == reference[name].dim(), name
            assert x is shard.key and x.numel() == shard.stop - shard.start, name
            assert (x is p) if zero == 0 else (x.dim() == 1), name
            covered[name] += x.numel()
    copies = 2 if zero == 0 else 1          # ZeRO: the two ranks' pieces, disjoint
    assert covered == {name: copies * p.numel() for name, p in reference.items()}
