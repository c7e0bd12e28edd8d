"""Issue 30, files: minipar never deletes or overwrites a file it did not write, every output
path is proved writable before any rank starts, a --save directory has one owner at a time,
and a full disk at a checkpoint is one line with the checkpoint before it kept.

Each refusal is asked of `main` in this process: exit 2, one `error:` line naming the flag
and the rule, no rank started, and the user's files byte for byte (and mtime) as they were.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from minipar.runtime import checkpoint, export, launch
from minipar.runtime.run import main

SHORT = ["--steps", "1", "--no-progress"]
ONE_LINE_RULE = "may not name each other"


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A working directory holding a user's files: a corpus, a directory of notes, a file;
    `user.unchanged()` says whether each is still as it was (bytes and mtime)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "old.jsonl").write_text('{"a log": "of mine"}\n')

    def state(paths):
        return {p: (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None for p in paths}
    before = state([p for p in tmp_path.rglob("*") if p.is_file()])

    class User:
        path = tmp_path

        @staticmethod
        def unchanged():
            return state(before) == before
    return User


def refused(argv, capsys, *words, status=2):
    """`main(argv)` exits `status` with one `error:` line holding each of `words`."""
    code = main([*argv, *SHORT])
    err = capsys.readouterr().err
    assert code == status, err
    assert len(err.strip().splitlines()) == 1 and "error: " in err, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    return err


# ------------------------------------------------------------ paths that name each other
NAMED = [
    (["--save", "out", "--export-hf", "out"], "--export-hf out is --save out"),
    (["--data", "corpus.txt", "--log-json", "corpus.txt"],
     "--log-json corpus.txt is --data corpus.txt"),
    (["--data", "corpus.txt", "--profile", "corpus.txt"], "--profile corpus.txt is --data"),
    (["--save", "hf/ckpt", "--export-hf", "hf"], "--save hf/ckpt lies inside --export-hf hf"),
    (["--log-json", "t.json", "--profile", "t.json"], "--log-json t.json is --profile t.json"),
    (["--save", "run", "--profile", "run"], "--profile run is --save run"),
]


@pytest.mark.parametrize("argv,said", NAMED, ids=[" ".join(a) for a, _ in NAMED])
def test_outputs_and_data_may_not_name_each_other(argv, said, user, capsys, no_rank_may_start):
    refused(argv, capsys, said, ONE_LINE_RULE)
    assert user.unchanged()
    assert not os.path.exists("out") and not os.path.exists("hf")     # nothing was made


def test_outputs_side_by_side_are_allowed(user, capsys, monkeypatch):
    """Only clobbering is refused: the log and the trace may live in the --save directory."""
    started = []
    monkeypatch.setattr(launch, "run_local",
                        lambda *a, **k: started.append(a) or [{"records": [], "ended": None}])
    os.makedirs("run")
    assert main(["--save", "run", "--log-json", "run/log.jsonl", "--profile", "run/trace",
                 "--data", "corpus.txt", *SHORT]) == 0, capsys.readouterr().err
    assert started and user.unchanged()


def test_a_symlink_to_the_corpus_is_the_corpus(user, capsys, no_rank_may_start):
    os.symlink("corpus.txt", "log.jsonl")
    before = os.stat("corpus.txt")
    refused(["--data", "corpus.txt", "--log-json", "log.jsonl"], capsys, ONE_LINE_RULE)
    assert os.stat("corpus.txt").st_mtime_ns == before.st_mtime_ns
    assert os.path.getsize("corpus.txt") == before.st_size


# ------------------------------------------------------------ whose directory it is
@pytest.mark.parametrize("flag", ["--save", "--export-hf"])
def test_a_directory_of_the_users_files_is_refused_not_emptied(flag, user, capsys, no_rank_may_start):
    refused([flag, "notes"], capsys, f"{flag} notes holds files minipar may not replace",
            "give a new or empty one")
    assert user.unchanged() and os.listdir("notes") == ["todo.txt"]


def test_an_export_never_replaces_a_checkpoint_directory(user, capsys, no_rank_may_start):
    os.makedirs("ckpt")
    for name in (checkpoint.MARK, checkpoint.LATEST):
        open(os.path.join("ckpt", name), "w").close()
    refused(["--export-hf", "ckpt"], capsys, "--export-hf ckpt holds files", "checkpoints")
    assert sorted(os.listdir("ckpt")) == sorted([checkpoint.MARK, checkpoint.LATEST])


@pytest.mark.parametrize("argv,said", [
    (["--save", "afile"], "--save afile is a file, not a directory"),
    (["--export-hf", "afile"], "--export-hf afile is a file, not a directory"),
    (["--profile", "afile"], "--profile afile is a file, not a directory"),
    (["--save", "afile/sub"], "Not a directory"),
    (["--log-json", "notes"], "--log-json notes is a directory, not a file"),
])
def test_a_file_where_a_directory_is_wanted_and_back(argv, said, user, capsys, no_rank_may_start):
    refused(argv, capsys, said)
    assert user.unchanged()


# ------------------------------------------------------------ writable, proved up front
UNWRITABLE = [
    (["--save", "/proc/minipar"], "--save /proc/minipar: cannot write in /proc"),
    (["--export-hf", "/proc/minipar"], "--export-hf /proc/minipar: cannot write in /proc"),
    (["--profile", "/proc/minipar"], "--profile /proc/minipar: cannot write in /proc"),
    (["--profile", "/proc/minipar.json"], "--profile /proc/minipar.json cannot be written"),
    (["--log-json", "/proc/minipar.jsonl"], "--log-json /proc/minipar.jsonl cannot be written"),
    (["--log-json", "/dev/full"], "--log-json /dev/full cannot be written: No space left on device"),
]


@pytest.mark.skipif(not os.path.isdir("/proc/self") or not os.path.exists("/dev/full"),
                    reason="needs /proc and /dev/full")
@pytest.mark.parametrize("argv,said", UNWRITABLE, ids=[" ".join(a) for a, _ in UNWRITABLE])
def test_an_unwritable_output_is_refused_before_any_rank(argv, said, capsys, no_rank_may_start):
    refused(argv, capsys, said)


def test_the_probes_leave_the_users_files_as_they_were(user, capsys, no_rank_may_start):
    """Every output is probed, then a later check refuses the run: the existing log keeps its
    bytes and mtime, and no probe file is left anywhere."""
    (user.path / "short.txt").write_text("0123456789")
    refused(["--log-json", "old.jsonl", "--save", "new/ckpt", "--profile", "prof",
             "--export-hf", "hf", "--data", "short.txt"], capsys, "--data short.txt holds 10 bytes")
    (user.path / "short.txt").unlink()
    assert user.unchanged()
    assert sorted(os.listdir(".")) == ["afile", "corpus.txt", "notes", "old.jsonl"]


# ------------------------------------------------------------ python -m minipar.export
@pytest.mark.parametrize("out,said", [("afile", "--out afile is a file, not a directory"),
                                      (".", "--out . holds files minipar may not replace"),
                                      ("notes", "--out notes holds files"),
                                      ("/proc/minipar", "cannot write in /proc")])
def test_export_refuses_a_users_file_or_directory(out, said, user, capsys):
    # the check comes before the checkpoint is read: no checkpoint is needed to be refused
    assert export.main(["--resume", "no-such-checkpoint", "--out", out]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert user.unchanged()


@pytest.mark.slow
def test_an_export_replaces_only_its_own_directory(user, capsys):
    """A second export replaces the first (it carries minipar's mark); a user's `hf.tmp` and
    `hf.old` beside it are nobody's debris to remove."""
    assert main(["--save", "ckpt", "--export-hf", "hf", *SHORT]) == 0
    for name in ("hf.tmp", "hf.old"):
        os.makedirs(name)
        open(os.path.join(name, "keep.txt"), "w").close()
    assert export.main(["--resume", "ckpt", "--out", "hf"]) == 0
    assert sorted(os.listdir("hf")) == [checkpoint.MARK, "config.json", "model.safetensors"]
    for name in ("hf.tmp", "hf.old"):
        assert os.listdir(name) == ["keep.txt"]
    assert sorted(os.listdir(".")) == ["afile", "ckpt", "corpus.txt", "hf", "hf.old", "hf.tmp",
                                       "notes", "old.jsonl"]
    assert user.unchanged()


# ------------------------------------------------------------ one run per --save directory
@pytest.mark.slow
def test_a_second_run_on_a_save_directory_is_refused_naming_the_owner(tmp_path, capsys, no_rank_may_start):
    root = str(tmp_path / "ckpt")
    with checkpoint.claim(root):        # this process owns it, as a running launcher would
        refused(["--save", root], capsys, f"--save {root} is in use by another run",
                f"pid {os.getpid()}")
    assert open(os.path.join(root, checkpoint.MARK)).read().startswith("minipar --save")


def test_a_dead_owner_holds_no_lock(tmp_path):
    root = str(tmp_path / "ckpt")
    owner = subprocess.run([sys.executable, "-c", "import os, signal; from minipar.runtime import "
                            f"checkpoint; checkpoint.claim({root!r}); "
                            "os.kill(os.getpid(), signal.SIGKILL)"], timeout=60)
    assert owner.returncode == -signal.SIGKILL
    with checkpoint.claim(root) as mark:        # the kernel dropped the dead owner's lock
        assert f"pid {os.getpid()}" in open(mark.name).read()


# ------------------------------------------------------------ a full disk at a checkpoint
@pytest.mark.slow
@pytest.mark.parametrize("fails", ["rank_00001.pt", "manifest.json"])
def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_one_before(fails, tmp_path,
                                                                          capfd, monkeypatch):
    root = str(tmp_path / "ckpt")
    write = checkpoint._write

    def full_at_step_4(path, data):
        if path.endswith(os.path.join("step_000004.tmp", fails)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return write(path, data)
    monkeypatch.setattr(checkpoint, "_write", full_at_step_4)   # the forked ranks inherit it
    code = main(["--dp", "2", "--steps", "6", "--save", root, "--save-every", "2",
                 "--no-progress"])
    err = capfd.readouterr().err
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    step4 = os.path.join(root, "step_000004.tmp", fails)
    assert f"{step4}: No space left on device" in err
    assert "could not write the checkpoint of step 4 (" in err and " bytes)" in err
    assert f"the latest checkpoint is still {os.path.join(root, 'step_000002')}" in err
    # the one before is complete and resumable; the half-written one is gone
    assert checkpoint.latest(root) == os.path.join(root, "step_000002")
    assert sorted(os.listdir(root)) == [checkpoint.MARK, "latest", "step_000002"]
    monkeypatch.undo()
    assert main(["--dp", "2", "--steps", "3", "--resume", root, "--no-progress"]) == 0
