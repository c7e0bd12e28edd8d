"""Sphinx extension: the book's numbers and pictures come from the package, never by hand.

- ``{n}`chapter.key` `` writes a number of `minipar.teach.numbers` (and, for a fact about
  Llama 3, a mark saying whether the paper reports it, the book derives it, or it is an
  assumption; its tooltip names the source: the paper's table or section, or how the book
  derived it). ``{ev}`paper` `` marks a statement that is not a number the same way
  (``{ev}`paper: Section 3.3.4` `` names the source). An unknown key is a build error:
  `make book` runs with warnings as errors.
- ``{mpfig}`` draws a figure with a function of `minipar.teach.figures` when the page is
  read, so the picture on a chapter's page is the one the tests' functions produce (an
  explorer's static figure is named from teach: `explorers.memory.figure`). The figure is
  drawn for the page's column (`minipar.teach.style.PAGE_WIDTH`; tests/test_book.py checks
  the size of its text as shown), and its alt text is the caption's first sentence (or
  `:alt:`), in words. It is an SVG, text kept as text: sharp on a 2x screen and at any
  zoom, and its font sizes are there for book/_ext/reading.py (how wide it must stay to be
  read on a phone) and `make test-html` (its smallest text as shown) to read:

      ```{mpfig} collectives.plot_ring_steps
      :kwargs: n=4
      The caption, in MyST.
      ```
"""
from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from reading import first_sentence     # book/_ext/reading.py: the alt text of a figure

logger = logging.getLogger(__name__)
GENERATED = "book/_generated"      # under the source dir (git-ignored): Sphinx copies from here


PAPER = "the Llama 3 paper (Dubey et al. 2024)"


def _mark(evidence: str, source: str = "") -> nodes.Node:
    """A P, D, A or M after a fact; its tooltip says what the letter means and the source."""
    from minipar.teach.numbers import EVIDENCE
    letter = {"paper": "P", "deepseek": "P", "derived": "D", "assumption": "A",
              "measured": "M"}[evidence]
    meaning = EVIDENCE[evidence]
    if evidence in ("paper", "derived"):        # name the paper where the meaning cites it
        meaning = re.sub(r"the (Llama 3 )?paper", PAPER, meaning, count=1)
    tip = f"{letter}: {meaning}" + (f"; source: {source}" if source else "")
    kind = "paper" if evidence == "deepseek" else evidence    # a report's fact: a P as well
    mark = nodes.superscript(classes=["evidence", f"evidence-{kind}"])
    mark += nodes.abbreviation(letter, letter, explanation=tip)
    return mark


def number_role(name, rawtext, text, lineno, inliner, options=None, content=()):
    from minipar.teach.numbers import CHAPTERS, all_numbers
    numbers = all_numbers()
    key = text.strip()
    # The page is read again when the chapter's numbers module changes (a key added or a
    # value moved), not only when the page itself does.
    module = CHAPTERS.get(key.partition(".")[0])
    if module is not None:
        inliner.document.settings.env.note_dependency(module.__file__)
    if key not in numbers:
        msg = inliner.reporter.error(f"{{n}}: no number {key!r} in minipar.teach.numbers",
                                     line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    number = numbers[key]
    out = nodes.inline(number.text(), number.text(), classes=["number"])
    if not number.evidence:
        return [out], []
    fact = nodes.inline(classes=["fact"])    # the number and its mark on one line
    fact += [out, _mark(number.evidence, number.source)]
    return [fact], []


def evidence_role(name, rawtext, text, lineno, inliner, options=None, content=()):
    """{ev}`paper`, or with its source: {ev}`paper: Table 5`."""
    from minipar.teach.numbers import EVIDENCE
    evidence, _, source = (part.strip() for part in text.partition(":"))
    if evidence not in EVIDENCE:
        msg = inliner.reporter.error(f"{{ev}}: {text!r} is not one of {sorted(EVIDENCE)}",
                                     line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    return [_mark(evidence, source)], []


def _kwargs(text: str) -> dict:
    """`:kwargs:` as Python keyword arguments (literals, and range/list/dict/tuple)."""
    names = {"dict": dict, "list": list, "tuple": tuple, "range": range}
    return eval(f"dict({text})", {"__builtins__": {}}, names) if text else {}


# Pixels per inch of a drawn figure: one PAGE_WIDTH (7 in) wide is 910 px, shown in the
# 672 px column at 1.35x less, so 7 pt text reads at 9 px; a click opens it full size.
# The SVG's own size says so (`width="910px"`), so it lays out as the PNG it replaced did.
DPI = 130
SVG_SIZE = re.compile(r'(<svg\b[^>]*?\b)width="([\d.]+)pt" height="([\d.]+)pt"')


# A figure of thousands of shapes (a replayed timeline) would be an SVG of megabytes: its
# shapes and lines are drawn as one picture inside it instead, at twice DPI (sharp on a 2x
# screen), its text and legends still text.
MAX_SVG_BYTES = 400_000
RASTER_BELOW_ZORDER = 2.5         # patches (1) and lines (2); text (3) and legends (5) stay


def _svg(fig, dpi: float) -> str:
    """`fig` as SVG text, text kept as text, no date and fixed ids (the same figure gives the
    same file); `dpi` is the resolution of the parts drawn as a picture, if any."""
    import matplotlib
    from minipar.teach.style import SVG_RC
    out = io.StringIO()
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None}, dpi=dpi)
    return out.getvalue()


