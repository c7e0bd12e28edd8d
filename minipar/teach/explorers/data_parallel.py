"""The data-parallelism chapter's explorer (book/data_parallel.md): what one GPU holds under
each ZeRO stage, from `formulas.zero_bytes_per_param`.

The model's parameters are first split by the model-parallel axes (TP x PP, `model_parallel`
GPUs), then each part is sharded over `dp` data-parallel ranks as the stage says. `figure`
draws it (the page shows Llama 3 405B on TP 8 x PP 16 with DP 64, in mixed precision);
`explore` puts sliders on it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import PRESETS, ModelConfig
from ...plan.flops import param_count
from ...plan.formulas.memory import zero_bytes_per_param
from ..figures.data_parallel import plot_zero_memory
from ..widgets import choice, explorer, powers, slider

DEFAULTS = dict(model="llama3-405b", model_parallel=128, dp=64, param_bytes=2, grad_bytes=2,
                optimizer_bytes=12, hbm_gb=80.0)


def zero_memory(**values) -> dict[int, dict[str, float]]:
    """{stage: {params, grads, optimizer}} bytes one GPU holds. Pure."""
    kw = {**DEFAULTS, **values}
    psi = param_count(ModelConfig.preset(kw["model"])) / kw["model_parallel"]
    return {z: {part: b * psi for part, b in zero_bytes_per_param(
                z, kw["dp"], kw["param_bytes"], kw["grad_bytes"], kw["optimizer_bytes"]).items()}
            for z in range(4)}


def figure(**values):
    """Stacked bars per ZeRO stage (GB per GPU, before activations) against the HBM."""
    kw = {**DEFAULTS, **values}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    plot_zero_memory(zero_memory(**kw), unit=1e9, unit_name="GB", limit=kw["hbm_gb"] * 1e9,
                     limit_label=f"HBM {kw['hbm_gb']:g} GB", ax=ax,
                     title=f"{kw['model']} / {kw['model_parallel']} GPUs of TP x PP, DP {kw['dp']}: "
                           f"{kw['param_bytes']:g} + {kw['grad_bytes']:g} + "
                           f"{kw['optimizer_bytes']:g} bytes/param")
    fig.tight_layout()
    return fig


CONTROLS = {"model": choice(PRESETS), "model_parallel": powers(0, 10, "TP x PP"),
            "dp": powers(0, 11, "DP"), "param_bytes": choice([2, 4], "weight B"),
            "grad_bytes": choice([2, 4], "grad B"), "optimizer_bytes": choice([8, 12, 16], "optim. B"),
            "hbm_gb": slider(16.0, 192.0, 8.0, "HBM GB")}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every DP degree
# (what ZeRO divides by); every value of the other controls one at a time (the HBM slider:
# its ends, its default and two between).
WEB = {"dp": list(CONTROLS["dp"].values)}
ALONE = {**{name: list(CONTROLS[name].values) for name in
            ("model", "model_parallel", "param_bytes", "grad_bytes", "optimizer_bytes")},
         "hbm_gb": sorted({16.0, 48.0, DEFAULTS["hbm_gb"], 128.0, 192.0})}


def explore(**defaults):
    """Sliders for the model, TP x PP, DP and the bytes per parameter of each part."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=4)
