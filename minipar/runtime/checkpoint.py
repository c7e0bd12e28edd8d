"""Checkpoints: save the training state as the ranks hold it, resume it in any layout.

Chapter "Failures at scale".

A checkpoint is one directory per save, named by the number of steps done:

    DIR/step_000010/rank_00000.pt ...  what each rank holds: its slices of the parameters
                                       and of AdamW's m and v, each labelled with where it
                                       lies in the full tensor
                    rng.pt             every rank's random-number-generator state
                    history.jsonl      rank 0's per-step records so far (the loss curve)
                    manifest.json      written last: the layout it was saved from, the
                                       model, the step, every file's size and SHA-256
    DIR/latest                         the name of the newest complete checkpoint

What else does a run need to continue exactly? The learning rate and the data are pure
functions of the step (`train.lr_at`, `data.py`), so the step *is* their state. AdamW's
state is m, v and its step count (the loop builds the optimizer and hands it to `save` and
`load`). Nothing in minipar's loop draws random numbers (no dropout), but the RNG state is
kept for whoever adds something that does.

**Atomic.** Every rank writes into `step_000010.tmp/`; rank 0 writes the manifest last,
renames the directory to `step_000010` (a rename is atomic) and then replaces `latest` the
same way (write `latest.tmp`, `os.replace`). A crash at any moment leaves either the old
checkpoint or the new one, never half of one: a reader follows `latest`, and `latest` only
ever names a directory whose manifest was written after everything it lists.

**Resharding.** Each saved slice says which part of the global tensor it is: TP shards are
contiguous chunks along the dim the parameter is placed `Shard(dim)` on "tp"
(`placement.py`), ZeRO pieces are flat ranges of the TP-local tensor
(`FlatShards.piece_range`), pipeline stages name their layers by global index. Loading
rebuilds each full tensor from the slices that hold it and cuts it again the way the *new*
layout cuts it (`placement.local_index`, the layers' own rule), so a run saved at
tp2 x pp2 resumes at dp2 x cp2, or ZeRO-3 resumes without ZeRO. Replicated tensors (over
DP without ZeRO, over TP for norms) are saved once: by the rank whose copy counts
(`grid.counts`).

At scale this is how a checkpoint of Llama 3 405B works too (each GPU writes its own
state, 1 MB to 4 GB of it, in parallel); a real implementation streams tensors instead of
rebuilding whole ones in memory, and resharding reads only the byte ranges it needs.
"""

import dataclasses
import fcntl
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from collections import defaultdict

import torch
import torch.distributed as dist

from ..plan.config import ConfigError, ModelConfig
from ..trainer import comm
from ..trainer.model import Transformer
from ..trainer.placement import Shard, local_index, placements

FORMAT = "minipar-checkpoint/1"
MANIFEST, LATEST, HISTORY, RNG = "manifest.json", "latest", "history.jsonl", "rng.pt"
ADAM = ("exp_avg", "exp_avg_sq")     # AdamW's m and v, saved beside each slice of a parameter
MARK = ".minipar"     # in each directory minipar made: what is in it is minipar's to replace


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete, corrupt or of another model; names the file."""

# ================================================================ where checkpoints are
def check_out_dir(flag: str, path: str, own: bool = True, replaced: bool = False) -> None:
    """`path` can take minipar's output, before any rank starts: not a file; with `own`, a
    new or empty directory or one with minipar's MARK (a directory of the user's files is
    refused, never emptied), and one `replaced` whole (an export) holds no checkpoints; and
    writable, proved by a probe file made and removed in it (`replaced`: in the directory
    above, where it is renamed into place) or, for a new one, in the nearest directory above
    it that exists. `os.access` would say yes to root even under /proc."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a file, not a directory")
    names = os.listdir(path) if own and os.path.isdir(path) else []
    if names and (MARK not in names or replaced and LATEST in names):
        raise ConfigError(f"{flag} {path} holds files minipar may not replace (no {MARK}"
                          f"{', or checkpoints' if replaced else ''}): give a new or empty one")
    where = os.path.dirname(os.path.abspath(path)) if replaced else os.path.abspath(path)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    try:        # a file with no name (or one removed at once), and one byte: a full disk too
        with tempfile.TemporaryFile(dir=where, buffering=0) as probe:
            probe.write(b"\n")
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write in {where}: {e.strerror}") from None


