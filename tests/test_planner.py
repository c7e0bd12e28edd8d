"""The planner: ranked layouts that fit, their limiting terms, and the constraint that binds
when nothing fits. Three cases, each a full search (seconds)."""
from __future__ import annotations

import pytest

from minipar.plan import costmodel as cm
from minipar.plan.config import ConfigError, ModelConfig
from minipar.plan.costmodel.planner import binding_constraint, candidates, limiting_term, plan

L405 = ModelConfig.preset("llama3-405b")


def test_llama3_405b_on_8192_h100s_ranks_fitting_layouts_and_finds_table4():
    p = plan(L405, cm.LLAMA3_CLUSTER, 8192, 8192, 16 * 2**20, top=None)
    assert p.ranked and p.tried > 100
    mfus = [e.mfu for e in p.ranked]
    assert mfus == sorted(mfus, reverse=True)
    assert all(e.fits_memory and e.parallel.world_size == 8192 for e in p.ranked)
    # Table 4 row 1 (TP8 PP16 DP64, 8 chunks) is among the fitting layouts, near the top
    table4 = [i for i, e in enumerate(p.ranked) if (e.parallel.tp, e.parallel.cp, e.parallel.pp,
                                                    e.parallel.dp) == (8, 1, 16, 64)]
    assert table4 and p.ranked[table4[0]].mfu >= 0.9 * mfus[0]
    first, share, term, part, without = limiting_term(p.ranked[0])
    assert 0 < share < 1 and 0 <= part < 1 and without >= p.ranked[0].mfu


def test_llama3_8b_on_64_h100s_choices_are_the_cheapest_that_fit():
    m8 = ModelConfig.preset("llama3-8b")
    cluster = cm.gpu_cluster("h100")
    p = plan(m8, cluster, 64, 8192, 4 * 2**20, top=3)
    best = p.ranked[0]
    assert best.parallel.world_size == 64 and best.fits_memory
    # recomputation and ZeRO-3 only cost time: an 8B model on 64 H100s needs neither
    assert best.workload.recompute == "none" and best.parallel.zero == 1
    # the space is what the docstring says: TP within a server, powers of two
    space = list(candidates(m8, cluster, 64, 8192, 512))
    for pc, mbs in space:
        assert pc.tp <= 8 and pc.world_size == 64 and 512 % (pc.dp * mbs) == 0
    # the search's one rule for chunks: every power of two with pp x v <= 32 layers + 2
    assert {pc.virtual_stages for pc, _ in space
            if pc.pp == 2 and pc.schedule == "interleaved"} == {2, 4, 8, 16}


def test_nothing_fits_names_memory_as_the_binding_constraint():
    p = plan(L405, cm.LLAMA3_CLUSTER, 64, 8192, 4 * 2**20)
    assert p.ranked == [] and p.rejected.get("memory")
    line = binding_constraint(p, cm.LLAMA3_CLUSTER)
    assert line.startswith("memory") and f"{cm.LLAMA3_CLUSTER.hbm_gb:g} GB of HBM" in line
    assert p.smallest_memory_gb > cm.LLAMA3_CLUSTER.hbm_gb


def test_the_planner_finds_table4_first_on_both_scales():
    """The chapter's answer to "does the planner find Table 4?": with the fitted constants
    and the headroom, Table 4's TP8 PP16 layout with eight chunks comes first on 8,192 and
    on 16,384 H100s; without the headroom a layout at the edge of the HBM would beat it
    (fewer pipeline ranks, twice the chunks: 81.8 of 85.9 GB)."""
    for gpus, dp in ((8192, 64), (16384, 128)):
        best = plan(L405, cm.LLAMA3_CLUSTER, gpus, 8192, 16 * 2**20, top=1).ranked[0].parallel
        assert (best.tp, best.cp, best.pp, best.dp, best.virtual_stages) == (8, 1, 16, dp, 8)
    edge = plan(L405, cm.LLAMA3_CLUSTER, 8192, 8192, 16 * 2**20, top=1, headroom=0.0).ranked[0]
    assert (edge.parallel.tp, edge.parallel.pp, edge.parallel.virtual_stages) == (8, 8, 16)
    assert edge.memory_gb_per_gpu > 0.95 * cm.LLAMA3_CLUSTER.hbm_gb


