"""The exercises of the experts chapter, checked (see core.py for how).

Chapter "Experts: the fifth axis". The code exercises run one mixture-of-experts layer on
real gloo ranks with expert parallelism (`parallel.experts.ExpertParallel`) against the same
layer on one device. The predictions are compared with a run: the bytes rank 0 writes to its
sockets during one forward and backward of an EP2 layer (measured by the kernel's counter,
`runtime.wire_meter`), and the copies a capacity-limited layer hands its experts. Both use a
router forced by its bias (`expert_bias`, which only chooses) to send every token to expert
0 and expert 7, so the answer follows from the chapter's rules, not from chance.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ...plan.config import ModelConfig
from ...runtime import wire_meter
from ...trainer.grid import ProcessGrid
from ...trainer.model import MoE
from ...trainer.parallel.experts import ExpertParallel
from ...runtime.launch import run_local
from .collectives import HEADERS_WHY
from .core import BITWISE, FLOAT32, Verdict, at, exercise, first_difference, on_ranks, predicted

# One MoE layer: 8 SwiGLU experts of 128, 2 per token, width 256 (wide enough that gloo's
# headers are a small part of what the wire carries).
LAYER = ModelConfig(n_layers=1, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=128,
                    moe_experts=8, moe_top_k=2)
EP = 2                  # gloo ranks of the EP checks: rank 0 holds experts 0-3, rank 1 4-7
SEQS, TOKENS = 4, 128   # each rank's micro-batch
FORCED = (0, 7)         # the experts a forced router sends every token to
STEPS = 2               # the combine check: the real router (step 0) and the forced one (step 1)
COUNT_RANKS = 4         # the count exchange: 4 ranks, 8 experts, 2 per rank
CAPACITY = dict(seqs=4, tokens=10, factor=1.0)   # the capacity exercise's batch and C


def moe_layer(cfg: ModelConfig = LAYER, forced: bool = False, seed: int = 0) -> MoE:
    """The layer, its weights drawn from `seed` (the same on every rank); `forced`: the
    bias sends every token to the experts FORCED (a bias no score in [0, 1] overcomes)."""
    moe = MoE(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        if forced:
            moe.expert_bias[list(FORCED)] = 2.0
    return moe


def tokens(rank: int, step: int = 0, seqs: int = SEQS, n: int = TOKENS, dim: int = LAYER.dim):
    """Rank `rank`'s activations [seqs, n, dim] and the gradient that comes back for them."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(seqs, n, dim, generator=gen), torch.randn(seqs, n, dim, generator=gen)


# ----------------------------------------------------------------- predict, then run: the wire
def _wire_worker() -> int:
    grid = ProcessGrid(dp=EP, ep=EP, rank=dist.get_rank()).init_groups()
    moe = moe_layer(forced=True)
    moe.experts = ExpertParallel(moe.experts, grid.ep)
    x, g = tokens(grid.ep.rank)
    x.requires_grad_()                   # as a layer's input is: its gradient goes back too
    dist.barrier()                       # every rank lined up: nothing else is in flight
    return wire_meter.measure(lambda: moe(x).backward(g))


@functools.cache
def measured_ep_bytes() -> int:
    """The bytes rank 0 writes to its sockets during one forward and backward of the forced
    EP2 layer (the count exchange, dispatch and combine, and their backward)."""
    return run_local(_wire_worker, EP, backend="gloo")[0]


