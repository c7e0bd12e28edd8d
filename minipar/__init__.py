"""minipar: a compact 4D-parallel (tensor, context, pipeline, data) trainer for a Llama-style
model, in plain PyTorch, that runs as N gloo processes on a laptop and as N GPUs under torchrun.

The package is the book's code, one file per chapter's idea (README.md's "Layout" gives the
order); this file only exposes the configurations.
"""
from .config import ConfigError, ModelConfig, ParallelConfig


def __getattr__(name):
    # lazily: `python -m minipar.costmodel` needs no torch, and importing torch costs seconds
    if name == "ProcessGrid":
        from .grid import ProcessGrid
        return ProcessGrid
    raise AttributeError(name)


__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelConfig", "ParallelConfig", "ProcessGrid"]
