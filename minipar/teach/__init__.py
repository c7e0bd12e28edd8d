"""The book's helpers, apart from the trainer: what the notebooks draw and check.

- `figures/`: one module per chapter, in the book's order, holding that chapter's
  plotting functions (`from minipar.teach import figures as viz` gives all of them);
- `widgets`: the what-if explorer of the MFU chapter (sliders over the cost model);
- `exercises`: the `check_*` functions that end each chapter's notebook;
- `style`: the one colour table every figure draws with.

teach/ reads the whole package (configs, formulas, the cost model, the schedules); nothing
in the trainer imports teach, so `python -m minipar.train` never loads matplotlib.
"""
