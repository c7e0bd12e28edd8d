"""The four parallel axes, one file per idea, in the order the book's chapters tell them:
regions.py (f and g), tensor.py, context.py, data.py and zero.py, schedules.py and
pipeline.py. `minipar.trainer.parallelize` applies them to a rank's model in one fixed order."""
