"""The exercises of the data parallelism chapter, checked (see core.py for how)."""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ...plan.config import ParallelConfig
from ...plan.config import TrainConfig
from ...plan.config import ModelConfig
from ...plan.flops import param_count
from ...plan.formulas.collectives import wire_bytes
from ...plan.formulas.data_parallel import dp_bytes
from ...trainer.parallel.data import FIRST_BUCKET_MB, make_buckets
from ...trainer.step import Trainer
from ...runtime import launch
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .. import replays
from .collectives import HEADERS_WHY, RING_NOT_GLOO, diagnosed
from .core import (FLOAT32, Verdict, at, compare_calls, exercise, first_difference, function_given,
                   on_ranks, predicted, replayed_exposure, right, wrong, yours)


def _zero_mistakes(n_params: int, n: int, zero: int, m: int, grad_bytes: int, param_bytes: int):
    if n == 1:
        return [(None, "with n = 1 there is no other rank: nothing goes on the wire.")]
    f = (n - 1) / n
    g, p = f * n_params * grad_bytes, f * n_params * param_bytes   # one ring pass of each
    want = dp_bytes(n_params, n, zero, m, grad_bytes, param_bytes)
    swapped = dp_bytes(n_params, n, zero, m, param_bytes, grad_bytes)
    mistakes = {
        0: [(m * 2 * g, "the gradients accumulate over the micro-batches and are all-reduced "
                        "once per step, after the last one."),
            (g, "that is one pass of the ring; an all-reduce makes two.")],
        1: [(2 * g + p, "ZeRO-1 does not all-reduce the gradients: a rank needs only the sum "
                        "of its own slice."),
            (g, "that is only the gradients' reduce-scatter; the updated parameter slices "
                "must come back to every rank too.")],
        2: [(g + p, "ZeRO-2 keeps no full gradient to accumulate into: what does it do with "
                    "each micro-batch's gradients?"),
            (m * (g + p), "the parameters are gathered once per step, after the optimizer "
                          "step, not once per micro-batch.")],
        3: [(m * (g + p), "the backward pass needs the full weights again: they were freed "
                          "after the forward."),
            (2 * p + g, "ZeRO-3 gathers the weights and reduce-scatters the gradients for "
                        "every micro-batch."),
            (want + p, "ZeRO-3 has no all-gather after the optimizer step: each rank keeps "
                       "and updates only its slice of the weights.")],
    }.get(zero, [])
    if swapped != want:
        mistakes.append((swapped, "the gradients travel in grad_bytes per element, the "
                                  "parameters in param_bytes: swapped."))
    return mistakes + [(want * n / (n - 1), "a ring pass sends n-1 chunks, not n: the chunk "
                                            "a rank keeps never leaves it.")]


# ---------------------------------------------------------------- find the bug: ZeRO's bytes
def buggy_zero_bytes(n_params: int, n: int, zero: int, microbatches: int, grad_bytes: int,
                     param_bytes: int) -> float:
    """The bytes one rank sends per step under ZeRO stage `zero` over n data-parallel ranks,
    ring collectives, with two bugs (the exercise)."""
    g = (n - 1) / n * n_params * grad_bytes        # one ring pass of the gradients
    p = (n - 1) / n * n_params * param_bytes       # one ring pass of the weights
    if zero == 0:
        return 2 * g
    if zero == 1:
        return g + p
    return microbatches * (g + p)


ZERO_WORLD = 4
ZERO_VARIANTS = [dict(zero=z, microbatches=m) for z in (0, 1, 2, 3) for m in (1, 2)]


def _zero_steps(variants):
    """On each rank: one step of `tiny` per variant on ZERO_WORLD data-parallel ranks; the
    bytes the step's collectives sent on the dp axis, as CommLog counts them."""
    out = []
    for kw in variants:
        cfg = TrainConfig(parallel=ParallelConfig(dp=ZERO_WORLD, **kw), steps=1,
                          progress=False, global_batch=8, seq_len=32)
        cfg.validate()
        comm = Trainer(cfg).step(0)["comm"].get("dp", {})
        out.append(sum(op["wire_bytes"] for op in comm.values()))
    return out


@functools.cache
def zero_run_bytes() -> dict:
    """{(zero, microbatches): dp bytes rank 0 sent} from one world of ZERO_WORLD gloo ranks."""
    sent = launch.run(_zero_steps, ZERO_WORLD, ZERO_VARIANTS, timeout_s=300)[0]
    return {(kw["zero"], kw["microbatches"]): b for kw, b in zip(ZERO_VARIANTS, sent)}


