"""The collectives chapter's checks accept a right answer, reject the typical wrong ones, and
shrug at None; its figures and explorer draw from the functions the checks use."""
import math

import torch
import torch.distributed as dist

from minipar.trainer.ring import ring_schedule
from minipar.plan.formulas.collective_time import all_reduce_cost, all_reduce_time
from minipar.plan.formulas.collectives import wire_bytes
from minipar.teach import exercises as E
from minipar.teach.figures.collectives import ring_states
from verdicts import Wrong, judged


# ------------------------------------------------------------ implementations, written from
# the chapter's description (not by calling the code the checks compare with)
def ring(x, rank, n, exchange, gather=True):
    chunks = [c.clone() for c in x.chunk(n)]
    incoming = torch.empty_like(chunks[0])
    for k in range(n - 1):                   # reduce-scatter: send (r-k-1), add into (r-k-2)
        exchange(chunks[(rank - k - 1) % n], incoming)
        chunks[(rank - k - 2) % n] += incoming
    for k in range(n - 1 if gather else 0):  # all-gather: send (r-k), overwrite (r-k-1)
        exchange(chunks[(rank - k) % n], incoming)
        chunks[(rank - k - 1) % n] = incoming.clone()
    return torch.cat(chunks)


def ring_without_all_gather(x, rank, n, exchange):
    return ring(x, rank, n, exchange, gather=False)


def ring_sending_everything(x, rank, n, exchange):
    """Right sum, wrong bytes: passes the whole tensor round the ring n-1 times."""
    total, incoming, current = x.clone(), torch.empty_like(x), x.clone()
    for _ in range(n - 1):
        exchange(current, incoming)
        current = incoming.clone()
        total += current
    return total


def uses_all_reduce(x, rank, n, exchange):
    dist.all_reduce(x)
    return x


def test_ring_all_reduce_check():
    judged(E.check_ring_all_reduce, ring, Wrong(ring_without_all_gather, "expected"),
           Wrong(ring_sending_everything, "bytes"), uses_all_reduce)


def test_predict_step_bytes_check():
    s = E.collectives.PREDICT_NUMEL * 4
    n = E.collectives.PREDICT_N
    # on gloo: a reduce-scatter of S is an all-reduce of S (2(n-1)/n S), the all-gather back
    # to S, an all-reduce of S, one send of S
    want = 2 * (n - 1) * s // n + (n - 1) * s // n + 2 * (n - 1) * s // n + s
    assert E.check_predict_step_bytes(want)           # runs on 4 gloo ranks, reads the wire
    ring = 4 * (n - 1) * s // n + s                   # the ring's count: CommLog's
    judged(E.check_predict_step_bytes, want, want - s, Wrong(ring, "gloo"), measured=want)


def bytes_sent(op, n, size):
    """Written from the chapter's ring: per phase n-1 chunks of S/n; an all-reduce is two
    phases; a send moves S; nothing moves with one rank or on a receive."""
    if n == 1 or op == "recv":
        return 0
    if op == "send":
        return size
    return (2 if op == "all_reduce" else 1) * (n - 1) * size / n


def test_bytes_sent_bug_against_the_ring_run_and_its_hints():
    for n in (1, 2, 3, 4):                     # the run sends what the chapter's ring says
        sent = E.collectives.ring_bytes_run(n)
        assert all(sent[op] == bytes_sent(op, n, 4 * E.collectives.RING_NUMEL) for op in sent)
    one_phase = lambda op, n, size: 0 if n == 1 else (n - 1) * size / n
    n_not_n_minus_1 = lambda op, n, size: 0 if n == 1 else 2 * size
    all_reduce_for_all = lambda op, n, size: 0 if n == 1 else 2 * (n - 1) * size / n
    whole_tensor = lambda op, n, size: bytes_sent(op, n, size) * (n if op not in ("send", "recv") else 1)
    lonely = lambda op, n, size: bytes_sent(op, max(n, 2), size)
    off_by_one = lambda op, n, size: bytes_sent(op, n, size) + 1
    judged(E.check_bytes_sent, bytes_sent,
           Wrong(one_phase, "one phase"), Wrong(n_not_n_minus_1, "n-1 steps, not n"),
           Wrong(all_reduce_for_all, "an all-reduce's count"),
           Wrong(whole_tensor, "not the whole tensor"), Wrong(E.buggy_bytes_sent, "n-1 steps, not n"),
           Wrong(lonely, "n = 1"), Wrong(off_by_one, "too high by 1 bytes"),
           Wrong(lambda op, n, size: {}[op], "KeyError"))
    message = E.check_bytes_sent(one_phase).message
    assert "2(n-1)" not in message and "(n-1)/n" not in message      # a hint, not the formula


# ------------------------------------------------------------ the ring figure plays the schedule
def test_ring_states_end_complete_after_each_phase():
    for n in (2, 3, 4, 8):
        states = ring_states(n)
        assert len(states) == 1 + 2 * (n - 1)
        after_rs = states[n - 1][2]
        assert all(len(after_rs[r][r]) == n for r in range(n))       # rank r owns chunk r
        assert all(len(c) == n for row in states[-1][2] for c in row)
        assert [s[1] for s in states[1:n]] == ring_schedule(n)[0]


def test_all_reduce_cost_by_algorithm():
    n, s = 8, 1e6
    assert all_reduce_cost("ring", n, s)[0] == wire_bytes("all_reduce", n, int(s))
    assert math.isclose(all_reduce_cost("ring", n, s, 1e-6, 1e9)[1],
                        all_reduce_time(s, n, 1e-6, 1e9))
    assert all_reduce_cost("in-network", n, s)[0] == s < all_reduce_cost("ring", n, s)[0]
    assert all_reduce_cost("root", n, s)[0] == (n - 1) * s
    assert all_reduce_cost("tree", 1024, s, 1e-6, 1e12)[1] < all_reduce_cost("ring", 1024, s, 1e-6, 1e12)[1]


def test_explorer_figure_draws():
    from minipar.teach.explorers import collectives
    for algorithm in ("ring", "in-network"):
        fig = collectives.figure(algorithm=algorithm, n=8)
        assert algorithm in fig._suptitle.get_text()


def test_collective_states_follow_the_identity():
    from minipar.teach.figures.collectives import collective_states
    n = 4
    _, reduced = collective_states("all_reduce", n)
    _, scattered = collective_states("reduce_scatter", n)
    gathered = [scattered[c][c] for c in range(n)]               # all-gather of the slices
    assert all(row == gathered for row in reduced)
    before, after = collective_states("all_to_all", n)
    assert all(after[r][q] == before[q][r] for r in range(n) for q in range(n))
