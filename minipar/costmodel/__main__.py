"""`python -m minipar.costmodel ...`: the cost model's command line (see `cli`), chapter
"MFU and communication volume"."""
import sys

from .cli import main

sys.exit(main())
