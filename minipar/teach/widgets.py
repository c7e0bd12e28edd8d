"""The one shape of every chapter's explorer, and the two explorers over the cost model:
the MFU chapter's what-if and the memory chapter's "will it fit".

Each explorer is two layers: a pure drawing function that returns a matplotlib Figure (the
built book shows that as a static picture, since a static page has no kernel) and its
controls, declared as data (`choice`, `steps`, `powers`, `slider`, `log_slider`, `toggle`);
`explorer` turns them into sliders and calls the drawing again whenever one moves.
ipywidgets is imported only there, so the static figures need nothing but matplotlib.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..plan.config import PRESETS, ConfigError, ModelConfig, ParallelConfig
from ..plan.costmodel import LLAMA3_CLUSTER, PRECISIONS, estimate
from ..plan.costmodel.memory import memory_of_rank
from ..plan.costmodel.workload import layout_problems, make_workload
from .style import AXES, COLORS, INVALID, PAGE_WIDTH, stacked_bars


# ---------------------------------------------------------------- controls, declared as data
@dataclass(frozen=True)
class Control:
    """One control of an explorer: a dropdown ("choice"), a slider over listed values
    ("steps"), a number slider ("int", "float"; `values` = (min, max, step)), a slider over
    powers of ten ("log"; `values` = (min exponent, max exponent)) or a checkbox ("toggle")."""
    kind: str
    values: tuple = ()
    label: str | None = None         # default: the name of the value it sets


def choice(options, label=None) -> Control:
    return Control("choice", tuple(options), label)


def steps(options, label=None) -> Control:
    return Control("steps", tuple(options), label)


def powers(lo: int, hi: int, label=None) -> Control:
    """A slider over 2**lo ... 2**hi."""
    return steps([2**i for i in range(lo, hi + 1)], label)


def slider(lo, hi, step=None, label=None) -> Control:
    whole = all(isinstance(v, int) for v in (lo, hi, step or 1))
    return Control("int" if whole else "float", (lo, hi, step or (1 if whole else 0.1)), label)


def log_slider(lo: float, hi: float, label=None) -> Control:
    """A slider over 10**lo ... 10**hi."""
    return Control("log", (lo, hi), label)


def toggle(label=None) -> Control:
    return Control("toggle", (), label)


def widget(name: str, control: Control, value):
    """The ipywidget of `control`, set to `value`. Sliders report a value when let go, not
    at every step of a drag: dragging the GPU count from 8 to 16,384 would redraw eleven
    plans on the way."""
    import ipywidgets as w   # here, not at the top: optional, only the live explorers need it

    label, v = control.label or name, control.values
    slid = dict(description=label, continuous_update=False)
    make = {"choice": lambda: w.Dropdown(options=list(v), value=value, description=label),
            "steps": lambda: w.SelectionSlider(options=list(v), value=value, **slid),
            "int": lambda: w.IntSlider(value=value, min=v[0], max=v[1], step=v[2], **slid),
            "float": lambda: w.FloatSlider(value=value, min=v[0], max=v[1], step=v[2], **slid),
            "log": lambda: w.FloatLogSlider(value=value, base=10, min=v[0], max=v[1], **slid),
            "toggle": lambda: w.Checkbox(value=value, description=label)}
    return make[control.kind]()


def offered(control: Control) -> tuple:
    """The values a reader can give `control` (a "log" slider's: its decades)."""
    v = control.values
    if control.kind in ("choice", "steps"):
        return v
    if control.kind == "int":
        return tuple(range(v[0], v[1] + 1, v[2]))
    if control.kind == "toggle":
        return (False, True)
    if control.kind == "float":
        return tuple(round(v[0] + i * v[2], 9) for i in range(int(round((v[1] - v[0]) / v[2])) + 1))
    return tuple(10.0 ** e for e in range(int(v[0]), int(v[1]) + 1))


# ---------------------------------------------------------------- an invalid setting, in place
def one_change_fixes(controls: dict[str, Control], values: dict, problems_of, most: int = 4) -> list[str]:
    """The controls that alone make `values` valid, each with the values that do
    ("tp = 1, 2, 4 or 8"): `problems_of(values)` lists the rules a setting breaks (cheap:
    it runs once per value of every control)."""
    out = []
    for name, control in controls.items():
        good = [v for v in offered(control)
                if v != values.get(name) and not problems_of({**values, name: v})]
        if good:
            shown = [f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v) for v in good]
            either = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
            out.append(f"{control.label or name} = {either}")
    return out[:most]


