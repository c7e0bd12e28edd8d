"""Checkpoints: resume in the same layout continues the exact curve, in another layout the
same curve within float32 tolerance; writes are atomic; a bad checkpoint is named.

The first tests need no processes: every rank of a layout is built in this one process
(the model's weights are a pure function of names and seed), so what `shard_entries` saves
can be reassembled and compared with the reference model, and cut again for another layout
and compared with what that layout builds itself. Then real worlds: a few checkpoints are
saved once (module fixtures) and resumed in several layouts.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from collections import defaultdict

import pytest
import torch

from helpers import losses, max_rel_diff
from minipar.runtime import checkpoint, launch
from minipar.runtime.checkpoint import CheckpointError
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.plan.formulas.failures import daly_interval, expected_waste, young_interval
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import Transformer
from minipar.trainer.parallelize import data_parallel
from minipar.trainer.parallel.zero import FlatShards
from minipar.plan.config import TrainConfig
from minipar.runtime.run import main, train

try:
    from minipar.trainer.parallel import tensor as _tensor
    HAVE_TP = True
except ImportError:
    HAVE_TP = False
try:
    from minipar.trainer.parallel import pipeline as _pipeline
    HAVE_PP = True
except ImportError:
    HAVE_PP = False
try:
    from minipar.trainer.parallel import context as _context
    HAVE_CP = True
except ImportError:
    HAVE_CP = False

needs_tp = pytest.mark.skipif(not HAVE_TP, reason="minipar/trainer/parallel/tensor.py not there yet")
needs_tp_pp_cp = pytest.mark.skipif(not (HAVE_TP and HAVE_PP and HAVE_CP),
                                    reason="tensor/pipeline/context parallelism not there yet")

TINY = ModelConfig.preset("tiny")
STEPS = 6          # every run below trains these steps (or resumes into them)


# =================================================== no processes: every rank built here
def virtual_rank(tp: int, dp: int, zero: int, rank: int, seed: int = 0):
    """What rank `rank` of a (tp, dp) layout builds, without any process group."""
    grid = ProcessGrid(tp=tp, dp=dp, rank=rank)
    model = Transformer(TINY, seed=seed)
    if tp > 1:
        from minipar.trainer.parallel.tensor import apply_tensor_parallel
        model = apply_tensor_parallel(model, grid.tp)
    dp_ = data_parallel([model], grid, ParallelConfig(tp=tp, dp=dp, zero=zero, bucket_mb=0.01))
    optimizer = torch.optim.AdamW([x for x, _ in dp_.optimizer_params()])
    return [model], dp_, optimizer, grid


def entries_of_layout(tp, dp, zero):
    """Everything a layout's ranks save, grouped by parameter name."""
    by_name = defaultdict(list)
    for r in range(tp * dp):
        parts, dp_, optimizer, grid = virtual_rank(tp, dp, zero, r)
        for e in checkpoint.shard_entries(parts, dp_, optimizer, grid, TINY):
            by_name[e["name"]].append(e)
    return by_name


LAYOUTS = [(1, 1, 0), (1, 2, 0), (1, 4, 1), (1, 2, 3)] + \
          ([(2, 1, 0), (2, 2, 1), (4, 1, 0), (2, 2, 3)] if HAVE_TP else [])


