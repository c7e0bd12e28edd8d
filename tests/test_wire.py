"""Bytes on the wire, measured: each rank's write counter around each collective minipar runs
on each axis of a 2x2x2x2 grid (16 gloo ranks) agrees with gloo's rule to within its headers;
the ring formula agrees too, except for reduce-scatter, which gloo runs as an all-reduce. A
training step of several axes at once, measured by axis (`wire_meter.by_axis`), agrees too."""
import itertools
import os

import pytest

from minipar.runtime import wire_meter
from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.plan.formulas.collectives import wire_bytes
from minipar.teach.exercises.collectives import wire_per_rank, wire_table
from minipar.trainer.step import Trainer
from minipar.runtime.run import train

SIZE = 2**20


@pytest.fixture(scope="module")
def per_rank():
    return wire_per_rank(SIZE)          # ~3 s: 16 forked ranks, 12 collectives each


def off_rule(per_rank, rule) -> list[str]:
    """Rows where a rank's measured bytes are not `rule`'s within the headers (never fewer
    bytes than the rule: headers only add)."""
    bad = []
    for rank, rows in enumerate(per_rank):
        for r in rows:
            want = rule(r["op"], r["n"], r["payload"])
            if not 0 <= r["measured"] - want <= wire_meter.HEADER_BYTES:
                bad.append(f"rank {rank} {r['axis']} {r['op']}: {r['measured']:,} vs {want:,}")
    return bad


def test_the_counter_counts_exactly_what_a_process_writes():
    with open(os.devnull, "wb", buffering=0) as f:
        assert wire_meter.measure(lambda: f.write(b"x" * 12345)) == 12345


@pytest.mark.slow
def test_every_axis_and_op_of_the_grid_is_measured(per_rank):
    assert len(per_rank) == 16
    seen = {(r["axis"], r["op"], r["n"]) for rows in per_rank for r in rows}
    assert seen == {(a, op, 4 if a == "dp_cp" else 2)
                    for a, ops in wire_meter.AXIS_OPS.items() for op in ops}


@pytest.mark.slow
def test_measured_bytes_are_gloos_rule_plus_headers(per_rank):
    assert not off_rule(per_rank, wire_meter.gloo_bytes)


@pytest.mark.slow
def test_the_ring_formula_is_the_wire_except_for_gloos_reduce_scatter(per_rank):
    # the same check with the ring formula as the rule fails exactly on reduce-scatter:
    # the test can tell a wrong rule from the right one
    bad = off_rule(per_rank, wire_bytes)
    assert bad and all("reduce_scatter" in b for b in bad)
    assert len(bad) == 16 * 3           # tp, dp and dp x cp on every rank
    for r in wire_table(per_rank):
        want = 2.0 if r["op"] == "reduce_scatter" else 1.0     # the finding
        assert r["measured/ring"] == want, r
        assert r["measured/gloo"] == 1.0, r


@pytest.mark.slow
def test_a_wrong_rule_fails(per_rank):
    ring_reduce_scatter = {**wire_meter.GLOO_WIRE, "reduce_scatter": ("ring", lambda n, s: (n - 1) * s // n)}
    assert off_rule(per_rank, lambda op, n, s: ring_reduce_scatter[op][1](n, s))
    assert off_rule(per_rank, lambda op, n, s: wire_meter.gloo_bytes(op, n, s) + wire_meter.HEADER_BYTES + 1)


# ---------------------------------------------------------------- one step, every axis at once
# tp x cp x dp = 2 x 2 x 2, ring attention, ZeRO-1: all-reduces on tp, ring sends on cp, a
# reduce-scatter and an all-gather over dp x cp, the loss's scalars on the world. ~3 s.
AXES_RUN = dict(parallel=ParallelConfig(tp=2, cp=2, dp=2, zero=1), seq_len=32, global_batch=4)


@pytest.fixture(scope="module")
def step_record():
    with wire_meter.steps_by_axis(Trainer):
        return train(TrainConfig(steps=1, progress=False, **AXES_RUN))["records"][-1]


def off_by_axis(tally: dict, rule) -> list[str]:
    """(axis, op) whose measured bytes are not `rule(axis, op, stats)`'s within headers."""
    return [f"{a} {op}: {st['measured']:,} vs {rule(a, op, st):,}" for a, ops in tally.items()
            for op, st in ops.items()
            if not 0 <= st["measured"] - rule(a, op, st) <= st["calls"] * wire_meter.HEADER_BYTES]


def test_a_multi_axis_step_splits_by_axis_into_gloos_rule(step_record):
    tally = step_record["wire_ops"]
    assert {("tp", "all_reduce"), ("cp", "send"), ("dp", "reduce_scatter"), ("dp", "all_gather"),
            ("world", "all_reduce")} <= {(a, op) for a, ops in tally.items() for op in ops}
    assert not off_by_axis(tally, lambda a, op, st: st["gloo"])
    assert step_record["wire"] == {a: sum(st["measured"] for st in ops.values())
                                   for a, ops in tally.items()}
    for a in ("tp", "cp", "dp"):       # the collectives CommLog saw, on the same axes
        assert {op for op in tally[a]} <= set(step_record["comm"][a]), a


def test_the_split_can_fail(step_record):
    tally, comm = step_record["wire_ops"], step_record["comm"]
    # CommLog's ring bytes as the rule: right on every axis but dp's reduce-scatter (x2)
    ring = off_by_axis(tally, lambda a, op, st: comm[a][op]["wire_bytes"])
    assert [b.split(":")[0] for b in ring if not b.startswith("world")] == ["dp reduce_scatter"]
    # an axis's bytes against another axis's rule: off, whichever two axes
    total = {a: {k: sum(st[k] for st in tally[a].values()) for k in ("measured", "gloo")}
             for a in ("tp", "cp", "dp")}
    for a, b in itertools.permutations(total, 2):
        assert abs(total[a]["measured"] - total[b]["gloo"]) > 10 * wire_meter.HEADER_BYTES, (a, b)