def draw_invalid(ax, problems: list[str], fixes: list[str] | None, width: int = 92):
    """An invalid setting where its picture would be: the rules it breaks (each names the
    flag and the rule) and the one-control changes that make it valid (None: the problems
    say the fix themselves), wrapped to the figure's width (a browser does not wrap a
    figure's text)."""
    ax.axis("off")
    lines = [textwrap.fill(p, width, initial_indent="- ", subsequent_indent="  ") for p in problems]
    if fixes is not None:
        lines += ["", "To make it valid, change one control:" if fixes else
                  "No single control makes it valid: change two (the rules above say which)."]
        lines += [textwrap.fill(f, width, initial_indent="- ", subsequent_indent="  ") for f in fixes]
    ax.text(0, 1, "This setting cannot run:", color=INVALID, fontsize=10, weight="bold",
            va="top", transform=ax.transAxes)
    ax.text(0, 0.86, "\n".join(lines), color=INVALID, fontsize=8.5, va="top",
            transform=ax.transAxes)


def explorer(controls: dict[str, Control], draw, values: dict, split: int, shown=None):
    """The live explorer of every chapter: `controls` (name -> Control) start at `values`,
    and `draw(**values)` (the chapter's `figure`) redraws with the controls' values;
    `shown(**values)`, if given, runs once the figure is on the page."""
    widgets = {name: widget(name, c, values[name]) for name, c in controls.items()}
    return live_panel(widgets, lambda moved: draw(**{**values, **moved}), split,
                      shown and (lambda moved: shown(**{**values, **moved})))


def live_panel(controls: dict, draw, split: int, shown=None):
    """Controls in two columns (the first `split`, then the rest) above a figure that
    `draw(values)` redraws on every change: the one layout of every explorer. `shown(values)`
    runs after the figure is displayed (work started there, in the background, does not
    slow the picture the reader waits for)."""
    import ipywidgets as w   # here, not at the top: optional, only the live explorers need it
    from IPython.display import display   # installed with ipywidgets

    out = w.Output()

    def redraw(_=None):
        values = {k: c.value for k, c in controls.items()}
        with out:
            out.clear_output(wait=True)
            fig = draw(values)
            display(fig)
            plt.close(fig)
        if shown:
            shown(values)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    names = list(controls)
    return w.VBox([w.HBox([w.VBox([controls[k] for k in names[:split]]),
                           w.VBox([controls[k] for k in names[split:]])]), out])


# ---------------------------------------------------------------- what if (MFU chapter)
WHATIF_DEFAULTS = dict(tp=8, cp=1, pp=16, dp=64, microbatch_size=1, seq_len=8192,
                       schedule="interleaved", virtual_stages=8, recompute="none", zero=1,
                       cp_impl="allgather", global_batch_tokens=2048 * 8192)


def whatif_estimate(model=None, cluster=None, **layout):
    """(Estimate, None) for a layout, or (None, [problems]) when it cannot run.
    `layout`: the keys of `WHATIF_DEFAULTS` (missing ones take Table 4 row 1's values)."""
    kw = {**WHATIF_DEFAULTS, **layout}
    model = model or ModelConfig.preset("llama3-405b")
    cluster = cluster or LLAMA3_CLUSTER
    v = kw["virtual_stages"] if kw["schedule"] == "interleaved" else 1
    pc = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp"], zero=kw["zero"],
                        sp=kw["tp"] > 1, schedule=kw["schedule"], virtual_stages=v,
                        cp_impl=kw["cp_impl"])
    try:
        e = estimate(model, pc, cluster, kw["seq_len"],
                     global_batch_tokens=kw["global_batch_tokens"],
                     microbatch_size=kw["microbatch_size"], recompute=kw["recompute"])
    except ConfigError as err:
        return None, str(err).split("; ")
    return e, None


def layout_problems_of(model, kw: dict) -> list[str]:
    """The rules a what-if layout breaks, without estimating it (cheap: what the fixes of
    an invalid setting try, once per value of every control)."""
    v = kw["virtual_stages"] if kw["schedule"] == "interleaved" else 1
    try:
        pc = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp"], zero=kw["zero"],
                            sp=kw["tp"] > 1, schedule=kw["schedule"], virtual_stages=v,
                            cp_impl=kw["cp_impl"])
        work = make_workload(kw["seq_len"], kw["global_batch_tokens"], None,
                             kw["microbatch_size"], kw["recompute"])
    except ConfigError as err:
        return err.problems
    return layout_problems(model, pc, work)


