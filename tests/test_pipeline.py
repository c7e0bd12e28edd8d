"""Pipeline parallelism on real ranks: the p2p plan, the split backward, the stages, and
training against the single device with every schedule.

Expected values come from the single-device run, from plain autograd, or from the rules
of the schedules themselves (a micro-batch's F before its B, m in flight for afab, <= p for
1F1B), never from the executor under test.
"""
from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

import pytest
import torch

from minipar.plan.config import PRESETS, ModelConfig, ParallelConfig
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer, cross_entropy_sum
from minipar.plan import traces
from minipar.plan.schedules import split_layers
from minipar.trainer.parallel.pipeline import boundary_shape, build_stage_modules
from minipar.plan.schedule_analysis import check_p2p_plan, peak_in_flight, pipeline_events
from minipar.plan.schedules import Message, inputs_of, make_schedule, outputs_of, p2p_plan
from minipar.trainer.parallel.zero_bubble import backward_input, backward_weight
from minipar.runtime.run import main

from helpers import STEPS, assert_same_losses, reference, run_layout, shard_dim

TINY = ModelConfig.preset("tiny")


def schedules_grid():
    for p in (2, 3, 4, 5):
        for m in range(1, 10):
            for name in ("afab", "1f1b", "zb"):
                yield name, p, m, 1
            if m % p == 0:
                for v in (2, 3):
                    yield "interleaved", p, m, v


GRID = list(schedules_grid())


# ------------------------------------------------------------------ pure: the p2p plan
@pytest.mark.parametrize("name,p,m,v", GRID[::3] + [("interleaved", 2, 4, 2)])
def test_plan_runs_each_rank_s_actions_in_schedule_order(name, p, m, v):
    schedule = make_schedule(name, p, m, v)
    for r, program in enumerate(p2p_plan(schedule)):
        assert [x for kind, x in program if kind == "compute"] == schedule[r]


def test_plan_receives_before_use_and_sends_after_production():
    for name, p, m, v in GRID:
        schedule = make_schedule(name, p, m, v)
        for r, program in enumerate(p2p_plan(schedule)):
            received, done = set(), set()
            for kind, x in program:
                if kind == "recv":
                    assert x.dst_stage % p == r, (name, p, m, v, r, x)
                    received.add(x)
                elif kind == "send":
                    assert x.src_stage % p == r and x in done, (name, p, m, v, r, x)
                else:
                    assert all(msg in received for msg in inputs_of(x, r, p, p * v))
                    done.update(outputs_of(x, r, p, p * v))
            # every message this rank produced is sent, every one it needs received
            assert {x for kind, x in program if kind == "send"} == done


def test_plan_cannot_deadlock_even_if_sends_block_until_received():
    # the strictest transport (a rendezvous, like NCCL's send/recv): each op waits for its
    # partner; the plan must still finish, for every schedule
    for name, p, m, v in GRID:
        check_p2p_plan(p2p_plan(make_schedule(name, p, m, v)))


def test_the_rendezvous_check_catches_a_bad_order():
    plan = p2p_plan(make_schedule("1f1b", 2, 2))
    # rank 1 receiving micro-batch 1 before micro-batch 0 never matches rank 0's sends
    r1 = plan[1]
    i, j = [k for k, (kind, _) in enumerate(r1) if kind == "recv"][:2]
    r1[i], r1[j] = r1[j], r1[i]
    with pytest.raises(RuntimeError, match="deadlocks"):
        check_p2p_plan(plan)


def test_message_tags_are_unique_within_a_step():
    p, m, v = 2, 4, 2          # the case where one pair of ranks carries both directions
    msgs = {x for program in p2p_plan(make_schedule("interleaved", p, m, v))
            for kind, x in program if kind != "compute"}
    # an activation and a gradient for each micro-batch across each of the p*v-1 boundaries
    assert len({x.tag(m) for x in msgs}) == len(msgs) == 2 * m * (p * v - 1)
    assert Message("act", 1, 2).dst_stage == 3 and Message("grad", 1, 2).dst_stage == 1


