"""`python -m minipar.train`: train on tp*cp*pp*dp ranks.

Chapter "From a laptop to a cluster". The command only: the run is `minipar/runtime/run.py`'s,
the step the trainer's (`minipar/trainer/step.py`)."""
import sys

from .runtime.run import main

if __name__ == "__main__":
    sys.exit(main())
