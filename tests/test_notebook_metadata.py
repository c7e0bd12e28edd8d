"""Opening a notebook in JupyterLab does not mark it modified (issue 42's solution rules).

When the kernel starts, JupyterLab writes the kernel's spec into the notebook's
metadata.kernelspec; a saved spec that differs from the kernel's (display_name "Python 3"
where ipykernel's python3 kernel says "Python 3 (ipykernel)") changes the document, and the
tab shows the modified dot before the reader has typed anything. `make notebooks` keeps the
spec (nbclient rewrites language_info from the kernel, never kernelspec), so it stays right
once written. (language_info.version is the Python that last ran the notebook: a reader
with another Python sees theirs recorded, which no notebook can avoid; tests/html/lab.mjs
checks the whole rule in JupyterLab itself.)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_spec() -> dict:
    """What JupyterLab writes for the python3 kernel this venv runs the notebooks on."""
    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"display_name": spec.display_name, "language": spec.language, "name": "python3"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_kernelspec_is_the_kernels_own(path, kernel_spec):
    saved = json.loads(path.read_text())["metadata"].get("kernelspec")
    assert saved == kernel_spec, (
        f"{path.name}: kernelspec {saved} is not the kernel's {kernel_spec}: JupyterLab marks "
        "the notebook modified when it opens it (set it to the kernel's)")