def save_svg(fig, path: Path) -> None:
    """`fig` as an SVG of DPI pixels per inch. Text stays text (the reader's sans-serif if
    DejaVu Sans is missing): a quarter of the bytes of glyphs drawn as paths, selectable, and
    its sizes readable by book/_ext/reading.py and `make test-html`."""
    svg = _svg(fig, DPI)
    if len(svg) > MAX_SVG_BYTES:
        for ax in fig.axes:
            ax.set_rasterization_zorder(RASTER_BELOW_ZORDER)
        svg = _svg(fig, 2 * DPI)
    px = DPI / 72
    path.write_text(SVG_SIZE.sub(
        lambda m: f'{m[1]}width="{float(m[2]) * px:.1f}px" height="{float(m[3]) * px:.1f}px"',
        svg, count=1))


def _function(target: str):
    """The module and the function "<module>.<function>" names: a module of
    `minipar.teach.figures`, or of `minipar.teach` for "explorers.x" and "widgets"."""
    import importlib
    module, _, func = target.rpartition(".")
    package = "minipar.teach" if module.split(".")[0] in ("explorers", "widgets") \
        else "minipar.teach.figures"
    module = importlib.import_module(f"{package}.{module}")
    return module, getattr(module, func)


def draw(target: str, kwargs: dict):
    """The figure the function `target` names returns (or draws) for `kwargs`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fn = _function(target)[1]
    plt.close("all")
    result = fn(**kwargs)
    return getattr(result, "figure", None) or (result if hasattr(result, "savefig") else plt.gcf())


class FigureFromCode(SphinxDirective):
    """Draw `minipar.teach.figures.<module>.<function>(**kwargs)` and show it as a figure."""
    required_arguments = 1
    has_content = True
    option_spec = {"kwargs": directives.unchanged, "name": directives.unchanged,
                   "alt": directives.unchanged}

    def target(self) -> str:
        """The "<module>.<function>" that draws the figure (book/_ext/explorer_html.py
        names it from a chapter)."""
        return self.arguments[0]

    def run(self):
        import matplotlib.pyplot as plt

        target = self.target()
        try:
            kwargs = _kwargs(self.options.get("kwargs", ""))
            fig = draw(target, kwargs)
        except Exception as e:   # noqa: BLE001 - any failure is the page's error
            raise self.error(f"mpfig {target}: {type(e).__name__}: {e}") from e
        digest = hashlib.sha1(f"{target}|{kwargs!r}".encode()).hexdigest()[:10]
        path = Path(self.env.srcdir) / GENERATED / f"{target.rpartition('.')[2]}-{digest}.svg"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_svg(fig, path)
        plt.close("all")
        self.env.note_dependency(_function(target)[0].__file__)

        figure = nodes.figure(classes=["mpfig"])
        image = nodes.image(uri=f"/{GENERATED}/{path.name}", alt=self.options.get("alt", ""))
        figure += image
        if self.content:
            holder = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, holder)
            first = holder.children[0] if holder.children else None
            if isinstance(first, nodes.paragraph):
                figure += nodes.caption(first.rawsource, "", *first.children)
                figure += holder.children[1:]
                image["alt"] = image["alt"] or first_sentence(first)
            else:
                figure += holder.children
        if not image["alt"]:
            raise self.error(f"mpfig {target}: no caption and no :alt: to describe it in words")
        if "name" in self.options:
            figure["names"].append(self.options["name"])
            self.state.document.note_explicit_target(figure)
        return [figure]


def setup(app):
    app.add_role("n", number_role)
    app.add_role("ev", evidence_role)
    app.add_directive("mpfig", FigureFromCode)
    return {"parallel_read_safe": False, "version": "1"}
