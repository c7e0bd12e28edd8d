"""One explorer per chapter: sliders over the chapter's own functions.

Each module `explorers/<chapter>.py` has two functions and its controls, in the one shape
of `teach/widgets.explorer`:
- `figure(**values)`: a pure drawing function that returns a matplotlib Figure. The
  chapter's page shows it with its default values (``{mpfig} explorers.<chapter>.figure``),
  because a static page has no kernel;
- `CONTROLS`: what the reader moves, declared as data (`widgets.choice`, `powers`, ...;
  the memory and MFU explorers use `widgets`' own, "will it fit" and the what-if);
- `explore(**defaults)`: the live explorer of the notebook; it redraws `figure` whenever a
  control moves (ipywidgets is imported only there).
"""
