"""`python -m minipar.export`: a checkpoint written as a Hugging Face directory (Chapter "Real models in and out"). The command only; the work is `minipar/runtime/export.py`'s."""
import sys

from .runtime.export import main

if __name__ == "__main__":
    sys.exit(main())
