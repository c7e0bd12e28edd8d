"""Sphinx extension: a chapter's explorer that works in the HTML book, offline.

    ```{explorer} pipeline_parallel
    :kwargs: schedule="interleaved", p=4, m=8
    The caption, in MyST.
    ```

draws the chapter's static figure as `{mpfig} explorers.<chapter>.figure` does (`:kwargs:`
choose the setting shown first; `:name:` and the caption work the same) and adds, above
it, the controls and a plot that book/_static/minipar-explorer.js draws with Plotly. The
static picture stays as the fallback until the script has drawn.

The frames are `minipar.teach.web.payload(chapter)`: the chapter's figure, read back as
data, for every setting its page offers. Computing them takes seconds per chapter, so they
are kept in book/_generated/explorers/, keyed by a hash of the package's files (any change
to minipar/ computes them again). Each page with an explorer gets
_static/explorers/<chapter>.js, a script that gives window.miniparFrames the controls and
the first frame, and one small script per other frame, _static/explorers/<chapter>/<hash>.js,
that the page loads when a control asks for it (a page offers up to hundreds of settings: it
loads only those the reader visits). Scripts, not JSON files fetched, so a page opened from
file:// works too.
"""
from __future__ import annotations

import hashlib
import html
import json
from pathlib import Path

from docutils import nodes

from minipar_book import GENERATED, FigureFromCode, _kwargs   # book/_ext/minipar_book.py

PLOTLY = "plotly/plotly-basic.min.js"       # vendored by `make vendor-plotly`
SCRIPT = "minipar-explorer.js"


def package_files() -> list[Path]:
    """Every file of the minipar package (its code and its data), in a fixed order."""
    import minipar
    root = Path(minipar.__file__).parent
    return [p for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def package_digest() -> str:
    """A hash of every file of the minipar package: the frames' cache key."""
    digest = hashlib.sha1()
    for path in package_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def cached_payload(srcdir: str, chapter: str, start: dict) -> Path:
    """The file holding `web.payload(chapter, start)`, computed when the package changed."""
    key = hashlib.sha1(f"{package_digest()}|{chapter}|{start!r}".encode()).hexdigest()[:12]
    folder = Path(srcdir) / GENERATED / "explorers"
    path = folder / f"{chapter}-{key}.json"
    if not path.exists():
        from minipar.teach import web
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"{chapter}-*.json"):      # an older package's frames
            old.unlink()
        path.write_text(json.dumps(web.payload(chapter, start), separators=(",", ":")))
    return path


class Explorer(FigureFromCode):
    """```{explorer} <chapter>```: the static figure of the chapter's explorer, with the
    controls and the plot that the page's script draws from the precomputed frames."""

    def target(self) -> str:
        return f"explorers.{self.arguments[0]}.figure"

    def run(self):
        chapter = self.arguments[0]
        try:
            cache = cached_payload(self.env.srcdir, chapter,
                                   _kwargs(self.options.get("kwargs", "")))
        except Exception as e:   # noqa: BLE001 - any failure is the page's error
            raise self.error(f"explorer {chapter}: {type(e).__name__}: {e}") from e
        [figure] = super().run()
        for path in package_files():         # any change to the package reads the page again
            self.env.note_dependency(str(path))
        figure["classes"].append("minipar-explorer-figure")
        for image in figure.findall(nodes.image):
            image["classes"].append("minipar-explorer-fallback")
        figure.insert(0, nodes.raw("", _controls_html(chapter), format="html"))
        pages = self.env.__dict__.setdefault("minipar_explorers", {})
        pages.setdefault(self.env.docname, {})[chapter] = str(cache)
        return [figure]


def _controls_html(chapter: str) -> str:
    """Where the script puts the controls and the plot; it says how the frames were made."""
    name = html.escape(chapter)
    return (f'<div class="minipar-explorer" data-chapter="{name}">'
            '<div class="minipar-explorer-controls"></div>'
            '<div class="minipar-explorer-plot"></div>'
            '<p class="minipar-explorer-note">Move the controls: each picture was drawn by '
            f'<code>minipar.teach.explorers.{name}.figure</code> when the book was built.</p>'
            '</div>')


def add_scripts(app, pagename, templatename, context, doctree):
    """On a page with an explorer: Plotly, the controls and first frame of its chapters, and
    the script that draws them (deferred, so they run in this order once the page is parsed)."""
    chapters = app.env.__dict__.get("minipar_explorers", {}).get(pagename)
    if not chapters:
        return
    folder = Path(app.outdir) / "_static" / "explorers"
    folder.mkdir(parents=True, exist_ok=True)
    app.add_js_file(PLOTLY, defer="defer")
    for chapter, cache in sorted(chapters.items()):
        write_frames(folder, chapter, json.loads(Path(cache).read_text()))
        app.add_js_file(f"explorers/{chapter}.js", defer="defer")
    app.add_js_file(SCRIPT, defer="defer")


def write_frames(folder: Path, chapter: str, payload: dict) -> None:
    """<chapter>.js: the controls, the values every frame shares (`base`), the file of each
    setting's frame and the first frame itself; <chapter>/<hash>.js: one frame each (equal
    frames, such as a control that does not change the picture, share a file)."""
    (folder / chapter).mkdir(exist_ok=True)
    files = {}
    for key, frame in payload["frames"].items():
        text = json.dumps(frame, separators=(",", ":"))
        name = hashlib.sha1(text.encode()).hexdigest()[:12]
        files[key] = name
        path = folder / chapter / f"{name}.js"
        if not path.exists():
            path.write_text(f"window.miniparFrame({json.dumps(chapter)}, {json.dumps(name)}, {text});\n")
    first = payload["first"]
    page = {"chapter": chapter, "first": first, "base": payload["base"],
            "controls": payload["controls"], "files": files,
            "frames": {files[first]: payload["frames"][first]}}
    (folder / f"{chapter}.js").write_text(
        "window.miniparFrames = window.miniparFrames || {};\n"
        f"window.miniparFrames[{json.dumps(chapter)}] = {json.dumps(page, separators=(',', ':'))};\n"
        f"window.miniparFrames[{json.dumps(chapter)}].folder = "
        "document.currentScript.src.replace(/\\.js(\\?.*)?$/, '/');\n")


def forget(app, env, docname):
    """A page read again registers its explorers again."""
    env.__dict__.get("minipar_explorers", {}).pop(docname, None)


def setup(app):
    app.setup_extension("minipar_book")
    app.add_directive("explorer", Explorer)
    app.connect("env-purge-doc", forget)
    app.connect("html-page-context", add_scripts)
    return {"parallel_read_safe": False, "version": "1"}
