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
contiguous chunks along the parameter's `_tp_dim` (`tensor.shard_param`), ZeRO pieces are
flat ranges of the TP-local tensor (`FlatShards.piece_range`), pipeline stages name their
layers by global index. Loading rebuilds each full tensor from the slices that hold it and
cuts it again the way the *new* layout cuts it, so a run saved at tp2 x pp2 resumes at
dp2 x cp2, or ZeRO-3 resumes without ZeRO. Replicated tensors (over DP without ZeRO, over
TP for norms) are saved once: by the rank whose copy counts (`grid.counts`).

At scale this is how a checkpoint of Llama 3 405B works too (each GPU writes its own
state, 1 MB to 4 GB of it, in parallel); a real implementation streams tensors instead of
rebuilding whole ones in memory, and resharding reads only the byte ranges it needs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
from collections import defaultdict

import torch
import torch.distributed as dist

from . import comm
from .config import ConfigError, ModelConfig
from .parallel.data import DataParallel

FORMAT = "minipar-checkpoint/1"
MANIFEST, LATEST, HISTORY, RNG = "manifest.json", "latest", "history.jsonl", "rng.pt"
TENSORS = ("param", "exp_avg", "exp_avg_sq")


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete, corrupt or of another model; names the file."""


# ================================================================ where checkpoints are
def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def latest(root: str | None) -> str | None:
    """The newest complete checkpoint under `root` (what `latest` names), or None."""
    pointer = os.path.join(root or "", LATEST)
    if not root or not os.path.isfile(pointer):
        return None
    try:
        with open(pointer, "rb") as f:
            name = f.read(4096).decode().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint pointer {pointer} is unreadable: {e}") from None
    if name and (os.sep in name or not name.startswith("step_")):
        raise CheckpointError(f"checkpoint pointer {pointer} names {name[:40]!r}, not a step_N directory")
    return os.path.join(root, name) if name else None


def resolve(path: str) -> str:
    """A checkpoint directory from what --resume was given: the directory itself (it has
    a manifest), or a --save directory, whose `latest` names one."""
    if not os.path.isdir(path):
        raise CheckpointError(f"--resume {path}: no such directory")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    step_dir = latest(path)
    if step_dir is None:
        raise CheckpointError(f"--resume {path}: no checkpoint there "
                              f"(neither a {MANIFEST} nor a `{LATEST}` pointer)")
    if not os.path.isfile(os.path.join(step_dir, MANIFEST)):
        raise CheckpointError(f"--resume {path}: `{LATEST}` names {step_dir}, which has no {MANIFEST}")
    return step_dir


def step_of(path: str | None) -> int:
    """The step a run resuming from `path` (None: from scratch) starts at."""
    return 0 if path is None else read_manifest(resolve(path))["step"]


# What a manifest must hold, and of which type: anything else is a damaged or foreign file.
MANIFEST_KEYS = {"format": str, "step": int, "world_size": int, "layout": dict, "model": dict,
                 "train": dict, "files": dict}


def read_manifest(step_dir: str) -> dict:
    path = os.path.join(step_dir, MANIFEST)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode())
    except (OSError, ValueError) as e:     # ValueError: bad UTF-8 or bad JSON
        raise CheckpointError(f"checkpoint file {path} is unreadable: {str(e).splitlines()[0]}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint file {path} holds a JSON {type(manifest).__name__}, "
                              "not the manifest's object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint file {path}: format {manifest.get('format')!r}, "
                              f"expected {FORMAT!r}")
    for key, kind in MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind):
            raise CheckpointError(f"checkpoint file {path}: `{key}` is missing or not a {kind.__name__}")
    for name, info in manifest["files"].items():
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int)
                and isinstance(info.get("sha256"), str) and os.sep not in name):
            raise CheckpointError(f"checkpoint file {path}: its entry for {name!r} lacks bytes or sha256")
    return manifest


def check_files(step_dir: str, manifest: dict) -> None:
    """Every file the manifest lists is there, with its size and its SHA-256, before any
    rank starts: a rank file whose rank holds no tensors is verified too, and a damaged one
    costs no start-up. Sizes first (cheap: a missing or truncated file is named without
    reading anything), then the checksums, a file at a time."""
    for name, info in manifest["files"].items():
        path = os.path.join(step_dir, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} is missing")
        size = os.path.getsize(path)
        if size != info["bytes"]:
            raise CheckpointError(f"checkpoint file {path} is {size} bytes, the manifest says "
                                  f"{info['bytes']} (truncated or overwritten)")
    for name, info in manifest["files"].items():
        if _sha256_of(os.path.join(step_dir, name)) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {os.path.join(step_dir, name)} is corrupt: "
                                  "its SHA-256 differs from the manifest's")


def _sha256_of(path: str, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path} is unreadable: {e}") from None
    return h.hexdigest()


def check_resume(path: str, model: ModelConfig, steps: int) -> dict:
    """What --resume needs before any process starts: a complete checkpoint of this model
    at a step not beyond --steps. Returns its manifest."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    check_files(step_dir, manifest)
    # a field the checkpoint predates has its default there (the model it was saved from)
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    saved = {**defaults, **manifest["model"]}
    now = dataclasses.asdict(model)
    differ = [f"{k}={saved.get(k)} (now {v})" for k, v in now.items()
              if k != "name" and saved.get(k) != v]
    if differ:
        raise CheckpointError(f"--resume {path}: the checkpoint is of another model: {', '.join(differ)}")
    if manifest["step"] > steps:
        raise CheckpointError(f"--resume {path}: the checkpoint is at step {manifest['step']}, "
                              f"beyond --steps {steps}")
    return manifest


