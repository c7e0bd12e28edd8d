"""ipywidgets explorers for the notebooks.

Each explorer is two layers: a pure drawing function that returns a matplotlib Figure (the
built book shows that as a static picture, since a static page has no kernel) and a thin
layer of sliders that calls it again whenever a slider moves. ipywidgets is imported only
by the slider layer, so the static figures need nothing but matplotlib.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


# --- cost model figures ---------------------------------------------------------------
TIME_COLORS = {"compute": "#4C72B0", "tp": "#8C9FCA", "cp": "#55A868", "bubble": "#CCCCCC",
               "pp": "#C44E52", "dp": "#8172B2"}
MEMORY_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
                 "activations": "#C44E52"}
WHATIF_DEFAULTS = dict(tp=8, cp=1, pp=16, dp=64, microbatch_size=1, seq_len=8192,
                       schedule="interleaved", virtual_stages=8, recompute="none", zero=1,
                       cp_impl="allgather", global_batch_tokens=2048 * 8192)


def whatif_estimate(model=None, cluster=None, **layout):
    """(Estimate, None) for a layout, or (None, [problems]) when it cannot run.
    `layout`: the keys of `WHATIF_DEFAULTS` (missing ones take Table 4 row 1's values)."""
    from . import costmodel
    from .config import ConfigError, ModelConfig, ParallelConfig

    kw = {**WHATIF_DEFAULTS, **layout}
    model = model or ModelConfig.preset("llama3-405b")
    cluster = cluster or costmodel.LLAMA3_CLUSTER
    v = kw["virtual_stages"] if kw["schedule"] == "interleaved" else 1
    pc = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp"], zero=kw["zero"],
                        sp=kw["tp"] > 1, schedule=kw["schedule"], virtual_stages=v,
                        cp_impl=kw["cp_impl"])
    try:
        e = costmodel.estimate(model, pc, cluster, kw["seq_len"],
                               global_batch_tokens=kw["global_batch_tokens"],
                               microbatch_size=kw["microbatch_size"], recompute=kw["recompute"])
    except ConfigError as err:
        return None, str(err).split("; ")
    return e, None


