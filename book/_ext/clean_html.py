"""Sphinx extension: every page of the book loads its assets from the build, each once
(`make test-html` checks the result in a browser).

Two things a reader of the HTML would otherwise hit:

- sphinx-thebe and sphinx-togglebutton add their inline scripts both before and after the
  builder exists (Sphinx 7.4 files one copy with filename None, the other with ''), so each
  page declares `const THEBE_JS_URL` twice and throws on load. Duplicates are dropped here.
- An offline book cannot load a script or a stylesheet from a CDN. Any page that would is a
  build warning, so `make book` (warnings as errors) fails instead of shipping it.
"""
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _identity(asset):
    """What makes two <script>/<link> tags the same tag."""
    return (asset.filename or "", asset.priority, tuple(sorted(asset.attributes.items())))


def dedupe_and_check_assets(app, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        assets = context.get(key)
        if assets is None:
            continue
        seen, unique = set(), []
        for asset in assets:
            if _identity(asset) not in seen:
                seen.add(_identity(asset))
                unique.append(asset)
        assets[:] = unique  # in place: Sphinx restores the shared list after each page
        for asset in unique:
            if "://" in (asset.filename or ""):
                logger.warning("%s loads %s from the network; an offline book serves it "
                               "from _static", pagename, asset.filename)


def setup(app):
    # Late, after the theme and the extensions have added their files to the page.
    app.connect("html-page-context", dedupe_and_check_assets, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
