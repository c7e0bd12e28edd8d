"""The data-parallel chapter's checks accept a right answer, reject the typical wrong ones
(the chapter's bugs: a loss over the local tokens, replicas that never synced, a ZeRO step
that forgets to gather), and shrug at None; its figures draw from the package's functions."""
import torch
import torch.distributed as dist

from minipar.plan.config import ModelConfig
from minipar.plan.formulas.data_parallel import bucket_timeline
from minipar.plan.flops import param_count
from minipar.teach import exercises as E
from minipar.teach.exercises.data_parallel import ZERO1_ADAMW, dp_loss_buggy
from minipar.teach.figures.data_parallel import model_buckets
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def global_mean_loss(model, x, y, global_tokens):
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / global_tokens


def zero_bytes(n_params, n, zero, m, grad_bytes, param_bytes):
    """Written from the chapter's table: one ring pass of the gradients g, of the weights p."""
    g, p = (n - 1) / n * n_params * grad_bytes, (n - 1) / n * n_params * param_bytes
    return [2 * g, g + p, m * g + p, m * (2 * p + g)][zero]


def test_zero_bytes_bug_against_the_trainers_steps_and_its_hints():
    def but(zero, wrong):
        return lambda P, n, z, m, gb, pb: wrong(P, n, m, gb, pb) if z == zero else zero_bytes(P, n, z, m, gb, pb)
    judged(E.check_zero_bytes, zero_bytes,
           Wrong(but(1, lambda P, n, m, gb, pb: 2 * (n - 1) / n * P * gb + (n - 1) / n * P * pb), "all-reduce"),
           Wrong(but(1, lambda P, n, m, gb, pb: (n - 1) / n * P * gb), "must come back"),
           Wrong(but(0, lambda P, n, m, gb, pb: m * zero_bytes(P, n, 0, 1, gb, pb)), "once per step"),
           Wrong(but(2, lambda P, n, m, gb, pb: zero_bytes(P, n, 2, 1, gb, pb)), "no full gradient"),
           Wrong(but(3, lambda P, n, m, gb, pb: m * zero_bytes(P, n, 1, 1, gb, pb)), "needs the full weights again"),
           Wrong(but(3, lambda P, n, m, gb, pb: zero_bytes(P, n, 3, m, gb, pb) + (n - 1) / n * P * pb),
                 "no all-gather after the optimizer step"),
           Wrong(lambda P, n, z, m, gb, pb: zero_bytes(P, n, z, m, gb, pb) * n / max(n - 1, 1), "n-1 chunks, not n"),
           Wrong(E.buggy_zero_bytes, "not once per micro-batch"))


def test_dp_loss_check():
    judged(E.check_dp_loss, global_mean_loss, dp_loss_buggy)


def broadcast_everything(model):
    for t in model.state_dict().values():
        dist.broadcast(t, 0)


def broadcast_trainable_only(model):
    for p in model.parameters():
        if p.requires_grad:
            dist.broadcast(p.data, 0)


def test_sync_replicas_check():
    judged(E.check_sync_replicas, broadcast_everything, lambda model: None,
           Wrong(broadcast_trainable_only, "step 1"))            # the frozen bias differs