@exercise("experts", "predict")
def check_predict_ep_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes rank 0 sends on the wire in one forward and backward of one MoE
    layer on EP2 (8 experts, top-2, d = 256, float32; each rank 4 sequences of 128 tokens;
    every token routed to experts 0 and 7); the check runs it on two gloo ranks and measures
    what rank 0 writes to its sockets."""
    rows = SEQS * TOKENS * LAYER.dim * 4           # one all-to-all of one copy per token
    return predicted(prediction, measured_ep_bytes if measured is None else measured,
                     "the bytes rank 0 sends", rel=0.03, why=HEADERS_WHY, unit="B", reveal=reveal,
                     hints=[(2 * rows, "that is the forward's dispatch and combine: the backward "
                                       "sends the gradients back the way the rows came, twice more."),
                            (8 * rows, "a token's copy for expert 0 stays on rank 0, which holds "
                                       "it: a rank sends nothing to itself."),
                            (rows, "that is one all-to-all; a layer's forward has two (dispatch, "
                                   "combine) and its backward two more.")])


# ----------------------------------------------------------------- implement: the count exchange
def counts_of(rank: int, experts: int = 8) -> torch.Tensor:
    """The copies rank `rank` routes to each of the `experts` experts (int64), as a router
    would count them: the fixture of the count exchange."""
    return torch.randint(0, 20, (experts,), generator=torch.Generator().manual_seed(rank))


def _count_worker(fn):
    grid = ProcessGrid(dp=COUNT_RANKS, ep=COUNT_RANKS, rank=dist.get_rank()).init_groups()
    axis, n = grid.ep, grid.ep.size
    want = torch.stack([counts_of(j).view(n, -1)[axis.rank] for j in range(n)])
    got = fn(counts_of(axis.rank), axis)
    if isinstance(got, torch.Tensor):
        got = got.reshape(want.shape) if got.numel() == want.numel() else got
    return at(0, axis.rank, first_difference(got, want, "theirs", BITWISE))


@exercise("experts", "implement")
def check_count_exchange(fn) -> Verdict:
    """fn(counts, axis) -> theirs: `counts` [E] are the copies this rank sends to each expert
    (rank j of the `axis` of n ranks holds experts [j E/n, (j+1) E/n)); return theirs
    [n, E/n], theirs[j, e] the copies rank j sends to this rank's e-th expert. Run on 4 gloo
    ranks (8 experts), compared exactly."""
    return on_ranks(COUNT_RANKS, _count_worker, fn,
                    "every rank learns what each rank will send to each of its experts, on 4 "
                    "gloo ranks.")


# ----------------------------------------------------------------- find the bug: the combine
def buggy_combine(out, token, weight, n_tokens):
    """The combine with a bug (the exercise): out [copies, d] the experts' outputs, token
    [copies] the token each copy belongs to, weight [copies] its routing weight ->
    [n_tokens, d], each token's expert outputs added up."""
    y = out.new_zeros(n_tokens, out.shape[-1])
    return y.index_add(0, token, out)


class CombinedMoE(MoE):
    """The reference's `MoE` with its last step, the combine, replaced by `combine`: the
    copies are grouped by expert and computed exactly as `MoE.routed` does."""

    def __init__(self, cfg: ModelConfig, combine):
        super().__init__(cfg)
        self.combine = combine

    def routed(self, x, chosen, weights, keep):
        token, slot = keep.nonzero(as_tuple=True)
        expert = chosen[token, slot]
        order = expert.argsort(stable=True)
        out = self.experts(x[token[order]], torch.bincount(expert, minlength=self.n))
        w = weights[token[order], slot[order]].to(out.dtype)
        return self.combine(out, token[order], w, x.shape[0])


def _ep_and_reference(fn, grid, step):
    """This rank's EP layer with the combine `fn`, and the reference on every rank's tokens,
    both run forward and backward: (mine, x, y, reference, reference's x, reference's y)."""
    forced, rank = step == 1, grid.ep.rank
    ref = moe_layer(forced=forced)
    xs, gs = zip(*(tokens(r, step) for r in range(EP)))
    rx = torch.cat(xs).requires_grad_()
    ry = ref(rx)
    ry.backward(torch.cat(gs))
    mine = CombinedMoE(LAYER, fn)
    mine.load_state_dict(ref.state_dict())
    mine.experts = ExpertParallel(mine.experts, grid.ep)
    x = xs[rank].clone().requires_grad_()
    y = mine(x)
    y.backward(gs[rank])
    return mine, x, y, ref, rx, ry


