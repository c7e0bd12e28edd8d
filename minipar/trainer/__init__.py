"""The trainer, in torch: collectives (`comm`), the process grid, the single-device
reference model, one file per parallel axis in the chapters' order (`parallel/`), the one
function that applies them (`parallelize`), and one training step (`step`).

The second of the package's four layers (every chapter): it reads `plan/` and never the
runtime or the book's helpers: plan <- trainer <- runtime <- teach.
"""