def test_plans_leave_the_headroom_free():
    """Every planned layout fits in the HBM less the headroom; without the headroom the
    best layouts fill the HBM to its edge, which is what the margin is for."""
    from minipar.plan.costmodel.planner import MEMORY_HEADROOM, memory_budget_gb
    c = cm.LLAMA3_CLUSTER
    budget = memory_budget_gb(c)
    assert budget == pytest.approx((1 - MEMORY_HEADROOM) * c.hbm_gb) and 0 < MEMORY_HEADROOM < 0.5
    kept = plan(L405, c, 8192, 8192, 16 * 2**20, top=None)
    assert kept.ranked and kept.budget_gb == budget
    assert all(e.memory_gb_per_gpu <= budget for e in kept.ranked)
    edge = plan(L405, c, 8192, 8192, 16 * 2**20, top=None, headroom=0.0)
    assert edge.ranked[0].mfu > kept.ranked[0].mfu       # the margin costs time, it is a choice
    assert budget < edge.ranked[0].memory_gb_per_gpu <= c.hbm_gb     # the unhedged best is at the edge
    with pytest.raises(ConfigError, match="--memory-headroom"):
        plan(L405, c, 8192, 8192, 16 * 2**20, headroom=1.0)


def test_plan_cli(capsys):
    code = cm.main(["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64",
                    "--seq-len", "8192", "--global-batch-tokens", "4M", "--top", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and "1. TP" in out and "limited by" in out
    code = cm.main(["plan", "--model", "llama3-405b", "--gpus", "64"])
    out, _ = capsys.readouterr()
    assert code == 0 and "nothing fits" in out and "memory" in out
    code = cm.main(["plan", "--model", "llama3-8b", "--gpus", "64", "--memory-headroom", "0.2",
                    "--top", "1"])
    out, _ = capsys.readouterr()
    assert code == 0 and "20% of HBM left free" in out


def test_rules_cross_their_thresholds_the_way_the_chapter_says():
    from minipar.plan.costmodel import rules
    c = cm.LLAMA3_CLUSTER
    narrow, wide = rules.llama_of_width(4096), rules.llama_of_width(16384)
    # TP: cheaper on wider models, dearer with t, far dearer out of the server, hidden by overlap
    assert rules.tp_ratio(wide, 8, c) < rules.tp_ratio(narrow, 8, c)
    assert rules.tp_ratio(wide, 4, c) < rules.tp_ratio(wide, 8, c) < 1 < rules.tp_ratio(narrow, 16, c)
    # out of the server (NICs, even on all eight rails at once) TP costs twice as much and more
    assert rules.tp_ratio(wide, 16, c) > 2 * rules.tp_ratio(wide, 8, c)
    assert rules.tp_ratio(wide, 8, c, overlap=True) < rules.tp_ratio(wide, 8, c)
    # CP: attention's share grows with s, CP's traffic over attention falls
    assert rules.attention_share(L405, 8192, c) < 0.1 < 0.45 < rules.attention_share(L405, 131072, c)
    assert rules.cp_ratio(L405, 131072, 16, c) < rules.cp_ratio(L405, 8192, 16, c)


def test_fourd_threshold_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minipar.teach import figures as viz
    e = plan(ModelConfig.preset("llama3-8b"), cm.gpu_cluster("h100"), 16, 8192, 2**20, top=2).ranked
    figs = [viz.plot_tp_threshold([1024, 2048], {2: [0.1, 0.05]}, {2: [0.01, 0.001]}),
            viz.plot_bubble_threshold([4, 8], {"p=4": [0.4, 0.2]}),
            viz.plot_dp_threshold([1e5, 1e6], {"m": [0.2, 0.02]}),
            viz.plot_cp_threshold([8192, 16384], [0.1, 0.2], {"CP2 ring": [0.0, 0.0]}),
            viz.plot_plan(["a", "b"], [x.time_breakdown_s for x in e], [x.mfu for x in e])]
    assert all(isinstance(f, matplotlib.figure.Figure) for f in figs)
    plt.close("all")
