"""Context parallelism: the zigzag layout, exact attention over a split sequence (ring and
all-gather), the same training run as one device, and the bytes the formula predicts."""
from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
import torch.distributed as dist

from minipar.trainer import comm
from minipar.runtime import launch
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.trainer.comm import Axis
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer, causal_attention
from minipar.trainer.parallel import context
from minipar.trainer.parallel.context import (CORES, apply_context_parallel, local_positions,
                                              ring_attention, ring_steps,
                                              shard_for_context_parallel, zigzag_chunks)
from minipar.trainer.parallel.context_analysis import attention_work, contiguous_chunks
from minipar.plan.formulas.context_parallel import (cp_hops, cp_kv_bytes,
                                                    cp_wire_bytes_per_step, ulysses_kv_heads,
                                                    ulysses_layer_bytes)
from minipar.runtime.run import main

from helpers import assert_close_grads, assert_same_losses, reference, run_layout, wire_bytes_of

TINY = ModelConfig.preset("tiny")


# ------------------------------------------------------------------ the layout (pure)
def test_zigzag_positions_and_shard():
    # s = 8, cp = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert local_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert local_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    x = torch.arange(16).reshape(2, 8)
    xl, yl, pos = shard_for_context_parallel(x, x + 100, Axis("cp", (0, 1), 1))
    assert pos.tolist() == [2, 3, 4, 5]
    assert xl.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert torch.equal(yl, xl + 100)     # targets stay with their inputs


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_every_token_is_held_by_exactly_one_rank(cp):
    s = 4 * cp
    held = torch.cat([local_positions(s, r, cp) for r in range(cp)])
    assert sorted(held.tolist()) == list(range(s))


def test_sequence_not_divisible_by_two_cp_is_refused():
    # the layout's rule lives in one place, the layout config (before any rank starts)
    with pytest.raises(ValueError, match=r"--cp 4 needs --seq-len divisible by 2\*cp=8"):
        ParallelConfig(cp=4).validate(TINY, 20, 8)


@pytest.mark.parametrize("layout", [zigzag_chunks, contiguous_chunks])
@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_ring_schedule_computes_each_causal_score_once(cp, layout):
    """The blocks the schedule keeps cover exactly the (query, key) pairs with key <= query:
    every skipped block was fully masked, and nothing is computed twice."""
    s = 6 * cp
    c = s // (2 * cp)
    for r in range(cp):
        seen = []
        q_pos = local_positions(s, r, cp, layout)
        for src, pairs in ring_steps(r, cp, layout):
            k_pos = local_positions(s, src, cp, layout)
            for a, b, diagonal in pairs:
                for qp in q_pos[a * c:(a + 1) * c].tolist():
                    seen += [(qp, kp) for kp in k_pos[b * c:(b + 1) * c].tolist()
                             if kp <= qp or not diagonal]
        want = [(qp, kp) for qp in q_pos.tolist() for kp in range(qp + 1)]
        assert sorted(seen) == sorted(want), f"rank {r}"


