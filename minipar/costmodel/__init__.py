"""The cost model's commands (Chapter "MFU and communication"): `python -m
minipar.costmodel` and `python -m minipar.costmodel.evaluate`. The model itself is torch-free
planning: `minipar/plan/costmodel/`."""
