"""Tensor parallelism: each layer against torch.nn, training against the single device, and
the bytes on the wire against the formula."""
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minipar.trainer import comm
from minipar.runtime import launch
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import RMSNorm, Transformer
from minipar.trainer.parallel import collective_matmul
from minipar.trainer.placement import Partial, Replicate, Shard, placements
from minipar.trainer.parallel.tensor import (OVERLAP_STYLES, STYLES, VocabParallelEmbedding,
                                             apply_tensor_parallel, replicated, style_of,
                                             sum_partial_grads,
                                             vocab_parallel_cross_entropy_sum)
from minipar.plan.formulas.tensor_parallel import (collective_matmul_bytes,
                                                   tp_wire_bytes_breakdown,
                                                   tp_wire_bytes_per_step)
from minipar.runtime.run import main

from helpers import (assert_close_grads, assert_same_losses, reference, run_layout, shard_dim,
                     wire_bytes_of)

TINY = ModelConfig.preset("tiny")


# ---------------------------------------------------------------- pure: the plan, the formula
def test_the_plan_names_every_weight_of_the_reference():
    model = Transformer(TINY)
    styles = {name: style_of(name) for name, m in model.named_modules()
              if isinstance(m, (nn.Linear, nn.Embedding, RMSNorm))}
    assert None not in styles.values(), [n for n, s in styles.items() if s is None]
    assert styles["layers.3.self_attn.k_proj"] == "colwise"
    assert styles["layers.3.mlp.down_proj"] == "rowwise"
    assert shard_dim("layers.0.self_attn.o_proj.weight") == 1
    assert shard_dim("lm_head.weight") == 0 and shard_dim("embed_tokens.weight") == 0
    assert shard_dim("layers.0.input_layernorm.weight") is None


def test_the_formula_is_megatrons_4_all_reduces_per_layer():
    b, s, t, h = 2, 16, 4, TINY.dim
    parts = tp_wire_bytes_breakdown(TINY, b, s, t)
    # 4 all-reduces of b*s*h float32 per layer, each 2(t-1)/t of its bytes
    assert parts["layers"] == TINY.n_layers * 4 * 2 * (t - 1) * b * s * h * 4 // t
    assert parts["loss"] == 3 * 2 * (t - 1) * b * s * 4 // t and parts["norms"] == 0
    sp = tp_wire_bytes_breakdown(TINY, b, s, t, sp=True)
    assert {k: v for k, v in sp.items() if k != "norms"} == {k: v for k, v in parts.items() if k != "norms"}
    assert sp["norms"] == (2 * TINY.n_layers + 1) * 2 * (t - 1) * h * 4 // t
    assert tp_wire_bytes_per_step(TINY, b, s, 1) == 0
    assert tp_wire_bytes_per_step(TINY, b, s, t, n_micro=3) == 3 * sum(parts.values())
    middle = tp_wire_bytes_breakdown(TINY, b, s, t, layers=2, first=False, last=False)
    assert middle["embedding"] == middle["head"] == middle["loss"] == 0


def test_the_formula_agrees_with_the_cost_model():
    cm = pytest.importorskip("minipar.plan.costmodel")
    if not hasattr(cm, "comm_bytes_per_gpu"):
        pytest.skip("costmodel has no comm_bytes_per_gpu yet")
    for tp, mb, sp in ((2, 1, False), (4, 2, False), (2, 4, True), (4, 1, True)):
        pc = ParallelConfig(tp=tp, dp=2, sp=sp)
        work = cm.Workload(seq_len=32, global_batch=8, microbatch_size=mb)
        want = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32)["tp"]
        n_micro = 8 // (2 * mb)
        assert tp_wire_bytes_per_step(TINY, mb, 32, tp, sp=sp, n_micro=n_micro) == want, (tp, mb, sp)