@pytest.mark.parametrize("cp", [2, 4, 16])
def test_zigzag_balances_the_causal_work(cp):
    s = 8 * cp
    # a query at position p attends p + 1 keys: count it directly from the positions
    direct = lambda layout: [sum(p + 1 for p in local_positions(s, r, cp, layout).tolist())
                             for r in range(cp)]
    zig, naive = attention_work(s, cp, zigzag_chunks), attention_work(s, cp, contiguous_chunks)
    assert zig == direct(zigzag_chunks) and naive == direct(contiguous_chunks)
    assert zig == [s * (s + 1) // 2 // cp] * cp           # perfectly balanced
    # by hand: rank r of the naive split holds chunks 2r, 2r+1 of length c; its queries see
    # 4r + 1 whole earlier chunks and two causal diagonals of c(c+1)/2 scores
    c = s // (2 * cp)
    assert naive == [(4 * r + 1) * c * c + c * (c + 1) for r in range(cp)]


# ------------------------------------------------------------------ the attention alone
# (b, chunk length, query heads, KV heads, head dim): MHA, GQA, MQA, odd lengths
CASES = [(1, 1, 1, 1, 2), (2, 3, 4, 4, 8), (1, 4, 8, 2, 8), (2, 5, 6, 1, 4)]


def _ulysses_fits(cp, hq, hkv):
    """The heads Ulysses can share out: query heads divisible by cp, KV heads too or
    replicable (cp a multiple of them)."""
    return hq % cp == 0 and (hkv % cp == 0 or cp % hkv == 0)


def _wire_formula(impl, cp, b, s, hq, hkv, d):
    """What the formulas say one rank sends for one attention, forward and backward."""
    if impl == "ulysses":
        heads = ulysses_kv_heads(hkv, cp)
        return ulysses_layer_bytes(cp_kv_bytes(b * s // cp, heads, d, 4), cp, hq // heads)
    return cp_hops(cp, impl) * cp_kv_bytes(b * s // cp, hkv, d, 4)


def _attention_cases(cp):
    """On each rank: every case, every implementation (and the ring on the naive layout),
    forward and backward against full causal attention on one device."""
    grid = ProcessGrid(cp=cp, rank=dist.get_rank()).init_groups()
    axis, results = grid.cp, []
    for b, c, hq, hkv, d in CASES:
        s = 2 * cp * c
        g = torch.Generator().manual_seed(1000 * c + hq)
        q, k, v = (torch.randn(b, s, h, d, generator=g, requires_grad=True) for h in (hq, hkv, hkv))
        dout = torch.randn(b, s, hq, d, generator=g)
        want = causal_attention(q, k, v)
        want.backward(dout)
        impls = [("ring", zigzag_chunks), ("allgather", zigzag_chunks), ("ring", contiguous_chunks)]
        if _ulysses_fits(cp, hq, hkv):
            impls.append(("ulysses", zigzag_chunks))
        for name, layout in impls:
            pos = local_positions(s, axis.rank, cp, layout)
            ql, kl, vl = (t.detach()[:, pos].clone().requires_grad_() for t in (q, k, v))
            comm.LOG.reset()
            out = CORES[name](ql, kl, vl, axis, layout=layout)
            out.backward(dout[:, pos])
            results.append({
                "case": (name, layout.__name__, b, s, hq, hkv, d),
                "pairs": [(out, want[:, pos]), (ql.grad, q.grad[:, pos]),
                          (kl.grad, k.grad[:, pos]), (vl.grad, v.grad[:, pos])],
                "wire": wire_bytes_of("cp"),
                "want_wire": _wire_formula(name, cp, b, s, hq, hkv, d)})
    return results


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_attention_matches_full_causal_attention(cp):
    for rank, results in enumerate(launch.run_local(_attention_cases, cp, cp)):
        for res in results:
            for what, (got, want) in zip(("out", "dq", "dk", "dv"), res["pairs"]):
                torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-5,
                                           msg=lambda m: f"rank {rank} {res['case']} {what}: {m}")
            # K/V sent as they are, GQA not expanded (but for Ulysses' replicas): the
            # block has hkv heads, not hq
            assert res["wire"] == res["want_wire"], res["case"]
        assert any(res["case"][0] == "ulysses" for res in results)


def _ring_events(cp):
    """The order in which one rank posts transfers, waits for them and computes blocks in
    ring attention's backward (`comm.ring_exchange` and `OnlineSoftmax.backprop` wrapped: this
    is a forked rank, the patch dies with it)."""
    grid = ProcessGrid(cp=cp, rank=dist.get_rank()).init_groups()
    events, real_pass, real_backprop = [], comm.ring_exchange, context.OnlineSoftmax.backprop

    def logged_pass(axis, *tensors):
        handle = real_pass(axis, *tensors)
        events.append("post")
        real_wait = handle.wait
        handle.wait = lambda: (events.append("wait"), real_wait())[1]
        return handle

    def logged_backprop(self, *args):
        events.append("compute")
        return real_backprop(self, *args)
    comm.ring_exchange, context.OnlineSoftmax.backprop = logged_pass, logged_backprop
    q, k, v = (torch.randn(1, 8, h, 4, requires_grad=True) for h in (4, 2, 2))
    out = ring_attention(q, k, v, grid.cp)
    events.clear()                       # the backward's events only
    out.sum().backward()
    return events


@pytest.mark.slow
def test_ring_backward_computes_every_block_with_a_transfer_in_flight():
    for events in launch.run_local(_ring_events, 3, 3):
        in_flight, computes = 0, []
        for e in events:
            in_flight += {"post": 1, "wait": -1, "compute": 0}[e]
            if e == "compute":
                computes.append(in_flight)
        assert len(computes) == 3 and in_flight == 0, events
        assert all(n > 0 for n in computes), events      # nothing computed while idle


def test_hop_counts_of_the_two_implementations():
    # by hand: ring = K/V forward (cp-1) + K/V again backward (cp-1) + dK/dV home (cp-1);
    # all-gather = (n-1)/n of n blocks forward, the same reduce-scattered backward
    for cp in (2, 4, 16):
        assert cp_hops(cp, "ring") == 3 * (cp - 1)
        assert cp_hops(cp, "allgather") == 2 * (cp - 1)
    assert cp_hops(1, "ring") == cp_hops(1, "allgather") == 0


def test_ulysses_bytes_by_hand():
    # q and the output are g/2 K/V blocks each: forward (cp-1)/cp (g + 1) B, backward again
    for cp, g in ((2, 1), (4, 2), (16, 8)):
        kv = 64 * cp
        assert ulysses_layer_bytes(kv, cp, g) == 2 * (cp - 1) * (g + 1) * kv // cp
        assert ulysses_layer_bytes(kv, cp, g, recompute="full") == 3 * (cp - 1) * (g + 1) * kv // cp
    assert ulysses_layer_bytes(64, 1, 2) == 0
    with pytest.raises(ValueError, match="ulysses_layer_bytes"):
        cp_hops(4, "ulysses")


def test_apply_context_parallel_replaces_every_core():
    m = apply_context_parallel(Transformer(TINY), Axis("cp", (0, 1), 0), impl="allgather")
    assert all(layer.self_attn.core.func is CORES["allgather"] for layer in m.layers.values())
    # an unknown implementation: `ParallelConfig` names the flag; a direct call, the key
    with pytest.raises(ValueError, match="--cp-impl 'flash'"):
        ParallelConfig(cp=2, cp_impl="flash").validate(TINY, 64, 8)
    with pytest.raises(KeyError, match="flash"):
        apply_context_parallel(m, Axis("cp", (0, 1), 0), impl="flash")


def test_single_rank_is_plain_causal_attention():
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    torch.testing.assert_close(ring_attention(q, k, v, Axis("cp", (0,), 0)), causal_attention(q, k, v))


# ------------------------------------------------------------------ activation memory
def saved_bytes(model, x, pos):
    """Bytes autograd keeps for the backward of one forward, weights and duplicates not
    counted (the same storage saved twice is held once)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            storages[st.data_ptr()] = st.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, pos)
    return sum(storages.values())


def _memory(cp, s, impl):
    grid = ProcessGrid(cp=cp, rank=dist.get_rank()).init_groups()
    x = torch.randint(0, TINY.vocab_size, (1, s))
    full = saved_bytes(Transformer(TINY), x, torch.arange(s))
    xl, _, pos = shard_for_context_parallel(x, x, grid.cp)
    return full, saved_bytes(apply_context_parallel(Transformer(TINY), grid.cp, impl), xl, pos)


@pytest.mark.slow
def test_context_parallel_divides_activation_memory():
    """Everything a layer keeps is per token, so a rank holding s/cp tokens keeps exactly 1/cp
    of it. The all-gather keeps the gathered K/V on top: 2 s hkv d values per layer instead of
    the ring's local 2 (s/cp) hkv d."""
    s, cp = 512, 2
    (full, ring), _ = launch.run_local(_memory, cp, cp, s, "ring")
    (_, gathered), _ = launch.run_local(_memory, cp, cp, s, "allgather")
    assert ring * cp == full
    kv = lambda tokens: 2 * tokens * TINY.n_kv_heads * TINY.head_dim * 4 * TINY.n_layers
    assert gathered - ring == kv(s) - kv(s // cp)


# ------------------------------------------------------------------ whole training runs
def _present(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# the layouts tested: (ParallelConfig fields, module they need beyond context.py)
LAYOUTS = {
    "cp2-ring": (dict(cp=2), None),
    "cp2-allgather": (dict(cp=2, cp_impl="allgather"), None),
    "cp4-ring": (dict(cp=4), None),
    "cp4-allgather": (dict(cp=4, cp_impl="allgather"), None),
    "cp2xdp2-ring-2micro": (dict(cp=2, dp=2, microbatches=2), None),
    "cp2xdp2-allgather-zero1": (dict(cp=2, dp=2, zero=1, cp_impl="allgather"), None),
    "cp2xtp2-ring-sp": (dict(cp=2, tp=2, sp=True), "minipar.trainer.parallel.tensor"),
    "cp2xtp2-allgather": (dict(cp=2, tp=2, cp_impl="allgather"), "minipar.trainer.parallel.tensor"),
    "cp2xpp2-ring": (dict(cp=2, pp=2, microbatches=2), "minipar.trainer.parallel.pipeline"),
    "cp2xpp2-allgather": (dict(cp=2, pp=2, microbatches=2, cp_impl="allgather"),
                          "minipar.trainer.parallel.pipeline"),
    "cp2-ulysses": (dict(cp=2, cp_impl="ulysses"), None),
    "cp4-ulysses": (dict(cp=4, cp_impl="ulysses"), None),
    "cp2xdp2-ulysses-2micro": (dict(cp=2, dp=2, microbatches=2, cp_impl="ulysses"), None),
    "cp2xtp2-ulysses-sp": (dict(cp=2, tp=2, sp=True, cp_impl="ulysses"), None),
    "cp2xpp2-ulysses": (dict(cp=2, pp=2, microbatches=2, cp_impl="ulysses"), None),
    "cp2xtp2-ring-sp-tp_overlap": (dict(cp=2, tp=2, sp=True, tp_overlap=True), None),
    "cp2xtp2-ulysses-sp-tp_overlap": (dict(cp=2, tp=2, sp=True, tp_overlap=True, cp_impl="ulysses"),
                                      None),
}


@functools.lru_cache(maxsize=None)
def _run(name):
    return run_layout(**LAYOUTS[name][0])


def _layout(name):
    kw, needs = LAYOUTS[name]
    if needs and not _present(needs):
        pytest.skip(f"{needs} does not exist yet")
    return kw, _run(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_loss_curve_as_one_device(name):
    _, out = _layout(name)
    assert_same_losses(out, reference())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_gradients_as_one_device_after_one_step(name):
    """Rank 0's gradients (summed over dp x cp) against the single device's, for every
    parameter it holds whole (a TP shard has another shape; test_tensor checks those)."""
    _, out = _layout(name)
    want = reference()["grads"]
    got = {k: g for k, g in out["grads"].items() if k in want and g.shape == want[k].shape}
    assert len(got) >= 3
    assert_close_grads(got, {k: want[k] for k in got}, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_measured_cp_bytes_match_the_formula(name):
    kw, out = _layout(name)
    dp, tp, micro = kw.get("dp", 1), kw.get("tp", 1), kw.get("microbatches", 1)
    # the layers rank 0 holds, counted from the names of its gradients
    layers = len({k.split(".")[1] for k in out["grads"] if k.startswith("layers.")})
    want = cp_wire_bytes_per_step(TINY, b=8 // dp // micro, s=32, cp=kw["cp"],
                                  impl=kw.get("cp_impl", "ring"), n_micro=micro, tp=tp,
                                  n_layers=layers)
    for rec in out["records"]:
        cp_ops = rec["comm"]["cp"]
        assert sum(op["wire_bytes"] for op in cp_ops.values()) == want, cp_ops


def test_cost_model_agrees_on_the_bytes():
    if not _present("minipar.costmodel"):
        pytest.skip("minipar.costmodel does not exist yet")
    from minipar.plan.costmodel import cp_kv_bytes, cp_layer_bytes
    for cp in (2, 4, 16):
        for impl in ("ring", "allgather"):
            tokens = 3 * 1024 // cp
            kv = cp_kv_bytes(tokens, TINY.n_kv_heads, TINY.head_dim, 4)
            assert cp_layer_bytes(kv, cp, impl) == cp_wire_bytes_per_step(
                TINY, b=3, s=1024, cp=cp, impl=impl, n_layers=1), (cp, impl)


# ------------------------------------------------------------------ the CLI refuses
@pytest.mark.parametrize("argv, rule", [(["--cp", "4", "--seq-len", "20"], "2*cp=8"),
                                        (["--cp", "3", "--seq-len", "32"], "2*cp=6")])
def test_cli_refuses_a_sequence_not_divisible_by_two_cp(argv, rule, capsys):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--cp {argv[1]}" in err and rule in err, err


@pytest.mark.parametrize("argv, rule", [
    (["--cp", "4", "--tp", "4", "--cp-impl", "ulysses"], "n_heads=8 divisible by cp*tp=16"),
    (["--cp", "3", "--seq-len", "36", "--cp-impl", "ulysses"], "n_heads=8 divisible by cp*tp=3")])
def test_cli_refuses_heads_ulysses_cannot_share_out(argv, rule, capsys):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cp-impl ulysses" in err and rule in err, err


def test_ulysses_kv_heads_replicated_only_when_cp_is_a_multiple():
    six_kv = ModelConfig(dim=96, n_heads=12, n_kv_heads=6, ffn_dim=192, vocab_size=264)
    assert ParallelConfig(cp=3, cp_impl="ulysses").problems(six_kv, 48, 8) == []
    assert ParallelConfig(cp=2, tp=3, cp_impl="ulysses").problems(six_kv, 48, 8) == []  # kv 2
    bad = ParallelConfig(cp=4, cp_impl="ulysses").problems(six_kv, 48, 8)
    assert len(bad) == 1 and "KV heads per TP rank (6)" in bad[0], bad
    assert ulysses_kv_heads(2, 4) == 4 and ulysses_kv_heads(4, 2) == 4
