"""`python -m minipar.costmodel`: the cost model's command line 
(Chapter "MFU and communication"), `minipar/plan/costmodel/cli.py`."""
import sys

from ..plan.costmodel.cli import main

if __name__ == "__main__":
    sys.exit(main())
