"""The exercises of the data parallelism chapter, checked (see core.py for how)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...formulas import dp_bytes
from .core import Verdict, exercise, first_difference, number, on_ranks


@exercise("data_parallel", "number")
def check_zero_bytes(n_params: int, n: int, zero: int, answer, grad_bytes: int = 4,
                     param_bytes: int = 4) -> Verdict:
    """Bytes one rank sends per step under ZeRO stage `zero` (one micro-batch)."""
    want = dp_bytes(n_params, n, zero, 1, grad_bytes, param_bytes)
    g = n_params * grad_bytes
    return number(answer, want, f"ZeRO-{zero} bytes per rank", rel=1e-6, hints=[
        (g, "that is the size of the gradients; count what the ring sends over n ranks."),
        ((n - 1) * g / n, "that is only the reduce-scatter of the gradients; the updated "
                          "parameter shards must come back to every rank too."),
    ])


def _average_gradients_worker(fn):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 4)            # the global batch; this rank trains on x[rank]
    model(x[rank]).pow(2).mean().backward()
    fn(model)
    reference(x.reshape(16, 4)).pow(2).mean().backward()   # one device, the whole batch
    for name, p in model.named_parameters():
        problem = first_difference(p.grad, dict(reference.named_parameters())[name].grad,
                         f"the gradient of {name}")
        if problem:
            return problem + " It should equal the gradient of the whole batch on one device."
    return None


@exercise("data_parallel", "implement")
def check_average_gradients(fn) -> Verdict:
    """fn(model) replaces every p.grad with its mean over the ranks."""
    return on_ranks(2, _average_gradients_worker, fn,
        "the averaged gradients equal one device's gradient of the whole batch (2 gloo ranks).")


__all__ = [n for n in dir() if n.startswith("check_")]