def whatif_figure(model=None, cluster=None, **layout):
    """One what-if panel: where the step's time goes, the memory of the most loaded GPU
    against the HBM, and the bytes each GPU sends per axis. An invalid layout draws its
    broken rules instead, in red."""
    from . import costmodel

    cluster = cluster or costmodel.LLAMA3_CLUSTER
    kw = {**WHATIF_DEFAULTS, **layout}
    e, problems = whatif_estimate(model, cluster, **kw)
    gpus = kw["tp"] * kw["cp"] * kw["pp"] * kw["dp"]
    head = (f"TP{kw['tp']} CP{kw['cp']} PP{kw['pp']} DP{kw['dp']} = {gpus:,} GPUs, "
            f"seq {kw['seq_len']:,}, micro-batch {kw['microbatch_size']}, {kw['schedule']}"
            + (f" v={kw['virtual_stages']}" if kw["schedule"] == "interleaved" else "")
            + f", recompute {kw['recompute']}, ZeRO-{kw['zero']}")
    fig, (ta, ma, ba) = plt.subplots(1, 3, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 1.2, 2]})
    if e is None:
        for a in (ta, ma, ba):
            a.axis("off")
        ta.text(0, 0.9, "invalid layout:", color="#B00020", fontsize=11, weight="bold",
                transform=ta.transAxes)
        for i, line in enumerate(problems[:6]):
            ta.text(0, 0.75 - 0.13 * i, line, color="#B00020", fontsize=8, transform=ta.transAxes)
        fig.suptitle(head, fontsize=9)
        return fig

    # where the time goes: one horizontal stacked bar
    left = 0.0
    for part, seconds in e.time_breakdown_s.items():
        ta.barh(0, seconds, left=left, color=TIME_COLORS[part], label=part)
        left += seconds
    ta.set_yticks([])
    ta.set_xlabel("seconds per step")
    ta.legend(ncol=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ta.set_title(f"MFU {100 * e.mfu:.1f}%  ({e.tflops_per_gpu:.0f} TFLOP/s), step {e.step_time_s:.2f} s, "
                 f"bubble {100 * e.bubble_fraction:.1f}%", fontsize=9)

    # memory against the HBM
    bottom = 0.0
    for part, gb in e.memory_breakdown_gb.items():
        ma.bar(0, gb, bottom=bottom, color=MEMORY_COLORS[part], label=part)
        bottom += gb
    ma.axhline(cluster.hbm_gb, ls="--", color="black", lw=1)
    ma.set_xticks([])
    ma.set_ylabel("GB per GPU")
    ma.set_ylim(0, max(cluster.hbm_gb, bottom) * 1.15)
    ma.set_title(f"{bottom:.0f} GB" + ("" if e.fits_memory else " (too big)"), fontsize=9,
                 color="black" if e.fits_memory else "#B00020")
    ma.legend(fontsize=6, loc="upper left")

    # bytes per axis
    axes = ("tp", "cp", "pp", "dp")
    ba.bar(range(4), [e.comm_bytes_per_gpu[a] / 1e9 for a in axes],
           color=[TIME_COLORS[a] for a in axes])
    ba.set_xticks(range(4))
    ba.set_xticklabels([a.upper() for a in axes])
    ba.set_ylabel("GB sent per GPU per step")
    ba.set_title("bytes on the wire (rank 0)", fontsize=9)
    fig.suptitle(head, fontsize=9)
    fig.tight_layout()
    return fig


def static_whatif(model=None, cluster=None, **layout):
    """The what-if panel for one layout (default: Llama 3's Table 4, row 1), as the built
    book shows it where a live notebook would show the sliders."""
    return whatif_figure(model, cluster, **layout)


def whatif(model=None, cluster=None, **defaults):
    """The live explorer: sliders for tp, cp, pp, dp, micro-batch size, sequence length,
    schedule, chunks, recompute and ZeRO; the panel below redraws on every change."""
    import ipywidgets as w
    from IPython.display import display

    kw = {**WHATIF_DEFAULTS, **defaults}
    pow2 = lambda lo, hi: [2**i for i in range(lo, hi + 1)]
    controls = {
        "tp": w.SelectionSlider(options=pow2(0, 4), value=kw["tp"], description="tp"),
        "cp": w.SelectionSlider(options=pow2(0, 6), value=kw["cp"], description="cp"),
        "pp": w.SelectionSlider(options=pow2(0, 6), value=kw["pp"], description="pp"),
        "dp": w.SelectionSlider(options=pow2(0, 11), value=kw["dp"], description="dp"),
        "microbatch_size": w.SelectionSlider(options=pow2(0, 4), value=kw["microbatch_size"],
                                             description="micro-batch"),
        "seq_len": w.SelectionSlider(options=pow2(11, 17), value=kw["seq_len"], description="seq len"),
        "schedule": w.Dropdown(options=["afab", "1f1b", "interleaved", "zb"], value=kw["schedule"],
                               description="schedule"),
        "virtual_stages": w.SelectionSlider(options=pow2(0, 4), value=kw["virtual_stages"],
                                            description="chunks v"),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=kw["recompute"],
                                description="recompute"),
        "zero": w.Dropdown(options=[0, 1, 2, 3], value=kw["zero"], description="ZeRO"),
    }
    out = w.Output()

    def redraw(_=None):
        values = {k: c.value for k, c in controls.items()}
        with out:
            out.clear_output(wait=True)
            fig = whatif_figure(model, cluster, **{**kw, **values})
            display(fig)
            plt.close(fig)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    names = list(controls)
    return w.VBox([w.HBox([w.VBox([controls[k] for k in names[:5]]),
                           w.VBox([controls[k] for k in names[5:]])]), out])