def whatif_figure(model=None, cluster=None, **layout):
    """One what-if panel: where the step's time goes, the memory of the most loaded GPU
    against the HBM, and the bytes each GPU sends per axis. An invalid layout draws its
    broken rules instead, in red."""
    cluster = cluster or LLAMA3_CLUSTER
    kw = {**WHATIF_DEFAULTS, **layout}
    e, problems = whatif_estimate(model, cluster, **kw)
    fig = plt.figure(figsize=(PAGE_WIDTH, 5.6))       # the step's time, then memory and bytes
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.4], height_ratios=[1, 1.5])
    ta = fig.add_subplot(grid[0, :])
    ma, ba = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    fig.suptitle(_whatif_title(kw), fontsize=9)
    if e is None:
        model = model or ModelConfig.preset("llama3-405b")
        _draw_problems((ta, ma, ba), problems, one_change_fixes(
            WHATIF_CONTROLS, kw, lambda values: layout_problems_of(model, values)))
        return fig
    _draw_time(ta, e)
    _draw_memory(ma, e, cluster.hbm_gb)
    _draw_bytes(ba, e)
    fig.tight_layout()
    return fig


def _whatif_title(kw: dict) -> str:
    gpus = kw["tp"] * kw["cp"] * kw["pp"] * kw["dp"]
    return (f"TP{kw['tp']} CP{kw['cp']} PP{kw['pp']} DP{kw['dp']} = {gpus:,} GPUs, "
            f"seq {kw['seq_len']:,}, micro-batch {kw['microbatch_size']}, {kw['schedule']}"
            + (f" v={kw['virtual_stages']}" if kw["schedule"] == "interleaved" else "")
            + f", recompute {kw['recompute']}, ZeRO-{kw['zero']}")


def _time_color(part: str) -> str:
    """TP's share of the time sits next to compute's, both blue: TP's is the lighter one."""
    return COLORS["tp time" if part == "tp" else part]


def _draw_problems(axes, problems: list[str], fixes: list[str]):
    """An invalid layout: no plots; its broken rules and their fixes where they were."""
    for a in axes:
        a.axis("off")
    draw_invalid(axes[0], problems[:6], fixes)


