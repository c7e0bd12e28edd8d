"""`python -m minipar.costmodel.evaluate`: the cost model's errors on published runs
(Chapter "MFU and communication"), `minipar/plan/costmodel/evaluate.py`."""
import sys

from ..plan.costmodel.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
