"""Runs that go wrong in ways the user did not ask for (issue 43, part B): a resume from a
directory another run is saving into, restarts that cannot help, --skip-nonfinite on NaN
weights, writes that fail mid-run, --data that is not a file or shrinks under the run.
Each ends with one line naming the flag, file or step, its exit status, no traceback and
nothing of the user's lost or left half-written."""
from __future__ import annotations

import faulthandler
import json
import math
import os
import resource
import signal
from contextlib import contextmanager

import pytest

from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.plan.flags import PROG
from minipar.runtime import checkpoint, launch, run
from minipar.runtime.run import main, train
from minipar.trainer import step as step_module

pytestmark = pytest.mark.slow

QUIET = ["--no-progress", "--timeout-s", "60"]


def last_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines and "Traceback" not in err, err
    return lines[-1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A --save directory at step 3 (a checkpoint at every step), of a one-rank run."""
    root = str(tmp_path_factory.mktemp("saved") / "ckpt")
    train(TrainConfig(steps=3, save=root, save_every=1, progress=False))
    assert checkpoint.latest(root).endswith("step_000003")
    return root


@contextmanager
def alarm(seconds: int):
    """A call that would block forever fails the test instead."""
    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- 2. a resume reads `latest` once
def test_every_rank_loads_the_step_the_launcher_resolved(saved, monkeypatch):
    """`latest` moves (another run saves) after the launcher read it: every rank still
    loads the step the launcher named, and no rank reads `latest` at all."""
    original = launch.run_local

    def moved_then_run(*args, **kwargs):
        with open(os.path.join(saved, "latest"), "w") as f:
            f.write("step_000002\n")          # as if a run saved an older step meanwhile

        def no_rank_reads_latest(root):
            raise AssertionError("a rank read `latest` on its own")
        monkeypatch.setattr(checkpoint, "latest", no_rank_reads_latest)    # the forks inherit it
        return original(*args, **kwargs)
    monkeypatch.setattr(launch, "run_local", moved_then_run)
    try:
        out = train(TrainConfig(parallel=ParallelConfig(dp=2), steps=5, resume=saved,
                                progress=False),
                    after_backward=lambda step, *_: step)
    finally:
        with open(os.path.join(saved, "latest"), "w") as f:
            f.write("step_000003\n")
    assert [sorted(r["probes"]) for r in out["all"]] == [[3, 4], [3, 4]]
    assert out["records"][3]["resume"]["step"] == 3


@pytest.mark.parametrize("inside", [False, True], ids=["save-dir", "its-step-dir"])
def test_a_resume_from_a_directory_a_live_run_holds_is_refused(inside, tmp_path, capsys,
                                                               no_rank_may_start):
    root = tmp_path / "ckpt"
    (root / "step_000003").mkdir(parents=True)
    (root / "step_000003" / "manifest.json").write_text("{}")
    (root / "latest").write_text("step_000003\n")
    with checkpoint.claim(str(root)):          # a live run saving into it
        target = root / "step_000003" if inside else root
        assert main(["--resume", str(target), *QUIET]) == 2
    line = last_line(capsys.readouterr().err)
    assert f"--resume {target}" in line and "being written by a live run" in line
    assert f"pid {os.getpid()}" in line


# ---------------------------------------------------------------- 3. restarts that cannot help
def test_a_checkpoint_that_never_loads_is_not_restarted_a_thousand_times(saved, tmp_path, capsys,
                                                                         monkeypatch):
    def cannot_load(path, *args, **kwargs):
        raise checkpoint.CheckpointError(f"checkpoint file {path}/rank_00000.pt cannot be loaded")
    monkeypatch.setattr(checkpoint, "load", cannot_load)      # the forked ranks inherit it
    assert main(["--resume", saved, "--save", saved, "--steps", "5", "--max-restarts", "1000",
                 *QUIET]) == 1
    err = capsys.readouterr().err
    line = last_line(err)
    assert "failed twice at step 3" in line and "cannot be loaded" in line
    assert line.endswith("; not restarting")
    assert "restart 1/1000" in err and "restart 2/1000" not in err


def test_a_deterministic_fault_is_restarted_once_then_named(tmp_path, capsys, monkeypatch):
    step = step_module.Trainer.step

    def fails_at_3(self, i):
        if i == 3:
            raise RuntimeError("an assertion in the model at step 3")
        return step(self, i)
    monkeypatch.setattr(step_module.Trainer, "step", fails_at_3)
    save = str(tmp_path / "ckpt")
    assert main(["--save", save, "--save-every", "2", "--steps", "5", "--max-restarts", "9",
                 *QUIET]) == 1
    err = capsys.readouterr().err
    line = last_line(err)
    assert "failed twice at step 2" in line and "an assertion in the model" in line
    assert err.count("restart 1/9") == 1 and "restart 2/9" not in err


# ---------------------------------------------------------------- 3. --skip-nonfinite
def nan_weights_at(monkeypatch, at: int):
    """The weights turn NaN during step `at` (after its backward: its update still runs),
    on every rank, as an overflow in the update would leave them."""
    probe = step_module.Trainer.probe

    def poisoned(self, i):
        if i == at:
            for m in self.model.chunks:
                for p in m.parameters():
                    p.data.fill_(math.nan)
        return probe(self, i)
    monkeypatch.setattr(step_module.Trainer, "probe", poisoned)


def test_skip_nonfinite_stops_after_its_stated_number_of_skipped_steps(tmp_path, capfd,
                                                                       monkeypatch):
    nan_weights_at(monkeypatch, 1)
    log = tmp_path / "log.jsonl"
    assert main(["--dp", "2", "--steps", "10", "--skip-nonfinite", "--log-json", str(log),
                 *QUIET]) == 1
    err = capfd.readouterr().err       # fd-level: rank 0's lines, from its fork
    cap = step_module.MAX_SKIPPED_IN_ROW
    skipped = [x for x in err.splitlines() if "skipped, no update (--skip-nonfinite" in x]
    assert [x.split(":")[0] for x in skipped] == [f"step {i}" for i in range(2, 2 + cap)]
    line = last_line(err)
    assert line.startswith(f"{PROG}: error: step {2 + cap}: ") and \
        f"skips at most {cap} in a row" in line
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r.get("skipped", False) for r in rows] == [False, False] + [True] * cap


def test_skip_nonfinite_never_saves_nan_weights(tmp_path, capfd, monkeypatch):
    nan_weights_at(monkeypatch, 1)
    save = tmp_path / "ckpt"
    assert main(["--steps", "6", "--skip-nonfinite", "--save", str(save), "--save-every", "1",
                 *QUIET]) == 1
    line = last_line(capfd.readouterr().err)
    assert f"--save {save}: not saving step 2: the weights are not finite" in line
    assert "latest checkpoint is still" in line and line.endswith("step_000001")
    assert sorted(p.name for p in save.iterdir()) == [".minipar", "latest", "step_000001"]
    assert (save / "latest").read_text().strip() == "step_000001"


def test_a_run_that_ends_on_skipped_steps_with_nan_weights_does_not_exit_0(capfd, monkeypatch):
    nan_weights_at(monkeypatch, 1)
    assert main(["--steps", "3", "--skip-nonfinite", *QUIET]) == 1
    line = last_line(capfd.readouterr().err)
    assert "step 2: the run ended on 1 skipped step(s) (--skip-nonfinite)" in line
    assert "weights are not finite" in line


# ---------------------------------------------------------------- 5. writes that fail
def test_a_log_on_a_disk_that_fills_stops_the_run_with_one_line(tmp_path, capsys, monkeypatch):
    """A file size limit in rank 0 (SIGXFSZ ignored: the write fails with EFBIG), as a full
    disk would: rank 0 tells the other rank, both stop at the same boundary; the log keeps
    whole lines only."""
    opened = run.open_log

    def small_disk(path):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.getrlimit(
            resource.RLIMIT_FSIZE)[1]))       # only in rank 0, the process that opens it
        return opened(path)
    monkeypatch.setattr(run, "open_log", small_disk)
    log = tmp_path / "log.jsonl"
    assert main(["--dp", "2", "--steps", "8", "--log-json", str(log), *QUIET]) == 1
    line = last_line(capsys.readouterr().err)
    assert f"--log-json {log}: cannot write the record of step" in line
    assert "File too large" in line and "the run stopped there" in line
    text = log.read_text()
    assert text.endswith("\n") and len(text) <= 1500
    n = int(line.split("record of step ")[1].split(":")[0])
    assert [json.loads(x)["step"] for x in text.splitlines()] == list(range(n))


@pytest.mark.parametrize("flag,name", [("--log-json", "log.jsonl"), ("--profile", "trace.json")])
def test_a_fifo_with_no_reader_is_refused_not_waited_on(flag, name, tmp_path, capsys,
                                                         no_rank_may_start):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with alarm(60):
        assert main([flag, str(fifo), *QUIET]) == 2
    line = last_line(capsys.readouterr().err)
    assert line == f"{PROG}: error: {flag} {fifo} is a FIFO with no reader (it would wait forever)"


def test_a_trace_that_cannot_be_written_is_one_line_and_no_half_file(tmp_path, capsys,
                                                                     monkeypatch):
    from minipar.trainer import profile

    def full_disk(trace, path):
        with open(path, "w") as f:
            f.write('{"traceEvents": [')         # half a trace, then the disk is full
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(profile, "write", full_disk)
    trace = tmp_path / "trace.json"
    assert main(["--steps", "2", "--profile", str(trace), *QUIET]) == 1
    line = last_line(capsys.readouterr().err)
    assert line == (f"{PROG}: error: --profile {trace}: cannot write {trace}: No space left "
                    "on device; no trace written")
    assert not trace.exists()


# ---------------------------------------------------------------- 5. --data
def test_data_that_is_not_a_regular_file_is_named_so(capsys, no_rank_may_start):
    assert main(["--data", "/dev/zero", *QUIET]) == 2
    assert last_line(capsys.readouterr().err) == (
        f"{PROG}: error: --data /dev/zero: not a regular file (a device, pipe or directory: "
        "--data reads a text file)")


def test_data_truncated_mid_run_names_data_and_sigbus(tmp_path, capsys, monkeypatch):
    data = tmp_path / "corpus.txt"
    data.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 4000)
    step = step_module.Trainer.step

    def truncated_at_2(self, i):
        if i == 2 and self.grid.rank == 0:
            faulthandler.disable()       # pytest's: its dump of the dying rank is noise here
            os.truncate(data, 0)         # someone rewrites the corpus while the run reads it
        return step(self, i)
    monkeypatch.setattr(step_module.Trainer, "step", truncated_at_2)
    save = tmp_path / "ckpt"
    assert main(["--data", str(data), "--steps", "4", "--save", str(save), "--max-restarts", "3",
                 *QUIET]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f"{PROG}: error: --data {data} was truncated or replaced while the run read it: rank 0 "
        "was killed by SIGBUS (exit -7) reading its memory map; restore the file and resume")
    assert "restart" not in err and "Traceback" not in err
