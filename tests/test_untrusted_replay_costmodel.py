"""Issue 43, part C: `python -m minipar.replay` and the cost model take untrusted input.
Every bad flag, trace file or damaged data file ends as one line naming it (the flag, the
file and its field), exit 2 for the user's input and 1 for a damaged installation, no
traceback and nothing left behind; a trace is read with bounded memory; --json never
prints NaN; output to a closed pipe ends quietly (141, as a tool killed by SIGPIPE)."""
import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

from minipar.plan import replay as replay_mod, traces
from minipar.plan.costmodel import calibration, cli, constants, evaluate
from minipar.plan.costmodel.untrusted import DataError
from minipar.plan.pipes import CLOSED_PIPE_EXIT

DATA = constants.DATA


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One real --profile run (two steps, dp 2): its trace file."""
    from minipar.plan.config import ParallelConfig, TrainConfig
    from minipar.runtime.run import train
    path = tmp_path_factory.mktemp("untrusted") / "run"
    train(TrainConfig(parallel=ParallelConfig(dp=2), global_batch=8, steps=2, progress=False,
                      profile=str(path)))
    return traces.trace_path(path)


def _replay(capsys, *argv) -> tuple[int, str, str]:
    """`python -m minipar.replay ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        rc = replay_mod.main([str(a) for a in argv])
    except SystemExit as e:                  # argparse's exit on a malformed flag
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(rc, out, err, *names, code=2):
    assert rc == code, (rc, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for name in names:
        assert name in err, (name, err)


def _written(tmp_path, name, text: str | bytes):
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def _edited(recorded, tmp_path, edit):
    trace = json.loads(recorded.read_text())
    edit(trace["otherData"]["minipar"])
    return _written(tmp_path, "edited.json", json.dumps(trace))


# ------------------------------------------------------------------ the trace file
def test_a_garbage_trace_is_named(tmp_path, capsys):
    path = _written(tmp_path, "garbage.json", "garbage\n")
    _refused(*_replay(capsys, path), str(path), "not JSON")


def test_a_truncated_trace_is_named(recorded, tmp_path, capsys):
    path = _written(tmp_path, "cut.json", recorded.read_bytes()[:3000])
    _refused(*_replay(capsys, path), str(path), "truncated")


def test_an_empty_list_is_not_a_minipar_trace(tmp_path, capsys):
    path = _written(tmp_path, "list.json", "[]")
    _refused(*_replay(capsys, path), str(path), "otherData.minipar")


def test_an_empty_object_is_not_a_trace(tmp_path, capsys):
    path = _written(tmp_path, "object.json", "{}")
    _refused(*_replay(capsys, path), str(path), "traceEvents")


def test_a_foreign_perfetto_json_trace_is_named(tmp_path, capsys):
    foreign = {"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}
    path = _written(tmp_path, "foreign.json", json.dumps(foreign))
    _refused(*_replay(capsys, path), str(path), "otherData.minipar", "foreign")


def test_a_binary_perfetto_trace_is_named(tmp_path, capsys):
    path = _written(tmp_path, "proto.json", b"\x0a\x0b\x12\xff\xfe\x00")
    _refused(*_replay(capsys, path), str(path), "not UTF-8")


def test_a_json_file_named_gz_is_not_gzip(recorded, tmp_path, capsys):
    path = _written(tmp_path, "fake.json.gz", recorded.read_bytes())
    _refused(*_replay(capsys, path), str(path), "not a gzip file")


def test_a_truncated_gzip_is_named(recorded, tmp_path, capsys):
    path = _written(tmp_path, "cut.json.gz", gzip.compress(recorded.read_bytes())[:400])
    _refused(*_replay(capsys, path), str(path), "truncated")


def test_a_real_gzip_trace_replays(recorded, tmp_path, capsys):
    path = _written(tmp_path, "good.json.gz", gzip.compress(recorded.read_bytes()))
    rc, out, err = _replay(capsys, path, "--json")
    assert rc == 0, err
    assert json.loads(out)["step_time_s"] > 0


def test_a_2gb_trace_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:              # sparse: 2 GB on paper, nothing on disk
        f.truncate(2 * 10**9)
    monkeypatch.setattr(traces.json, "loads", lambda *a: pytest.fail("read a capped file"))
    _refused(*_replay(capsys, path), str(path), "2,000,000,000 bytes", traces.MAX_TRACE_ENV)


def test_a_gzip_is_decompressed_only_up_to_the_cap(recorded, tmp_path, capsys, monkeypatch):
    path = _written(tmp_path, "bomb.json.gz", gzip.compress(recorded.read_bytes()))
    monkeypatch.setenv(traces.MAX_TRACE_ENV, "0.01")     # 10 kB: the file is 20 kB unpacked
    read = []
    real = gzip.GzipFile.read
    monkeypatch.setattr(gzip.GzipFile, "read", lambda self, n=-1: read.append(n) or real(self, n))
    _refused(*_replay(capsys, path), str(path), "decompressed", "10,000 bytes")
    assert read == [10_001]                  # never read whole


def test_the_cap_can_be_raised_and_a_bad_cap_is_named(recorded, capsys, monkeypatch):
    monkeypatch.setenv(traces.MAX_TRACE_ENV, "1000")
    assert _replay(capsys, recorded)[0] == 0
    monkeypatch.setenv(traces.MAX_TRACE_ENV, "-1")
    _refused(*_replay(capsys, recorded), traces.MAX_TRACE_ENV)


@pytest.mark.parametrize("field, edit", [
    ("layout.tp", lambda m: m["layout"].update(tp="two")),
    ("layout.foo", lambda m: m["layout"].update(foo=1)),
    ("--tp 0", lambda m: m["layout"].update(tp=0)),
    ("ranks", lambda m: m["layout"].update(dp=4)),
    ("otherData.minipar.layout", lambda m: m.pop("layout")),
    ("model_shape.dim", lambda m: m["model_shape"].update(dim=None)),
    ("global_batch", lambda m: m.update(global_batch=-8)),
], ids=["type", "unknown-field", "rule", "ranks", "missing", "model", "batch"])
def test_edited_layout_metadata_is_named(recorded, tmp_path, capsys, field, edit):
    path = _edited(recorded, tmp_path, edit)
    _refused(*_replay(capsys, path), str(path), field)


def test_an_edited_event_is_named(recorded, tmp_path, capsys):
    trace = json.loads(recorded.read_text())
    i, e = next((i, e) for i, e in enumerate(trace["traceEvents"]) if e.get("cat") == "comm")
    del e["args"]["payload_bytes"]
    path = _written(tmp_path, "event.json", json.dumps(trace))
    _refused(*_replay(capsys, path), str(path), f"traceEvents[{i}]", "payload_bytes")


# ------------------------------------------------------------------ the flags
@pytest.mark.parametrize("step", ["99", "-5"])
def test_a_step_not_recorded_is_refused_with_the_range(recorded, capsys, step):
    _refused(*_replay(capsys, recorded, "--step", step), f"--step {step}", "steps 0 to 1")


def test_a_recorded_step_replays(recorded, capsys):
    assert _replay(capsys, recorded, "--step", "0")[0] == 0


@pytest.mark.parametrize("flag, value", [("--tp", "0"), ("--dp", "-2"), ("--seq-len", "-1"),
                                         ("--seq-len", "x")])
def test_counts_must_be_positive_integers(recorded, capsys, flag, value):
    _refused(*_replay(capsys, recorded, flag, value), flag, "positive integer")


def test_an_unknown_gpu_is_a_choice_refused(recorded, capsys):
    _refused(*_replay(capsys, recorded, "--gpu", "h900"), "--gpu", "h900")


def test_a_step_beyond_floating_point_is_refused(recorded, capsys):
    rc, out, err = _replay(capsys, recorded, "--seq-len", "1" + "0" * 160, "--json")
    _refused(rc, out, err, "floating point")


def test_the_replay_refuses_a_non_finite_result():
    with pytest.raises(replay_mod.ConfigError, match="step_time_s is inf"):
        replay_mod.finite({"step_time_s": float("inf"), "exposed_s": {"tp": 0.0}})


def test_an_out_under_a_file_is_refused_before_the_replay(recorded, tmp_path, capsys):
    blocker = _written(tmp_path, "file", "x")
    _refused(*_replay(capsys, recorded, "--out", blocker / "sub"), "--out", "not a directory")
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_an_out_that_cannot_be_written_leaves_nothing(recorded, tmp_path, capsys, monkeypatch):
    def full(self, text):
        self.write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(replay_mod.Path, "write_text", full)
    out = tmp_path / "a" / "b"
    _refused(*_replay(capsys, recorded, "--out", out), f"--out {out}", "No space left")
    assert os.listdir(tmp_path) == []


def test_the_replay_to_a_closed_pipe_ends_quietly(recorded):
    _closed_pipe([sys.executable, "-m", "minipar.replay", str(recorded), "--json"])


# ------------------------------------------------------------------ the cost model
def _costmodel(capsys, main, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("json_flag", [["--json"], []], ids=["json", "text"])
def test_an_absurd_peak_is_refused_naming_the_flag(capsys, json_flag):
    rc, out, err = _costmodel(capsys, cli.main, "--peak-tflops", "1e-320", *json_flag)
    _refused(rc, out, err, "--peak-tflops 1e-320", "finite")


def test_the_planner_refuses_an_absurd_peak(capsys):
    rc, out, err = _costmodel(capsys, cli.main, "plan", "--gpus", "64", "--preset", "llama3-8b",
                              "--peak-tflops", "1e-320")
    _refused(rc, out, err, "--peak-tflops 1e-320")


def test_the_estimate_json_is_strict_json(capsys):
    rc, out, _ = _costmodel(capsys, cli.main, "--json")
    assert rc == 0
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


@pytest.fixture
def kernels_copy(tmp_path, monkeypatch):
    """A copy of kernels_h200.json the cost model reads instead, to damage; the caches
    cleared before and after."""
    copy = tmp_path / "kernels_h200.json"
    shutil.copy(constants.KERNELS_FILE, copy)
    monkeypatch.setattr(constants, "KERNELS_FILE", copy)
    _clear_caches()
    yield copy
    _clear_caches()


def _clear_caches():
    """Every cached function of the cost model: what earlier tests computed from the real
    file (the GEMM curve, the constants' table) must not stand in for the damaged copy."""
    import minipar.plan.costmodel as pkg
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(pkg.__name__):
            for obj in vars(module).values():
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()


@pytest.mark.parametrize("damage", [
    lambda t: t[: len(t) // 2],
    lambda t: "garbage",
    lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "gemms"}),
    lambda t: t.replace('"s": ', '"s": "x", "_": ', 1),
], ids=["truncated", "garbage", "missing-key", "bad-number"])
def test_damaged_kernels_file_is_named_exit_1(kernels_copy, capsys, damage):
    kernels_copy.write_text(damage(kernels_copy.read_text()))
    rc, out, err = _costmodel(capsys, cli.main, "constants")
    _refused(rc, out, err, str(kernels_copy), "damaged", code=1)


@pytest.mark.parametrize("damage", [
    lambda t: t[: len(t) // 2] + "\x00\x01",
    lambda t: t.replace(",", ";"),
    lambda t: t + "llama3-405b,not,a,row\n",
], ids=["truncated", "wrong-separator", "short-row"])
def test_damaged_published_runs_are_named_exit_1(tmp_path, capsys, monkeypatch, damage):
    copy = tmp_path / "published_runs.csv"
    copy.write_text(damage(calibration.RUNS_FILE.read_text()))
    monkeypatch.setattr(evaluate, "published_runs", lambda: calibration.published_runs(copy))
    rc, out, err = _costmodel(capsys, evaluate.main)
    _refused(rc, out, err, str(copy), "damaged", code=1)


def test_every_data_loader_names_its_file(tmp_path):
    bad = _written(tmp_path, "bad.csv", "a,b\n1\n")
    for loader in (calibration.published_runs, calibration.heatmap_cells, calibration.nemo_runs,
                   calibration.playbook_runs, calibration.memory_rows):
        with pytest.raises(DataError, match="bad.csv"):
            loader(bad)


def test_evaluate_into_head_ends_quietly():
    _closed_pipe([sys.executable, "-m", "minipar.costmodel.evaluate"])


def test_the_estimate_into_a_closed_pipe_ends_quietly():
    _closed_pipe([sys.executable, "-m", "minipar.costmodel", "--json"])


def _closed_pipe(cmd):
    """`cmd | head -0`, deterministic: the pipe's read end is closed before the command
    writes. It ends with 141 (128 + SIGPIPE, a shell's status for a tool killed by the
    closed pipe) and nothing on stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == CLOSED_PIPE_EXIT, err
    assert err == b"", err
