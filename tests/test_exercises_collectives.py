"""The collectives chapter's checks accept a right answer, reject the typical wrong ones, and
shrug at None; its figures and explorer draw from the functions the checks use."""
import math

import torch
import torch.distributed as dist

from minipar.ring import ring_schedule
from minipar.formulas.collective_time import all_reduce_cost, all_reduce_time
from minipar.formulas.collectives import wire_bytes
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
    # reduce-scatter of S, all-gather back to S, all-reduce of S, one send of S
    want = 2 * (n - 1) * s // n + 2 * (n - 1) * s // n + s
    assert E.check_predict_step_bytes(want)           # runs on 4 gloo ranks
    judged(E.check_predict_step_bytes, want, want - s, measured=want)   # forgot the send


def test_bytes_check_hints():
    judged(E.check_ring_allreduce_bytes, 2 * 7 * 2**30 // 8, Wrong(7 * 2**30 // 8, "phase"),
           args=(8, 2**30))


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
