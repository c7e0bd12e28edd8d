"""The book's HTML extensions (book/_ext) on real inputs: a figure drawn by the book's own
code, the pages of the build (`make test-html` runs this after `make book`).

- reading.legible_width reads from an SVG the width at which its smallest text is 9 px:
  the same number the figure's matplotlib Text objects give.
- page_weight.slim_html takes the theme's fontawesome.js out of every written page and the
  search tools out of every page but the search page; every built page is so.
- search_offline.article_text keeps what Sphinx's snippet reads: the text of the article,
  with its sections' ids, without the "#" links.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build" / "html"
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import minipar_book    # noqa: E402  (book/_ext is not a package)
import page_weight     # noqa: E402
import reading         # noqa: E402
import search_offline  # noqa: E402


def test_legible_width_is_the_figures_smallest_text_at_9_px(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    fig = minipar_book.draw("collectives.plot_collectives", {})
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    smallest_px = min(t.get_fontsize() for t in texts) * minipar_book.DPI / 72
    path = tmp_path / "figure.svg"
    minipar_book.save_svg(fig, path)
    plt.close("all")
    svg = path.read_text()
    width = float(reading.SVG_WIDTH.search(svg)[1])
    expected = min(width, width * reading.MIN_TEXT_PX / smallest_px)
    assert reading.legible_width(svg) == pytest.approx(expected, rel=1e-3)
    assert reading.legible_width("<svg></svg>") is None


def test_a_notebooks_svg_in_points_is_read_in_css_px():
    """The inline backend's SVG says its size in pt (1 pt = 4/3 CSS px): 10 px text in a
    300-unit box, 300 pt wide (400 px) is legible from 270 px."""
    svg = ('<svg width="300pt" height="100pt" viewBox="0 0 300 100">'
           '<text style="font: 10px \'DejaVu Sans\'">a</text></svg>')
    assert reading.legible_width(svg) == pytest.approx(270)
    assert reading.legible_width(svg.replace("10px", "1px")) == pytest.approx(400)   # at most its own


def test_inline_code_breaks_after_dots_and_copies_the_same():
    code = '<span class="pre">formulas.tensor_parallel.collective_matmul_bytes</span>'
    broken = reading.INLINE_CODE.sub(reading._breakable, code)
    assert broken.count("<wbr>") == 5
    assert broken.replace("<wbr>", "") == code


PAGE = ('<head><script defer src="../_static/scripts/fontawesome.js?digest=1"></script>\n'
        '<script src="../_static/searchtools.js"></script>\n'
        '<script src="../searchindex.js"></script>\n</head>'
        '<body><nav>menu</nav><article class="bd-article"><section id="s1"><h1>Title'
        '<a class="headerlink" href="#s1">#</a></h1><p>Some <em>text</em>.</p>'
        '<script>var x = 1;</script><img src="a.png"></section></article></body>')


def test_slim_html_drops_fontawesome_everywhere_and_search_outside_search():
    page = page_weight.slim_html(PAGE, "book/memory")
    assert "fontawesome" not in page and "searchtools" not in page and "searchindex" not in page
    search = page_weight.slim_html(PAGE, "search")
    assert "fontawesome" not in search and "searchtools" in search and "searchindex" in search


def test_article_text_keeps_the_sections_ids_and_drops_links_and_scripts():
    text = search_offline.article_text(PAGE)
    assert text == '<div role="main"><div id="s1">TitleSome text.</div></div>'


def built_pages() -> list[Path]:
    return sorted(p for p in BUILD.rglob("*.html") if not p.relative_to(BUILD).parts[0].startswith("_"))


@pytest.mark.skipif(not (BUILD / "search.html").exists(), reason="no _build/html: run make book")
def test_every_built_page_is_slim():
    for path in built_pages():
        page = path.read_text(encoding="utf-8")
        assert "fontawesome.js" not in page, path
        assert ("searchindex.js" in page) == (path.name == "search.html"), path
