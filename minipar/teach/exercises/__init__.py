"""Every chapter's exercises, checked: the `check_*` functions of each chapter's notebook.

`core` says how a check works (one fixed signature per exercise, a `Verdict` that states
its tolerance, real gloo ranks against the single-device reference), `units` how a number
with its unit is read; each other module holds one chapter's checks, in the book's order.
`from minipar.teach.exercises import check_x` finds any of them.
"""
from .core import KINDS, REGISTRY, Verdict, exercises_of  # noqa: F401
from .llama3 import *             # noqa: F401,F403
from .collectives import *        # noqa: F401,F403
from .data_parallel import *      # noqa: F401,F403
from .tensor_parallel import *    # noqa: F401,F403
from .pipeline_parallel import *  # noqa: F401,F403
from .context_parallel import *   # noqa: F401,F403
from .memory import *             # noqa: F401,F403
from .fourd import *              # noqa: F401,F403
from .mfu import *                # noqa: F401,F403
from .failures import *           # noqa: F401,F403
from .cluster import *            # noqa: F401,F403
from .hf import *                 # noqa: F401,F403
