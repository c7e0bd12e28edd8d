"""Sphinx extension: what a reader of the HTML sees, past what the theme does
(`make test-html` checks the result at 1280 px).

- A long line of code or output wraps under its own indentation instead of scrolling
  sideways: each line of a highlighted block becomes a `<span class="line">` whose
  hanging indent (`--indent`) is the line's own leading spaces; book/_static/minipar.css
  wraps it. Copying a block still gives its text exactly.
- Every picture on a page opens full size: an image not already in a link gets one to its
  file (the figures are drawn for the column, so the full size is a little larger).
- Every picture has alt text in words. A `{mpfig}` figure's is its caption's first
  sentence (book/_ext/minipar_book.py); a glued one's, the italic caption under it; a
  notebook's output, the section it belongs to.
- Headings the notebooks number by hand ("### 1. Count the parameters", which a reader of
  the notebook in JupyterLab wants) lose that number in the book, which numbers every
  section itself ("1.10.7.1. Count the parameters", not "1.10.7.1. 1. Count ...").
"""
from __future__ import annotations

import html
import re

from docutils import nodes
from sphinx.transforms import SphinxTransform

BLOCK = re.compile(r'(<div class="highlight"><pre>)(.*?)(</pre></div>)', re.S)
IMAGE = re.compile(r'(<a\b[^>]*>\s*)?(<img\b[^>]*?\bsrc="([^"]+)"[^>]*>)')
HAND_NUMBER = re.compile(r"^\d+\.\s+")


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


def _linked(match: re.Match) -> str:
    link, image, src = match.groups()
    if link:
        return match.group(0)
    return f'<a class="reference internal image-reference" href="{src}">{image}</a>'


def rewrite_body(app, pagename, templatename, context, doctree):
    if "body" in context:
        context["body"] = IMAGE.sub(_linked, BLOCK.sub(_lines, context["body"]))


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
