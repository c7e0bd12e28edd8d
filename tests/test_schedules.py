"""Pipeline schedules as data: validity, the simulator, the bubble formulas, memory, figures.

Everything here is pure (no processes). Expected values come from the textbook formulas
or from small cases timed by hand, never from the code under test.
"""
from __future__ import annotations

from collections import Counter

import pytest

from minipar.trainer import profile
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.plan.formulas.memory import in_flight_chunks
from minipar.plan.schedules import split_layers
from minipar.plan.schedule_analysis import peak_in_flight, timeline_from_events
from minipar.plan.schedules import (Action, ScheduleError, Timeline, make_schedule,
                                    rank_and_chunk, simulate, stage_of)


def grid():
    """(name, p, m, v, N) for every schedule over a grid of pipeline shapes."""
    for p in range(1, 7):
        for m in range(1, 11):
            for name in ("afab", "1f1b", "zb"):
                yield name, p, m, 1, None
            if m % p == 0:
                for v in (1, 2, 3):
                    yield "interleaved", p, m, v, None
    # Llama 3's tunable consecutive micro-batches: groups of N >= p, or all m in one group.
    for p, m, v, n in [(4, 10, 2, 5), (4, 12, 2, 6), (4, 12, 3, 12), (3, 10, 2, 5),
                       (4, 2, 2, 2), (4, 3, 3, 3), (8, 1, 2, 1), (2, 9, 2, 3)]:
        yield "interleaved", p, m, v, n


GRID = list(grid())
NAMES = ("afab", "1f1b", "interleaved", "zb")


def build(name, p, m, v, n):
    return make_schedule(name, p, m, v, **({} if n is None else {"consecutive": n}))


# --------------------------------------------------------------------- validity of the lists

@pytest.mark.parametrize("schedule", NAMES)
def test_every_action_once_and_local_order(schedule):
    for name, p, m, v, n in GRID:
        if name != schedule:
            continue
        sched = build(name, p, m, v, n)
        case = f"{name} p={p} m={m} v={v} N={n}"
        assert len(sched) == p, case
        kinds = "FBW" if name == "zb" else "FB"
        for rank, acts in enumerate(sched):
            want = Counter(Action(k, i, c) for k in kinds for i in range(m) for c in range(v))
            assert Counter(acts) == want, f"{case} rank {rank}"
            pos = {a: i for i, a in enumerate(acts)}
            for i in range(m):
                for c in range(v):
                    assert pos[Action("F", i, c)] < pos[Action("B", i, c)], case
                    if name == "zb":
                        assert pos[Action("B", i, c)] < pos[Action("W", i, c)], case


def _deps(kind, mb, s, last):
    # The dependency rules, written again here so the simulator is checked against them.
    if kind == "F":
        return [("F", mb, s - 1)] if s > 0 else []
    if kind == "B":
        return [("F", mb, s)] + ([("B", mb, s + 1)] if s < last else [])
    return [("B", mb, s)]


@pytest.mark.parametrize("schedule", NAMES)
def test_simulation_respects_every_dependency(schedule):
    for name, p, m, v, n in GRID:
        if name == schedule:
            check_simulated_timeline(name, p, m, v, n)


def check_simulated_timeline(name, p, m, v, n):
    """Each action starts exactly when its rank is free and its inputs exist, in list order."""
    sched = build(name, p, m, v, n)
    tl = simulate(sched, t_f=1.0, t_b=1.5, t_w=0.5)
    assert len(tl.events) == sum(map(len, sched))
    end = {(e.kind, e.microbatch, e.chunk * p + e.rank): e.end for e in tl.events}
    last = p * v - 1
    for rank, acts in enumerate(sched):
        mine = [e for e in tl.events if e.rank == rank]
        assert [Action(e.kind, e.microbatch, e.chunk) for e in mine] == acts
        free = 0.0
        for e in mine:
            ready = max([free] + [end[d] for d in _deps(e.kind, e.microbatch,
                                                       e.chunk * p + rank, last)])
            assert e.start == pytest.approx(ready)
            assert e.end - e.start == pytest.approx({"F": 1.0, "W": 0.5}.get(
                e.kind, 1.5 if name == "zb" else 2.0))
            free = e.end
    assert tl.makespan == pytest.approx(max(e.end for e in tl.events))