# ------------------------------------------------------------------- pure: the stages
@pytest.mark.parametrize("p,v", [(2, 1), (4, 1), (2, 2), (4, 2), (8, 1)])
def test_stages_hold_every_layer_once_with_the_reference_weights(p, v):
    full = dict(Transformer(TINY, seed=3).named_parameters())
    pcfg = ParallelConfig(pp=p, virtual_stages=v, schedule="interleaved" if v > 1 else "1f1b")
    seen = {}
    for r in range(p):
        parts = build_stage_modules(TINY, pcfg, ProcessGrid(pp=p, rank=r), seed=3)
        assert len(parts) == v
        for c, chunk in enumerate(parts):
            stage = c * p + r
            assert list(chunk.layers) == [str(i) for i in split_layers(TINY.n_layers, p * v)[stage]]
            assert (chunk.embed_tokens is not None) == (stage == 0)
            assert (chunk.lm_head is not None) == (stage == p * v - 1)
            for name, w in chunk.named_parameters():
                assert name not in seen, name
                seen[name] = w
    assert seen.keys() == full.keys()
    for name, w in full.items():
        assert torch.equal(seen[name], w), name


def test_boundary_shape_follows_cp_and_sp():
    assert boundary_shape(2, 16, 64, ParallelConfig()) == (2, 16, 64)
    assert boundary_shape(2, 16, 64, ParallelConfig(tp=4, sp=True)) == (2, 4, 64)
    assert boundary_shape(2, 16, 64, ParallelConfig(tp=4)) == (2, 16, 64)


# ------------------------------------------------------- pure: zero-bubble's B and W
@pytest.mark.parametrize("first,last", [(False, False), (True, False), (False, True)])
def test_split_backward_equals_one_backward(first, last):
    torch.manual_seed(0)
    stage = Transformer(TINY, layer_ids=range(2, 4), first=first, last=last, seed=0)
    x = torch.randint(0, TINY.vocab_size, (2, 8)) if first else torch.randn(2, 8, TINY.dim)
    y = torch.randint(0, TINY.vocab_size, (2, 8))
    dout = None if last else torch.randn(2, 8, TINY.dim)

    def forward():
        # returns the stage output (or loss) and the tensor B differentiates: the stage
        # input, or on the first stage the embedding's output
        inp = x if first else x.clone().requires_grad_()
        seen = {}
        if first:
            hook = stage.embed_tokens.register_forward_hook(lambda m, a, o: seen.setdefault("h", o))
        out = stage(inp)
        if first:
            hook.remove()
        return (cross_entropy_sum(out, y) / 16 if last else out), (seen["h"] if first else inp)

    out, inp = forward()
    torch.autograd.backward(out, dout)
    want = {n: w.grad.clone() for n, w in stage.named_parameters()}
    want_input = None if first else inp.grad.clone()

    stage.zero_grad(set_to_none=True)
    fired = []
    for w in stage.parameters():
        w.register_post_accumulate_grad_hook(fired.append)
    out, boundary = forward()
    d_input, work = backward_input(out, dout, boundary, list(stage.parameters()))
    assert all(w.grad is None for w in stage.parameters()), "B must not touch weight grads"
    if not first:
        torch.testing.assert_close(d_input, want_input, rtol=0, atol=0)
    backward_weight(work)
    assert len(fired) == len(want), "each weight's gradient accumulated exactly once"
    for n, w in stage.named_parameters():
        torch.testing.assert_close(w.grad, want[n], rtol=1e-6, atol=1e-8, msg=n)


