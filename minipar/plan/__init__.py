"""Planning, without torch: the run's configuration, FLOPs, the book's formulas (one file
per chapter), pipeline schedules as data and their simulator, traces, the cost model and
the replay. Everything here is a pure function of numbers, tested and drawn without a
process; nothing here imports torch (tests/test_layers.py imports it with torch blocked).

The first of the package's four layers (every chapter): plan <- trainer <- runtime <- teach.
"""
