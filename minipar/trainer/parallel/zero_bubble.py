"""Zero-bubble's split backward: B computes the gradient w.r.t. the stage input alone, W the
weight gradients later, where they fill the pipeline's bubble.

Chapter "Pipeline parallelism", section on zero-bubble schedules (Qi et al. 2024).

B is `torch.autograd.grad(out, input, retain_graph=True)`: only what the previous stage
waits for. Before it runs, a hook is placed on every graph node where a path to a weight
branches off the path to the input (the node of `x @ W.T`, say) and records the gradient
that arrives there. W then restarts autograd from those nodes with the recorded gradients
and `inputs=weights` (`torch.autograd.backward(GradientEdge, ..., inputs=...)`): it computes
dW = dy^T x and nothing twice, and it *accumulates* into `.grad`, so the post-accumulate
hooks that DataParallel's buckets hang on fire as in a plain backward. On the first stage
the "input" is the embedding's output; the embedding's own gradient is W's work.

`SplitBackward` is the executor's strategy for `--schedule zb` (`pipeline.Backward` is the
one-pass B of every other schedule).
"""

import torch
import torch.nn as nn
from torch.autograd.graph import GradientEdge, get_gradient_edge


def _children(node) -> list:
    return [c for c, _ in node.next_functions if c is not None]


def _below(root, target=None) -> dict:
    """Every graph node under `root` (root included, children before parents), mapped to
    whether a path from it leads to `target`."""
    memo, stack = {}, [(root, False)]
    while stack:                                  # iterative: graphs are deep
        node, children_done = stack.pop()
        if children_done:
            memo[node] = node is target or any(memo.get(c, False) for c in _children(node))
        elif node not in memo:
            stack.append((node, True))
            stack += [(c, False) for c in _children(node) if c not in memo]
    return memo


def _weights_below(node, weights: dict) -> list[nn.Parameter]:
    leaves = (getattr(n, "variable", None) for n in _below(node))   # AccumulateGrad: a leaf
    return [weights[id(var)] for var in leaves if var is not None and id(var) in weights]


def backward_input(out, dout, boundary, weights):
    """Zero-bubble's B: the gradient w.r.t. `boundary` (the stage input) alone.

    Returns it and the deferred weight work for `backward_weight`: for each node where a
    path to weights leaves the path to the input, the gradient that reached it."""
    weights = {id(w): w for w in weights}
    root = get_gradient_edge(boundary).node
    on_path = _below(out.grad_fn, root)
    branches = []
    for node, reaches_input in on_path.items():
        if reaches_input and node is not root:
            below = [w for c in _children(node) if not on_path[c]
                     for w in _weights_below(c, weights)]
            if below:
                branches.append((node, below))
    seen = {}
    hooks = [node.register_prehook(lambda grads, node=node: seen.__setitem__(node, grads))
             for node, _ in branches]
    try:
        (d_input,) = torch.autograd.grad(out, boundary, dout, retain_graph=True)
    finally:
        for h in hooks:
            h.remove()
    below_root = _weights_below(root, weights)       # the embedding, on the first stage
    work = [([get_gradient_edge(boundary)], [d_input], below_root)] if below_root else []
    for node, below in branches:
        grads = seen[node]
        work.append(([GradientEdge(node, i) for i, g in enumerate(grads) if g is not None],
                     [g for g in grads if g is not None], below))
    return d_input, work


def backward_weight(work) -> None:
    """Zero-bubble's W: weight gradients from what B left, accumulated into `.grad`."""
    for edges, grads, weights in work:
        torch.autograd.backward(edges, grads, inputs=weights, retain_graph=True)


class SplitBackward:
    """The executor's B and W for zero-bubble schedules: B leaves W's work behind."""

    def __init__(self):
        self.deferred: dict[tuple[int, int], list] = {}     # (mb, chunk) -> W's work

    def b(self, pipe, a, work, dout):
        d_input, self.deferred[(a.microbatch, a.chunk)] = backward_input(
            work.out, dout, work.boundary, pipe.chunks[a.chunk].parameters())
        return d_input

    def w(self, pipe, a):
        key = (a.microbatch, a.chunk)
        pipe.dp.set_last_microbatch(a.microbatch == pipe.m - 1)
        pipe.dp.gather_module(pipe.chunks[a.chunk])     # ZeRO-3 may have freed them since B
        backward_weight(self.deferred.pop(key))
        del pipe.stash[key]          # the graph and its saved activations go with it
