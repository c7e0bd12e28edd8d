"""`python -m minipar.costmodel ...`: the cost model's command line (see `cli`)."""
import sys

from .cli import main

sys.exit(main())