# ---------------------------------------------------------------- each layer against torch.nn
def _layers_against_torch_nn():
    """On each of 2 ranks: (name, got, want) for every output and gradient of every layer."""
    r = dist.get_rank()
    axis = ProcessGrid(tp=2, rank=r).init_groups().tp
    torch.manual_seed(0)                      # the same full tensors on both ranks
    out = []

    def seq(t):                               # this rank's half of the sequence (dim 1)
        return t.chunk(2, dim=1)[r]

    def feat(t, dim=-1):                      # this rank's half of the features
        return t.chunk(2, dim=dim)[r]

    for sp, overlap in ((False, False), (True, False), (True, True)):
        sp_ = f"{sp}{' overlap' if overlap else ''}"
        styles = OVERLAP_STYLES if overlap else STYLES    # the layers the plan picks
        # column-parallel entering by itself (the head's style): whole (or SP:
        # sequence-sharded) input, half the outputs
        lin = nn.Linear(6, 4, bias=True)
        x = torch.randn(2, 4, 6, requires_grad=True)
        w = torch.randn(2, 4, 4)
        (lin(x) * w).sum().backward()
        col = styles["head"](lin, axis, sp)
        xl = (seq(x) if sp else x).detach().requires_grad_()
        y = col(xl)
        (y * feat(w)).sum().backward()        # the ranks' losses add up to the reference's
        out += [(f"col sp={sp_} y", y, feat(lin(x))),
                (f"col sp={sp_} dx", xl.grad, seq(x.grad) if sp else x.grad),
                (f"col sp={sp_} dW", col.weight.grad, feat(lin.weight.grad, 0)),
                (f"col sp={sp_} db", col.bias.grad, feat(lin.bias.grad, 0))]

        # row-parallel: half the input features, the whole (or SP: sequence-sharded) sum
        lin = nn.Linear(4, 6, bias=True)
        x = torch.randn(2, 4, 4, requires_grad=True)
        w = torch.randn(2, 4, 6)
        ref = lin(x)
        (ref * w).sum().backward()
        row = styles["rowwise"](lin, axis, sp)
        xl = feat(x).detach().requires_grad_()
        y = row(xl)
        (y * (seq(w) if sp else w)).sum().backward()
        sum_partial_grads([(row.bias.grad, row.bias)], axis)   # SP: the DP wrapper's, once a step
        out += [(f"row sp={sp_} y", y, seq(ref) if sp else ref),
                (f"row sp={sp_} dx", xl.grad, feat(x.grad)),
                (f"row sp={sp_} dW", row.weight.grad, feat(lin.weight.grad, 1)),
                (f"row sp={sp_} db", row.bias.grad, lin.bias.grad)]

        # vocab-parallel embedding: half the rows, every token
        emb = nn.Embedding(8, 6)
        tokens = torch.randint(0, 8, (2, 4))
        w = torch.randn(2, 4, 6)
        ref = emb(tokens)
        (ref * w).sum().backward()
        vemb = VocabParallelEmbedding(emb, axis, sp=sp)
        y = vemb(tokens)
        (y * (seq(w) if sp else w)).sum().backward()
        out += [(f"embedding sp={sp_} y", y, seq(ref) if sp else ref),
                (f"embedding sp={sp_} dW", vemb.weight.grad, feat(emb.weight.grad, 0))]

        # a replicated norm: under SP its weight's gradient is summed over the ranks
        norm = RMSNorm(6)
        with torch.no_grad():
            norm.weight.add_(torch.randn(6))
        x = torch.randn(2, 4, 6)
        w = torch.randn(2, 4, 6)
        (norm(x) * w).sum().backward()
        tp_norm = RMSNorm(6)
        tp_norm.load_state_dict(norm.state_dict())
        replicated(tp_norm, axis, sp)
        y = tp_norm(seq(x) if sp else x)
        (y * (seq(w) if sp else w)).sum().backward()
        sum_partial_grads([(tp_norm.weight.grad, tp_norm.weight)], axis)
        out.append((f"norm sp={sp_} dW", tp_norm.weight.grad, norm.weight.grad))

    # the vocab-parallel loss: the same value and gradient as F.cross_entropy, from half the
    # logits, stable for large logits
    for scale in (1.0, 50.0):
        logits = (torch.randn(2, 4, 8) * scale).requires_grad_()
        targets = torch.randint(0, 8, (2, 4))
        ref = F.cross_entropy(logits.reshape(-1, 8), targets.reshape(-1), reduction="sum")
        ref.backward()
        local = feat(logits).detach().requires_grad_()
        loss = vocab_parallel_cross_entropy_sum(local, targets, axis)
        (loss * 0.5).backward()
        out += [(f"loss x{scale}", loss, ref.detach()),
                (f"loss x{scale} dlogits", local.grad, 0.5 * feat(logits.grad))]

    # a middle pipeline stage (no embedding, norm or head) maps hidden states to hidden
    # states; under SP its input and output are this rank's half of the sequence
    def middle():
        return Transformer(TINY, layer_ids=range(2, 4), first=False, last=False)
    h = torch.randn(2, 8, TINY.dim)
    want = middle()(h, torch.arange(8))
    for sp, overlap in ((False, False), (True, False), (True, True)):
        got = apply_tensor_parallel(middle(), axis, sp=sp, overlap=overlap)(
            seq(h) if sp else h, torch.arange(8))
        out.append((f"middle stage sp={sp} overlap={overlap}", got, seq(want) if sp else want))

    # the whole model: each parameter records its placement as the plan says
    for sp in (False, True):
        model = apply_tensor_parallel(Transformer(TINY), axis, sp=sp)
        for name, p in model.named_parameters():
            dim = shard_dim(name)
            want = Shard(dim) if dim is not None else Partial() if sp else Replicate()
            if placements(p) != {"tp": want}:
                out.append((f"{name} placed {placements(p)}, not {want}", torch.tensor(0),
                            torch.tensor(1)))
    out += _matmuls_with_a_transfer_in_flight(axis)
    return [(n, g.detach(), w.detach()) for n, g, w in out]


