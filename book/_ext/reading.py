"""Sphinx extension: what a reader of the HTML sees, past what the theme does
(`make test-html` checks the result at 1280 px).

- A long line of code or output wraps under its own indentation instead of scrolling
  sideways: each line of a highlighted block becomes a `<span class="line">` whose
  hanging indent (`--indent`) is the line's own leading spaces; book/_static/minipar.css
  wraps it. Copying a block still gives its text exactly.
- Every picture on a page opens full size: an image not already in a link gets one to its
  file, which book/_static/minipar-zoom.js shows larger than the page does. Pictures load
  as the reader reaches them (`loading="lazy"`).
- On a phone a figure keeps the width at which its smallest text reads at 9 px: each SVG
  figure gets that min-width, from the font sizes in its own file; a narrower screen
  scrolls it sideways inside its box (book/_static/minipar.css).
- A long name in inline code (`formulas.tensor_parallel.collective_matmul_bytes`) may break
  after a dot, an underscore or a slash (a `<wbr>`), so that it never widens a phone's page;
  what a reader copies is unchanged.
- The theme pair's sidebar buttons work (book/_static/minipar-sidebars.js).
- Every picture has alt text in words. A `{mpfig}` figure's is its caption's first
  sentence (book/_ext/minipar_book.py); a glued one's, the italic caption under it; a
  notebook's output, the section it belongs to.
- Headings the notebooks number by hand ("### 1. Count the parameters", which a reader of
  the notebook in JupyterLab wants) lose that number in the book, which numbers every
  section itself ("1.10.7.1. Count the parameters", not "1.10.7.1. 1. Count ...").
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

BLOCK = re.compile(r'(<div class="highlight"><pre>)(.*?)(</pre></div>)', re.S)
IMAGE = re.compile(r'(<a\b[^>]*>\s*)?(<img\b[^>]*?\bsrc="([^"]+)"[^>]*>)')
INLINE_CODE = re.compile(r'(<span class="pre">)([^<]+)(</span>)')
HAND_NUMBER = re.compile(r"^\d+\.\s+")

# The smallest text a figure may show, in CSS px, on any screen (`make test-html` checks it).
MIN_TEXT_PX = 9
SVG_WIDTH = re.compile(r'<svg\b[^>]*?\bwidth="([\d.]+)(px|pt)"')   # a notebook's SVG: pt
CSS_PX = {"px": 1.0, "pt": 4 / 3}
SVG_VIEWBOX = re.compile(r'<svg\b[^>]*?\bviewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"')
FONT_SIZE = re.compile(r'font(?:-size)?:[^;"]*?([\d.]+)px')


def first_sentence(paragraph: nodes.Node) -> str:
    """A paragraph's first sentence as plain words (evidence marks left out, TeX's spacing
    commands gone): up to the first full stop outside parentheses."""
    words = paragraph.deepcopy()
    for mark in list(words.findall(nodes.superscript)):
        if "evidence" in mark["classes"]:
            mark.parent.remove(mark)
    text = " ".join(re.sub(r"\\[,;:! ]", " ", words.astext()).split())
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i]
    return text


def _caption_after(image: nodes.image) -> str:
    """The first sentence of an italic paragraph right after the image's block, if any."""
    after = image.next_node(descend=False, siblings=True, ascend=True)
    if isinstance(after, nodes.paragraph) and after.children \
            and isinstance(after.children[0], nodes.emphasis):
        return first_sentence(after)
    return ""


def describe_images(app, doctree, docname):
    """Alt text in words for an image that has none (or only its file name)."""
    for image in doctree.findall(nodes.image):
        if image.get("alt") and image["alt"] != image["uri"]:
            continue
        section = image.parent
        while section is not None and not isinstance(section, nodes.section):
            section = section.parent
        title = section[0].astext() if section is not None else docname
        image["alt"] = (_caption_after(image)
                        or f"A figure of “{title}”, drawn by the code above it")


def _line(line: str) -> str:
    """One line of a highlighted block (Pygments closes its spans at each line's end)."""
    text = html.unescape(re.sub(r"<[^>]+>", "", line))
    indent = len(text) - len(text.lstrip(" "))
    return f'<span class="line" style="--indent:{indent}ch">{line}</span>'


def _lines(match: re.Match) -> str:
    head, body, tail = match.groups()
    lines = body.split("\n")
    end = "\n" if lines[-1] == "" else ""               # the block's final newline
    if end:
        lines.pop()
    return head + "\n".join(_line(line) for line in lines) + end + tail


def legible_width(svg: str) -> float | None:
    """The width, in CSS px, at which an SVG (as minipar_book.save_svg writes it: its size
    in px, text as text) shows its smallest text at MIN_TEXT_PX; at most its own width.
    None for an SVG without both."""
    width, box = SVG_WIDTH.search(svg), SVG_VIEWBOX.search(svg)
    sizes = [float(size) for size in FONT_SIZE.findall(svg)]
    if not (width and box and sizes):
        return None
    return min(float(width[1]) * CSS_PX[width[2]], MIN_TEXT_PX * float(box[1]) / min(sizes))


def _breakable(match: re.Match) -> str:
    """Inline code that may break after a dot, an underscore or a slash."""
    head, text, tail = match.groups()
    return head + re.sub(r"([./_])(?=[^./_])", r"\1<wbr>", text) + tail


def _picture(match: re.Match, widths: dict) -> str:
    """An <img> that loads when reached, keeps its legible width and opens full size."""
    link, image, src = match.groups()
    extra = ' loading="lazy"'
    if (width := widths.get(src.rpartition("/")[2])) is not None:
        extra += f' style="min-width: {math.ceil(width)}px"'
    image = image.replace("<img ", f"<img{extra} ", 1)
    if link:
        return link + image
    return f'<a class="reference internal image-reference" href="{src}">{image}</a>'


def figure_widths(app) -> dict:
    """{file name in _images: legible width} for the SVG pictures of the build (read once
    per build: a figure drawn again keeps its file's name)."""
    widths = app.builder.__dict__.setdefault("minipar_legible_widths", {})
    for source, name in app.builder.images.items():
        if name.endswith(".svg") and name not in widths:
            widths[name] = legible_width((Path(app.srcdir) / source).read_text())
    return widths


def rewrite_body(app, pagename, templatename, context, doctree):
    if "body" in context:
        widths = figure_widths(app)
        body = INLINE_CODE.sub(_breakable, BLOCK.sub(_lines, context["body"]))
        context["body"] = IMAGE.sub(lambda m: _picture(m, widths), body)


class DropHandNumbers(SphinxTransform):
    """"1. Count the parameters" -> "Count the parameters" in a section's title."""
    default_priority = 500

    def apply(self, **kwargs):
        for title in self.document.findall(nodes.title):
            first = title.children[0] if title.children else None
            if isinstance(title.parent, nodes.section) and isinstance(first, nodes.Text) \
                    and HAND_NUMBER.match(first):
                title.replace(first, nodes.Text(HAND_NUMBER.sub("", str(first))))


def setup(app):
    app.add_transform(DropHandNumbers)
    app.connect("doctree-resolved", describe_images)
    app.connect("html-page-context", rewrite_body)
    app.add_css_file("minipar.css")
    app.add_js_file("minipar-sidebars.js", defer="defer")
    app.add_js_file("minipar-zoom.js", defer="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