def _draw_time(ta, e):
    """Where the step's time goes: one horizontal stacked bar."""
    left = 0.0
    for part, seconds in e.time_breakdown_s.items():
        ta.barh(0, seconds, left=left, color=_time_color(part), label=part)
        left += seconds
    ta.set_yticks([])
    ta.set_xlabel("seconds per step")
    ta.legend(ncol=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ta.set_title(f"MFU {100 * e.mfu:.1f}%  ({e.tflops_per_gpu:.0f} TFLOP/s), step {e.step_time_s:.2f} s, "
                 f"bubble {100 * e.bubble_fraction:.1f}%", fontsize=9)


def _draw_memory(ma, e, hbm_gb: float):
    """The memory of the most loaded GPU, stacked, against the HBM (dashed)."""
    total, = stacked_bars(ma, {part: [gb] for part, gb in e.memory_breakdown_gb.items()})
    ma.axhline(hbm_gb, ls="--", color="black", lw=1)
    ma.set_xticks([])
    ma.set_ylabel("GB per GPU")
    ma.set_ylim(0, max(hbm_gb, total) * 1.15)
    ma.set_title(f"{total:.0f} GB" + ("" if e.fits_memory else " (too big)"), fontsize=9,
                 color="black" if e.fits_memory else INVALID)
    ma.legend(fontsize=7, loc="upper left")


def _draw_bytes(ba, e):
    """The bytes each GPU sends per step, one bar per axis (pipeline rank 0)."""
    ba.bar(range(4), [e.comm_bytes_per_gpu[a] / 1e9 for a in AXES],
           color=[_time_color(a) for a in AXES])
    ba.set_xticks(range(4))
    ba.set_xticklabels([a.upper() for a in AXES])
    ba.set_ylabel("GB sent per GPU per step")
    ba.set_title("bytes on the wire (rank 0)", fontsize=9)


def static_whatif(model=None, cluster=None, **layout):
    """The what-if panel for one layout (default: Llama 3's Table 4, row 1), as the built
    book shows it where a live notebook would show the sliders."""
    return whatif_figure(model, cluster, **layout)


WHATIF_CONTROLS = {  # one slider or dropdown per layout knob
    "tp": powers(0, 4), "cp": powers(0, 6), "pp": powers(0, 6), "dp": powers(0, 11),
    "microbatch_size": powers(0, 4, "micro-batch"), "seq_len": powers(11, 17, "seq len"),
    "schedule": choice(["afab", "1f1b", "interleaved", "zb"]),
    "virtual_stages": powers(0, 4, "chunks v"), "recompute": choice(["none", "selective", "full"]),
    "zero": choice([0, 1, 2, 3], "ZeRO"),
}


def whatif(model=None, cluster=None, **defaults):
    """The live explorer: sliders for tp, cp, pp, dp, micro-batch size, sequence length,
    schedule, chunks, recompute and ZeRO; the panel below redraws on every change."""
    return explorer(WHATIF_CONTROLS, lambda **kw: whatif_figure(model, cluster, **kw),
                    {**WHATIF_DEFAULTS, **defaults}, split=5)


# ---------------------------------------------------------------- will it fit (memory chapter)
FIT_DEFAULTS = {**WHATIF_DEFAULTS, "model": "llama3-405b", "precision": "bf16", "zero": 2}
# An H100's "80 GB" of HBM3 are 80 GiB (nvidia-smi: 81,559 MiB usable, 85.5 GB): the line
# the explorer draws, in decimal GB like every other number of the cost model.
H100_HBM_GB = 80 * 2**30 / 1e9


def fit_figure(**layout):
    """"Will it fit": the bytes of every pipeline rank by part (parameters, gradients,
    optimizer state, activations), against the cluster's HBM (dashed). `layout`: the keys
    of `FIT_DEFAULTS` (model preset, precision, layout, batch, schedule, ZeRO, recompute)."""
    kw = {**FIT_DEFAULTS, **layout}
    model = ModelConfig.preset(kw["model"])
    v = kw["virtual_stages"] if kw["schedule"] == "interleaved" else 1
    pc = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp"], zero=kw["zero"],
                        sp=kw["tp"] > 1, schedule=kw["schedule"], virtual_stages=v,
                        cp_impl=kw["cp_impl"], recompute=kw["recompute"])
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.4))
    fig.suptitle(f"{model.name}, {kw['precision']}: " + _whatif_title(kw), fontsize=8)
    try:
        work = make_workload(kw["seq_len"], kw["global_batch_tokens"], None,
                             kw["microbatch_size"], kw["recompute"])
        problems = layout_problems(model, pc, work)
        if problems:
            raise ConfigError(*problems)
        ranks = [memory_of_rank(model, pc, work, PRECISIONS[kw["precision"]], r)
                 for r in range(pc.pp)]
    except ConfigError as err:
        _draw_problems((ax,), err.problems, one_change_fixes(
            FIT_CONTROLS, kw, _fit_problems))
        return fig
    totals = stacked_bars(ax, {part: [r[part] / 1e9 for r in ranks]
                               for part in ("params", "grads", "optimizer", "activations")})
    hbm = H100_HBM_GB
    ax.axhline(hbm, ls="--", color="black", lw=1)
    worst = max(range(pc.pp), key=lambda r: totals[r])
    fits = totals[worst] <= hbm
    ax.set_title(f"fullest: pipeline rank {worst}, {totals[worst]:.1f} GB of {hbm:.1f} GB (80 GiB)"
                 + ("" if fits else " (too big)"), fontsize=9, color="black" if fits else INVALID)
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GB per GPU")
    ax.set_ylim(0, max(hbm, max(totals)) * 1.15)
    ax.legend(fontsize=7, loc="upper right", ncol=4)
    fig.tight_layout()
    return fig


def _fit_problems(kw: dict) -> list[str]:
    """The rules a "will it fit" setting breaks (its model is a control too)."""
    return layout_problems_of(ModelConfig.preset(kw["model"]), kw)


# The dense presets only: the memory model's expert parts (MoE presets, the experts chapter)
# are not what this chapter teaches, and its figure has no bar for them.
DENSE = tuple(name for name, m in PRESETS.items() if not m.moe_experts)
FIT_CONTROLS = {**WHATIF_CONTROLS, "model": choice(DENSE), "precision": choice(PRECISIONS)}


def will_it_fit(**defaults):
    """The live "will it fit" explorer: the what-if sliders, plus the model and precision;
    the per-rank memory redraws on every change."""
    return explorer(FIT_CONTROLS, fit_figure, {**FIT_DEFAULTS, **defaults}, split=6)