def test_one_f_one_b_timed_by_hand():
    # p = 2, m = 2, t_f = 1, t_b = 2. Rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7].
    # Rank 0: F0 [0,1] F1 [1,2], then B0 waits for rank 1's B0 [4,6], B1 for its B1 [7,9].
    tl = simulate(make_schedule("1f1b", 2, 2))
    got = [(e.rank, e.kind, e.microbatch, e.start, e.end) for e in tl.events]
    assert got == [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 4, 6), (0, "B", 1, 7, 9),
                   (1, "F", 0, 1, 2), (1, "B", 0, 2, 4), (1, "F", 1, 4, 5), (1, "B", 1, 5, 7)]
    assert tl.makespan == 9
    assert tl.bubble_fraction == pytest.approx((18 - 12) / 18)


def test_communication_time_delays_only_cross_rank_dependencies():
    # afab, p = 2, m = 1: F0 [0,1] -> comm -> F0 [1.5,2.5] B0 [2.5,4.5] -> comm -> B0 [5,7].
    tl = simulate(make_schedule("afab", 2, 1), t_comm=0.5)
    assert [(e.start, e.end) for e in tl.events] == [(0, 1), (5, 7), (1.5, 2.5), (2.5, 4.5)]


def test_deadlock_is_detected_and_explained():
    # Rank 1 wants micro-batch 1 first, which rank 0 sends only after micro-batch 0's
    # backward, which needs rank 1 to have run micro-batch 0.
    sched = [[Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
             [Action("F", 1), Action("F", 0), Action("B", 0), Action("B", 1)]]
    with pytest.raises(ScheduleError, match=r"deadlock.*rank 0 is stuck at B0.*rank 1 is stuck at F1"):
        simulate(sched)


def test_missing_or_misordered_actions_are_refused():
    with pytest.raises(ScheduleError, match="missing"):
        simulate([[Action("F", 0), Action("F", 1), Action("B", 0)]])
    with pytest.raises(ScheduleError, match="before"):
        simulate([[Action("B", 0), Action("F", 0)]])


# --------------------------------------------------------------------- the bubble formulas

TIMES = [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0), (1.0, 3.0), (0.5, 1.25)]


@pytest.mark.parametrize("name", ["afab", "1f1b"])
@pytest.mark.parametrize("t_f,t_b", TIMES)
def test_bubble_of_afab_and_1f1b_is_p_minus_1_over_m_plus_p_minus_1(name, t_f, t_b):
    for p in range(1, 7):
        for m in range(1, 14):
            tl = simulate(make_schedule(name, p, m), t_f=t_f, t_b=t_b)
            assert tl.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
            assert tl.makespan == pytest.approx((m + p - 1) * (t_f + t_b))


@pytest.mark.parametrize("t_f,t_b", TIMES)
def test_bubble_of_interleaved_is_p_minus_1_over_vm_plus_p_minus_1(t_f, t_b):
    # Holds for every ratio t_f : t_b tried, whenever m is a multiple of p.
    for p in range(2, 6):
        for v in (2, 3, 4):
            for m in range(p, 3 * p + 1, p):
                tl = simulate(make_schedule("interleaved", p, m, v), t_f=t_f, t_b=t_b)
                assert tl.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m,v,n", [(4, 10, 2, 5), (4, 12, 3, 6), (3, 9, 2, 9), (2, 6, 4, 3)])
def test_consecutive_groups_of_at_least_p_keep_the_interleaved_bubble(p, m, v, n):
    for t_f, t_b in TIMES:
        tl = simulate(make_schedule("interleaved", p, m, v, consecutive=n), t_f=t_f, t_b=t_b)
        assert tl.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


def test_larger_consecutive_groups_hold_more_activations():
    # Depth-first (N = p) to breadth-first (N = m): the same bubble, more memory on rank 0.
    peaks = [peak_in_flight(make_schedule("interleaved", 4, 16, 2, consecutive=n))[0]
             for n in (4, 8, 16)]
    assert peaks[0] < peaks[1] < peaks[2] <= 2 * 16


@pytest.mark.parametrize("p,m,v,n", [(4, 16, 2, 8), (4, 16, 2, 16), (4, 12, 3, 6), (2, 6, 2, 3),
                                     (4, 10, 2, 5), (4, 3, 3, 3), (4, 8, 2, None)])
def test_the_memory_model_counts_what_consecutive_groups_hold(p, m, v, n):
    # --consecutive-microbatches reaches the preflight's memory model: its in-flight count
    # per rank is the simulated schedule's
    want = peak_in_flight(make_schedule("interleaved", p, m, v, consecutive=n))
    assert [sum(in_flight_chunks("interleaved", p, m, r, v, n)) for r in range(p)] == want


@pytest.mark.parametrize("t_f,t_b,t_w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5),
                                         (1, 1.5, 0.25)])