def zero_cases() -> list[tuple]:
    n = param_count(ModelConfig.preset("tiny"))
    return [(n, ZERO_WORLD, kw["zero"], kw["microbatches"], 4, 4) for kw in ZERO_VARIANTS]


@exercise("data_parallel", "bug")
def check_zero_bytes(fn) -> Verdict:
    """fn(n_params, n, zero, microbatches, grad_bytes, param_bytes): `buggy_zero_bytes`
    fixed. Compared, for ZeRO-0 to 3 with one and two micro-batches, with what one step of
    `tiny` (float32) on 4 gloo ranks sends on the dp axis, as minipar's CommLog counts the
    collectives the step ran."""
    call = lambda args: f"{yours(fn)}{args!r}"
    return compare_calls(fn, zero_cases(), lambda *a: zero_run_bytes()[(a[2], a[3])], 1e-9,
                         diagnosed(call, _zero_mistakes),
                         "zero_bytes agrees with the bytes the trainer's steps sent: ZeRO-0 to "
                         "3, one and two micro-batches, 4 gloo ranks.", call=call)


def _average_gradients_worker(fn):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 4)            # the global batch; this rank trains on x[rank]
    model(x[rank]).pow(2).mean().backward()
    fn(model)
    reference(x.reshape(16, 4)).pow(2).mean().backward()   # one device, the whole batch
    for name, p in model.named_parameters():
        problem = first_difference(p.grad, dict(reference.named_parameters())[name].grad,
                         f"the gradient of {name}")
        if problem:
            return problem + " It should equal the gradient of the whole batch on one device."
    return None


@exercise("data_parallel", "implement")
def check_average_gradients(fn) -> Verdict:
    """fn(model) replaces every p.grad with its mean over the ranks."""
    return on_ranks(2, _average_gradients_worker, fn,
        "the averaged gradients equal one device's gradient of the whole batch (2 gloo ranks).")




# ---------------------------------------------------------------- find the bug: the loss
def dp_loss_buggy(model, x, y, global_tokens):
    """The loss of this rank's tokens, as a data-parallel rank must NOT compute it: the mean
    over its own tokens. Summed over ranks (minipar's all-reduce is a sum) the gradients are
    wrong; averaged they are wrong too as soon as the ranks hold different token counts."""
    return torch.nn.functional.cross_entropy(model(x), y)


def _loss_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    cuts = [0, 3, 10]                     # uneven shards: 3 tokens on rank 0, 7 on rank 1
    mine = slice(cuts[rank], cuts[rank + 1])
    fn(model, x[mine], y[mine], len(y)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)           # a sum, as minipar does
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        problem = first_difference(p.grad, q.grad, f"the summed gradient of {name}")
        if problem:
            return at(0, rank, problem + " It should be the gradient of the mean loss over "
                      "all 10 tokens (3 on rank 0, 7 on rank 1).")
    return None


@exercise("data_parallel", "bug")
def check_dp_loss(fn) -> Verdict:
    """fn(model, x, y, global_tokens) -> this rank's loss, such that the gradients summed
    over the ranks are the gradient of the mean token loss of the whole batch. Runs on 2 gloo
    ranks holding 3 and 7 tokens (uneven on purpose)."""
    return on_ranks(2, _loss_worker, fn,
        "summed over ranks with uneven shards, the gradients are one device's (2 gloo ranks).")


# ---------------------------------------------------------------- find the bug: the replicas
def make_replica_buggy(rank: int) -> torch.nn.Module:
    """A replica as a data-parallel rank must NOT start: each rank seeds its own weights
    (the first layer's bias is frozen: it never gets a gradient, but the forward uses it)."""
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model[0].bias.requires_grad_(False)
    return model


