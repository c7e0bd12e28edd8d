"""`python -m minipar.generate`: text from a checkpoint or a Hugging Face directory
(Chapter "Real models in and out"). The command only; the sampling is
`minipar/runtime/generate.py`'s."""
import sys

from .runtime.generate import main

if __name__ == "__main__":
    sys.exit(main())
