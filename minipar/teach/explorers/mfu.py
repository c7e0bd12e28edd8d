"""The MFU chapter's explorer (book/mfu.md): the cost model's what-if.

`figure(**layout)` draws where one step's time goes, the memory of the fullest GPU against
the HBM and the bytes per axis, for any layout of Llama 3 405B (default: Table 4 row 1);
`explore(**defaults)` puts sliders on it. Both are `teach.widgets`' what-if
(`whatif_figure`, `whatif`), which the memory chapter's "will it fit" shares its controls
with; this module is the chapter's name for them.
"""
from __future__ import annotations

from ..widgets import WHATIF_CONTROLS, WHATIF_DEFAULTS, whatif, whatif_estimate, whatif_figure

DEFAULTS = dict(WHATIF_DEFAULTS)
# The settings the HTML book offers (teach/web.py draws each ahead of time; the controls are
# teach.widgets.WHATIF_CONTROLS): every schedule; every value of the other controls one at
# a time.
WEB = {"schedule": list(WHATIF_CONTROLS["schedule"].values)}
ALONE = {name: list(control.values) for name, control in WHATIF_CONTROLS.items() if name not in WEB}


def same_picture(values: dict) -> dict:
    """A setting that draws the same picture (teach.web draws it once): a layout that runs
    without the interleaved schedule has no chunks v (one that cannot run names fixes, and
    "schedule = interleaved" may depend on v)."""
    if values["schedule"] != "interleaved" and whatif_estimate(**values)[0] is not None:
        return {**values, "virtual_stages": DEFAULTS["virtual_stages"]}
    return values


def figure(**layout):
    """The what-if panel for one layout (the keys of `DEFAULTS`)."""
    return whatif_figure(**layout)


def explore(**defaults):
    """The live what-if: sliders for the layout, batch, schedule, recomputation and ZeRO."""
    return whatif(**defaults)