def _replica_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_replica_buggy(rank)
    fn(model)
    reference = make_replica_buggy(0)          # one device, rank 0's initialisation
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    problem = None                    # the first one; every rank still runs every collective
    for step in range(3):
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
        problem = problem or _compare(model, reference, step, rank)
        mine = slice(rank * 8 // n, (rank + 1) * 8 // n)
        torch.nn.functional.cross_entropy(model(x[mine]), y[mine], reduction="sum").div(8).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    return problem or _compare(model, reference, 3, rank)


def _compare(model, reference, step, rank):
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        problem = first_difference(p, q, f"parameter {name}")
        if problem:
            return at(step, rank, problem + " Every replica must hold rank 0's weights "
                      "(all of them, frozen ones included) before the first step.")
    return None


@exercise("data_parallel", "bug")
def check_sync_replicas(fn) -> Verdict:
    """fn(model) -> None, called once on every rank right after `make_replica_buggy(rank)`:
    make every replica hold rank 0's weights. Then 3 steps of data-parallel AdamW, compared
    with one device at every step (2 gloo ranks)."""
    return on_ranks(2, _replica_worker, fn,
        "every replica starts from rank 0's weights and stays equal to one device for 3 steps.")


# ---------------------------------------------------------------- implement: a ZeRO-1 step
ZERO1_ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
ZERO1_SHAPES = ((3, 3), (5,), (7,), (2, 2))    # 9, 5, 7 and 4 elements: uneven over 2 ranks


def _zero1_params() -> list[torch.Tensor]:
    torch.manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ZERO1_SHAPES]
    params[3].requires_grad_(False)            # frozen: no gradient, never updated
    return params


def _zero1_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    params, reference = _zero1_params(), _zero1_params()
    step_fn = fn(params)
    ref_opt = torch.optim.AdamW([p for p in reference if p.requires_grad], **ZERO1_ADAMW)
    problem = None                    # the first one; every rank still runs every step
    for step in range(4):
        grads = [[torch.randn(p.shape, generator=torch.Generator().manual_seed(
            1000 * step + 10 * i + r)) for i, p in enumerate(params)] for r in range(n)]
        before = [p.detach().clone() for p in params]
        for i, (p, q) in enumerate(zip(params, reference)):
            if p.requires_grad:
                p.grad, q.grad = grads[rank][i].clone(), sum(g[i] for g in grads)
        step_fn()
        ref_opt.step()
        problem = problem or _zero1_problem(params, reference, before, step, rank)
    return problem


def _zero1_problem(params, reference, before, step, rank):
    for i, (p, q, b) in enumerate(zip(params, reference, before)):
        problem = first_difference(p.detach(), q.detach(), f"parameter {i}", FLOAT32)
        if problem:
            stale = bool(torch.equal(p.detach(), b)) and not torch.equal(q.detach(), b)
            hint = (" It did not change at all on this rank: did the updated shards come "
                    "back (all-gather)?") if stale else ""
            return at(step, rank, problem + hint)
    return None


@exercise("data_parallel", "implement")
def check_zero1_step(fn) -> Verdict:
    """fn(params) -> step: set up ZeRO-1 over the ranks for `params` (a list of tensors,
    some of whose sizes do not divide by n, one frozen), and return a function `step()`
    that, called after every rank has set each trainable p.grad to its local gradient,
    sums the gradients over ranks, applies AdamW(**ZERO1_ADAMW) to this rank's shard only,
    and leaves every rank with all the updated parameters. Compared with one device's
    AdamW on the summed gradients at each of 4 steps, on 2 gloo ranks."""
    return on_ranks(2, _zero1_worker, fn,
        "sharded AdamW equals one device's AdamW at every step, on every rank (2 gloo ranks).")


# ---------------------------------------------------------------- predict, then run: ZeRO's bytes
PREDICT_ZERO = dict(dp=4, zero=2, microbatches=2)   # `tiny`, float32, 2 micro-batches per rank


def measured_zero_bytes() -> int:
    """One step of `python -m minipar.train --dp 4 --zero 2 --microbatches 2 --steps 1`: the
    bytes rank 0 wrote to its sockets for the dp axis (`wire.steps_by_axis`)."""
    with steps_by_axis(Trainer):
        out = train(TrainConfig(parallel=ParallelConfig(**PREDICT_ZERO), steps=1, progress=False))
    return out["records"][-1]["wire"]["dp"]


def _ring_zero_bytes() -> int:
    """ZeRO-2's step under the ring formula (what CommLog files, not what gloo sends)."""
    n, m = PREDICT_ZERO["dp"], PREDICT_ZERO["microbatches"]
    g = 4 * param_count(ModelConfig.preset("tiny"))
    return m * wire_bytes("reduce_scatter", n, g) + wire_bytes("all_gather", n, g)


