"""The memory chapter's explorer (book/memory.md): "will it fit", the bytes of every
pipeline rank by part (parameters, gradients, optimizer state, activations) against an
H100's 80 GiB, for any model preset, layout, schedule, ZeRO stage, recompute mode and
precision.

It wraps `teach.widgets.fit_figure` and `will_it_fit` (the shared style lives there):
`figure` is the static picture the chapter's page shows (Table 4 row 1 with sharded
gradients), `explore` the sliders of the notebook.
"""
from __future__ import annotations

from ..widgets import FIT_CONTROLS, FIT_DEFAULTS, fit_figure, will_it_fit

DEFAULTS = dict(FIT_DEFAULTS)
# The settings the HTML book offers (teach/web.py draws each ahead of time; the controls are
# teach.widgets.FIT_CONTROLS): every ZeRO stage, each with every value of the other
# controls one at a time (recomputation, the layout, the model, the precision).
WEB = {"zero": [0, 1, 2, 3]}
ALONE = {name: list(control.values) for name, control in FIT_CONTROLS.items() if name not in WEB}


def figure(**values):
    """Every pipeline rank's bytes by part for `values` (the keys of FIT_DEFAULTS). Pure."""
    return fit_figure(**{**DEFAULTS, **values})


def explore(**defaults):
    """The live "will it fit": sliders for the layout, model and precision."""
    return will_it_fit(**{**DEFAULTS, **defaults})
