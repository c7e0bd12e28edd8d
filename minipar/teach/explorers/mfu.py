"""The MFU chapter's explorer (book/mfu.md): the cost model's what-if.

`figure(**layout)` draws where one step's time goes, the memory of the fullest GPU against
the HBM and the bytes per axis, for any layout of Llama 3 405B (default: Table 4 row 1);
`explore(**defaults)` puts sliders on it. Both are `teach.widgets`' what-if
(`whatif_figure`, `whatif`), which the memory chapter's "will it fit" shares its controls
with; this module is the chapter's name for them.
"""
from __future__ import annotations

from ..widgets import WHATIF_DEFAULTS, whatif, whatif_figure

DEFAULTS = dict(WHATIF_DEFAULTS)
# The settings the HTML book offers (teach/web.py draws each combination when the book is
# built; the controls are teach.widgets.WHATIF_CONTROLS); the others stay at DEFAULTS.
WEB = {"tp": [1, 2, 4, 8, 16], "pp": [8, 16], "schedule": ["1f1b", "interleaved", "zb"]}


def figure(**layout):
    """The what-if panel for one layout (the keys of `DEFAULTS`)."""
    return whatif_figure(**layout)


def explore(**defaults):
    """The live what-if: sliders for the layout, batch, schedule, recomputation and ZeRO."""
    return whatif(**defaults)
