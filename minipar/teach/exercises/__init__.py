"""Every chapter's exercises, checked: the `check_*` functions of each chapter's notebook.

`core` says how a check works (one fixed signature per exercise, a `Verdict` that states
its tolerance, real gloo ranks against the single-device reference), `units` how a number
with its unit is read; each other module holds one chapter's checks, in the book's order.
`from minipar.teach.exercises import check_x` finds any of them. `solution` is the
`%%solution` cell magic of the worked solutions, registered when this is imported in IPython.
"""
from .cluster import *
from .collectives import *
from .context_parallel import *
from .core import KINDS, REGISTRY, Verdict, exercises_of
from .data_parallel import *
from .experts import *
from .failures import *
from .fourd import *
from .hf import *
from .llama3 import *
from .memory import *
from .mfu import *
from .pipeline_parallel import *
from .solution import load_ipython_extension, register_in_ipython
from .tensor_parallel import *

register_in_ipython()