@pytest.mark.parametrize("tp,dp,zero", LAYOUTS, ids=[f"tp{t}-dp{d}-zero{z}" for t, d, z in LAYOUTS])
def test_saved_slices_reassemble_the_reference_weights_each_saved_once(tp, dp, zero):
    reference = dict(Transformer(TINY, seed=0).named_parameters())
    by_name = entries_of_layout(tp, dp, zero)
    assert by_name.keys() == reference.keys()
    for name, entries in by_name.items():
        # saved once: the slices' sizes add up to the tensor's, no copies of replicas
        assert sum(e["stop"] - e["start"] for e in entries) == reference[name].numel(), name
        torch.testing.assert_close(checkpoint.full_tensor(entries), reference[name].detach(),
                                   rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


PAIRS = [((1, 2, 3), (1, 4, 1)), ((1, 4, 1), (1, 1, 0))] + \
        ([((2, 2, 1), (4, 1, 0)), ((4, 1, 0), (2, 2, 3)), ((2, 2, 3), (1, 2, 0))] if HAVE_TP else [])


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{s}->{d}" for s, d in PAIRS])
def test_restore_cuts_slices_exactly_as_the_new_layout_does(src, dst):
    """Save from one layout built with seed 1, restore into another built with seed 0: every
    rank must end up holding exactly what the new layout builds from seed 1."""
    saved = defaultdict(list)
    tp, dp, zero = src
    for r in range(tp * dp):
        parts, dp_, optimizer, grid = virtual_rank(tp, dp, zero, r, seed=1)
        for e in checkpoint.shard_entries(parts, dp_, optimizer, grid, TINY):
            saved[e["name"]].append(e)
    tp, dp, zero = dst
    for r in range(tp * dp):
        parts, dp_, optimizer, grid = virtual_rank(tp, dp, zero, r, seed=0)
        want, want_dp, _, _ = virtual_rank(tp, dp, zero, r, seed=1)
        with torch.no_grad():
            for name, p in checkpoint.named_params(parts, TINY):
                checkpoint._restore(p, saved[name], dp_, optimizer, grid)
        for (name, p), (_, q) in zip(checkpoint.named_params(parts, TINY),
                                     checkpoint.named_params(want, TINY)):
            got, exp = dp_.shard_of(p).data, want_dp.shard_of(q).data
            assert torch.equal(got, exp), f"rank {r} {name}"
            if zero in (1, 2):     # the whole parameter too, not only this rank's piece
                assert torch.equal(p.data, q.data), f"rank {r} {name} (full)"


def test_full_tensor_names_a_missing_slice():
    x = torch.arange(10.0)
    layout = FlatShards([x.shape], 3)
    entries = []
    for r in (0, 2):                 # rank 1's piece is lost
        a, b = layout.piece_range(0, r)
        entries.append({"name": "w", "shape": [10], "start": a, "stop": b, "tp_dim": None,
                        "tp_rank": 0, "tp_size": 1, "param": x[a:b]})
    with pytest.raises(CheckpointError, match="w: 4 of its elements"):
        checkpoint.full_tensor(entries)


# =================================================== real worlds
def run(steps=STEPS, **kw) -> dict:
    train_fields = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(parallel=ParallelConfig(**kw), steps=steps, progress=False, timeout_s=60,
                      **train_fields)
    return train(cfg)


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted single-device curve every resumed run is compared with."""
    return losses(run())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tp2 x dp2, ZeRO-1 (or dp2 without TP), checkpoints at steps 2, 4 and 6."""
    root = str(tmp_path_factory.mktemp("ckpt") / "run")
    layout = dict(tp=2, dp=2, zero=1) if HAVE_TP else dict(dp=2, zero=1)
    out = run(save=root, save_every=2, **layout)
    return root, layout, losses(out)


@pytest.mark.slow
def test_save_writes_a_complete_manifest_and_latest(saved):
    root, layout, _ = saved
    names = sorted(os.listdir(root))
    assert names == [".minipar", "latest", "step_000002", "step_000004", "step_000006"]   # no .tmp
    assert checkpoint.latest(root) == os.path.join(root, "step_000006")
    step_dir = os.path.join(root, "step_000004")
    m = checkpoint.read_manifest(step_dir)
    assert m["step"] == 4 and m["world_size"] == 4
    assert {k: m["layout"][k] for k in layout} == layout
    assert ModelConfig(**m["model"]) == TINY
    assert sorted(os.listdir(step_dir)) == sorted([*m["files"], "manifest.json"])
    for name, info in m["files"].items():
        data = open(os.path.join(step_dir, name), "rb").read()
        assert info["bytes"] == len(data)
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
    history = [json.loads(x) for x in open(os.path.join(step_dir, "history.jsonl"))]
    assert [r["step"] for r in history] == [0, 1, 2, 3]


@pytest.mark.slow
def test_resume_in_the_same_layout_continues_the_exact_curve(saved):
    root, layout, curve = saved
    out = run(resume=os.path.join(root, "step_000002"), **layout)
    assert [r["step"] for r in out["records"]] == list(range(STEPS))
    assert losses(out) == curve          # bit for bit: same weights, same Adam state, same LR
    out = run(resume=root, **layout)     # its latest: step 6, nothing left to do
    assert losses(out) == curve


RESHARD = [dict(), dict(cp=2, dp=2, zero=3)]
if HAVE_TP and HAVE_PP:
    RESHARD.append(dict(tp=2, pp=2, microbatches=2, zero=2))


@pytest.mark.slow
@pytest.mark.parametrize("layout", RESHARD, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "single")
def test_resume_in_another_layout_continues_the_curve(saved, reference, layout):
    if layout.get("cp", 1) > 1 and not HAVE_CP:
        pytest.skip("minipar/trainer/parallel/context.py not there yet")
    root, _, _ = saved
    out = run(resume=os.path.join(root, "step_000004"), **layout)
    assert max_rel_diff(losses(out), reference) <= 1e-5


@pytest.mark.slow
@needs_tp_pp_cp
def test_tp2_pp2_resumes_at_dp2_cp2(tmp_path, reference):
    """The issue's example: saved at tp2 x pp2, resumed at dp2 x cp2."""
    root = str(tmp_path / "run")
    run(steps=3, save=root, tp=2, pp=2, microbatches=2)
    out = run(resume=root, dp=2, cp=2)
    assert max_rel_diff(losses(out), reference) <= 1e-5


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PP, reason="minipar/trainer/parallel/pipeline.py not there yet")
def test_tied_embeddings_saved_from_two_stages_resume_on_one(tmp_path, monkeypatch):
    """With tied embeddings the first stage's embedding and the last stage's head are one
    tensor: saved once, under one name, and read back by a model holding both."""
    from minipar.plan import config
    monkeypatch.setitem(config.PRESETS, "tied", dataclasses.replace(TINY, tie_embeddings=True))
    root = str(tmp_path / "run")
    reference = losses(run(steps=4, model="tied"))
    run(steps=2, model="tied", save=root, pp=2, microbatches=2)
    names = checkpoint.read_manifest(checkpoint.resolve(root))["files"]["rank_00001.pt"]["names"]
    assert "lm_head.weight" not in names and "embed_tokens.weight" not in names   # the head's copy: not saved
    out = run(steps=4, model="tied", resume=root)
    assert max_rel_diff(losses(out), reference) <= 1e-5


