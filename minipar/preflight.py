"""Every check that can run before a rank starts: one line naming the flag or file, exit 2.

Chapter "From a laptop to a cluster". A rule broken inside a rank costs the start-up of every rank
and then shows up as a traceback from one of them (or, worse, as a run that trains to NaN
and exits 0). So `check_run` asks, in the parent process and in this order:

1. the configuration's own rules (`TrainConfig.validate`: layout, model, numbers), with
   --init-hf's config.json read first (`hf.with_model`): it is the model;
2. the world: torchrun's size against the layout's;
3. the files: --data long enough for one sequence, the --log-json path writable,
   --init-hf's weights, --save and --export-hf directories, --resume's manifest and the
   SHA-256 of every file it lists (`checkpoint.check_flags`);
4. the memory: what the ranks on this machine will hold against what the machine has.
"""
from __future__ import annotations

import contextlib
import os

import torch
from tokenizers import Tokenizer

from . import checkpoint, data, flops, hf, launch
from .parallel.schedules import rank_layers
from .config import ConfigError, ModelConfig, TrainConfig


def check_run(cfg: TrainConfig) -> TrainConfig:
    """Raise `ConfigError` (one line) on the first rule the run breaks; return the run:
    `cfg`, with --init-hf's model read."""
    cfg, p = hf.with_model(cfg).validate(), cfg.parallel      # the layout is the one given
    if launch.in_torchrun() and int(os.environ["WORLD_SIZE"]) != p.world_size:
        raise ConfigError(f"--tp {p.tp} x --cp {p.cp} x --pp {p.pp} x --dp {p.dp} = "
                          f"{p.world_size} ranks, but torchrun started {os.environ['WORLD_SIZE']}")
    if cfg.init_hf:      # config.json was read above; now every weight's file and shape
        hf.check_dir(cfg.init_hf, cfg.model_config())
    for flag, path in (("--save", cfg.save), ("--export-hf", cfg.export_hf)):
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"{flag} {path} is a file, not a directory")
    if os.path.isfile(cfg.profile or "") and not cfg.profile.endswith((".json", ".json.gz")):
        raise ConfigError(f"--profile {cfg.profile} is a file; give a directory (or a path "
                          "ending in .json or .json.gz)")
    if cfg.log_json:
        check_writable_file("--log-json", cfg.log_json)
    if cfg.data is not None:
        check_data(cfg)
    checkpoint.check_flags(cfg)
    check_memory(cfg)
    return cfg


def check_writable_file(flag: str, path: str) -> None:
    """`path` can be written by rank 0 later: an existing writable file, or a new name in
    an existing, writable directory. Asked of `open` itself at the end: `os.access` says yes
    to root for every path, even in /proc or on a file system mounted read-only."""
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is a file, not a directory" if os.path.exists(parent) else "does not exist"
        raise ConfigError(f"{flag} {path}: {parent} {what}")
    existed = os.path.exists(path)
    if not os.access(path if existed else parent, os.W_OK if existed else os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path} is not writable" if existed else
                          f"{flag} {path}: the directory {parent} is not writable")
    try:
        open(path, "a").close()        # appends nothing: an existing file keeps its bytes
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be written: {e.strerror}") from None
    if not existed:
        os.remove(path)