def test_zero_bubble_h1(t_f, t_b, t_w):
    # ZB-H1's bubble (Qi et al. 2024): (p-1)(t_f + t_b - t_w) per rank instead of 1F1B's
    # (p-1)(t_f + t_b + t_w), exact for m >= p when t_w <= min(t_f, t_b); a third of 1F1B's
    # when all three are equal.
    for p in range(2, 7):
        for m in range(1, 13):
            zb = simulate(make_schedule("zb", p, m), t_f, t_b, t_w)
            one = simulate(make_schedule("1f1b", p, m), t_f, t_b, t_w)
            assert zb.bubble_fraction < one.bubble_fraction
            if m >= p:
                idle = (p - 1) * (t_f + t_b - t_w)
                work = m * (t_f + t_b + t_w)
                assert zb.bubble_fraction == pytest.approx(idle / (work + idle), abs=1e-12)


def test_zero_bubble_without_a_separate_w_time_is_1f1b():
    for p, m in [(4, 8), (3, 5)]:
        assert simulate(make_schedule("zb", p, m)).makespan == \
            simulate(make_schedule("1f1b", p, m)).makespan


# --------------------------------------------------------------------- activation memory

@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (4, 8), (4, 3), (6, 12), (8, 4)])
def test_peak_in_flight(p, m):
    assert peak_in_flight(make_schedule("afab", p, m)) == [m] * p
    # 1F1B: rank r holds its p-1-r warm-up micro-batches plus the one in the steady state.
    assert peak_in_flight(make_schedule("1f1b", p, m)) == [min(p - r, m) for r in range(p)]
    zb = make_schedule("zb", p, m)
    assert peak_in_flight(zb) == [min(p - r, m) for r in range(p)]
    # Until W, every ZB-H1 rank holds as many as 1F1B's rank 0 does: the memory bound kept.
    assert peak_in_flight(zb, release="W") == [min(p, m)] * p


def test_interleaved_rank0_warmup_memory_matches_megatron():
    # Megatron's warm-up on rank 0: (v-1)*p + 2*(p-1) forwards, then one more before B.
    for p, v, m in [(4, 2, 8), (4, 3, 8), (2, 4, 4)]:
        assert peak_in_flight(make_schedule("interleaved", p, m, v))[0] == \
            min((v - 1) * p + 2 * (p - 1) + 1, v * m)


# --------------------------------------------------------------------- stages and errors

def test_virtual_stages_go_round_the_ranks():
    p = 4
    assert [stage_of(r, c, p) for c in range(2) for r in range(p)] == list(range(8))
    assert all(rank_and_chunk(stage_of(r, c, p), p) == (r, c) for r in range(p) for c in range(3))
    assert Action("F", 3, 1).stage(2, p) == 6


@pytest.mark.parametrize("n_layers,n_stages", [(8, 1), (8, 2), (8, 3), (8, 8), (126, 16), (7, 4)])
def test_split_layers_is_balanced_and_contiguous(n_layers, n_stages):
    parts = split_layers(n_layers, n_stages)
    assert len(parts) == n_stages
    assert [i for part in parts for i in part] == list(range(n_layers))
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_llama3_lighter_first_and_last_stage():
    # 126 layers + 2 (embedding, head) on 16 x 8 = 128 stages: one layer each, none on the
    # first and the last stage.
    sizes = [len(r) for r in split_layers(126, 128, first_last_lighter=1)]
    assert sizes == [0] + [1] * 126 + [0]
    assert [len(r) for r in split_layers(30, 4, first_last_lighter=1)] == [7, 8, 8, 7]
    assert [len(r) for r in split_layers(31, 4, first_last_lighter=1)] == [7, 9, 8, 7]
    assert [len(r) for r in split_layers(8, 2, first_last_lighter=1)] == [4, 4]
    assert [i for r in split_layers(126, 16, first_last_lighter=1) for i in r] == list(range(126))


