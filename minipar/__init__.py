"""minipar: a compact 4D-parallel (tensor, context, pipeline, data) trainer for a Llama-style
model, in plain PyTorch, that runs as N gloo processes on a laptop and as N GPUs under torchrun.

The package is the code of every chapter of the book, in four layers, each a folder, imports
running one way:
`plan/` (torch-free: formulas, schedules as data, the cost model, the replay) <- `trainer/`
(the model, one file per axis, the step) <- `runtime/` (launching, checkpoints, the loop) <-
`teach/` (the book's numbers, figures, explorers and exercise checks). The files beside them
are the commands (`python -m minipar.train`, ...). README.md's "Layout" lists every file.
This file imports nothing: `import minipar.plan` needs no torch.
"""
__version__ = "0.1.0"