@exercise("data_parallel", "predict")
def check_predict_zero_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the data-parallel bytes one rank sends in one step of PREDICT_ZERO, then run
    minipar's trainer on 4 gloo ranks and compare with what rank 0 wrote to its sockets
    (`wire`; the ratio is reported)."""
    return predicted(prediction, measured_zero_bytes if measured is None else measured,
                     "the data-parallel bytes one rank sent", rel=0.01, why=HEADERS_WHY, unit="B",
                     reveal=reveal, hints=[(_ring_zero_bytes(), RING_NOT_GLOO)])


# ---------------------------------------------------------------- implement: buckets
MB = 2**20
# (gradient bytes in forward order, bucket_mb): built so that minipar's buckets number
# exactly 1, 2 and 3 (the check asserts it), with the small first bucket deciding one case.
BUCKET_CASES = [([MB // 4, MB // 4, MB // 4], 25.0),
                ([3 * MB, MB // 2, 2 * MB], 25.0),
                ([MB, 2 * MB, MB, MB // 2], 2.0)]


def _reference_buckets(sizes: list[int], bucket_mb: float) -> list[list[int]]:
    """minipar's own buckets for gradients of these byte sizes, as parameter indices."""
    params = [torch.nn.Parameter(torch.empty(s // 4)) for s in sizes]   # float32
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in b] for b in make_buckets(params, bucket_mb)]


def _bucket_hint(sizes, bucket_mb, got) -> str:
    flat = [i for b in got for i in b] if isinstance(got, list) else []
    if flat == list(range(len(sizes))):
        return (" Backward produces the gradients last layer first: fill the buckets in "
                "reverse forward order, so the first bucket can start while backward runs.")
    return (f" The first bucket closes at {FIRST_BUCKET_MB:g} MB (or bucket_mb if smaller), "
            f"the others at bucket_mb; a bucket closes once it reaches its limit.")


@exercise("data_parallel", "implement")
def check_buckets(fn) -> Verdict:
    """fn(sizes, bucket_mb) -> buckets: `sizes` are the gradients' bytes in forward order;
    return lists of parameter indices in the order backward fills them, grouped as
    `parallel.data.make_buckets` does (the first bucket closes at FIRST_BUCKET_MB, the
    others at bucket_mb). Three fixtures give exactly 1, 2 and 3 buckets."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for want_count, (sizes, bucket_mb) in enumerate(BUCKET_CASES, 1):
        want = _reference_buckets(sizes, bucket_mb)
        assert len(want) == want_count, "the fixture no longer gives the bucket count it tests"
        try:
            got = [[int(i) for i in b] for b in fn(list(sizes), bucket_mb)]
        except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
            return wrong(f"{yours(fn)}({sizes}, {bucket_mb}) raised {type(e).__name__}: {e}")
        if got != want:
            return wrong(f"{yours(fn)}({sizes}, {bucket_mb}) returned {got}, expected {len(want)} bucket"
                         f"{'s' if len(want) > 1 else ''}." + _bucket_hint(sizes, bucket_mb, got))
    return right("your buckets match make_buckets for 1, 2 and 3 buckets.")


# ---------------------------------------------------------------- predict, then replay
@exercise("data_parallel", "predict")
def check_replayed_dp_exposure(predicted_ms, reveal: bool = False) -> Verdict:
    """Predict how long rank 0 waits for DP per step (exposed time, ms) in the naive run
    (`--dp 2 --bucket-mb 0`) replayed at Llama 3 8B's shapes on H100s; the check replays
    it (`teach.replays`, the chapter's figure) and compares."""
    def clues(truth):
        bucketed = replays.replayed("data_parallel").exposed_s["dp"] * 1e3
        hints = [(truth / 2, "that is one pass of the ring: an all-reduce makes two, a "
                             "reduce-scatter and an all-gather."),
                 (bucketed, "that is the bucketed run's: naive, nothing is sent before the "
                            "backward pass ends.")]
        return hints, (f" Bucketed, the same gradients wait {bucketed:.2g} ms: only what is "
                       "still on the wire when the backward ends, the last bucket, whose size "
                       "decides how long the tail is.")
    return replayed_exposure(predicted_ms, reveal, "the naive run's exposed DP time per step",
                             "data_parallel_naive", "dp", clues)


__all__ = [n for n in dir() if n.startswith("check_")] + ["BUCKET_CASES", "buggy_zero_bytes", "PREDICT_ZERO", "ZERO1_ADAMW", "dp_loss_buggy",
                                                          "make_replica_buggy"]