def claim(root: str):
    """The --save directory `root` is this run's (made, with its MARK, if new) for as long
    as the returned file is open: an exclusive `flock` on MARK, which holds the owner's pid.
    The kernel drops the lock when its owner dies, so a crashed run never keeps it; a second
    run on `root` is refused instead of writing into the same `step_N.tmp`."""
    os.makedirs(root, exist_ok=True)
    mark = open(os.path.join(root, MARK), "a+")
    try:
        fcntl.flock(mark, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"--save {root} is in use by another run "
                          f"({open(mark.name).read().strip()}): one run per directory") from None
    mark.truncate(0)
    print(f"minipar --save, pid {os.getpid()}", file=mark, flush=True)
    return mark


def held_by(root: str) -> str | None:
    """Who holds `root` (`claim`: a live run saving into it, its MARK's line), or None. A run
    that resumes from a directory another run is writing would read `latest` while it moves
    (its ranks at different steps): `run.resume_dir` refuses it. Asked by taking a shared
    lock for a moment: it fails only while an owner holds the exclusive one."""
    try:
        mark = open(os.path.join(root, MARK))
    except OSError:        # no MARK (not a --save directory), or not readable: no owner known
        return None
    with mark:
        try:
            fcntl.flock(mark, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return mark.read().strip() or "another run"
        fcntl.flock(mark, fcntl.LOCK_UN)
    return None


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def latest(root: str | None) -> str | None:
    """The newest complete checkpoint under `root` (what `latest` names), or None."""
    pointer = os.path.join(root or "", LATEST)
    if not root or not os.path.isfile(pointer):
        return None
    # bytes that are not UTF-8 are not a step_N name either (the check below says so)
    name = _read(pointer, "checkpoint pointer").decode(errors="replace").strip()
    if name and (os.sep in name or not name.startswith("step_")):
        raise CheckpointError(f"checkpoint pointer {pointer} names {name[:40]!r}, "
                              "not a step_N directory")
    return os.path.join(root, name) if name else None


def resolve(path: str) -> str:
    """A checkpoint directory from what --resume was given: the directory itself (it has
    a manifest), or a --save directory, whose `latest` names one (whose manifest
    `read_manifest` then reads, naming it if it is not there)."""
    if not os.path.isdir(path):
        raise CheckpointError(f"--resume {path}: no such directory")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    if (step_dir := latest(path)) is None:
        raise CheckpointError(f"--resume {path}: no checkpoint there "
                              f"(neither a {MANIFEST} nor a `{LATEST}` pointer)")
    return step_dir


def step_of(path: str | None) -> int:
    """The step a run resuming from `path` (None: from scratch) starts at."""
    return 0 if path is None else read_manifest(resolve(path))["step"]


# What a manifest must hold, and of which type: anything else is a damaged or foreign file.
MANIFEST_KEYS = {"format": str, "step": int, "world_size": int, "layout": dict, "model": dict,
                 "train": dict, "files": dict}


def read_manifest(step_dir: str) -> dict:
    path = os.path.join(step_dir, MANIFEST)
    where = f"checkpoint file {path}"      # every message names the file
    try:
        manifest = json.loads(_read(path).decode())
    except ValueError as e:     # bad UTF-8 or bad JSON
        raise CheckpointError(f"{where} is unreadable: {str(e).splitlines()[0]}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where} holds a JSON {type(manifest).__name__}, "
                              "not the manifest's object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    for key, kind in MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind):
            raise CheckpointError(f"{where}: `{key}` is missing or not a {kind.__name__}")
    for name, info in manifest["files"].items():
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int)
                and isinstance(info.get("sha256"), str) and os.sep not in name):
            raise CheckpointError(f"{where}: its entry for {name!r} lacks bytes or sha256")
    if absent := [n for n in (RNG, HISTORY) if n not in manifest["files"]]:   # every rank reads
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, absent[0])} is not in "
                              "its manifest")
    check_manifest(manifest, where)
    return manifest


# ================================================================ a manifest, as a whole
# Whoever wrote a checkpoint, its manifest is checked as a whole before any process starts:
# the layout against the rank files, their names, the model's fields, each refusal one line
# naming the field (`key.sub`).
AXES = ("tp", "cp", "pp", "dp")
KINDS = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}


