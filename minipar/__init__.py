"""minipar: a compact 4D-parallel (tensor, context, pipeline, data) trainer for a Llama-style
model, in plain PyTorch, that runs as N gloo processes on a laptop and as N GPUs under torchrun.

The package is the book's code, one file per chapter's idea (README.md's "Layout" gives the
files in the book's reading order). This file imports nothing: `import minipar.costmodel`
needs no torch, and a reader imports the one file a chapter is about.
"""
__version__ = "0.1.0"
