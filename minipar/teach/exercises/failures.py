"""The exercises of the failures chapter, checked (see core.py for how)."""
from __future__ import annotations

import functools
import math
import posixpath
import tempfile

from ...formulas.failures import expected_waste
from ...config import ParallelConfig
from ...train import TrainConfig, train
from .core import NOT_ANSWERED, Verdict, compare_calls, exercise, function_given, number, predicted, right, wrong


@exercise("failures", "number")
def check_young_daly_interval(write_s: float, mtbf_s: float, answer) -> Verdict:
    """Young's optimal checkpoint interval, in seconds."""
    want = math.sqrt(2 * write_s * mtbf_s)
    return number(answer, want, "the interval in seconds", rel=5e-3, hints=[
        (math.sqrt(write_s * mtbf_s), "missing a factor: the interval is sqrt(2 C M)."),
        (want / 60, "give the interval in seconds, not minutes."),
    ])


@exercise("failures", "implement")
def check_expected_waste(fn) -> Verdict:
    """fn(interval_s, write_s, mtbf_s, restart_s) -> fraction of time lost (first order)."""
    return compare_calls(
        fn, [(600.0, 30.0, 3 * 3600.0, 0.0), (1200.0, 60.0, 11134.0, 300.0),
             (60.0, 5.0, 600.0, 20.0)], expected_waste, 1e-9,
        lambda args, got, want: f"fn{args} = {got:.5f}, expected another value (off by "
                                f"{got - want:+.5f}); count the writes, the restart and the "
                                f"lost work.",
        "your waste model matches minipar.formulas.failures.expected_waste.")


@functools.cache
def _resumed_at(steps: int, save_every: int, fail_at_step: int) -> int:
    """Run the failing run once (per arguments) and return the step its restart resumed at."""
    with tempfile.TemporaryDirectory(prefix="minipar-exercise-") as save:
        out = train(TrainConfig(parallel=ParallelConfig(dp=2), steps=steps, progress=False,
                                save=posixpath.join(save, "ckpt"), save_every=save_every,
                                fail_at_step=fail_at_step, fail_rank=1, max_restarts=1))
    return out["failures"][0]["resumed_at_step"]


@exercise("failures", "predict")
def check_steps_computed(prediction, steps: int = 10, save_every: int = 4,
                         fail_at_step: int = 7) -> Verdict:
    """Predict how many steps a run of `steps` computes in all (redone ones included) when
    it saves after every `save_every` steps and rank 1 dies at the start of step
    `fail_at_step`; then run it (`tiny`, two data-parallel ranks, one restart) and compare."""
    if prediction is None:
        return Verdict(None, NOT_ANSWERED)
    resumed = _resumed_at(steps, save_every, fail_at_step)
    computed = steps + fail_at_step - resumed
    verdict = predicted(prediction, computed, "steps computed", 1e-9,
                        "a count of steps is exact")
    verdict.message += (f" The restart resumed from the checkpoint of step {resumed} and redid "
                        f"{fail_at_step - resumed} step(s).")
    return verdict


# ------------------------------------------------------------- a commit a crash cannot break
class RecordingFS:
    """A file system the check can crash at any moment: files are {path: text}, a directory
    is every path under it. `write` is NOT atomic (a crash during it leaves a prefix of the
    text); `rename` and `replace` are (POSIX rename(2))."""

    def __init__(self, files: dict[str, str]):
        self.files, self.ops = dict(files), []

    def write(self, path: str, text: str):
        self.ops.append(("write", path, text))
        self.files[path] = text

    def rename(self, src: str, dst: str):
        self.ops.append(("rename", src, dst))
        self.files = _renamed(self.files, src, dst)

    replace = rename

    def exists(self, path: str) -> bool:
        return path in self.files or any(p.startswith(path + "/") for p in self.files)


def _renamed(files: dict, src: str, dst: str) -> dict:
    out = {}
    for p, text in files.items():
        if p == src or p.startswith(src + "/"):
            p = dst + p[len(src):]
        out[p] = text
    return out


RANK_FILES = ("rank_00000.pt", "rank_00001.pt")
CUT = "<cut>"     # how a write interrupted by a crash ends: half its text, then nothing