@pytest.mark.slow
def test_a_crash_during_a_save_leaves_the_last_good_checkpoint(tmp_path, reference, monkeypatch):
    root = str(tmp_path / "run")
    write_shard = checkpoint._write_shard

    def die_in_second_save(path, entries, grid):   # rank 1 wrote its file of step 4, then died
        info = write_shard(path, entries, grid)
        if grid.rank == 1 and os.path.basename(os.path.dirname(path)) == "step_000004.tmp":
            os._exit(1)
        return info
    # patched here, in the parent: the ranks forked by the launcher inherit it
    monkeypatch.setattr(checkpoint, "_write_shard", die_in_second_save)
    with pytest.raises(launch.RankFailed) as e:
        run(steps=5, save=root, save_every=2, dp=2)
    monkeypatch.undo()
    assert e.value.rank == 1
    assert checkpoint.latest(root) == os.path.join(root, "step_000002")
    assert not os.path.exists(os.path.join(root, "step_000004"))
    assert os.path.exists(os.path.join(root, "step_000004.tmp"))     # the half-written one
    # the last good one resumes, and saving step 4 again replaces the debris
    out = run(resume=root, save=root, save_every=2, dp=2)
    assert max_rel_diff(losses(out), reference) <= 1e-5
    assert sorted(os.listdir(root)) == [".minipar", "latest", "step_000002", "step_000004",
                                        "step_000006"]


# =================================================== bad checkpoints and flags
@pytest.fixture
def broken(saved, tmp_path):
    """A private copy of step 4 of the saved run, to break."""
    step_dir = str(tmp_path / "step_000004")
    shutil.copytree(os.path.join(saved[0], "step_000004"), step_dir)
    return step_dir, saved[1]