def check_data(cfg: TrainConfig) -> None:
    """The --data file exists, fits the vocabulary, and holds at least one training window:
    seq_len + 1 tokens (inputs and shifted targets) and one more so that windows can start
    at more than one place."""
    tokenizer, vocab_size = hf.tokenizer_file(cfg.init_hf), cfg.model_config().vocab_size
    if not os.path.isfile(cfg.data):
        raise ConfigError(f"--data {cfg.data}: no such file")
    if tokenizer is None and vocab_size < 256:
        raise ConfigError("--data trains on bytes and needs a vocabulary of at least 256")
    if tokenizer is not None:
        try:
            n = Tokenizer.from_file(tokenizer).get_vocab_size()
        except Exception as e:  # noqa: BLE001 - the library raises its own exception types
            raise ConfigError(f"--init-hf {tokenizer}: unreadable tokenizer: {e}") from None
        if n > vocab_size:
            raise ConfigError(f"--init-hf {tokenizer}: the tokenizer has {n} tokens, more than "
                              f"the model's vocab_size={vocab_size}")
    try:
        n = os.path.getsize(cfg.data) if not tokenizer else \
            len(data.make_source(cfg.data, vocab_size, cfg.seed, tokenizer).data)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--data {cfg.data}: unreadable: {str(e).splitlines()[0]}") from None
    if n < cfg.seq_len + 2:
        raise ConfigError(f"--data {cfg.data} holds {n} {'tokens' if tokenizer else 'bytes'}; "
                          f"--seq-len {cfg.seq_len} needs at least seq_len + 2 = {cfg.seq_len + 2}")


# ---------------------------------------------------------------- memory
def stage_bytes(model: ModelConfig, cfg: TrainConfig, stage: int) -> tuple[int, int]:
    """Lower bounds on the bytes one rank of pipeline stage `stage` allocates, (built,
    held): the stage's layers are built whole in float32 on the CPU before tensor
    parallelism cuts them; then, on its device, it keeps its shard of weights (4 B),
    gradients (4 B) and AdamW's m and v (8 B), ZeRO-sharded over dp x cp as far as its
    stage says. Activations come on top."""
    p = cfg.parallel
    layers = rank_layers(model, p.pp, p.virtual_stages, stage)
    first, last = stage == 0, stage == p.pp - 1
    # the stage's parameters whole (tp = 1), and the TP shard of them this rank keeps
    whole, n = (flops.local_param_count(model, tp, layers, first, last) for tp in (1, p.tp))
    # (bytes, the ZeRO stage from which they are sharded): weights, gradients, AdamW's m and v
    held = sum(n * b / (p.dp * p.cp if p.zero >= z else 1) for b, z in ((4, 3), (4, 2), (8, 1)))
    return 4 * whole, int(held)


def available_ram() -> int | None:
    """Bytes this machine (or its container's cgroup) can still give: MemAvailable, capped
    by cgroup v2's memory.max - memory.current. None where neither can be read."""
    room = []
    try:
        with open("/proc/meminfo") as f:
            room += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        with contextlib.suppress(ValueError, OSError):
            room.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):     # ValueError: memory.max says "max"
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            room.append(int(f.read()) - int(g.read()))
    return min(room, default=None)


def check_memory(cfg: TrainConfig) -> None:
    """The ranks on this machine need more memory than it has: say so now, not after the
    machine has been swapping for minutes. Locally every rank is here; under torchrun the
    LOCAL_WORLD_SIZE ranks of this node (counted at the largest stage's need)."""
    model, p, on_gpu = cfg.model_config(), cfg.parallel, torch.cuda.is_available()
    parts = [stage_bytes(model, cfg, s) for s in range(p.pp)]
    per_stage = [built if on_gpu else max(built, held) for built, held in parts]
    if launch.in_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", p.world_size))
        need, ranks = local * max(per_stage), local
    else:
        need, ranks = sum(per_stage) * (p.world_size // p.pp), p.world_size
    have = available_ram()
    what = f"--model {cfg.model}" if not cfg.init_hf else f"--init-hf {cfg.init_hf}"
    if have is not None and need > have:
        raise ConfigError(f"{what} needs at least {need / 2**30:.1f} GiB for the weights, "
                          f"gradients and AdamW state of its {ranks} rank(s) on this machine "
                          f"(float32), but {have / 2**30:.1f} GiB is available")
    if on_gpu:
        gpu, held = torch.cuda.get_device_properties(0).total_memory, max(h for _, h in parts)
        if held > gpu:
            raise ConfigError(f"{what} needs at least {held / 2**30:.1f} GiB per GPU "
                              f"for weights, gradients and AdamW state in this layout, but a "
                              f"GPU has {gpu / 2**30:.1f} GiB")