def _matmuls_with_a_transfer_in_flight(axis):
    """Both ring loops of the collective matmul, with their transfers and matmuls logged:
    t - 1 of the t matmuls run while a chunk is on its way (the last has nothing left to
    hide). `comm.ring_exchange` is wrapped in this forked rank only."""
    events, real_pass = [], comm.ring_exchange

    def logged_pass(ax, *tensors):
        handle = real_pass(ax, *tensors)
        events.append(+1)
        real_wait = handle.wait
        handle.wait = lambda: (events.append(-1), real_wait())[1]
        return handle

    def busy_matmuls():
        n, in_flight = 0, 0
        for e in events:
            in_flight += e if e != "mm" else 0
            n += e == "mm" and in_flight > 0
        return n
    comm.ring_exchange = logged_pass
    x, w = torch.randn(2, 3, 6), torch.randn(4, 6)
    checks, t = [], axis.size
    comm.LOG.reset()
    collective_matmul.all_gather_matmul(x, lambda c, xc: events.append("mm") or xc @ w.T, axis)
    checks += [("all-gather matmul: busy matmuls", busy_matmuls(), t - 1),
               ("all-gather matmul: bytes", wire_bytes_of("tp"),      # of the gathered x
                collective_matmul_bytes(t * x.numel() * 4, t))]
    events.clear()
    comm.LOG.reset()
    collective_matmul.matmul_reduce_scatter(lambda c: events.append("mm") or x @ w.T, axis)
    checks += [("matmul reduce-scatter: busy matmuls", busy_matmuls(), t - 1),
               ("matmul reduce-scatter: bytes", wire_bytes_of("tp"),  # of the full output
                collective_matmul_bytes(t * x.shape[0] * x.shape[1] * w.shape[0] * 4, t))]
    comm.ring_exchange = real_pass
    return [(name, torch.tensor(got), torch.tensor(want)) for name, got, want in checks]


def test_each_layer_matches_torch_nn_forward_and_backward():
    for rank, checks in enumerate(launch.run(_layers_against_torch_nn, 2)):
        for name, got, want in checks:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")