@pytest.mark.slow
def test_a_truncated_file_is_named_before_any_process_starts(broken, capsys):
    step_dir, _ = broken
    path = os.path.join(step_dir, "rank_00001.pt")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match=re.escape(path) + r" is \d+ bytes, the manifest says \d+ \(truncated"):
        checkpoint.check_resume(step_dir, TINY, STEPS)
    assert main(["--resume", step_dir, "--steps", str(STEPS), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert path in err and len(err.strip().splitlines()) == 1


def flip_a_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF                       # same size, one byte flipped
    open(path, "wb").write(bytes(data))


def refused_before_any_rank(argv, message, capsys, monkeypatch):
    """main(argv) exits 2 with one line holding `message`, and no rank ever started."""
    def refuse(*a, **k):
        raise AssertionError("a rank started")
    monkeypatch.setattr(launch, "run_local", refuse)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.undo()


@pytest.mark.slow
def test_a_corrupt_file_is_named_before_any_rank_starts(broken, capsys, monkeypatch):
    step_dir, layout = broken
    path = os.path.join(step_dir, "rank_00002.pt")
    flip_a_byte(path)
    with pytest.raises(CheckpointError, match=re.escape(path) + " is corrupt: its SHA-256"):
        checkpoint.check_resume(step_dir, TINY, STEPS)
    refused_before_any_rank(["--resume", step_dir, "--steps", str(STEPS)], f"{path} is corrupt",
                            capsys, monkeypatch)


@pytest.mark.slow
def test_a_rank_file_without_tensors_is_verified_too(broken, capsys, monkeypatch):
    """dp 2 without ZeRO: rank 1's copies do not count, its file holds no tensors and no
    rank reads it on resume; it is still checked against the manifest."""
    step_dir, _ = broken
    manifest_path = os.path.join(step_dir, "manifest.json")
    m = json.load(open(manifest_path))
    m["files"]["rank_00003.pt"]["names"] = []          # as a rank holding nothing lists it
    json.dump(m, open(manifest_path, "w"))
    flip_a_byte(os.path.join(step_dir, "rank_00003.pt"))
    refused_before_any_rank(["--resume", step_dir, "--steps", str(STEPS)],
                            "rank_00003.pt is corrupt", capsys, monkeypatch)


def test_damaged_manifests_and_pointers_are_one_line(tmp_path, capsys, monkeypatch):
    """Binary garbage, a JSON list, a manifest without `files`, a `latest` of garbage:
    each a CheckpointError naming the file, never a UnicodeDecodeError or KeyError."""
    good = {"format": checkpoint.FORMAT, "step": 2, "world_size": 1, "layout": {},
            "model": dataclasses.asdict(TINY), "train": {}, "files": {}}
    cases = {"garbage": bytes(range(256)) * 4, "list": b"[1, 2, 3]",
             "nofiles": json.dumps({k: v for k, v in good.items() if k != "files"}).encode(),
             "badentry": json.dumps({**good, "files": {"rank_00000.pt": 7}}).encode()}
    expect = {"garbage": "is unreadable", "list": "holds a JSON list",
              "nofiles": "`files` is missing", "badentry": "lacks bytes or sha256"}
    for name, data in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "manifest.json").write_bytes(data)
        with pytest.raises(CheckpointError, match=re.escape(expect[name])):
            checkpoint.check_resume(str(d), TINY, STEPS)
        refused_before_any_rank(["--resume", str(d)], str(d / "manifest.json"), capsys, monkeypatch)
    root = tmp_path / "save"
    root.mkdir()
    (root / "latest").write_bytes(b"\xff\xfe\x00garbage")
    refused_before_any_rank(["--resume", str(root)], f"checkpoint pointer {root / 'latest'}",
                            capsys, monkeypatch)


@pytest.mark.slow
def test_resume_refuses_another_meaning_unless_allowed(saved, tmp_path, capsys, monkeypatch):
    """seq-len, global batch, data and seed decide which tokens a step reads: changing one
    on resume splices two runs. Refused, unless --resume-allow-change; then the log says."""
    root, layout, _ = saved
    step2 = os.path.join(root, "step_000002")
    text = tmp_path / "t.txt"
    text.write_text("abcdefgh" * 100)
    for argv, said in [(["--seq-len", "16"], "--seq-len 32 (now 16)"),
                       (["--global-batch", "4"], "--global-batch 8 (now 4)"),
                       (["--seed", "1"], "--seed 0 (now 1)"),
                       (["--data", str(text)], "--data None (now sha256:")]:
        refused_before_any_rank(["--resume", step2, *argv], said, capsys, monkeypatch)
    log = tmp_path / "log.jsonl"
    argv = ["--resume", step2, "--seed", "1", "--resume-allow-change", "--steps", "3",
            "--dp", "2", "--no-progress", "--log-json", str(log)]
    assert main(argv) == 0
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2]["resume"] == {"from": step2, "step": 2, "changed": {"--seed": [0, 1]}}
    assert "resume" not in rows[1]