def check_manifest(manifest: dict, where: str) -> None:
    """Every file a plain name in the directory; `layout` counts whose product is
    `world_size`, one `rank_N.pt` per rank listing its tensor `names`; `model` a model
    minipar builds (`manifest_model`)."""
    files, layout, world = manifest["files"], manifest["layout"], manifest["world_size"]

    def need(ok: bool, field: str, rule: str):
        if not ok:
            raise CheckpointError(f"{where}: `{field}` {rule}")
    for name in files:      # no "..", nothing absolute, nothing under another directory
        need(name not in ("", ".", "..") and "/" not in name, "files",
             f"names {name!r}, not a file of the checkpoint")
    need(manifest["step"] >= 0, "step", "is negative")
    for k in (*AXES, "zero"):
        need(type(layout.get(k)) is int and layout[k] >= (k != "zero"), f"layout.{k}",
             f"is {layout.get(k)!r}, not a count")
    ranks = math.prod(layout[k] for k in AXES)
    need(ranks == world, "layout", f"{' x '.join(f'{k}={layout[k]}' for k in AXES)} is {ranks} "
         f"ranks, but `world_size` is {world}")
    want = [f"rank_{r:05d}.pt" for r in range(world)]
    need(sorted(n for n in files if n.startswith("rank_")) == want, "files",
         f"does not list one file per rank, rank_00000.pt to {want[-1]}")
    for r, name in enumerate(want):
        names = files[name].get("names")
        need(isinstance(names, list) and all(isinstance(n, str) for n in names),
             f"files.{name}.names", "is missing or not a list of tensor names")
        need(files[name].get("rank", r) == r, f"files.{name}.rank", f"is not {r}")
    need(isinstance(manifest["train"].get("init_hf") or "", str), "train.init_hf",
         "is not a directory name")
    manifest_model(manifest, where)