# What a step *means*: the tokens it reads are a pure function of these (and of the step).
# A resumed run that changes one of them continues another run's curve.
MEANING = {"seq_len": "--seq-len", "global_batch": "--global-batch", "data": "--data",
           "seed": "--seed"}


def data_digest(path: str | None) -> str | None:
    """The --data file's SHA-256 (None: synthetic data): the same text under another path
    is the same data, another text under the same path is not."""
    return None if path is None else _sha256_of(path)


def run_meaning(cfg) -> dict:
    return {"seq_len": cfg.seq_len, "global_batch": cfg.global_batch, "seed": cfg.seed,
            "data": data_digest(cfg.data)}


def meaning_changes(manifest: dict, cfg) -> dict:
    """{flag: [the checkpoint's value, this run's]} for each of `MEANING` that differs."""
    saved, now = manifest["train"], run_meaning(cfg)
    if "data_sha256" in saved:
        saved = {**saved, "data": saved["data_sha256"]}
    else:      # a checkpoint from before the digest was kept: compare the paths
        now["data"] = cfg.data
    return {MEANING[k]: [saved.get(k), now[k]] for k in MEANING if saved.get(k) != now[k]}


def check_flags(cfg) -> None:
    """What --save and --resume name on disk, before any rank starts (`preflight.check_run`;
    the flags' own rules, --save-every's among them, are `TrainConfig.problems`)."""
    if cfg.save and os.path.exists(cfg.save) and not os.path.isdir(cfg.save):
        raise ConfigError(f"--save {cfg.save} is a file, not a directory")
    if cfg.resume is not None:
        manifest = check_resume(cfg.resume, cfg.model_config(), cfg.steps)
        changes = meaning_changes(manifest, cfg)
        if changes and not cfg.resume_allow_change:
            what = ", ".join(f"{flag} {_short(old)} (now {_short(new)})"
                             for flag, (old, new) in changes.items())
            raise CheckpointError(f"--resume {cfg.resume}: the checkpoint was trained with "
                                  f"{what}; continuing would splice another run's curve onto "
                                  "it (--resume-allow-change to do it anyway)")


def _short(v):
    return f"sha256:{v[:12]}" if isinstance(v, str) and len(v) == 64 else v


# ================================================================ what a rank holds
def canonical_name(name: str, model: ModelConfig) -> str:
    """With tied embeddings the head *is* the embedding: one tensor, one name, wherever a
    pipeline stage keeps its copy."""
    return "embed_tokens.weight" if model.tie_embeddings and name == "lm_head.weight" else name


def named_params(chunks, model: ModelConfig) -> list[tuple[str, torch.nn.Parameter]]:
    return [(canonical_name(n, model), p) for m in chunks for n, p in m.named_parameters()]


def shard_entries(chunks, dp: DataParallel, optimizer, grid, model: ModelConfig) -> list[dict]:
    """This rank's slices of every parameter it saves, with AdamW's m, v and step, each
    labelled with where it lies in the global tensor. What a rank holds of a parameter is
    `dp.shard_of(p)`: all of it, or (ZeRO) its piece. Copies of one tensor are saved once,
    by the rank whose copy counts, as the gradient norm counts it once."""
    out = []
    for name, p in named_params(chunks, model):
        shard = dp.shard_of(p)
        if shard.start == shard.stop or not grid.counts(p, dp.holds_replicas):
            continue
        tp_dim = getattr(p, "_tp_dim", None)
        entry = {"name": name, "shape": list(shard.shape), "start": shard.start,
                 "stop": shard.stop, "tp_dim": tp_dim,
                 "tp_rank": grid.tp.rank if tp_dim is not None else 0,
                 "tp_size": grid.tp.size if tp_dim is not None else 1,
                 # a copy: a view would drag its whole storage (the full parameter) along
                 "param": shard.data.detach().reshape(-1).to("cpu", copy=True)}
        state = optimizer.state.get(shard.key) or {}
        if state:
            entry["adam_step"] = float(state["step"])
            for k in ("exp_avg", "exp_avg_sq"):
                entry[k] = state[k].detach().reshape(-1).to("cpu", copy=True)
        out.append(entry)
    return out


