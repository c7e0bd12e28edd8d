"""The cluster chapter's checks accept the right answer and reject the usual wrong ones, and
the placement they rest on agrees with ProcessGrid."""
from __future__ import annotations

from minipar.plan.formulas.collectives import wire_bytes
from minipar.plan.flops import local_param_count
from minipar.plan.config import ModelConfig
from minipar.trainer.grid import AXES, ProcessGrid
from minipar.teach.exercises import cluster as ex
from minipar.runtime import topology as place
from minipar.runtime import wire_meter
from verdicts import Wrong, fresh_attempts, judged, peeling  # noqa: F401 (a fixture)


def test_groups_are_processgrids():
    grid = ProcessGrid(tp=2, cp=2, pp=3, dp=2)
    for axis in AXES:
        assert sorted(place.groups(grid, axis)) == grid.all_groups(axis)


def test_llama3_row3_replicas_straddle_pods():
    # 2,048-GPU replicas on 3,072-GPU pods: replicas 1, 4 and 7 cross a boundary
    assert place.straddling_replicas(2048, 16384, 3072) == [1, 4, 7]
    assert place.straddling_replicas(128, 8192, 3072) == []


def test_axis_links_critiques_row3_on_the_pods(fresh_attempts):
    """Row 3 as published spans pods with 3 of its 8 replicas; 1,024-GPU replicas do not,
    and with ZeRO-3 and interleaving they are the planner's best."""
    best = dict(tp=8, cp=16, pp=4, zero=3, schedule="interleaved", virtual_stages=32)
    good, = [judged(ex.check_axis_links, best,
                    Wrong(dict(tp=8, cp=16, pp=16, recompute="selective", schedule="interleaved",
                               virtual_stages=8), "3 of the 8 model replicas"),
                    Wrong(dict(tp=8, cp=16, pp=4), "largest part"),
                    Wrong(dict(tp=8, cp=16, pp=4, zero=3), "bubble"))[0]]
    assert "span two pods" in good.message
    right = ex.check_axis_links(best)
    assert "tp NVLink" in right.message and "dp across pods" in right.message
    # the placement the critique reads agrees with the grid, axis by axis
    assert place.placement(8, 16, 16, 8) == {"tp": "NVLink", "cp": "rail", "pp": "across pods",
                                             "dp": "across pods"}


def test_coords_of_catches_dp_innermost():
    # pp before cp: a subtler order bug, that only cp > 1 shows
    judged(ex.check_coords_of, lambda r, tp, cp, pp, dp: ProcessGrid(tp, cp, pp, dp).coords(r),
           Wrong(ex.broken_coords_of, "TP group"), peeling("tp", "pp", "cp", "dp"))


def test_exposed():
    def counts_lanes_twice(compute, comm):     # subtracts compute per span, sums the spans
        from minipar.plan import traces
        return sum(traces.length(traces.subtract([c], traces.union(compute))) for c in comm)
    judged(ex.check_exposed, ex.reference_exposed,
           lambda compute, comm: sum(b - a for a, b in comm), counts_lanes_twice)


def test_bytes_leaving_server_runs_one_step():
    local = local_param_count(ModelConfig.preset("tiny"), 2, 8, True, True)
    ring = wire_bytes("all_reduce", 2, 4 * local)      # fp32 gradients over DP 2
    measured, axes = ex.leaving_bytes(2, 2, 2)          # rank 0's wire, dp and world added
    assert axes == ["dp", "world"] and 0 <= measured - ring <= 3 * wire_meter.HEADER_BYTES
    judged(ex.check_bytes_leaving_server, ring, 2 * ring)   # all-reduce counted twice