@pytest.mark.slow
def test_missing_files_and_manifests_and_other_models_are_named(broken):
    step_dir, _ = broken
    with pytest.raises(CheckpointError, match="another model: n_layers=8 \\(now 4\\)"):
        checkpoint.check_resume(step_dir, ModelConfig(n_layers=4), STEPS)
    with pytest.raises(CheckpointError, match="at step 4, beyond --steps 3"):
        checkpoint.check_resume(step_dir, TINY, 3)
    os.remove(os.path.join(step_dir, "rng.pt"))
    with pytest.raises(CheckpointError, match=re.escape(os.path.join(step_dir, "rng.pt")) + " is missing"):
        checkpoint.check_resume(step_dir, TINY, STEPS)
    open(os.path.join(step_dir, "manifest.json"), "w").write('{"format": ')
    with pytest.raises(CheckpointError, match="manifest.json is unreadable"):
        checkpoint.check_resume(step_dir, TINY, STEPS)


def _bad_flags(tmp):
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty, exist_ok=True)
    afile = os.path.join(tmp, "a_file")
    open(afile, "w").close()
    return [
        (["--save-every", "2"], "--save-every 2 needs --save DIR"),
        (["--save", empty, "--save-every", "-1"], "--save-every -1 must be >= 0"),
        (["--save", afile], f"--save {afile} is a file, not a directory"),
        (["--resume", "/no/such/dir"], "--resume /no/such/dir: no such directory"),
        (["--resume", empty], f"--resume {empty}: no checkpoint there"),
        (["--max-restarts", "1"], "--max-restarts 1 needs --save DIR"),
        (["--max-restarts", "-1"], "--max-restarts -1 must be >= 0"),
        (["--fail-rank", "1"], "--fail-rank 1 needs --fail-at-step K"),
        (["--fail-at-step", "10", "--steps", "10"], "--fail-at-step 10 must be a step of the run: 0..9"),
        (["--fail-at-step", "1", "--fail-rank", "2", "--dp", "2"],
         "--fail-rank 2 is not a rank of this layout (0..1)"),
    ]


def test_bad_checkpoint_and_fault_flags_exit_2_with_one_line(tmp_path, capsys):
    for argv, message in _bad_flags(str(tmp_path)):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


# =================================================== how often to save
@pytest.mark.parametrize("mtbf,write", [(1000.0, 5.0), (11_134.0, 24.0), (11_134.0, 300.0)])
def test_young_and_daly_intervals(mtbf, write):
    import numpy as np
    taus = np.linspace(1.0, 20 * math.sqrt(2 * write * mtbf), 400_001)
    # Young's tau minimises the first-order waste ...
    first_order = [expected_waste(t, write, mtbf) for t in taus[::100]]
    best = taus[::100][int(np.argmin(first_order))]
    assert abs(best / young_interval(write, mtbf) - 1) < 2e-3
    # ... and Daly's the exact one: with exponential failures, an interval of tau followed by
    # a write needs on average mtbf * (exp((tau + write) / mtbf) - 1) of wall-clock time
    exact = mtbf * np.expm1((taus + write) / mtbf) / taus
    best = taus[int(np.argmin(exact))]
    assert abs(best / daly_interval(write, mtbf) - 1) < 1e-3