def zero1(params, gather=True):
    n, r = dist.get_world_size(), dist.get_rank()
    trainable = [p for p in params if p.requires_grad]
    shards = []
    for p in trainable:                       # pad to a multiple of n; keep my r-th piece
        k = -(-p.numel() // n)
        flat = torch.zeros(k * n)
        flat[:p.numel()] = p.detach().flatten()
        shards.append(flat[r * k:(r + 1) * k].clone().requires_grad_())
    opt = torch.optim.AdamW(shards, **ZERO1_ADAMW)

    def step():
        for p, s in zip(trainable, shards):
            g = torch.zeros(s.numel() * n)
            g[:p.numel()] = p.grad.flatten()
            s.grad = torch.empty(s.numel())
            dist.reduce_scatter_single(s.grad, g)
        opt.step()
        for p, s in zip(trainable if gather else [], shards):
            full = torch.empty(s.numel() * n)
            dist.all_gather_single(full, s.detach())
            p.data.copy_(full[:p.numel()].view_as(p))
    return step


def test_zero1_step_check():
    judged(E.check_zero1_step, zero1, Wrong(lambda params: zero1(params, gather=False), "all-gather"))


# ------------------------------------------------------------ the pictures' arithmetic
def test_bucket_counts_and_timeline():
    tiny = ModelConfig.preset("tiny")
    naive = model_buckets(tiny, 0)
    assert naive[-1][1] == param_count(tiny) and sum(b for b, _ in naive) == 4 * param_count(tiny)
    assert len(model_buckets(tiny, 100)) == 2          # the 1 MB first bucket, then the rest
    spans = bucket_timeline([10, 10], [0.0, 0.0], 2, alpha=0.0, bandwidth=10.0)
    assert spans == [(0.0, 1.0), (1.0, 2.0)]           # one link: the second waits


def test_explorer_zero_memory():
    from minipar.teach.explorers import data_parallel
    mem = data_parallel.zero_memory(model="tiny", model_parallel=1, dp=4, param_bytes=4,
                                    grad_bytes=4, optimizer_bytes=8)
    psi = param_count(ModelConfig.preset("tiny"))
    assert [sum(m.values()) for m in mem.values()] == [16 * psi, 10 * psi, 7 * psi, 4 * psi]
    assert data_parallel.figure(dp=8).axes


def test_predict_zero_bytes_check():
    from minipar.teach.exercises.data_parallel import PREDICT_ZERO
    psi = param_count(ModelConfig.preset("tiny"))
    n, m, g = PREDICT_ZERO["dp"], PREDICT_ZERO["microbatches"], 4 * psi
    # ZeRO-2: a reduce-scatter of the gradients per micro-batch, one all-gather of the
    # weights; on gloo a reduce-scatter sends what an all-reduce does, 2(n-1)/n G
    want = m * 2 * (n - 1) * g // n + (n - 1) * g // n
    assert E.check_predict_zero_bytes(want)                         # runs the trainer, reads the wire
    ring = m * (n - 1) * g // n + (n - 1) * g // n                  # CommLog's count: the ring's
    once = 2 * (n - 1) * g // n + (n - 1) * g // n                  # one reduce-scatter, ZeRO-1's
    judged(E.check_predict_zero_bytes, want, Wrong(ring, "gloo"), once, measured=want)


def _buckets_by_hand(sizes, bucket_mb):
    """The chapter's rule, written from its prose: reverse order, the first bucket closes at
    1 MB (or bucket_mb if smaller), the others at bucket_mb."""
    buckets, current, size, limit = [], [], 0, min(bucket_mb, 1.0) * 2**20
    for i in reversed(range(len(sizes))):
        current.append(i)
        size += sizes[i]
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, bucket_mb * 2**20
    if current:
        buckets.append(current)
    return buckets


def test_check_buckets_right_wrong_and_unanswered():
    judged(E.check_buckets, _buckets_by_hand, Wrong(lambda s, b: [list(range(len(s)))], "reverse"),
           Wrong(lambda s, b: _buckets_by_hand(s, b) if b < 1 else [list(reversed(range(len(s))))],
                 "first bucket"), lambda s, b: 1 / 0)


def test_replayed_dp_exposure(fresh_attempts):
    """The naive run's exposed DP time, as the replay times it: right within 15%; one ring
    pass, or the bucketed run's tail, is wrong with the hint that says why."""
    from minipar.teach import replays
    naive = replays.replayed("data_parallel_naive").exposed_s["dp"] * 1e3
    bucketed = replays.replayed("data_parallel").exposed_s["dp"] * 1e3
    judged(E.check_replayed_dp_exposure, naive * 1.05, Wrong(naive / 2, "one pass of the ring"),
           Wrong(bucketed, "bucketed run's"))
    assert E.check_replayed_dp_exposure(f"{naive / 1e3:.4f} s")      # a unit is read