# ================================================================ reassembling and cutting
def full_tensor(entries: list[dict], key: str = "param") -> torch.Tensor:
    """The global tensor `key` of one parameter from the slices that hold it: pieces fill
    the flat ranges of each TP shard, TP shards are concatenated along their dim. Copies of
    one slice (a tied head, say) are harmless: they are equal."""
    first = entries[0]
    name, tp_size, tp_dim = first["name"], first["tp_size"], first["tp_dim"]
    shards = []
    for t in range(tp_size):
        mine = [e for e in entries if e["tp_rank"] == t]
        if not mine:
            raise CheckpointError(f"{name}: no file holds its tensor-parallel shard {t} of {tp_size}")
        shape = mine[0]["shape"]
        flat = torch.empty(math.prod(shape), dtype=mine[0][key].dtype)
        covered = torch.zeros(flat.numel(), dtype=torch.bool)
        for e in mine:
            flat[e["start"]:e["stop"]] = e[key]
            covered[e["start"]:e["stop"]] = True
        if not covered.all():
            raise CheckpointError(f"{name}: {int((~covered).sum())} of its elements "
                                  f"(TP shard {t}) are in no file of the checkpoint")
        shards.append(flat.view(shape))
    return torch.cat(shards, dim=tp_dim) if tp_dim is not None else shards[0]


def tp_local(full: torch.Tensor, tp_dim: int | None, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The TP rank's part of a global tensor, cut exactly as `tensor.shard_param` cuts it."""
    return full if tp_dim is None else full.chunk(tp_size, dim=tp_dim)[tp_rank]


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


def read_verified(step_dir: str, name: str, manifest: dict) -> bytes:
    """A file's bytes, after checking them against the manifest's size and SHA-256."""
    path = os.path.join(step_dir, name)
    info = manifest["files"].get(name)
    if info is None:
        raise CheckpointError(f"checkpoint file {path} is not in its manifest")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path} is unreadable: {e}") from None
    if len(data) != info["bytes"]:
        raise CheckpointError(f"checkpoint file {path} is {len(data)} bytes, the manifest says "
                              f"{info['bytes']} (truncated or overwritten)")
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupt: its SHA-256 differs from the manifest's")
    return data


def load_torch(step_dir: str, name: str, manifest: dict):
    data = read_verified(step_dir, name, manifest)
    try:
        # weights_only: tensors, numbers, strings, lists and dicts, never arbitrary code
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"checkpoint file {os.path.join(step_dir, name)} "
                              f"cannot be loaded: {e}") from None


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


# ================================================================ save and load
def save(root: str, step: int, chunks, dp: DataParallel, optimizer, grid, cfg,
         history: list[dict]) -> str:
    """Every rank calls this after `step` steps are done; returns the checkpoint directory.

    Each rank writes its own file into a temporary directory; rank 0, once every rank has
    reported its file's size and checksum, writes the manifest, renames the directory into
    place and points `latest` at it.
    """
    final = os.path.join(root, step_dir_name(step))
    tmp = final + ".tmp"
    model = cfg.model_config()
    with comm.paused():
        if grid.rank == 0:
            os.makedirs(root, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)     # left by a save that crashed
            os.makedirs(tmp)
        dist.barrier()
        name = f"rank_{grid.rank:05d}.pt"
        entries = shard_entries(chunks, dp, optimizer, grid, model)
        info = _write_shard(os.path.join(tmp, name), entries, grid)
        reports = [None] * grid.world_size
        dist.all_gather_object(reports, (name, info, _rng_state()))
        if grid.rank == 0:
            _commit(root, tmp, final, step, cfg, reports, history)
        dist.barrier()       # nobody goes on (or dies) before the checkpoint is complete
    return final


def _write_shard(path: str, entries: list[dict], grid) -> dict:
    """One rank's file; returns what the manifest records of it."""
    info = _write(path, _torch_bytes({"rank": grid.rank, "entries": entries}))
    info.update(rank=grid.rank, coords=grid.coords(grid.rank),
                names=sorted({e["name"] for e in entries}))
    return info


