"""`python -m minipar.torchrun`: torchrun's agent, with signals passed on to every rank
(Chapter "From a laptop to a cluster"). The command only; the agent is
`minipar/runtime/torchrun.py`'s."""
import sys

from .runtime.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
