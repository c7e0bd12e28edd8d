"""`python -m minipar.replay DIR --gpu h100`: a recorded run re-timed on a GPU cluster
(Chapter "From a laptop to a cluster"). The command only; the replay is torch-free planning,
`minipar/plan/replay.py`."""
import sys

from .plan.replay import main

if __name__ == "__main__":
    sys.exit(main())
