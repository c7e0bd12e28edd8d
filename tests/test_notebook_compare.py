"""What `make test` compares in a notebook: numbers and text, never image bytes.

notebooks/conftest.py takes every image (shown, or glued for the book by myst_nb) out of
nbval's comparison. Two one-cell notebooks prove it: one whose committed picture differs
from the one a fresh run draws passes; one whose committed number differs fails.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

SOURCE = """%matplotlib inline
import matplotlib.pyplot as plt
from IPython.display import display
from myst_nb import glue
fig = plt.figure(figsize=(2, 1), dpi=100)
_ = plt.plot([0, 1], [0, 1])
glue("line", fig, display=False)
display(fig)
plt.close(fig)
print(f"{0.1 + 0.2:.2f}")"""
FIGURE_TEXT = "<Figure size 200x100 with 1 Axes>"
NOT_THIS_PICTURE = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMI"
                    "QAAAABJRU5ErkJggg==")           # a 1x1 PNG: not what the cell draws


def notebook(printed: str) -> dict:
    """The notebook as if committed: its outputs are a made-up picture and `printed`."""
    record = "application/papermill.record/"
    outputs = [
        {"output_type": "display_data",
         "metadata": {"scrapbook": {"mime_prefix": record, "name": "line"}},
         "data": {record + "image/png": NOT_THIS_PICTURE, record + "text/plain": FIGURE_TEXT}},
        {"output_type": "display_data", "metadata": {},
         "data": {"image/png": NOT_THIS_PICTURE, "text/plain": FIGURE_TEXT}},
        {"output_type": "stream", "name": "stdout", "text": printed},
    ]
    cell = {"cell_type": "code", "execution_count": 1, "id": "c0", "metadata": {},
            "source": SOURCE, "outputs": outputs}
    return {"cells": [cell], "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}}}


@pytest.mark.slow
def test_nbval_skips_pictures_and_checks_numbers(tmp_path):
    shutil.copy(REPO_ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "same_number.ipynb").write_text(json.dumps(notebook("0.30\n")))
    (tmp_path / "other_number.ipynb").write_text(json.dumps(notebook("0.31\n")))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", "--nbval-sanitize-with", str(REPO_ROOT / "notebooks/sanitize.cfg"),
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert "PASSED same_number.ipynb::Cell 0" in run.stdout, run.stdout + run.stderr
    assert "FAILED other_number.ipynb::Cell 0" in run.stdout, run.stdout + run.stderr
    assert "mismatch 'stdout'" in run.stdout and "image" not in run.stdout, run.stdout