@pytest.mark.parametrize("call,message", [
    (lambda: split_layers(3, 4), r"n_layers=3 is fewer than the 4 pipeline stages.*--pp"),
    (lambda: split_layers(6, 6, first_last_lighter=2), r"first_last_lighter"),
    (lambda: make_schedule("interleaved", 4, 6, 2), r"--microbatches \(6\).*multiple of --pp 4"),
    (lambda: make_schedule("1f1b", 4, 8, 2), r"--virtual-stages 2 needs --schedule interleaved"),
    (lambda: make_schedule("zb", 4, 8, 2), r"--virtual-stages 2"),
    (lambda: make_schedule("gpipe", 4, 8), r"--schedule 'gpipe' is unknown"),
    (lambda: make_schedule("1f1b", 0, 8), r"--pp 0"),
    (lambda: make_schedule("1f1b", 4, 0), r"--microbatches 0"),
    (lambda: make_schedule("interleaved", 4, 9, 2, consecutive=2), r"multiple of 2"),
    (lambda: make_schedule("interleaved", 4, 6, 2, consecutive=3), r"at least --pp 4"),
    (lambda: make_schedule("1f1b", 4, 8, consecutive=4), r"only apply to --schedule interleaved"),
])
def test_bad_shapes_are_refused_naming_the_flag(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("m,n,rules", [(10, 5, []), (12, 8, ["groups"]), (6, 3, ["group size"]),
                                       (2, 2, []), (4, 0, ["positive"])])
def test_the_layout_check_refuses_what_make_schedule_refuses(m, n, rules):
    """`--consecutive-microbatches` N reaches the trainer through ParallelConfig, whose check
    (run before any rank starts) applies make_schedule's rules: one set of rules."""
    layout = ParallelConfig(pp=4, schedule="interleaved", virtual_stages=2, microbatches=m,
                            consecutive_microbatches=n)
    got = layout.problems(ModelConfig(), 32, m)
    assert [p.rule for p in got if p.flag == "--consecutive-microbatches"] == rules
    if not rules:
        make_schedule("interleaved", 4, m, 2, consecutive=n)
    else:
        with pytest.raises(ValueError, match="--consecutive-microbatches"):
            make_schedule("interleaved", 4, m, 2, consecutive=n)


def test_groups_smaller_than_the_pipeline_would_deadlock():
    # Why make_schedule refuses N < p with several groups: the 1F1B order then cannot run.
    from minipar.plan.schedules import _interleaved
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(_interleaved(4, 4, 2, 2))


# --------------------------------------------------------------------- measured traces, figures

def _trace(tl: Timeline, offset: float):
    return [dict(e._asdict(), start=e.start + offset, end=e.end + offset) for e in tl.events]


def _profile_trace(tl: Timeline) -> dict:
    """A --profile trace holding `tl`'s actions as compute spans, one rank per stage."""
    parts = [{"rank": r, "host": "h", "start_ns": 0, "coords": {"tp": 0, "cp": 0, "pp": r, "dp": 0},
              "spans": [{"name": e.kind, "cat": "compute", "start": int(e.start * 1e9),
                         "end": int(e.end * 1e9),
                         "args": {"kind": e.kind, "microbatch": e.microbatch, "chunk": e.chunk}}
                        for e in tl.events if e.rank == r]} for r in range(tl.n_ranks)]
    return profile.trace_events(parts)


def test_measured_events_become_a_timeline():
    tl = simulate(make_schedule("1f1b", 3, 4))
    back = timeline_from_events(_trace(tl, offset=1234.5))
    assert back.n_ranks == 3 and back.events == tl.events
    assert back.makespan == tl.makespan and back.bubble_fraction == tl.bubble_fraction


def test_gantt_draws_one_labelled_box_per_timed_action(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from minipar.teach.figures import plot_bubble_vs_microbatches, plot_schedule, plot_trace

    sched = make_schedule("interleaved", 2, 4, 2)
    ax = plot_schedule(sched, t_f=1, t_b=2)
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(boxes) == sum(map(len, sched))
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(a.microbatch) for acts in sched
                                                           for a in acts)
    assert ax.get_title() == f"bubble {1 / 9:.1%}"            # (p-1)/(v*m+p-1) = 1/9
    # Chunks differ by shade: chunk 1's forward box is lighter than chunk 0's.
    faces = {(e.kind, e.chunk): b.get_facecolor() for b, e in
             zip(boxes, simulate(sched, 1, 2).events)}
    assert sum(faces[("F", 1)][:3]) > sum(faces[("F", 0)][:3])
    plt.close("all")

    zb = simulate(make_schedule("zb", 2, 2))                   # t_w = 0: W boxes are empty
    assert len([p for p in plot_schedule(zb).patches if isinstance(p, Rectangle)]) == 8
    path = profile.write(_profile_trace(zb), tmp_path / "t.json")
    ax = plot_trace(path)
    assert ax.get_xlabel() == "time (s)"
    assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 8
    ax = plot_bubble_vs_microbatches(pp=3, microbatches=range(1, 7))
    assert len(ax.get_legend().get_texts()) == 4
    plt.close("all")


# --------------------------------------------------------------------- DualPipeV (simulated only)
from minipar.plan import dualpipe                                    # noqa: E402
from minipar.plan.config import SCHEDULES                           # noqa: E402

DUALPIPE_CASES = [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (6, 12), (8, 20)]


@pytest.mark.parametrize("p, m", DUALPIPE_CASES)
def test_dualpipev_runs_every_action_once_in_a_v(p, m):
    sched = dualpipe.dualpipev(p, m)
    for rank, acts in enumerate(sched):
        assert Counter(acts) == Counter(Action(k, i, c) for k in "FBW" for i in range(m) for c in (0, 1))
        # the V: rank r holds stage r on the way down and 2p-1-r on the way back
        assert {a.stage(rank, p) for a in acts} == {rank, 2 * p - 1 - rank}
    timeline = simulate(sched, 1.0, 1.0, 1.0)                 # raises on a deadlock
    ends = {(e.kind, e.microbatch, dualpipe.VAction(e.kind, e.microbatch, e.chunk).stage(e.rank, p)): e
            for e in timeline.events}
    for (kind, mb, stage), e in ends.items():                 # every dependency respected
        if kind == "F" and stage > 0:
            assert ends[("F", mb, stage - 1)].end <= e.start
        if kind == "B" and stage < 2 * p - 1:
            assert ends[("B", mb, stage + 1)].end <= e.start


def test_dualpipev_is_simulated_only():
    assert "dualpipev" in dualpipe.SIMULATED and "dualpipev" not in SCHEDULES
    with pytest.raises(ValueError, match="microbatches >= 2 x pp"):
        dualpipe.dualpipev(4, 7)
    assert dualpipe.simulated_schedule("1f1b", 4, 8) == make_schedule("1f1b", 4, 8)


@pytest.mark.parametrize("t_f, t_b, t_w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.5, 0.5)])
def test_dualpipev_bubble_is_within_the_reports_bound_and_below_1f1b_and_zb(t_f, t_b, t_w):
    # DeepSeek-V3's Table 2 with PP = 2p stages: (p-1)(F&B + B - 3W), F&B (a forward and a
    # backward overlapped) no longer than F + B, B the full backward (B + W here). Each
    # rank's idle time is the makespan less its work, 2 m chunks of F + B + W.
    for p, m in [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)]:
        idle = simulate(dualpipe.dualpipev(p, m), t_f, t_b, t_w).makespan - 2 * m * (t_f + t_b + t_w)
        bound = (p - 1) * ((t_f + t_b + t_w) + (t_b + t_w) - 3 * t_w)
        assert 0 < idle <= bound + 1e-9
        # the same model on the same p ranks: 1F1B and ZB-H1 run one stage per rank, twice
        # the layers of a DualPipeV chunk, so each pass takes twice as long
        for name in ("1f1b", "zb"):
            other = simulate(make_schedule(name, p, m), 2 * t_f, 2 * t_b, 2 * t_w)
            assert other.makespan - 2 * m * (t_f + t_b + t_w) > idle


def test_dualpipev_holds_2p_plus_1_chunks_however_many_micro_batches():
    # the report: activations PP + 1 chunks (PP = 2p stages), not growing with m; 1F1B's rank 0
    # holds p stages' worth, each two DualPipeV chunks: 2p. One chunk more, on every rank.
    for p in (2, 4, 8):
        for m in (2 * p, 3 * p, 5 * p):
            assert peak_in_flight(dualpipe.dualpipev(p, m)) == [2 * p + 1] * p
            assert peak_in_flight(dualpipe.dualpipev(p, m), "W") == [2 * p + 1] * p
        assert 2 * peak_in_flight(make_schedule("1f1b", p, 3 * p))[0] == 2 * p


def test_sends_inside_the_v_s_turn_cost_nothing():
    # stage p-1 and stage p live on rank p-1: the turn needs no send, the others each t_comm
    p, m = 2, 4
    free = simulate(dualpipe.dualpipev(p, m), 1.0, 1.0, 1.0)
    slow = simulate(dualpipe.dualpipev(p, m), 1.0, 1.0, 1.0, t_comm=0.5)
    first = {(e.rank, e.kind, e.microbatch, e.chunk): e for e in slow.events}
    # micro-batch 0's forward on rank 1: chunk 0 waits for rank 0's send, chunk 1 follows at once
    assert first[(1, "F", 0, 0)].start == pytest.approx(1.5)
    assert first[(1, "F", 0, 1)].start == pytest.approx(first[(1, "F", 0, 0)].end)
    assert slow.makespan > free.makespan