def _combine_worker(fn):
    grid = ProcessGrid(dp=EP, ep=EP, rank=dist.get_rank()).init_groups()
    rank, local = grid.ep.rank, LAYER.moe_experts // EP
    for step in range(STEPS):
        mine, x, y, ref, rx, ry = _ep_and_reference(fn, grid, step)
        rows = slice(rank * SEQS, (rank + 1) * SEQS)
        grad = mine.gate.weight.grad         # None when nothing reached the router
        gate = torch.zeros_like(mine.gate.weight) if grad is None else grad.clone()
        dist.all_reduce(gate)                    # the router's gradient, over every token
        held = slice(rank * local, (rank + 1) * local)
        pairs = [("y", y, ry[rows]), ("dx", x.grad, rx.grad[rows]), ("router grad", gate, ref.gate.weight.grad)]
        pairs += [(f"experts.{n} grad", getattr(mine.experts, n).grad, getattr(ref.experts, n).grad[held])
                  for n in ("gate_proj", "up_proj", "down_proj")]
        for name, got, want in pairs:
            problem = at(step, rank, first_difference(got, want.detach(), name, FLOAT32))
            if problem and not gate.any():
                problem += (" The router's gradient is zero: nothing the loss sees depends on "
                            "its scores.")
            if problem:
                return problem
    return None


@exercise("experts", "bug")
def check_combine_fix(combine) -> Verdict:
    """combine(out, token, weight, n_tokens) -> [n_tokens, d]: the fixed `buggy_combine`.
    Run inside one MoE layer with EP2 on two gloo ranks, at a step of the real router and
    one of a forced one, against the layer on one device: output, input gradient, the
    router's gradient (summed over the ranks) and each rank's experts' gradients."""
    return on_ranks(EP, _combine_worker, combine,
                    "your combine gives the single-device layer's output and gradients (the "
                    "router's too) with EP2 on 2 gloo ranks.")


# ----------------------------------------------------------------- predict, then run: capacity
def copies_computed(seqs: int, n: int, factor: float) -> int:
    """The copies a forced layer with capacity factor `factor` hands its experts for `seqs`
    sequences of `n` tokens: counted where the experts receive them."""
    cfg = ModelConfig(n_layers=1, dim=64, n_heads=8, n_kv_heads=4, ffn_dim=128, moe_experts=8,
                      moe_top_k=2, moe_capacity_factor=factor)
    moe, seen = moe_layer(cfg, forced=True), []
    moe.experts.register_forward_pre_hook(lambda mod, args: seen.append(int(args[1].sum())))
    with torch.no_grad():
        moe(tokens(0, seqs=seqs, n=n, dim=cfg.dim)[0])
    return seen[0]


@exercise("experts", "predict")
def check_predict_capacity(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict how many token copies the experts compute in one MoE layer (8 experts, top-2,
    capacity factor 1.0) for 4 sequences of 10 tokens, every token routed to experts 0 and 7;
    the check runs the layer and counts the copies its experts receive."""
    c = CAPACITY
    every = c["seqs"] * c["tokens"] * LAYER.moe_top_k
    batch = 2 * int(c["factor"] * c["seqs"] * c["tokens"] * LAYER.moe_top_k / LAYER.moe_experts)
    per_seq_floor = 2 * c["seqs"] * int(c["factor"] * c["tokens"] * LAYER.moe_top_k / LAYER.moe_experts)
    run = functools.partial(copies_computed, c["seqs"], c["tokens"], c["factor"])
    return predicted(prediction, run if measured is None else measured, "the copies computed",
                     rel=1e-9, why="a count", reveal=reveal, hints=[
        (every, "that is dropless: with a capacity factor each expert keeps at most "
                "ceil(C T k / E) copies of each sequence, the earliest."),
        (batch, "the capacity is per sequence (T its tokens), not over the whole batch."),
        (per_seq_floor, "the capacity rounds up: ceil(C T k / E)."),
    ])


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_combine"]