def manifest_model(manifest: dict, where: str) -> ModelConfig:
    """The model a manifest describes: each field one of `ModelConfig`'s, of its type (one it
    leaves out, that the checkpoint predates, has its default), the architecture's rules
    kept. Another version's field, or a damaged file's, is named, never a TypeError."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for k, v in manifest["model"].items():
        kind = type(getattr(ModelConfig, k, None))      # every field has a default, of its type
        if k not in fields or not (type(v) is kind or kind is float and type(v) is int) or \
                kind is float and not math.isfinite(v):
            raise CheckpointError(f"{where}: `model.{k}` " + (
                f"is {v!r}, not {KINDS[kind]}" if k in fields else
                "is not a field of minipar's model (another version's checkpoint, or damaged)"))
    if problems := (model := ModelConfig(**manifest["model"])).problems():
        raise CheckpointError(f"{where}: `model`: {problems[0]}")
    return model


def check_files(step_dir: str, manifest: dict) -> None:
    """Every file the manifest lists is there, with its size and its SHA-256, before any
    rank starts: a rank file whose rank holds no tensors is verified too, and a damaged one
    costs no start-up. Sizes first (cheap: a missing or truncated file is named without
    reading anything), then the checksums, a file at a time. A file that is a symlink out
    of the directory is refused: a checkpoint is what its directory holds."""
    real_dir = os.path.realpath(step_dir)
    for name, info in manifest["files"].items():
        path = os.path.join(step_dir, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} is missing")
        if os.path.dirname(os.path.realpath(path)) != real_dir:
            raise CheckpointError(f"checkpoint file {path} is a link to "
                                  f"{os.path.realpath(path)}, outside the checkpoint")
        if os.path.getsize(path) != info["bytes"]:
            raise CheckpointError(f"checkpoint file {path} is {os.path.getsize(path)} bytes, the "
                                  f"manifest says {info['bytes']} (truncated or overwritten)")
    for name in manifest["files"]:
        read_verified(step_dir, name, manifest)


def read_verified(step_dir: str, name: str, manifest: dict) -> bytes:
    """A file's bytes, after checking them against the manifest's SHA-256 (a rank checks
    every file it reads; `check_files` checked the sizes before any rank started)."""
    path = os.path.join(step_dir, name)
    data = _read(path)
    if hashlib.sha256(data).hexdigest() != manifest["files"][name]["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupt: its SHA-256 differs from the "
                              "manifest's")
    return data


def _read(path: str, what: str = "checkpoint file") -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{what} {path} is unreadable: {e}") from None


def check_resume(path: str, model: ModelConfig, steps: int) -> dict:
    """What --resume needs before any process starts: a complete checkpoint of this model
    at a step not beyond --steps. Returns its manifest."""
    manifest = read_manifest(step_dir := resolve(path))
    check_files(step_dir, manifest)
    # a field the checkpoint predates has its default there (the model it was saved from)
    saved = {**dataclasses.asdict(ModelConfig()), **manifest["model"]}
    differ = ", ".join(f"{k}={saved[k]} (now {v})" for k, v in dataclasses.asdict(model).items()
                       if k != "name" and saved[k] != v)
    if differ:
        raise CheckpointError(f"--resume {path}: the checkpoint is of another model: {differ}")
    if manifest["step"] > steps:
        raise CheckpointError(f"--resume {path}: the checkpoint is at step {manifest['step']}, "
                              f"beyond --steps {steps}")
    check_contents(step_dir, manifest, model)
    return manifest


def check_contents(step_dir: str, manifest: dict, model: ModelConfig) -> dict:
    """Every file's contents against the manifest and `model`, before any rank reads them;
    returns the full weights (`full_state`). The rank files and rng.pt are unpickled as the
    ranks will (`load_torch`): a refused pickle is one line here, not a traceback in a
    rank. Why unpickle rather than scan the pickles' opcodes (`pickletools`) for globals
    outside an allowed set: this is the very unpickler the ranks use (torch's weights_only
    one), so the check and the load cannot disagree, and no second allow-list has to
    follow torch's; the price, reading the files twice, is small for minipar's checkpoints
    (at Llama 3's scale one would scan the opcodes). Each slice is one of `model`'s
    parameters, cut as the layout says (`check_entry`), the manifest's `names` its file's,
    and together they fill every parameter; history.jsonl is JSON objects."""
    with torch.device("meta"):      # every parameter's shape, no memory (a tied head: none)
        want = {n: list(p.shape) for n, p in
                Transformer(model, seed=None).state_dict(keep_vars=True).items()
                if not (model.tie_embeddings and n == "lm_head.weight")}
    cut, entries = {}, []
    for name in sorted(n for n in manifest["files"] if n.startswith("rank_")):
        where = f"checkpoint file {os.path.join(step_dir, name)}"
        data = load_torch(step_dir, name, manifest)
        mine = data.get("entries") if isinstance(data, dict) else None
        for e in mine if isinstance(mine, list) else [None]:
            entries.append(e := check_entry(e, want, manifest["layout"]["tp"], where))
            # a parameter's slices cut alike (`full_tensor`, `_restore` read the first's)
            if cut.setdefault(e["name"], e["how"]) != e["how"]:
                raise CheckpointError(f"{where}: {e['name']} is cut unlike its other slices")
        if differ := {e["name"] for e in mine} ^ set(manifest["files"][name]["names"]):
            raise CheckpointError(f"{where}: its tensors are not its manifest's `names` "
                                  f"({min(differ)})")
    try:
        state = full_state(entries)      # coverage: every element of every parameter
    except (RuntimeError, IndexError, TypeError) as e:
        raise CheckpointError(f"checkpoint {step_dir}: its slices do not make the model's "
                              f"tensors: {str(e).splitlines()[0]}") from None
    if missing := sorted(set(want) - set(state)):
        raise CheckpointError(f"checkpoint {step_dir}: {missing[0]} is in no file")
    states = load_torch(step_dir, RNG, manifest)
    if not (isinstance(states, list) and len(states) == manifest["world_size"] and all(
            isinstance(r, dict) and type(r.get("cpu")) is torch.Tensor
            and r["cpu"].shape == torch.get_rng_state().shape and r["cpu"].dtype == torch.uint8
            for r in states)):
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, RNG)} does not hold "
                              "a CPU generator state for each rank")
    try:
        if not all(isinstance(json.loads(x), dict) for x in
                   read_verified(step_dir, HISTORY, manifest).splitlines() if x):
            raise ValueError("a line is not an object")
    except ValueError as e:
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, HISTORY)} is not JSON "
                              f"objects: {str(e).splitlines()[0]}") from None
    return state


ENTRY = {"name": str, "shape": list, "start": int, "stop": int, "tp_rank": int, "tp_size": int,
         "param": torch.Tensor}


def check_entry(e, want: dict, tp: int, where: str) -> dict:
    """One saved slice (`shard_entries`) is one of `want`'s parameters: its shape the
    whole's cut along `tp_dim` into the layout's `tp` shards, its tensors 1-D and as long as
    its flat range, AdamW's state whole. Returns it without AdamW's state, with `how` it is
    cut (along which dim, into how many shards, with which state)."""
    name = e.get("name") if isinstance(e, dict) else None
    if name not in want or not all(type(e.get(k)) is t for k, t in ENTRY.items()) or \
            "tp_dim" not in e:
        raise CheckpointError(f"{where}: {name!r} is not a slice of a parameter of the "
                              "manifest's model")
    shape, dim, adam = list(e["shape"]), e["tp_dim"], tuple(k for k in ADAM if k in e)
    if type(dim) is int and 0 <= dim < len(shape) and type(shape[dim]) is int:
        shape[dim] *= e["tp_size"]
    cuts = e.get("ep_size", 1)      # an expert weight: this EP rank's experts (dim 0)
    if type(cuts) is not int or not 0 <= e.get("ep_rank", 0) < cuts or not shape:
        raise CheckpointError(f"{where}: {name}: its ep_rank and ep_size are not a cut")
    shape[0] *= cuts
    if shape != want[name] or e["tp_size"] != (tp if dim is not None else 1):
        raise CheckpointError(f"{where}: {name} is {shape} in the file (tp_size {e['tp_size']}"
                              f"), the manifest's model makes it {want[name]} (tp {tp})")
    if any(type(e[k]) is not torch.Tensor or e[k].shape != (e["stop"] - e["start"],)
           for k in ("param", *adam)) or adam and (adam != ADAM or type(e.get("adam_step"))
                                                     not in (int, float)):
        raise CheckpointError(f"{where}: {name}: its tensors are not its elements "
                              f"{e['start']}:{e['stop']}, or AdamW's state is incomplete")
    return {**{k: v for k, v in e.items() if k not in ADAM}, "how": (dim, e["tp_size"], cuts, adam)}


# What a step *means*: the tokens it reads are a pure function of these (and of the step).
# A resumed run that changes one of them continues another run's curve.
MEANING = {"seq_len": "--seq-len", "global_batch": "--global-batch", "data": "--data",
           "seed": "--seed"}
# What the manifest records of the run (with the data's digest): `MEANING`'s and the schedule's
TRAIN_KEYS = ("seed", "global_batch", "seq_len", "lr", "warmup_steps", "decay_steps",
              "min_lr_ratio", "weight_decay", "clip", "data", "init_hf")


def data_digest(path: str | None) -> str | None:
    """The --data file's SHA-256 (None: synthetic data): the same text under another path
    is the same data, another text under the same path is not."""
    return None if path is None else hashlib.sha256(_read(path)).hexdigest()


def meaning_changes(manifest: dict, cfg) -> dict:
    """{flag: [the checkpoint's value, this run's]} for each of `MEANING` that differs.
    The data is compared by its digest, not by its path."""
    saved = {**manifest["train"], "data": manifest["train"].get("data_sha256")}
    now = {**{k: getattr(cfg, k) for k in MEANING}, "data": data_digest(cfg.data)}
    return {MEANING[k]: [saved.get(k), now[k]] for k in MEANING if saved.get(k) != now[k]}


def check_flags(cfg) -> None:
    """What --resume names on disk, before any rank starts (`preflight.check_run`, which
    also checks --save with `check_out_dir`; the flags' own rules, --save-every's among
    them, are `TrainConfig.problems`): a checkpoint of this model whose steps meant what
    this run's mean."""
    if cfg.resume is not None:
        changes = meaning_changes(check_resume(cfg.resume, cfg.model_config(), cfg.steps), cfg)
        if changes and not cfg.resume_allow_change:
            what = ", ".join(f"{flag} {_short(old)} (now {_short(new)})"
                             for flag, (old, new) in changes.items())
            raise CheckpointError(f"--resume {cfg.resume}: the checkpoint was trained with "
                                  f"{what}; continuing would splice another run's curve onto "
                                  "it (--resume-allow-change to do it anyway)")


def _short(v):
    return f"sha256:{v[:12]}" if isinstance(v, str) and len(v) == 64 else v


# ================================================================ what a rank holds
def named_params(chunks, model: ModelConfig) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every piece of the model. With tied embeddings the head *is*
    the embedding: one tensor, one name, wherever a pipeline stage keeps its copy."""
    tied = {"lm_head.weight": "embed_tokens.weight"} if model.tie_embeddings else {}
    return [(tied.get(n, n), p) for m in chunks for n, p in m.named_parameters()]


def named_buffers(chunks) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of the state that is no parameter but part of the model (a MoE
    layer's routing bias): the same on every TP and data-parallel rank."""
    return [(n, t) for m in chunks for n, t in m.state_dict(keep_vars=True).items()
            if not isinstance(t, torch.nn.Parameter)]


def shard_entries(chunks, dp, optimizer, grid, model: ModelConfig):
    """This rank's slices of every parameter it saves, one at a time, with AdamW's m, v and
    step, each labelled with where it lies in the global tensor. What a rank holds of a parameter is
    `dp.shard_of(p)`: all of it, or (ZeRO) its piece. Copies of one tensor are saved once,
    by the rank whose copy counts, as the gradient norm counts it once; an expert's slices
    say which of the EP group's cuts along dim 0 they are. Buffers (`named_buffers`) are
    saved whole by the first rank of TP and dp x cp."""
    if grid.tp.rank == grid.dp_cp.rank == 0:
        yield from ({"name": n, "shape": list(t.shape), "start": 0, "stop": t.numel(),
                     "tp_dim": None, "tp_rank": 0, "tp_size": 1,
                     "param": t.detach().reshape(-1).to("cpu", copy=True)}
                    for n, t in named_buffers(chunks))
    for name, p in named_params(chunks, model):
        shard = dp.shard_of(p)
        if shard.start == shard.stop or not grid.counts(p, dp.holds_replicas):
            continue
        tp = placements(p).get("tp")
        tp_dim = tp.dim if isinstance(tp, Shard) else None
        tp_rank, tp_size = (grid.tp.rank, grid.tp.size) if tp_dim is not None else (0, 1)
        ep = grid.ep if "ep" in placements(p) else None
        entry = {"name": name, "shape": list(shard.shape), "start": shard.start,
                 "stop": shard.stop, "tp_dim": tp_dim, "tp_rank": tp_rank, "tp_size": tp_size,
                 "ep_rank": ep.rank if ep else 0, "ep_size": ep.size if ep else 1,
                 # a copy: a view would drag its whole storage (the full parameter) along
                 "param": shard.data.detach().reshape(-1).to("cpu", copy=True)}
        state = optimizer.state.get(shard.key)
        if state:
            entry.update(adam_step=float(state["step"]),
                         **{k: state[k].detach().reshape(-1).to("cpu", copy=True) for k in ADAM})
        yield entry


# ================================================================ reassembling and cutting
def full_tensor(entries: list[dict], key: str = "param") -> torch.Tensor:
    """The global tensor `key` of one parameter from the slices that hold it: pieces fill
    the flat ranges of each TP shard, TP shards are concatenated along their dim, and an
    expert weight's EP cuts along dim 0. Copies of one slice (a tied head, say) are
    harmless: they are equal. Every TP shard has the same shape (the layout's rules make
    tp divide the dim it cuts)."""
    if (cuts := entries[0].get("ep_size", 1)) > 1:
        return torch.cat([full_tensor([{**e, "ep_size": 1} for e in entries if e["ep_rank"] == r],
                                      key) for r in range(cuts)])
    first = entries[0]
    shape, tp_dim = first["shape"], first["tp_dim"]
    shards = []
    for t in range(first["tp_size"]):
        flat = torch.empty(math.prod(shape), dtype=first[key].dtype)
        covered = torch.zeros(flat.numel(), dtype=torch.bool)
        for piece in (e for e in entries if e["tp_rank"] == t):
            flat[piece["start"]:piece["stop"]] = piece[key]
            covered[piece["start"]:piece["stop"]] = True
        if not covered.all():
            raise CheckpointError(f"{first['name']}: {int((~covered).sum())} of its elements "
                                  f"(TP shard {t}) are in no file of the checkpoint")
        shards.append(flat.view(shape))
    return torch.cat(shards, dim=tp_dim) if tp_dim is not None else shards[0]


def full_state(entries: list[dict]) -> dict[str, torch.Tensor]:
    """Every parameter's full tensor from the slices (`shard_entries`) that hold it,
    whichever ranks saved them."""
    by_name = defaultdict(list)
    for e in entries:
        by_name[e["name"]].append(e)
    return {name: full_tensor(es) for name, es in by_name.items()}


# ================================================================ files
def _write(path: str, data: bytes) -> dict:
    """Write and fsync; return what the manifest records of the file."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _fsync_dir(path: str) -> None:
    # a rename is atomic at once, but durable (survives a power cut) only once the
    # directory holding it is on disk
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_torch(step_dir: str, name: str, manifest: dict):
    data = read_verified(step_dir, name, manifest)
    try:
        # weights_only: tensors, numbers, strings, lists and dicts, never arbitrary code
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        # torch's message is a paragraph; the line that says why is its unpickler's
        lines = [x.strip() for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
        why = next((x.split("error: ", 1)[-1] for x in lines[1:]
                    if "GLOBAL" in x or "Unpickler error" in x), "not only tensors and data")
        said = (f"is refused: its pickle is not plain data ({why.split('. ')[0].rstrip('.')}): "
                "a crafted or foreign file" if lines[0].startswith("Weights only load failed")
                else f"cannot be loaded: {lines[0]}")
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, name)} {said}") from None


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


# ================================================================ save and load
def save(root: str, step: int, chunks, dp, optimizer, grid, cfg, history: list[dict]) -> str:
    """Every rank calls this after `step` steps are done; returns the checkpoint directory.

    Each rank writes its own file into a temporary directory; rank 0, once every rank has
    reported its file's size and checksum, writes the manifest, renames the directory into
    place and points `latest` at it. Weights that are not finite are refused first, on
    every rank alike (`CheckpointError`, nothing written).
    """
    final = os.path.join(root, step_dir_name(step))
    tmp = final + ".tmp"
    entries = list(shard_entries(chunks, dp, optimizer, grid, cfg.model_config()))
    with comm.paused():
        # weights that are NaN or inf (a run that --skip-nonfinite kept going) are never
        # saved: they would become `latest`, and every resume and restart would start from them
        bad = next((e["name"] for e in entries for k in ("param", *ADAM)
                    if k in e and not torch.isfinite(e[k]).all()), None)
        every = [None] * grid.world_size
        dist.all_gather_object(every, bad)
        if name := next((n for n in every if n), None):
            raise CheckpointError(f"--save {root}: not saving step {step}: the weights are not "
                                  f"finite ({name} holds NaN or inf); the latest checkpoint is "
                                  f"still {latest(root) or 'none'}")
        if grid.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)     # left by a save that crashed
            os.makedirs(tmp)                           # (and `root`, the first time)
        dist.barrier()
        name = f"rank_{grid.rank:05d}.pt"
        info = _write_shard(os.path.join(tmp, name), entries, grid)
        reports = [None] * grid.world_size
        dist.all_gather_object(reports, (name, info, _rng_state()))
        # a file that could not be written (a full disk): every rank knows it from the reports
        failed = [next((i["error"] for _, i, _ in reports if "error" in i), None)]
        if grid.rank == 0 and not failed[0]:
            try:
                _commit(root, tmp, final, step, cfg, reports, history)
            except OSError as e:
                failed[0] = f"{e.filename}: {e.strerror}"
        dist.broadcast_object_list(failed, src=0)    # nobody goes on before it is complete
    if failed[0]:         # no checkpoint: the one before stays `latest`, the debris goes
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"--save {root}: could not write the checkpoint of step {step} "
                              f"({sum(i['bytes'] for _, i, _ in reports)} bytes): {failed[0]}; "
                              f"the latest checkpoint is still {latest(root) or 'none'}")
    return final


def _write_shard(path: str, entries: list[dict], grid) -> dict:
    """One rank's file; returns what the manifest records of it, or (a full disk, say: the
    others must hear of it, not wait in the collective for a rank that raised) its size and
    the error."""
    data = _torch_bytes({"rank": grid.rank, "entries": entries})
    try:
        info = _write(path, data)
    except OSError as e:
        return {"bytes": len(data), "error": f"{path}: {e.strerror}"}
    info.update(rank=grid.rank, coords=grid.coords(grid.rank),
                names=sorted({e["name"] for e in entries}))
    return info


def replace_dir(tmp: str, final: str) -> None:
    """Move the complete directory `tmp` to `final`. When `final` exists: two renames, not
    one (a directory cannot replace a non-empty one); between them `final` is briefly
    missing, but whatever points at it (`latest`) is written only after both. The old one
    goes to a new, empty name (nobody's file is in the way) and is removed last."""
    old = tempfile.mkdtemp(suffix=".old", dir=os.path.dirname(os.path.abspath(final)))
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def _commit(root, tmp, final, step, cfg, reports, history):
    files = {name: info for name, info, _ in reports}
    files[RNG] = _write(os.path.join(tmp, RNG), _torch_bytes([rng for _, _, rng in reports]))
    files[HISTORY] = _write(os.path.join(tmp, HISTORY),
                            "".join(json.dumps(r) + "\n" for r in history).encode())
    train = {**{k: getattr(cfg, k) for k in TRAIN_KEYS}, "data_sha256": data_digest(cfg.data)}
    manifest = {"format": FORMAT, "step": step, "world_size": len(reports),
                "layout": cfg.parallel.as_dict(), "model": dataclasses.asdict(cfg.model_config()),
                "train": train, "files": files}
    _write(os.path.join(tmp, MANIFEST), json.dumps(manifest, indent=1).encode())
    _fsync_dir(tmp)
    # saved before? a run resumed from an older checkpoint passes this step again
    replace_dir(tmp, final)
    pointer = os.path.join(root, LATEST + ".tmp")
    _write(pointer, (os.path.basename(final) + "\n").encode())
    os.replace(pointer, os.path.join(root, LATEST))
    _fsync_dir(root)


def load(path: str, chunks, dp, optimizer, grid, model: ModelConfig) -> tuple[int, list[dict]]:
    """Every rank calls this after building its model pieces (in any layout). Fills the
    parameters and AdamW's state with the checkpoint's; returns (the step to continue
    from, the records of the steps before it)."""
    manifest = read_manifest(step_dir := resolve(path))
    mine, buffers = named_params(chunks, model), named_buffers(chunks)
    needed = {name for name, _ in mine + buffers}
    entries = defaultdict(list)     # the slices of each parameter, from the files that hold any
    for fname, info in manifest["files"].items():
        if fname.startswith("rank_") and needed.intersection(info["names"]):
            for e in load_torch(step_dir, fname, manifest)["entries"]:
                entries[e["name"]].append(e)
    with torch.no_grad():      # every name is there: `check_resume` found the same model
        for name, p in mine:
            _restore(p, entries[name], dp, optimizer, grid)
        for name, t in buffers:
            t.copy_(full_tensor(entries[name]).view_as(t))
    _restore_rng(step_dir, manifest, grid)
    history = [json.loads(line) for line in
               read_verified(step_dir, HISTORY, manifest).decode().splitlines() if line]
    return manifest["step"], history


def _restore(p, entries, dp, optimizer, grid):
    shard = dp.shard_of(p)
    # each key saved (the weight; AdamW's m and v) whole, then this layout's part of it, ...
    full = {k: full_tensor(entries, k) for k in ("param", *ADAM) if k in entries[0]}
    local = {k: t[local_index(t.shape, placements(p), grid.axes)] for k, t in full.items()}
    # ... and the piece of it this rank holds (all of it, or its ZeRO range)
    piece = {k: t.reshape(-1)[shard.start:shard.stop] for k, t in local.items()}
    if p.shape == shard.shape:
        p.data.copy_(local["param"])     # whole here (ZeRO-1/2 pieces are views of it)
    # ZeRO-3 holds the whole parameter only while a unit runs: its piece is the only copy
    shard.data.copy_(piece["param"])
    if "exp_avg" in piece:
        optimizer.state[shard.key] = {
            "step": torch.tensor(entries[0]["adam_step"], dtype=torch.float32),
            **{k: piece[k].to(shard.key.device, copy=True).view(shard.key.shape) for k in ADAM}}


def _restore_rng(step_dir, manifest, grid):
    """The same layout gets back each rank's own state; another layout has no such thing
    as "the same rank", and every rank takes rank 0's."""
    states = load_torch(step_dir, RNG, manifest)
    same = all(manifest["layout"][k] == n for k, n in grid.sizes.items())
    state = states[grid.rank if same else 0]
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