def replace_dir(tmp: str, final: str) -> None:
    """Move the complete directory `tmp` to `final`. When `final` exists: two renames, not
    one (a directory cannot replace a non-empty one); between them `final` is briefly
    missing, but whatever points at it (`latest`) is written only after both."""
    if os.path.exists(final):
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)


def _commit(root, tmp, final, step, cfg, reports, history):
    files = {name: info for name, info, _ in reports}
    files[RNG] = _write(os.path.join(tmp, RNG), _torch_bytes([rng for _, _, rng in reports]))
    files[HISTORY] = _write(os.path.join(tmp, HISTORY),
                            "".join(json.dumps(r) + "\n" for r in history).encode())
    manifest = {
        "format": FORMAT, "step": step, "world_size": len(reports),
        "layout": cfg.parallel.as_dict(),
        "model": dataclasses.asdict(cfg.model_config()),
        "train": {**{k: getattr(cfg, k) for k in ("seed", "global_batch", "seq_len", "lr",
                                                  "warmup_steps", "decay_steps", "min_lr_ratio",
                                                  "weight_decay", "clip", "data", "init_hf")},
                  "data_sha256": data_digest(cfg.data)},
        "files": files,
    }
    _write(os.path.join(tmp, MANIFEST), json.dumps(manifest, indent=1).encode())
    _fsync_dir(tmp)
    # saved before? a run resumed from an older checkpoint passes this step again
    replace_dir(tmp, final)
    pointer = os.path.join(root, LATEST + ".tmp")
    _write(pointer, (os.path.basename(final) + "\n").encode())
    os.replace(pointer, os.path.join(root, LATEST))
    _fsync_dir(root)


def load(path: str, chunks, dp: DataParallel, optimizer, grid,
         model: ModelConfig) -> tuple[int, list[dict]]:
    """Every rank calls this after building its model pieces (in any layout). Fills the
    parameters and AdamW's state with the checkpoint's; returns (the step to continue
    from, the records of the steps before it)."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    mine = named_params(chunks, model)
    needed = {name for name, _ in mine}
    entries = defaultdict(list)
    for fname, info in manifest["files"].items():
        if fname.startswith("rank_") and needed.intersection(info["names"]):
            for e in load_torch(step_dir, fname, manifest)["entries"]:
                if e["name"] in needed:
                    entries[e["name"]].append(e)
    with torch.no_grad():
        for name, p in mine:
            if name not in entries:
                raise CheckpointError(f"{step_dir}: no file of the checkpoint holds {name}")
            _restore(name, p, entries[name], dp, optimizer, grid)
    _restore_rng(step_dir, manifest, grid)
    history = [json.loads(line) for line in
               read_verified(step_dir, HISTORY, manifest).decode().splitlines() if line]
    return manifest["step"], history


def _restore(name, p, entries, dp: DataParallel, optimizer, grid):
    shard = dp.shard_of(p)
    tp_dim = getattr(p, "_tp_dim", None)

    def local(k):          # this layout's TP-local tensor k of the parameter
        t = tp_local(full_tensor(entries, k), tp_dim, grid.tp.rank, grid.tp.size)
        if t.shape != shard.shape:
            raise CheckpointError(f"{name}: the checkpoint's slice has shape {tuple(t.shape)}, "
                                  f"this layout holds {tuple(shard.shape)}")
        return t

    param = local("param")
    if p.shape == shard.shape:
        p.data.copy_(param)     # whole here (ZeRO-1/2 pieces are views of it)
    # ZeRO-3 holds the whole parameter only while a unit runs: its piece is the only copy
    shard.data.copy_(param.reshape(-1)[shard.start:shard.stop])
    if "exp_avg" in entries[0]:
        key = shard.key
        optimizer.state[key] = {
            "step": torch.tensor(entries[0]["adam_step"], dtype=torch.float32),
            **{k: local(k).reshape(-1)[shard.start:shard.stop].to(key.device, copy=True).view(key.shape)
               for k in ("exp_avg", "exp_avg_sq")}}


def _restore_rng(step_dir, manifest, grid):
    """The same layout gets back each rank's own state; another layout has no such thing
    as "the same rank", and every rank takes rank 0's."""
    states = load_torch(step_dir, RNG, manifest)
    same = manifest["world_size"] == grid.world_size and \
        all(manifest["layout"][k] == grid.sizes[k] for k in ("tp", "cp", "pp", "dp"))
    state = states[grid.rank if same else 0]
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
