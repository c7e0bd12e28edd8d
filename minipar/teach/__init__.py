"""The book's helpers, apart from the trainer: what the notebooks draw and check.

In the order they read each other (tests/test_teach_layers.py holds them to it):
- `style`: the one colour table every figure draws with;
- `numbers/`: every number the book states, computed once, with its evidence (and the few
  small models a figure and a check share, such as a commit crashed at every moment);
- `figures/`: one module per chapter, in the book's order, holding that chapter's
  plotting functions (`from minipar.teach import figures as viz` gives all of them);
- `widgets`: the one shape of every explorer, and the what-if and "will it fit" panels
  over the cost model;
- `explorers/`: one per chapter, sliders over the chapter's own figure;
- `exercises/`: the `check_*` functions that end each chapter's notebook; they read
  `numbers` only, never a figure.

teach/ reads the whole package (configs, formulas, the cost model, the schedules); nothing
in the trainer imports teach, so `python -m minipar.train` never loads matplotlib.
"""