def _start(root: str, step: str) -> dict:
    """An older complete checkpoint named by `latest`, and the new one's rank files in .tmp."""
    old = {f"{root}/step_000004/{f}": "tensors" for f in (*RANK_FILES, "manifest.json")}
    new = {f"{root}/{step}.tmp/{f}": "tensors" for f in RANK_FILES}
    return {**old, **new, f"{root}/latest": "step_000004"}


def _broken_invariant(files: dict, root: str) -> str | None:
    """What a reader of `root` would find wrong after a crash, or None."""
    dirs = {p.rsplit("/", 1)[0] for p in files if p.count("/") == root.count("/") + 2}
    for d in sorted(dirs):
        if not d.endswith(".tmp") and f"{d}/manifest.json" not in files:
            return f"{d} looks like a checkpoint but has no manifest.json"
        if not d.endswith(".tmp") and files[f"{d}/manifest.json"].endswith(CUT):
            return f"{d}/manifest.json is half-written"
    if f"{root}/latest" in files:
        name = files[f"{root}/latest"].strip()
        target = f"{root}/{name}"
        if not all(f"{target}/{f}" in files for f in (*RANK_FILES, "manifest.json")):
            return f"latest names {name!r}, which is not a complete checkpoint"
    return None


def _crash_states(start: dict, ops: list):
    """(when, files) after a crash at every moment: between operations, and in the middle
    of each write (half its text written)."""
    fs = RecordingFS(start)
    yield "before any operation", dict(fs.files)
    for i, (op, a, b) in enumerate(ops, 1):
        if op == "write":
            yield f"during operation {i} (write {a})", {**fs.files, a: b[:len(b) // 2] + CUT}
            fs.files[a] = b
        else:
            fs.files = _renamed(fs.files, a, b)
        yield f"after operation {i} ({op} {a})", dict(fs.files)


def safe_commit(fs, root: str, step: str):
    """The protocol of `checkpoint._commit`: the manifest last inside .tmp, one atomic rename,
    then `latest` through a temporary file and an atomic replace."""
    fs.write(f"{root}/{step}.tmp/manifest.json", "{...}")
    fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
    fs.write(f"{root}/latest.tmp", step)
    fs.replace(f"{root}/latest.tmp", f"{root}/latest")


def broken_commit(fs, root: str, step: str):
    """The notebook's broken version: rename before the manifest, `latest` written in place."""
    fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
    fs.write(f"{root}/{step}/manifest.json", "{...}")
    fs.write(f"{root}/latest", step)


def crash_table(commit, root: str = "ckpt", step: str = "step_000008"):
    """[(moment, files, what is wrong or None)] for a crash at every moment of `commit`."""
    fs = RecordingFS(_start(root, step))
    commit(fs, root, step)
    return [(when, files, _broken_invariant(files, root))
            for when, files in _crash_states(_start(root, step), fs.ops)]


@exercise("failures", "bug")
def check_commit(commit) -> Verdict:
    """commit(fs, root, step): make `root/step.tmp/` (the ranks' files, already written) the
    checkpoint `root/step` and point `root/latest` at it, with fs.write / fs.rename /
    fs.replace, so that a crash at ANY moment leaves `latest` naming a complete checkpoint
    and no manifest-less directory named like one."""
    problem = function_given(commit)
    if problem is not None:
        return problem
    root, step = "ckpt", "step_000008"
    fs = RecordingFS(_start(root, step))
    try:
        commit(fs, root, step)
    except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
        return wrong(f"commit raised {type(e).__name__}: {e}")
    for when, files in _crash_states(_start(root, step), fs.ops):
        broken = _broken_invariant(files, root)
        if broken:
            return wrong(f"a crash {when}: {broken}.")
    if fs.files.get(f"{root}/latest", "").strip() != step:
        return wrong(f"after the commit, latest names {fs.files.get(f'{root}/latest')!r}, "
                     f"not {step!r}.")
    return right(f"a crash at any of the {2 * len(fs.ops) + 1} moments leaves a usable "
                 f"checkpoint, and latest names the new one.")


__all__ = [n for n in dir() if n.startswith("check_")]
