"""Sphinx extension: the search page shows a snippet of each page it finds, also when the
book is opened from file:// (`make test-html` checks it there).

Sphinx's search page fetches each page it lists to cut a snippet from its text; a browser
refuses fetch() from file://, so offline the results had titles only. Here the build writes
_static/minipar-search-pages.js, each page's text (its article, with the ids of the
sections in it, which is all Sphinx's snippet reads), and book/_static/minipar-search.js
answers the search page's fetch of a page from it. That script also ranks the glossary,
which names every term once and so matched nearly every query first, below the chapters
that teach the term.
"""
from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path

PAGES = "minipar-search-pages.js"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
SKIPPED = {"script", "style"}


class ArticleText(HTMLParser):
    """The text of a page's <article>, each element with an id kept (as a <div>) around its
    text, without the theme's "#" links, scripts and styles (as Sphinx's snippet has it)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.open, self.depth, self.skip = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        attrs = dict(attrs)
        if tag == "article":
            self.depth += 1
        skip = self.skip or tag in SKIPPED or "headerlink" in (attrs.get("class") or "").split()
        kept = bool(self.depth and not skip and attrs.get("id"))
        if kept:
            self.out.append(f'<div id="{html.escape(attrs["id"])}">')
        self.open.append((tag, kept, skip and not self.skip))
        self.skip += skip and not self.skip

    def handle_endtag(self, tag):
        if tag in VOID or not self.open:
            return
        while self.open:                   # close what was left open inside it too
            name, kept, skipping = self.open.pop()
            self.out.append("</div>" if kept else "")
            self.skip -= skipping
            self.depth -= name == "article"
            if name == tag:
                break

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.out.append(html.escape(data))


def article_text(page: str) -> str:
    """A page's article as Sphinx's snippet reads it: `[role="main"]`, with its ids."""
    parser = ArticleText()
    parser.feed(page)
    text = " ".join("".join(parser.out).split())
    return f'<div role="main">{text}</div>'


def write_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    pages = {}
    for name in sorted(app.env.found_docs):
        path = out / f"{name}.html"
        if path.exists():
            pages[name] = article_text(path.read_text(encoding="utf-8"))
    (out / "_static" / PAGES).write_text(
        f"window.miniparSearchPages = {json.dumps(pages, separators=(',', ':'))};\n",
        encoding="utf-8")


def search_scripts(app, pagename, templatename, context, doctree):
    """On the search page, before Sphinx's searchtools.js: the pages and the script."""
    if pagename == "search":
        app.add_js_file(PAGES)
        app.add_js_file("minipar-search.js")


def setup(app):
    app.connect("html-page-context", search_scripts)
    app.connect("build-finished", write_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
