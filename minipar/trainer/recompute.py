"""Activation recomputation: keep less for the backward, compute it again when it is needed.

Chapter "Memory: where every byte goes". `--recompute`:

    none       autograd keeps everything each operation saves
    selective  each attention core (`Attention.core`: plain attention, or under context
               parallelism the ring / all-gather attention) keeps only its inputs q, k, v
               and runs again in the backward (Korthikanti et al. 2022's selective recompute)
    full       each transformer block keeps only its input and runs again in the backward

`recomputed(fn, *args)` runs `fn(*args)` while telling autograd to keep *nothing* the
operations inside save: through `saved_tensors_hooks`, each saved tensor is replaced by its
slot number. When the backward first asks for a slot, `fn` runs again from the kept inputs
(with grad enabled, under the same autocast) and this time the hooks collect what it saves,
slot by slot; each slot is handed over once and then dropped.

This is the idea of `torch.utils.checkpoint(use_reentrant=False)`, written out so that the
lesson is readable and so that two things work that the book relies on:
* the memory meter (`minipar.trainer.memory_meter`) counts what recomputation keeps — the inputs, and a
  block's recomputed tensors while its backward runs — through `memory_meter.hold`; inside
  torch's checkpoint those tensors are invisible to any outer saved-tensor hook;
* zero-bubble's split backward (`parallel/pipeline.py`) still finds the weight branches in
  the graph: the graph is the ordinary one, only its saved tensors are deferred. B
  recomputes the block; the slots only W needs wait, recomputed, until W consumes them (if
  W needs a slot B already consumed, the block runs once more).
The older "reentrant" checkpoint (one autograd node for the whole block, whose backward
runs a nested backward) would compute the weight gradients inside B and break that split.
"""

import contextlib
import functools

import torch

from . import memory_meter


class _AllSaved(Exception):
    """Raised by the recomputation's pack hook once it has every slot: stop the rerun there
    (every rank of a group stops at the same operation, so no collective is left half-done)."""

class _Recomputation:
    """One call of a recomputed function: its kept inputs and, in the backward, the
    tensors a second run of it saves."""

    def __init__(self, fn, args):
        self.fn = fn
        # kept (and counted) detached, with whether each needs a gradient
        self.inputs = [(memory_meter.hold(a), a.requires_grad) if torch.is_tensor(a) else a for a in args]
        device = next((a.device.type for a in args if torch.is_tensor(a)), "cpu")
        # the rerun computes in the precision the forward did (bf16 autocast or not)
        self.autocast = torch.autocast(device, dtype=torch.get_autocast_dtype(device),
                                       enabled=torch.is_autocast_enabled(device))
        self.n_slots, self.slots = 0, None      # slots: the rerun's saved tensors, once it ran

    def pack(self, t):                # forward: remember the slot, keep nothing
        self.n_slots += 1
        return self.n_slots - 1

    def unpack(self, slot: int):      # backward: the slot's tensor, recomputed if needed
        if self.slots is None or self.slots[slot] is None:
            self.slots = self.run_again()
        held, self.slots[slot] = self.slots[slot], None
        return held.tensor

    def run_again(self) -> list:
        saved = []

        def collect(t):       # this run's graph is thrown away: keep the tensor in `saved`
            saved.append(memory_meter.hold(t))
            if len(saved) == self.n_slots:
                raise _AllSaved      # nothing after the last saved tensor is needed

        args = [a[0].tensor.detach().requires_grad_(a[1]) if isinstance(a, tuple) else a
                for a in self.inputs]
        with contextlib.suppress(_AllSaved), torch.enable_grad(), self.autocast, \
                torch.autograd.graph.saved_tensors_hooks(collect, lambda t: t):
            self.fn(*args)
        if len(saved) != self.n_slots:
            raise RuntimeError(f"recomputation saved {len(saved)} tensors, the forward "
                               f"{self.n_slots}: {self.fn} is not deterministic in what it saves")
        return saved


def recomputed(fn, *args):
    """`fn(*args)`, keeping only `args` for the backward and running `fn` again there."""
    if not torch.is_grad_enabled():
        return fn(*args)
    r = _Recomputation(fn, args)
    with torch.autograd.graph.saved_tensors_hooks(r.pack, r.unpack):
        return fn(*args)


def apply_recompute(model, mode: str):
    """`--recompute MODE` on one model chunk: wrap each block's forward (full) or each
    attention core (selective). Apply it after context parallelism has installed its core,
    so that selective wraps the ring or all-gather attention itself. `mode` is one of
    `config.RECOMPUTE_MODES`, which `ParallelConfig` checks."""
    for block in model.layers.values():
        if mode == "full":
            block.forward = functools.partial(recomputed, block.forward)
        elif mode == "selective":
            block.self_attn.core = functools.partial(recomputed, block.self_attn.core)
    return model