# ---------------------------------------------------------------- training against one device
LAYOUTS = [
    dict(tp=2),
    dict(tp=2, sp=True),
    dict(tp=4),
    dict(tp=4, sp=True),
    dict(tp=2, dp=2, zero=0),
    dict(tp=2, dp=2, zero=1, sp=True),
    dict(tp=2, dp=2, zero=2, microbatches=2),
    dict(tp=2, dp=2, zero=3, sp=True),
    # --tp-overlap (collective matmul): alone, over a ring of 4, with DP, PP and micro-batches
    dict(tp=2, sp=True, tp_overlap=True, microbatches=2),
    dict(tp=4, sp=True, tp_overlap=True),
    dict(tp=2, dp=2, zero=3, sp=True, tp_overlap=True),
    dict(tp=2, pp=2, sp=True, tp_overlap=True, microbatches=2),
]


def _name(kw):
    return "-".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in kw.items())


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=_name)
def test_training_matches_single_device(layout):
    """One run per layout proves three things: the loss curve, every shard's gradient after
    the first step (of the layers the rank holds), and the TP bytes on the wire of every step."""
    ref, got = reference(), run_layout(**layout)
    assert_same_losses(got, ref)

    t = layout["tp"]
    for res in got["all"]:
        r = res["coords"]["tp"]
        want = {}
        for name in res["grads"]:
            g, dim = ref["grads"][name], shard_dim(name)
            want[name] = g if dim is None else g.chunk(t, dim=dim)[r]
        assert len(want) >= 10
        assert_close_grads(res["grads"], want)
    _check_tp_bytes(layout, got)


def _check_tp_bytes(layout, got):
    """Rank 0's TP bytes of every step against the formula, op by op."""
    t, sp, overlap = layout["tp"], layout.get("sp", False), layout.get("tp_overlap", False)
    dp, m = layout.get("dp", 1), layout.get("microbatches", 1)
    held = got["grads"]                       # rank 0's: which layers, first or last stage
    shape = dict(layers=len({k.split(".")[1] for k in held if k.startswith("layers.")}),
                 first="embed_tokens.weight" in held, last="lm_head.weight" in held,
                 norm_shards=dp if layout.get("zero", 0) else 1)
    b = 8 // (dp * m)                         # TrainConfig: global batch 8, seq_len 32
    parts = tp_wire_bytes_breakdown(TINY, b, 32, t, sp=sp, n_micro=m, **shape)
    for rec in got["records"]:
        ops = rec["comm"]["tp"]
        assert sum(op["wire_bytes"] for op in ops.values()) == sum(parts.values())
        if overlap:      # the blocks' and the head's gathers and scatters go as ring steps
            assert ops["send"]["wire_bytes"] == parts["layers"] + parts["head"]
            assert ops.get("all_gather", {}).get("wire_bytes", 0) == parts["embedding"] // 2
        elif sp:   # the big tensors move as all-gather + reduce-scatter, half the bytes each
            half = (parts["layers"] + parts["embedding"] + parts["head"]) // 2
            assert ops["all_gather"]["wire_bytes"] == ops["reduce_scatter"]["wire_bytes"] == half
        else:
            assert set(ops) == {"all_reduce"}
        if sp:   # the norms' partial gradients: one all-reduce per step, not per micro-batch
            assert ops["all_reduce"]["wire_bytes"] == parts["loss"] + parts["norms"]
            assert ops["all_reduce"]["calls"] == (3 * m if shape["last"] else 0) + 1


# ---------------------------------------------------------------- the command line
def test_cli_refuses_a_tp_that_does_not_divide_the_heads(repo_root):
    p = subprocess.run([sys.executable, "-m", "minipar.train", "--tp", "3"], cwd=repo_root,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tp 3" in lines[0] and "n_heads=8" in lines[0], p.stderr


def test_sp_without_tp_is_refused():
    problems = ParallelConfig(sp=True).problems(TINY, seq_len=32, global_batch=8)
    assert any(line.startswith("--sp") for line in problems)


def test_tp_overlap_without_sp_is_refused_before_any_rank_starts(capsys):
    assert main(["--tp", "2", "--tp-overlap", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count("--tp-overlap needs --sp"), err
    zb = ParallelConfig(tp=2, sp=True, tp_overlap=True, pp=2, schedule="zb", microbatches=2)
    assert any("--schedule zb" in line for line in zb.problems(TINY, seq_len=32, global_batch=8))
