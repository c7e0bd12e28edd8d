"""Sphinx extension: what a page of the book weighs (`make test-html` measures every page at
a phone's size and fails a chapter over 2.5 MB when opened).

A chapter page loaded 5.3-6.2 MB. What it no longer loads, and why each is safe to drop:

- `fontawesome.js` (1.49 MB), which pydata-sphinx-theme adds to every page "so that users can
  add custom icons" by turning each <i class="fa-..."> into an inline SVG. The book adds
  none, and the theme's stylesheet already draws its icons with Font Awesome's web font.
- Sphinx's search tools and the search index (0.18 MB) on every page but the search page:
  the theme loads them everywhere for its search-as-you-type, which is off here; its search
  box sends the reader to search.html, which loads them itself.
- sphinx-design's stylesheet and script on a page that uses none of its components, and
  sphinx-thebe's (thebe is off in _config.yml).
- Plotly (1.2 MB) and an explorer's frames and script until the reader is within a screen of
  the explorer: book/_static/minipar-explorer-loader.js loads them then, in order; the
  static picture of the explorer shows until they have drawn.
"""
from __future__ import annotations

import re
from pathlib import Path

LOADER = "minipar-explorer-loader.js"
EXPLORER_SCRIPTS = ("plotly/", "explorers/", "minipar-explorer.js")
DESIGN = ("sphinx-design", "design-tabs.js")
THEBE = "sphinx-thebe"
DESIGN_CLASS = re.compile(r'class="[^"]*\bsd-')

# Script tags the theme's templates write into every page (not in Sphinx's list of assets,
# so they are taken out of the written HTML).
FONTAWESOME_TAG = re.compile(r'[ \t]*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>\n?')
SEARCH_TAGS = re.compile(r'[ \t]*<script src="[^"]*(?:_static/searchtools\.js|_static/language_data\.js'
                         r'|searchindex\.js)"></script>\n?')


def _name(asset) -> str:
    """The asset's file under _static/ (Sphinx names the page's assets "_static/...")."""
    return (asset.filename or "").removeprefix("_static/")


def _unused(asset, body: str) -> bool:
    """An asset this page does not need: thebe's, or sphinx-design's on a page without it."""
    name = _name(asset)
    if THEBE in name or "THEBE_JS_URL" in (asset.attributes.get("body") or ""):
        return True
    return name.startswith(DESIGN) and not DESIGN_CLASS.search(body)


def slim_assets(app, pagename, templatename, context, doctree):
    """Drop what the page does not use; load the explorers' scripts when they are near."""
    body = context.get("body", "")
    for key in ("css_files", "script_files"):
        assets = context.get(key)
        if assets is not None:
            assets[:] = [a for a in assets if not _unused(a, body)]   # in place, see clean_html
    scripts = context.get("script_files")
    if not scripts:
        return
    later = [s for s in scripts if _name(s).startswith(EXPLORER_SCRIPTS)]
    if not later:
        return
    scripts[:] = [s for s in scripts if s not in later]
    urls = " ".join(context["pathto"](f"_static/{_name(s)}", 1) for s in later)
    app.add_js_file(LOADER, defer="defer", **{"data-scripts": urls})


def slim_html(html: str, pagename: str) -> str:
    """A written page without the theme's fontawesome.js, and without the search tools
    unless it is the search page."""
    html = FONTAWESOME_TAG.sub("", html)
    return html if pagename == "search" else SEARCH_TAGS.sub("", html)


def slim_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for path in out.rglob("*.html"):
        if path.relative_to(out).parts[0].startswith("_"):    # _static, _sources: not pages
            continue
        text = path.read_text(encoding="utf-8")
        slim = slim_html(text, path.relative_to(out).with_suffix("").as_posix())
        if slim != text:
            path.write_text(slim, encoding="utf-8")


def setup(app):
    # After the explorers (explorer_html.py) and the theme have added their files, and after
    # clean_html.py (900) has removed duplicates.
    app.connect("html-page-context", slim_assets, priority=950)
    app.connect("build-finished", slim_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
