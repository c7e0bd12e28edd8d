"""Sphinx extension: the book's numbers and pictures come from the package, never by hand.

- ``{n}`chapter.key` `` writes a number of `minipar.teach.numbers` (and, for a fact about
  Llama 3, a mark saying whether the paper reports it, the book derives it, or it is an
  assumption). ``{ev}`paper` `` marks a statement that is not a number the same way.
  An unknown key is a build error: `make book` runs with warnings as errors.
- ``{mpfig}`` draws a figure with a function of `minipar.teach.figures` when the page is
  read, so the picture on a chapter's page is the one the tests' functions produce (an
  explorer's static figure is named from teach: `explorers.memory.figure`):

      ```{mpfig} collectives.plot_ring_steps
      :kwargs: n=4
      The caption, in MyST.
      ```
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)
GENERATED = "book/_generated"      # under the source dir (git-ignored): Sphinx copies from here


def _mark(evidence: str) -> nodes.Node:
    from minipar.teach.numbers import EVIDENCE
    letter = {"paper": "P", "derived": "D", "assumption": "A"}[evidence]
    mark = nodes.superscript(classes=["evidence", f"evidence-{evidence}"])
    mark += nodes.abbreviation(letter, letter, explanation=EVIDENCE[evidence])
    return mark


def number_role(name, rawtext, text, lineno, inliner, options=None, content=()):
    from minipar.teach.numbers import all_numbers
    numbers = all_numbers()
    key = text.strip()
    if key not in numbers:
        msg = inliner.reporter.error(f"{{n}}: no number {key!r} in minipar.teach.numbers",
                                     line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    number = numbers[key]
    out = [nodes.inline(number.text(), number.text(), classes=["number"])]
    if number.evidence:
        out.append(_mark(number.evidence))
    return out, []


def evidence_role(name, rawtext, text, lineno, inliner, options=None, content=()):
    from minipar.teach.numbers import EVIDENCE
    if text.strip() not in EVIDENCE:
        msg = inliner.reporter.error(f"{{ev}}: {text!r} is not one of {sorted(EVIDENCE)}",
                                     line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    return [_mark(text.strip())], []


def _kwargs(text: str) -> dict:
    """`:kwargs:` as Python keyword arguments (literals, and range/list/dict/tuple)."""
    names = {"dict": dict, "list": list, "tuple": tuple, "range": range}
    return eval(f"dict({text})", {"__builtins__": {}}, names) if text else {}


class FigureFromCode(SphinxDirective):
    """Draw `minipar.teach.figures.<module>.<function>(**kwargs)` and show it as a figure."""
    required_arguments = 1
    has_content = True
    option_spec = {"kwargs": directives.unchanged, "name": directives.unchanged,
                   "width": directives.unchanged}

    def run(self):
        import importlib

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        target = self.arguments[0]
        module, _, func = target.rpartition(".")
        # "explorers.x.figure" and "widgets.f" name teach's modules; the rest are figures'
        package = "minipar.teach" if module.split(".")[0] in ("explorers", "widgets") \
            else "minipar.teach.figures"
        module = f"{package}.{module}"
        try:
            fn = getattr(importlib.import_module(module), func)
            kwargs = _kwargs(self.options.get("kwargs", ""))
        except Exception as e:   # noqa: BLE001 - any failure is the page's error
            raise self.error(f"mpfig {target}: {type(e).__name__}: {e}") from e
        digest = hashlib.sha1(f"{target}|{kwargs!r}".encode()).hexdigest()[:10]
        path = Path(self.env.srcdir) / GENERATED / f"{func}-{digest}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        plt.close("all")
        result = fn(**kwargs)
        fig = getattr(result, "figure", None) or (result if hasattr(result, "savefig") else plt.gcf())
        fig.savefig(path, dpi=130, bbox_inches="tight")
        plt.close("all")
        self.env.note_dependency(importlib.import_module(module).__file__)

        figure = nodes.figure(classes=["mpfig"])
        image = nodes.image(uri=f"/{GENERATED}/{path.name}", alt=f"{target}({self.options.get('kwargs', '')})")
        if "width" in self.options:
            image["width"] = self.options["width"]
        figure += image
        if self.content:
            holder = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, holder)
            first = holder.children[0] if holder.children else None
            if isinstance(first, nodes.paragraph):
                figure += nodes.caption(first.rawsource, "", *first.children)
                figure += holder.children[1:]
            else:
                figure += holder.children
        if "name" in self.options:
            figure["names"].append(self.options["name"])
            self.state.document.note_explicit_target(figure)
        return [figure]


def setup(app):
    app.add_role("n", number_role)
    app.add_role("ev", evidence_role)
    app.add_directive("mpfig", FigureFromCode)
    return {"parallel_read_safe": False, "version": "1"}