def test_the_activation_meter_counts_activations_not_weights():
    from minipar.trainer.memory_meter import ActivationMeter
    lin = torch.nn.Linear(8, 16, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    with ActivationMeter() as saved:
        h = lin(x)                    # saves x (and the weight, not counted)
        y = torch.relu(h)             # saves its output, 4 x 16
        assert saved.current == x.numel() * 4 + 4 * 16 * 4
    del y


# ---------------------------------------------------------- real ranks: the runs
def trained(**kw):
    """One world per layout, shared by the tests that look at it."""
    return _trained(tuple(sorted(kw.items())))


@functools.lru_cache(maxsize=None)
def _trained(items):
    kw = dict(items)
    path = kw.pop("trace_path")
    out = run_layout(profile=path, **kw)
    out["trace"] = pipeline_events(traces.load(path))
    return out


PIPELINES = [  # (pp, schedule, microbatches, virtual stages)
    (2, "afab", 4, 1), (2, "1f1b", 4, 1), (2, "interleaved", 4, 2), (2, "zb", 4, 1),
    (4, "afab", 4, 1), (4, "1f1b", 8, 1), (4, "interleaved", 4, 2), (4, "zb", 8, 1),
]


def _run(tmp_path_factory, pp, schedule, m, v, **more):
    path = str(tmp_path_factory.getbasetemp() / f"trace-{pp}-{schedule}-{m}-{v}-{sorted(more)}")
    return trained(pp=pp, schedule=schedule, microbatches=m, virtual_stages=v, trace_path=path,
                   **more)


def _grads_by_name(result):
    out = {}
    for res in result["all"]:
        for name, g in res["grads"].items():
            out.setdefault(name, []).append((res["coords"], g))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pp,schedule,m,v", PIPELINES)
def test_pipeline_matches_single_device(tmp_path_factory, pp, schedule, m, v):
    ref = reference(steps=STEPS)
    out = _run(tmp_path_factory, pp, schedule, m, v)
    assert_same_losses(out, ref)
    norms = [r["grad_norm"] for r in out["records"]]
    want = [r["grad_norm"] for r in ref["records"]]
    assert norms == pytest.approx(want, rel=1e-5)
    grads = _grads_by_name(out)
    assert grads.keys() == ref["grads"].keys()      # every weight lives on exactly one stage
    for name, held in grads.items():
        assert len(held) == 1, name
        torch.testing.assert_close(held[0][1], ref["grads"][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("pp,schedule,m,v", PIPELINES)
def test_trace_is_the_schedule_in_time(tmp_path_factory, pp, schedule, m, v):
    events = _run(tmp_path_factory, pp, schedule, m, v)["trace"]
    sched = make_schedule(schedule, pp, m, v)
    assert {e["step"] for e in events} == set(range(STEPS))
    for e in events:
        assert {"rank", "kind", "microbatch", "chunk", "start", "end"} <= e.keys()
        assert 0 <= e["start"] < e["end"]
    step = [e for e in events if e["step"] == STEPS - 1]
    end = {}
    for r in range(pp):
        mine = sorted((e for e in step if e["rank"] == r), key=lambda e: e["start"])
        assert [(e["kind"], e["microbatch"], e["chunk"]) for e in mine] == \
            [(a.kind, a.microbatch, a.chunk) for a in sched[r]]
        assert all(a["end"] <= b["start"] for a, b in zip(mine, mine[1:])), "overlapping actions"
        end.update({(e["kind"], e["microbatch"], e["chunk"] * pp + r): e for e in mine})
    # across ranks: a stage's F starts after the previous stage's F ended; B after the next B
    last = pp * v - 1
    for (kind, mb, s), e in end.items():
        if kind == "F" and s > 0:
            assert e["start"] >= end[("F", mb, s - 1)]["end"]
        if kind == "B" and s < last:
            assert e["start"] >= end[("B", mb, s + 1)]["end"]


@pytest.mark.slow
def test_consecutive_microbatches_reach_the_executor(tmp_path_factory):
    """--consecutive-microbatches 3 on --pp 2: three micro-batches (not a multiple of pp) go
    through each chunk as one group, Llama 3's tunable N. The ranks run that schedule's
    order, and learn what one device learns."""
    out = _run(tmp_path_factory, 2, "interleaved", 3, 2, consecutive_microbatches=3,
               global_batch=6)
    assert_same_losses(out, reference(steps=STEPS, global_batch=6))
    sched = make_schedule("interleaved", 2, 3, 2, consecutive=3)
    step = [e for e in out["trace"] if e["step"] == STEPS - 1]
    for r in range(2):
        mine = sorted((e for e in step if e["rank"] == r), key=lambda e: e["start"])
        assert [(e["kind"], e["microbatch"], e["chunk"]) for e in mine] == \
            [(a.kind, a.microbatch, a.chunk) for a in sched[r]]


@pytest.mark.slow
@pytest.mark.parametrize("pp,schedule,m,v", PIPELINES)
def test_peak_in_flight_measured_by_the_executor(tmp_path_factory, pp, schedule, m, v):
    events = _run(tmp_path_factory, pp, schedule, m, v)["trace"]
    measured = [max(e["in_flight"] for e in events if e["rank"] == r) for r in range(pp)]
    release = "W" if schedule == "zb" else "B"     # zb keeps a stage's inputs until W
    assert measured == peak_in_flight(make_schedule(schedule, pp, m, v), release=release)
    if schedule == "afab":
        assert measured == [m] * pp                # every micro-batch held at the turn
    if schedule == "1f1b":
        assert max(measured) <= pp and measured[0] == min(pp, m)


@pytest.mark.slow
def test_activation_memory_afab_against_1f1b(tmp_path_factory):
    # the same micro-batches, so each held micro-batch costs the same bytes on a rank:
    # peak bytes must scale exactly with the peak number held (4 vs 2 on rank 0, p = 2)
    peaks = {}
    for schedule in ("afab", "1f1b"):
        events = _run(tmp_path_factory, 2, schedule, 4, 1)["trace"]
        peaks[schedule] = [max((e["in_flight"], e["activation_bytes"]) for e in events
                               if e["rank"] == r) for r in range(2)]
    for (n_a, b_a), (n_1, b_1) in zip(peaks["afab"], peaks["1f1b"]):
        assert b_a * n_1 == b_1 * n_a and b_a > b_1 > 0


@pytest.mark.slow
@pytest.mark.parametrize("schedule,zero", [("1f1b", 1), ("zb", 3), ("interleaved", 3)])
def test_pipeline_with_data_parallel_and_zero(tmp_path_factory, schedule, zero):
    ref = reference(steps=STEPS)
    # zb with ZeRO-3: W runs after a later forward has freed the weights; they are gathered again
    v = 2 if schedule == "interleaved" else 1
    out = _run(tmp_path_factory, 2, schedule, 2, v, dp=2, zero=zero, bucket_mb=0.01)
    assert_same_losses(out, ref)
    for name, held in _grads_by_name(out).items():
        assert len(held) == 2, name                      # one copy per DP rank
        for _, g in held:
            torch.testing.assert_close(g, ref["grads"][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_zero_bubble_with_tensor_parallel_and_sp(tmp_path_factory):
    ref = reference(steps=STEPS)
    out = _run(tmp_path_factory, 2, "zb", 2, 1, tp=2, sp=True)
    assert_same_losses(out, ref)
    for name, held in _grads_by_name(out).items():
        dim = shard_dim(name)
        for coords, g in held:
            want = ref["grads"][name]
            if dim is not None:
                want = want.chunk(2, dim=dim)[coords["tp"]]
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_interleaved_with_context_parallel(tmp_path_factory):
    pytest.importorskip("minipar.trainer.parallel.context")
    out = _run(tmp_path_factory, 2, "interleaved", 2, 2, cp=2)
    assert_same_losses(out, reference(steps=STEPS))


@pytest.fixture
def tied_preset(monkeypatch):
    # forked ranks inherit the parent's PRESETS, so a preset added here reaches them
    monkeypatch.setitem(PRESETS, "tiny-tied",
                        dataclasses.replace(TINY, tie_embeddings=True, name="tiny-tied"))
    return "tiny-tied"


@pytest.mark.slow
def test_tied_embeddings_stay_in_sync_across_first_and_last_stage(tied_preset):
    ref = run_layout(steps=3, model=tied_preset)
    out = run_layout(steps=3, model=tied_preset, pp=2, dp=2, zero=1, schedule="zb",
                     microbatches=2)
    assert_same_losses(out, ref)
    # clipping counts the shared matrix once: the same norm as one device
    assert [r["grad_norm"] for r in out["records"]] == \
        pytest.approx([r["grad_norm"] for r in ref["records"]], rel=1e-5)
    grads = _grads_by_name(out)
    want = ref["grads"]["embed_tokens.weight"]          # one parameter on one device
    for name in ("embed_tokens.weight", "lm_head.weight"):
        for _, g in grads[name]:
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-7, msg=name)


# --------------------------------------------------------------------- CLI errors
@pytest.mark.parametrize("argv,flag,rule", [
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "3", "--microbatches", "4"],
     "--virtual-stages 3", "exceeds n_layers=8"),
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "2"],
     "--microbatches (2)", "multiple of --pp 4"),
    (["--pp", "2", "--schedule", "1f1b", "--virtual-stages", "2"],
     "--virtual-stages 2", "needs --schedule interleaved"),
    (["--schedule", "interleaved", "--virtual-stages", "2"], "--virtual-stages 2", "needs --pp > 1"),
    (["--pp", "2", "--schedule", "gpipe"], "--schedule 'gpipe'", "unknown"),
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "6",
      "--consecutive-microbatches", "3"], "--consecutive-microbatches 3", "at least --pp 4"),
    (["--pp", "2", "--microbatches", "2", "--consecutive-microbatches", "2"],
     "--consecutive-microbatches 2", "only apply to --schedule interleaved"),
])
def test_cli_rejects_bad_pipelines(capsys, argv, flag, rule):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and rule in err, err


@pytest.mark.slow
def test_cli_exit_status(repo_root):
    proc = subprocess.run([sys.executable, "-m", "minipar.train", "--pp", "16"],
                          cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--pp 16" in proc.stderr and "n_layers=8" in proc.stderr
