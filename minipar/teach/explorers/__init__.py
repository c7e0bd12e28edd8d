"""One explorer per chapter: sliders over the chapter's own functions.

Each module `explorers/<chapter>.py` has two functions and its controls, in the one shape
of `teach/widgets.explorer`:
- `figure(**values)`: a pure drawing function that returns a matplotlib Figure. The
  chapter's page (``{explorer} <chapter>``, book/_ext/explorer_html.py) shows it drawn
  ahead of time for the settings `WEB` lists, because a static page has no kernel: the
  build reads each picture back as data (`teach.web`) and the browser draws it again with
  Plotly as its controls move; the default's picture is the fallback without JavaScript;
- `WEB` and `ALONE`: the settings the HTML page offers, control name -> its values (every
  combination of `WEB`'s; each `ALONE` control moved one at a time from `DEFAULTS`, with
  every `WEB` combination): together every control of `CONTROLS`, over its whole range;
- `CONTROLS`: what the reader moves, declared as data (`widgets.choice`, `powers`, ...;
  the memory and MFU explorers use `widgets`' own, "will it fit" and the what-if);
- `explore(**defaults)`: the live explorer of the notebook; it redraws `figure` whenever a
  control moves (ipywidgets is imported only there).
"""
