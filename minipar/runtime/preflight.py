"""Every check that can run before a rank starts: one line naming the flag or file, exit 2.

Chapter "From a laptop to a cluster". A rule broken inside a rank costs the start-up of every rank
and then shows up as a traceback from one of them (or, worse, as a run that trains to NaN
and exits 0). So `check_run` asks, in the parent process and in this order:

1. the configuration's own rules (`TrainConfig.validate`: layout, model, numbers), with
   --init-hf's config.json read first (`hf.with_model`): it is the model;
2. the world: torchrun's size against the layout's;
3. the files: no two of --data and the outputs the same, every output proved writable
   (--save and --export-hf new, empty or minipar's own: `check_paths`), --data long enough
   for one sequence;
4. the memory: what the ranks on this machine will hold against what the machine has,
   before anything of the model is built (a config.json may say 100 million layers);
5. what the model is read from: --init-hf's weights (every path inside the directory),
   --resume's manifest as a whole, the SHA-256 of every file it lists and their contents,
   unpickled as the ranks will (`checkpoint.check_flags`); and room on the disk for
   --export-hf's directory.

Every directory and file read is untrusted until checked: `hf.check_model_memory` bounds a
model read from a file (`minipar.generate`, `minipar.export`) the same way.
"""

import errno
import itertools
import os
import shutil
import stat
from dataclasses import replace

import torch
from tokenizers import Tokenizer

from ..plan import flops, schedules
from ..plan.config import ConfigError, ModelConfig, TrainConfig
from ..plan.memory import FP32, memory_of_rank
from ..trainer import tokens
from . import checkpoint, hf, launch
from .hf import available_ram, check_model_memory     # (the tests replace available_ram here)


def check_run(cfg: TrainConfig) -> TrainConfig:
    """Raise `ConfigError` (one line) on the first rule the run breaks; return the run:
    `cfg`, with --init-hf's model read."""
    cfg, p = hf.with_model(cfg).validate(), cfg.parallel      # the layout is the one given
    if launch.in_torchrun() and int(os.environ["WORLD_SIZE"]) != p.world_size:
        raise ConfigError(f"--tp {p.tp} x --cp {p.cp} x --pp {p.pp} x --dp {p.dp} = "
                          f"{p.world_size} ranks, but torchrun started {os.environ['WORLD_SIZE']}")
    check_paths(cfg)
    if cfg.data is not None:
        check_data(cfg)
    # the sizes config.json (or --model) gives, bounded before anything is built of them: the
    # checks below build the model on the meta device (100 million layers would take days)
    if cfg.init_hf and not launch.in_torchrun():      # locally, all of it is built here
        check_model_memory(cfg.model_config(), f"--init-hf {cfg.init_hf}/{hf.CONFIG}", copies=1)
    check_memory(cfg)
    if cfg.init_hf:      # config.json was read above; now every weight's file and shape
        hf.check_dir(cfg.init_hf, cfg.model_config())
    checkpoint.check_flags(cfg)
    check_export_space(cfg)
    return cfg


def check_paths(cfg: TrainConfig) -> None:
    """The files a run reads (--data) and writes, before anything is written: none names
    another (the log written over the corpus, an export that replaces the checkpoints it
    holds), and each output can be written, by its check: --save and --export-hf are new,
    empty or minipar's own (`checkpoint.check_out_dir`), the others are any writable place."""
    trace = check_writable_file if (cfg.profile or "").endswith((".json", ".json.gz")) else \
        lambda flag, path: checkpoint.check_out_dir(flag, path, own=False)   # DIR/trace.json
    paths = [("--data", cfg.data, None), ("--save", cfg.save, checkpoint.check_out_dir),
             ("--export-hf", cfg.export_hf,        # replaced whole: a rename in its parent
              lambda flag, path: checkpoint.check_out_dir(flag, path, replaced=True)),
             ("--profile", cfg.profile, trace), ("--log-json", cfg.log_json, check_writable_file)]
    real = [(flag, path, os.path.realpath(path)) for flag, path, _ in paths if path]
    for (a, path_a, real_a), (b, path_b, real_b) in itertools.permutations(real, 2):
        if real_a == real_b or a == "--export-hf" and real_b.startswith(real_a + os.sep):
            raise ConfigError(f"{b} {path_b} {'is' if real_a == real_b else 'lies inside'} {a} "
                              f"{path_a}: --data, --save, --export-hf, --profile and --log-json "
                              "may not name each other")
    for flag, path, check in paths:
        if path and check:
            check(flag, path)


