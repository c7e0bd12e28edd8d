"""One explorer per chapter: sliders over the chapter's own functions.

Each module `explorers/<chapter>.py` has two functions, in the one style of
`teach/widgets.live_panel`:
- `figure(**values)`: a pure drawing function that returns a matplotlib Figure. The
  chapter's page shows it with its default values (``{mpfig} explorers.<chapter>.figure``),
  because a static page has no kernel;
- `explore(**defaults)`: the live explorer of the notebook; it redraws `figure` whenever a
  control moves (ipywidgets is imported only there).
"""
