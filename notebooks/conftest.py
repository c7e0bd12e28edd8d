"""What nbval compares when `make test` re-runs a notebook (pytest reads this file for
every notebook under notebooks/).

A notebook's outputs are checked against the committed ones: text, numbers and booleans
must match (after notebooks/sanitize.cfg removes what legitimately varies: times, paths,
ports). Pictures are never compared byte for byte. Another CPU's kernels round a float32
reduction differently, a curve moves by a fraction of a pixel and the PNG's bytes change,
though nothing the picture shows has. So every image, shown or glued for the book
(myst_nb's `glue` stores it under `application/papermill.record/image/png`), is left out
of the comparison; what a figure proves is printed in its cell as a number or a verdict,
and that is checked. nbval itself skips only `image/png` and `image/jpeg`.
"""
from __future__ import annotations

# nbval compares by exact key: name every image type a cell here can hold.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml", "image/webp")
NOT_COMPARED = IMAGE_TYPES + tuple("application/papermill.record/" + t for t in IMAGE_TYPES)


def pytest_collection_modifyitems(items):
    from nbval.plugin import IPyNbFile   # only present when nbval is installed

    for notebook in {item.parent for item in items if isinstance(item.parent, IPyNbFile)}:
        notebook.skip_compare = tuple(dict.fromkeys(notebook.skip_compare + NOT_COMPARED))