def check_writable_file(flag: str, path: str) -> None:
    """`path` can be written by rank 0 later: an existing writable file, or a new name in
    an existing, writable directory. Asked of `open` itself, with a byte where no file's
    bytes are changed by it: `os.access` says yes to root for every path, even in /proc or
    on a file system mounted read-only, and nothing but a write finds a full disk. Under
    torchrun every rank checks its run, but only rank 0 probes: two probes of one new name
    race (one removes the other's), and a late one would remove rank 0's real file."""
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is a file, not a directory" if os.path.exists(parent) else "does not exist"
        raise ConfigError(f"{flag} {path}: {parent} {what}")
    # torchrun's other ranks: rank 0 writes the file, and alone probes it; a FIFO: no probe
    if os.environ.get("RANK", "0") != "0" or check_fifo(flag, path):
        return
    existed = os.path.exists(path)
    try:    # a new file or a device takes a byte now: a full disk, /dev/full, say so here
        with open(path, "ab", buffering=0) as f:     # a file keeps its bytes and its mtime
            f.write(b"" if existed and os.path.isfile(path) else b"\n")
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be written: {e.strerror}") from None
    finally:        # a new file was only the probe
        if not existed and os.path.isfile(path):
            os.remove(path)


def check_fifo(flag: str, path: str) -> bool:
    """True when `path` is a FIFO (a named pipe, /dev/stdout into a pipe) with a reader, which
    the run may write; one with no reader is refused. Asked without blocking (O_NONBLOCK:
    ENXIO when nobody reads), where a plain open would wait for a reader forever; nothing is
    written into it (a probe's byte would reach the reader)."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return False
    except OSError:        # a new name: the probe below makes it
        return False
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as e:
        why = "is a FIFO with no reader (it would wait forever)" if e.errno == errno.ENXIO \
            else f"cannot be written: {e.strerror}"
        raise ConfigError(f"{flag} {path} {why}") from None
    return True


def check_data(cfg: TrainConfig) -> None:
    """The --data file exists, fits the vocabulary, and holds at least one training window:
    seq_len + 1 tokens (inputs and shifted targets) and one more so that windows can start
    at more than one place."""
    tokenizer, vocab_size = hf.tokenizer_file(cfg.init_hf), cfg.model_config().vocab_size
    if not os.path.isfile(cfg.data):
        raise ConfigError(f"--data {cfg.data}: " + ("not a regular file (a device, pipe or "
                          "directory: --data reads a text file)" if os.path.exists(cfg.data)
                          else "no such file"))
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
            len(tokens.make_source(cfg.data, vocab_size, cfg.seed, tokenizer).data)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--data {cfg.data}: unreadable: {str(e).splitlines()[0]}") from None
    if n < cfg.seq_len + 2:
        raise ConfigError(f"--data {cfg.data} holds {n} {'tokens' if tokenizer else 'bytes'}; "
                          f"--seq-len {cfg.seq_len} needs at least seq_len + 2 = {cfg.seq_len + 2}")


# ---------------------------------------------------------------- memory
def stage_bytes(model: ModelConfig, cfg: TrainConfig, stage: int,
                act_bytes: int = 4) -> tuple[int, int, int]:
    """The bytes one rank of pipeline stage `stage` allocates, (built, held, step). Built:
    the stage's layers, whole in float32 on the CPU before tensor parallelism cuts them.
    Held, then, on its device: its shard of weights, gradients and AdamW's m and v in float32,
    ZeRO-sharded over dp x cp as far as its stage says. Step: what a step adds, the global
    batch, which every rank builds whole as int64 (`tokens.py`), and the activations the
    stage keeps at its peak (of `act_bytes` each). The last two are the memory model's
    (`plan.memory.memory_of_rank`, minipar's own tensors)."""
    p = cfg.parallel
    layers = schedules.rank_layers(model, p.pp, p.virtual_stages, stage)
    moes = schedules.rank_layers(model, p.pp, p.virtual_stages, stage, moe=True)
    whole = (flops.local_param_count(model, 1, layers, stage == 0, stage == p.pp - 1, moes)
             + flops.local_expert_param_count(model, 1, 1, moes))   # every expert, before EP
    rank = memory_of_rank(model, p, replace(FP32, act_bytes=act_bytes), cfg.seq_len,
                          cfg.global_batch // (p.dp * p.microbatches), stage)
    held = rank["params"] + rank["grads"] + rank["optimizer"]
    step = cfg.global_batch * (cfg.seq_len + 1) * 8 + rank["activations"]
    return 4 * whole, int(held), int(step)


def check_memory(cfg: TrainConfig) -> None:
    """The ranks on this machine need more memory than it has: say so now, not after the
    machine has been swapping for minutes, naming the flag behind the largest part. Locally
    every rank is here; under torchrun the LOCAL_WORLD_SIZE ranks of this node (each counted
    at the largest stage). On a GPU the state, batch and activations live there; a bytes
    --data file is memory-mapped (`tokens.make_source`), a tokenized one each rank reads whole."""
    model, p, on_gpu = cfg.model_config(), cfg.parallel, torch.cuda.is_available()
    act_bytes = 2 if cfg.dtype == "bf16" or (cfg.dtype == "auto" and on_gpu) else 4
    text = os.path.getsize(cfg.data) if cfg.data and hf.tokenizer_file(cfg.init_hf) else 0
    stages = [stage_bytes(model, cfg, s, act_bytes) for s in range(p.pp)]
    # RAM per rank (all of it, state, step): the stage built whole, or later what it holds
    ram = [(max(b, text + (0 if on_gpu else h + s)), b if on_gpu else max(b, h), s * (not on_gpu))
           for b, h, s in stages]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", p.world_size)) if launch.in_torchrun() else 0
    ranks = local * [max(ram)] if local else ram * (p.world_size // p.pp)
    (need, state, step), room = (sum(c) for c in zip(*ranks)), available_ram()
    why = {f"--model {cfg.model}" if not cfg.init_hf else f"--init-hf {cfg.init_hf}":
           "the weights, gradients and AdamW state (float32)",
           f"--global-batch {cfg.global_batch} x --seq-len {cfg.seq_len}": "the batch and one "
           f"micro-batch's activations (--microbatches {p.microbatches})",
           f"--data {cfg.data}": f"the {text:,} bytes of text tokenized by each"}
    if room is not None and need > room:
        raise too_big(why, (state, step, text * len(ranks)), need, "of RAM", f" of its {len(ranks)}"
                      f" rank(s) on this machine, but {room / 2**30:.1f} GiB is available")
    held, step = max((stage[1:] for stage in stages), key=sum)     # on one GPU
    if on_gpu and held + step > (gpu := torch.cuda.get_device_properties(0).total_memory):
        raise too_big(why, (held, step, 0), held + step, "per GPU",
                      f" in this layout, but a GPU has {gpu / 2**30:.1f} GiB")


def too_big(why: dict[str, str], parts: tuple, need: int, unit: str, tail: str) -> ConfigError:
    """One line for `need` bytes, naming the flag behind the largest of its `parts`."""
    flag, part = max(zip(why, parts), key=lambda fp: fp[1])
    return ConfigError(f"{flag} needs at least {need / 2**30:.1f} GiB {unit}, "
                       f"{part / 2**30:.1f} GiB of it for {why[flag]}{tail}")


def export_bytes(cfg: TrainConfig) -> int:
    """What `hf.save_pretrained` writes: the weights in float32 (a tied head once, as
    `param_count` counts it), --init-hf's tokenizer files, and a MiB for config.json and
    the safetensors header."""
    tokenizer = sum(os.path.getsize(f) for f in hf.tokenizer_files(cfg.init_hf))
    return 4 * flops.param_count(cfg.model_config()) + tokenizer + 2**20


def check_export_space(cfg: TrainConfig) -> None:
    """--export-hf's directory fits on its disk, said before the run rather than after it:
    the export is written at the end, and a full disk then costs the whole run's time."""
    if not cfg.export_hf:
        return
    where = os.path.dirname(os.path.abspath(cfg.export_hf))
    while not os.path.exists(where):
        where = os.path.dirname(where)
    need, free = export_bytes(cfg), shutil.disk_usage(where).free
    if need > free:
        raise ConfigError(f"--export-hf {cfg.export_hf} needs {need / 2**20:,.1f} MiB on the "
                          f"disk of {where}, which has {free / 2**20:,.1f} MiB free")
