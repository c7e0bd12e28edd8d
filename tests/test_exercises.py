"""Every exercise check accepts the right answer, rejects a wrong one, and shrugs at None."""
import math

import pytest
import torch
import torch.distributed as dist

from minipar.teach import exercises as E
from minipar.config import ModelConfig
from minipar.flops import param_count

LLAMA = ModelConfig.preset("llama3-405b")


# ------------------------------------------------------------ right implementations,
# written from the chapters' formulas (not by calling the code the checks compare with)
def allreduce(t):
    n = dist.get_world_size()
    shard = torch.empty(t.numel() // n)
    dist.reduce_scatter_single(shard, t)
    out = torch.empty_like(t)
    dist.all_gather_single(out, shard)
    return out


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def column_parallel(x, w_shard):
    y = x @ w_shard.T
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts, dim=-1)


def zigzag(seq_len, rank, cp):
    c = seq_len // (2 * cp)
    return [*range(rank * c, (rank + 1) * c), *range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def dp_group(rank, tp, cp, pp, dp):
    inner = tp * cp * pp
    return [rank % inner + d * inner for d in range(dp)]


def flops_per_token(model, s):
    return 6 * param_count(model, embeddings=False) + 12 * model.n_layers * model.dim * s


def waste(interval, write, mtbf, restart):
    return write / interval + ((interval + write) / 2 + restart) / mtbf


# 405B at 8192 tokens: 6N + 12 L h s FLOPs per token, from the paper's numbers
N405 = param_count(LLAMA, embeddings=False)
F405 = 6 * N405 + 12 * 126 * 16384 * 8192

NUMERIC = [  # (check, args, right answer, a wrong answer)
    (E.check_ring_allreduce_bytes, (4, 1000), 1500, 1000),
    (E.check_zero_bytes, (1000, 4, 1), 3000 + 3000, 3000),     # RS 3/4 G + AG 3/4 P, 4 B each
    (E.check_tp_allreduce_bytes, (8, 1, 8192, 16384, 2), 2 * 7 * 8192 * 16384 * 2 // 8, 8192 * 16384 * 2),
    (E.check_bubble, (4, 8), 3 / 11, 3 / 8),
    # cp=2, 4 chunks of c=16: rank 0 does diag0, 1x0, diag1; rank 1 five full blocks + 2 diagonals
    (E.check_contiguous_imbalance, (64, 2), (5 * 256 + 2 * 136) / (256 + 2 * 136), 2.0),
    (E.check_mfu, (LLAMA, 8192, 1e6, 1000, 989e12), 1e6 * F405 / (989e12 * 1000), 0.5),
    (E.check_young_daly_interval, (60.0, 3600.0), math.sqrt(2 * 60 * 3600), 60.0),
]


@pytest.mark.parametrize("check,args,right,wrong", NUMERIC, ids=lambda v: getattr(v, "__name__", ""))
def test_numeric_checks(check, args, right, wrong):
    assert check(*args, right).ok is True
    assert check(*args, wrong).ok is False
    assert "Not quite" in repr(check(*args, wrong))
    assert check(*args, None).ok is None
    assert "Not answered yet" in repr(check(*args, None))


def test_coords():
    # rank 10000 of TP8 CP16 PP16 DP8: 10000 = 0 + 8 (2 + 16 (14 + 16 * 4))
    assert E.check_coords(10000, 8, 16, 16, 8, {"tp": 0, "cp": 2, "pp": 14, "dp": 4}).ok is True
    assert E.check_coords(10000, 8, 16, 16, 8, {"tp": 0, "cp": 14, "pp": 2, "dp": 4}).ok is False
    assert E.check_coords(10000, 8, 16, 16, 8, None).ok is None


PURE = [  # (check, right function, wrong function)
    (E.check_interleaved_bubble, lambda p, m, v: (p - 1) / (v * m + p - 1), lambda p, m, v: (p - 1) / (m + p - 1)),
    (E.check_zigzag, zigzag, lambda s, r, cp: list(range(r * s // cp, (r + 1) * s // cp))),
    (E.check_dp_group, dp_group, lambda r, tp, cp, pp, dp: list(range(r, r + dp))),
    (E.check_flops_per_token, flops_per_token, lambda m, s: 6 * param_count(m)),
    (E.check_expected_waste, waste, lambda i, w, m, r: w / i + i / 2 / m),
]


@pytest.mark.parametrize("check,right,wrong", PURE, ids=lambda v: getattr(v, "__name__", ""))
def test_function_checks(check, right, wrong):
    assert check(right).ok is True
    assert check(wrong).ok is False
    assert check(None).ok is None
    assert check(lambda *a: 1 / 0).ok is False        # a raising attempt is reported, not raised


def test_multiprocess_checks():
    assert E.check_allreduce(allreduce).ok is True
    assert E.check_allreduce(lambda t: t).ok is False
    cheat = E.check_allreduce(lambda t: (dist.all_reduce(t), t)[1])
    assert cheat.ok is False and "not allowed" in repr(cheat)
    assert E.check_allreduce(None).ok is None
    assert E.check_average_gradients(average_gradients).ok is True
    assert E.check_average_gradients(lambda m: None).ok is False
    assert E.check_column_parallel(column_parallel).ok is True
    assert E.check_column_parallel(lambda x, w: x @ w.T).ok is False
    assert E.check_column_parallel(None).ok is None


def _dies_once(flag, fn):
    """A worker whose rank 1 exits without raising the first time (a stalled or killed
    process, not the reader's code), and calls `fn` once restarted."""
    import os
    if dist.get_rank() == 1 and not os.path.exists(flag):
        open(flag, "w").close()
        os._exit(1)
    return fn()


def test_on_ranks_restarts_a_rank_that_died_once_but_reports_raising_code(tmp_path):
    from functools import partial
    from minipar.teach.exercises.core import on_ranks
    flag = str(tmp_path / "died")
    v = on_ranks(2, partial(_dies_once, flag), lambda: None, "fine", timeout_s=20)
    assert v.ok is True and (tmp_path / "died").exists()          # restarted, then right
    v = on_ranks(2, partial(_dies_once, flag), lambda: 1 / 0, "fine", timeout_s=20)
    assert v.ok is False and "raised" in v.message and "ZeroDivisionError" in v.message
