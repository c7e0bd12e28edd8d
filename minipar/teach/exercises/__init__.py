"""Every chapter's exercises, checked: the `check_*` functions of each chapter's notebook.

`core` says how a check works (one fixed signature per exercise, a `Verdict` that states
its tolerance, real gloo ranks against the single-device reference), `units` how a number
with its unit is read; each other module holds one chapter's checks, in the book's order.
`from minipar.teach.exercises import check_x` finds any of them.
"""
from .core import KINDS, REGISTRY, Verdict, exercises_of
from .llama3 import *
from .collectives import *
from .data_parallel import *
from .tensor_parallel import *
from .pipeline_parallel import *
from .context_parallel import *
from .memory import *
from .fourd import *
from .mfu import *
from .failures import *
from .cluster import *
from .hf import *
