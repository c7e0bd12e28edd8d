"""Hugging Face directories in and out: `config.json` plus safetensors, read a slice per rank.

Chapter "Real models in and out".

Every Llama is published as a directory: `config.json` (the shape: `model_config` reads it
into a `ModelConfig` and refuses any field this model does not implement, `to_hf` writes
it back) and the weights in safetensors files,
one `model.safetensors` or several shards listed by `model.safetensors.index.json`
(tensor name -> file). A Mixtral (`MixtralForCausalLM`) is the same directory with a
mixture of experts for each MLP (chapter "Experts: the fifth axis"): its router is the
block's `gate`, and each expert's three matrices are tensors of their own, where minipar
stacks the E experts' into one (`stored_names`, `Stacked`). A safetensors file is a JSON
header (each tensor's name, dtype, shape and byte offsets) followed by the raw bytes, so a
reader can fetch *part* of a tensor without reading the rest:
`safe_open(file).get_slice(name)[rows, cols]`.

That is how a rank loads its piece (`load_weights`): tensor parallelism tells it which rows
(column-parallel, the vocabulary) or columns (row-parallel) of each matrix it holds, the
pipeline stage which layers, expert parallelism which experts, ZeRO which flat range of
those. Each rank reads exactly those bytes and nothing else, which is how the 810 GB of a
405B checkpoint get onto 16K GPUs: no rank ever holds the whole model. (Here the slices
are copied into a model that `parallelize` first initialised from the seed; a 405B loader
builds it on the meta device.)

Going out (`save_pretrained`), the full tensors are written under Hugging Face's names with a
`config.json` that `LlamaForCausalLM.from_pretrained` (or Mixtral's) reads, in shards of at
most `SHARD_BYTES` listed by an index when there is more than one; the directory is written
under a temporary name and renamed into place, like a checkpoint. `--export-hf DIR` does it
at the end of a run (`export_run`): the ranks' slices are gathered to rank 0 and put back
together as a checkpoint's are (`checkpoint.full_state`); `python -m minipar.export`
(`export.py`) reads them from a checkpoint's files instead.
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..plan import flops
from ..plan.config import ConfigError, ModelConfig, TrainConfig
from ..trainer import comm
from ..trainer.model import Transformer
from ..trainer.placement import local_index, placements
from . import launch
from .checkpoint import ADAM, MARK, full_state, named_params, replace_dir, shard_entries

WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
IGNORED = ("rotary_emb.inv_freq",)     # a buffer older transformers saved: computed, not learned
# files of at most this many bytes (a bigger tensor alone): transformers 4's default cut
SHARD_BYTES = 5 * 10**9
# a Mixtral expert's matrices, each [out, in] (Mistral's names: w1 the gate, w3 the up)
MIXTRAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def hf_name(name: str) -> str:
    """minipar's name of a weight -> Hugging Face's: `LlamaForCausalLM` keeps everything but
    the head under `model.` (the reference model's module names are Hugging Face's);
    Mixtral's MoE block is `block_sparse_moe`, its router `gate` as minipar's."""
    name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
    return name if name.startswith("lm_head.") else "model." + name


def is_stacked(name: str) -> bool:
    """A weight of E experts stacked along dim 0 (`model.Experts`)."""
    return ".mlp.experts." in name


def stored_names(name: str, mcfg: ModelConfig) -> list[str]:
    """The tensors of a Hugging Face directory that hold minipar's weight `name`: its
    `hf_name`, or for stacked experts (`layers.3.mlp.experts.up_proj`) Mixtral's E tensors,
    expert e's `model.layers.3.block_sparse_moe.experts.e.w3.weight`."""
    if not is_stacked(name):
        return [hf_name(name)]
    layer, _, matrix = name.rpartition(".mlp.experts.")
    return [f"model.{layer}.block_sparse_moe.experts.{e}.{MIXTRAL_EXPERT[matrix]}.weight"
            for e in range(mcfg.moe_experts)]


# ================================================================ config.json <-> ModelConfig
# The config.json fields that must be present, and the values minipar's Llama implements of
# those that change the architecture (silu: SwiGLU's gate; no dropout). Anything else is
# another model.
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
            "vocab_size")
SUPPORTED = {"architectures": (["LlamaForCausalLM"], None, []), "model_type": ("llama",),
             "hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,),
             "attention_dropout": (0, 0.0)}
# ModelConfig's fields under config.json's names, and the values taken where a config.json
# leaves one out (num_key_value_heads: one per query head, plain multi-head attention)
HF_NAMES = {"n_layers": "num_hidden_layers", "dim": "hidden_size",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
            "ffn_dim": "intermediate_size", "vocab_size": "vocab_size",
            "max_seq_len": "max_position_embeddings", "rope_theta": "rope_theta",
            "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
HF_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
               "rope_theta": 10000.0}
# Mixtral's: the same fields and values, no sliding window, no noise on a training run's router
# inputs; the router's fields (under ModelConfig's names), and MixtralConfig's defaults. Its
# `router_aux_loss_coef` weighs a balance loss transformers adds in training when asked
# (`output_router_logits`): a training choice, as minipar's own (--moe-aux-loss) is.
MIXTRAL = {"architectures": (["MixtralForCausalLM"], None, []), "model_type": ("mixtral",),
           "hidden_act": ("silu",), "attention_dropout": (0, 0.0), "sliding_window": (None,),
           "router_jitter_noise": (0.0, 0)}
MIXTRAL_NAMES = {"moe_experts": "num_local_experts", "moe_top_k": "num_experts_per_tok"}
MIXTRAL_DEFAULTS = {"max_position_embeddings": 4096 * 32, "num_local_experts": 8,
                    "num_experts_per_tok": 2, "rope_theta": 1e6}
# Llama 3.1's RoPE scaling: ModelConfig's fields under the names of its `rope_scaling`
LLAMA3_ROPE = {"rope_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
               "rope_high_freq_factor": "high_freq_factor",
               "rope_original_max_len": "original_max_position_embeddings"}


# where a config.json gives the rotary embedding's parameters: the older `rope_scaling` (with
# a top-level `rope_theta`) or transformers 5's `rope_parameters`; transformers reads the first
ROPE_KEYS = ("rope_scaling", "rope_parameters")
# the kind of value each field holds (ModelConfig's type of it), and the test of a JSON value
KIND = {name: type(getattr(ModelConfig, ours))
        for ours, name in (HF_NAMES | LLAMA3_ROPE | MIXTRAL_NAMES).items()}
KINDS = {int: ("a positive integer", lambda v: type(v) is int and v > 0),    # true is no count
         float: ("a finite number > 0", lambda v: type(v) in (int, float) and 0 < v < math.inf),
         bool: ("true or false", lambda v: type(v) is bool)}


def family(hf: dict) -> tuple[str, dict, dict, dict]:
    """(name, the values it implements, its extra fields, transformers' defaults) of the
    architecture a config.json describes, picked by its model_type as transformers picks."""
    if hf.get("model_type") == "mixtral":
        return "Mixtral", MIXTRAL, MIXTRAL_NAMES, HF_DEFAULTS | MIXTRAL_DEFAULTS
    return "Llama", SUPPORTED, {}, HF_DEFAULTS


def rope_parameters(hf: dict) -> dict:
    """The rotary embedding's parameters, read as transformers reads them (`ROPE_KEYS`); with
    its `rope_type` ("default": plain RoPE, the legacy key is `type`) and `rope_theta`."""
    rope = next((hf[k] for k in ROPE_KEYS if hf.get(k)), {})
    return {"rope_theta": hf.get("rope_theta", family(hf)[3]["rope_theta"]),
            "rope_type": rope.get("type", "default"), **rope}


def config_problems(hf: dict) -> list[str]:
    """Each field of a Hugging Face Llama or Mixtral config that this model does not
    implement, or that is not of its kind (`KIND`). Every RoPE type given is checked,
    whichever key holds it."""
    if not isinstance(hf, dict) or not all(isinstance(hf.get(k) or {}, dict) for k in ROPE_KEYS):
        return [f"must be a JSON object, its {' and '.join(ROPE_KEYS)} objects or null"]
    kind, supported = family(hf)[:2]
    out = [f"missing field {k!r}" for k in REQUIRED if hf.get(k) is None]
    out += [f"{key}={hf[key]!r} is not supported (minipar's {kind} has {allowed[0]!r})"
            for key, allowed in supported.items() if key in hf and hf[key] not in allowed]
    out += [f"{k}: rope_type={t!r} is not supported (plain RoPE, or Llama 3.1's 'llama3')"
            for k in ROPE_KEYS for t in {(hf.get(k) or {}).get(w, "default") for w in
                                         ("rope_type", "type")} - {"default", "llama3"}]
    rope = rope_parameters(hf)
    out += [f"rope_scaling: rope_type 'llama3' needs {k!r}" for k in LLAMA3_ROPE.values()
            if rope["rope_type"] == "llama3" and k not in rope]
    out += [f"{k}={v!r} must be {KINDS[KIND[k]][0]}" for k, v in {**hf, **rope}.items()
            if k in KIND and v is not None and not KINDS[KIND[k]][1](v)]
    if not out:
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
        if hf.get("head_dim") not in (None, head_dim):
            out.append(f"head_dim={hf['head_dim']} is not supported: minipar's is hidden_size / "
                       f"num_attention_heads = {head_dim}")
    return out


def model_config(hf: dict, source: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of a Hugging Face `LlamaConfig` or `MixtralConfig` (its `to_dict()`
    or config.json). A field this model does not implement is a `ConfigError` naming it
    (`config_problems`): better no run than a quiet run of another model."""
    if out := config_problems(hf):
        raise ConfigError(f"{source}: {'; '.join(out)}")
    rope, (_, _, extra, defaults) = rope_parameters(hf), family(hf)
    given = {**defaults, "num_key_value_heads": hf["num_attention_heads"],
             **{k: v for k, v in hf.items() if v is not None},
             "rope_theta": float(rope["rope_theta"])}
    scaled = LLAMA3_ROPE if rope["rope_type"] == "llama3" else {}
    return ModelConfig(**{ours: given[theirs] for ours, theirs in (HF_NAMES | extra).items()},
                       **{ours: rope[theirs] for ours, theirs in scaled.items()},
                       name=hf.get("_name_or_path") or "hf")


# ================================================================ paths inside the directory
def inside(path: str, name: str, flag: str = "--init-hf") -> str:
    """`path/name`, a file the directory `path` holds: a relative name without `..`, and,
    links followed, a file inside `path`, or, for a snapshot of the Hugging Face cache
    (`models--ORG--NAME/snapshots/REVISION`, whose files are links to `../../blobs/SHA`),
    in that model's `blobs`. A directory is untrusted until checked: an index naming
    `../outside/model.safetensors`, or a link out of the directory, would have a run train
    on, and republish, another model's weights."""
    if not isinstance(name, str) or not name or os.path.isabs(name) \
            or ".." in name.replace("\\", "/").split("/"):
        raise ConfigError(f"{flag} {path}: {name!r} is not a name inside the directory")
    real, file = os.path.realpath(path), os.path.join(path, name)
    snapshot = os.path.basename(os.path.dirname(real)) == "snapshots"
    roots = [real, os.path.join(os.path.dirname(os.path.dirname(real)), "blobs")][:1 + snapshot]
    if not any(os.path.realpath(file).startswith(root + os.sep) for root in roots):
        raise ConfigError(f"{flag} {file} is a link to {os.path.realpath(file)}, outside the "
                          "directory")
    return file


def read_config(path: str) -> ModelConfig:
    """The model of a Hugging Face directory, from its config.json (`--init-hf DIR`)."""
    if not os.path.isdir(path):
        raise ConfigError(f"--init-hf {path}: no such directory")
    file = inside(path, CONFIG)
    try:
        with open(file) as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--init-hf {path}: no config.json in the directory") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--init-hf {file}: unreadable: {str(e).splitlines()[0]}") from None
    return model_config(hf, source=f"--init-hf {file}")


def with_model(cfg: TrainConfig) -> TrainConfig:
    """The run with --init-hf's model read (`TrainConfig.init_model`); without --init-hf,
    `cfg` itself."""
    return dataclasses.replace(cfg, init_model=read_config(cfg.init_hf)) if cfg.init_hf else cfg


def to_hf(mcfg: ModelConfig) -> dict:
    """The inverse of `model_config`: config.json, which `LlamaForCausalLM.from_pretrained`
    (with experts, `MixtralForCausalLM`'s) reads and `transformers.LlamaConfig(**d)` (or
    `MixtralConfig`) accepts. Experts that are no Mixtral's are a `ConfigError`."""
    if mcfg.is_moe and not (mcfg.mixtral and mcfg.moe_bias_rate == 0):
        raise ConfigError(f"model {mcfg.name!r} is neither a Llama nor a Mixtral: a Mixtral's "
                          "experts are in every layer, softmax-scored, none shared, unbiased")
    supported, extra = (MIXTRAL, MIXTRAL_NAMES) if mcfg.is_moe else (SUPPORTED, {})
    scaling = {"rope_type": "llama3", **{theirs: getattr(mcfg, ours)
                                         for ours, theirs in LLAMA3_ROPE.items()}}
    return {"torch_dtype": "float32", **{key: allowed[0] for key, allowed in supported.items()},
            **{theirs: getattr(mcfg, ours) for ours, theirs in (HF_NAMES | extra).items()},
            "intermediate_size": mcfg.expert_ffn_dim if mcfg.is_moe else mcfg.ffn_dim,
            "rope_scaling": None if mcfg.llama3_rope is None else scaling}


# ================================================================ memory: before building
def available_ram(cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this machine (or its container's or job's cgroup) can still give: MemAvailable,
    capped by the memory cgroup's limit less its usage, v2's or v1's (`launch.memory_cgroup`;
    v1 says "no limit" with a number near 2**63, which `min` passes over, v2 says "max").
    None where nothing can be read."""
    room = []
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        room += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    with contextlib.suppress(TypeError, ValueError):      # TypeError: no cgroup read
        limit, usage = launch.memory_cgroup(("limit", "usage"), cgroup)
        room.append(int(limit) - int(usage))
    return min(room, default=None)


# Python's own objects of one built layer (its modules, parameters and their bookkeeping),
# beside the tensors' bytes: 25-34 KB measured with torch 2.x on CPU, counted at 64 KB. A
# config of many tiny layers costs this, not its weights.
LAYER_OBJECTS = 64 * 1024


def check_model_memory(model: ModelConfig, source: str, copies: int = 3) -> None:
    """A model read from a file (a config.json, a checkpoint's manifest) can be built here:
    `copies` of its weights in float32 (the file's tensors, the full ones, the model's) and
    its layers' objects (`LAYER_OBJECTS`), against `available_ram` (unknown: no refusal).
    Before any tensor of it exists: a manifest may claim 70B parameters over tiny files."""
    n = flops.param_count(model)
    need, room = copies * 4 * n + model.n_layers * LAYER_OBJECTS, available_ram()
    if room is not None and need > room:
        raise ConfigError(f"{source}: its model ({model.n_layers:,} layers, dim {model.dim:,}, "
                          f"{n / 1e9:.2f}B parameters) needs at least {need / 2**30:.1f} GiB of "
                          f"RAM to build, but {room / 2**30:.1f} GiB is available")


# ================================================================ reading: where and what
def weight_files(path: str) -> dict[str, str]:
    """Weight name -> the file that holds it: the index's `weight_map`, or every tensor of
    the single `model.safetensors` (a computed buffer, `IGNORED`, is no weight). A file the
    index names must exist."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(inside(path, INDEX)) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--init-hf {index}: unreadable index: {e!r}") from None
        if not (isinstance(weight_map, dict) and all(
                isinstance(v, str) and v for v in weight_map.values())):
            raise ConfigError(f"--init-hf {index}: its weight_map is not an object of file names")
        files = {file: inside(path, file) for file in sorted(set(weight_map.values()))}
        if absent := [file for file in files if not os.path.isfile(files[file])]:
            raise ConfigError(f"--init-hf {path}: {absent[0]} is named by {INDEX} but absent")
        return {name: files[file] for name, file in weight_map.items()
                if not name.endswith(IGNORED)}
    if not os.path.isfile(os.path.join(path, WEIGHTS)):
        raise ConfigError(f"--init-hf {path}: neither {WEIGHTS} nor {INDEX} in the directory")
    single = inside(path, WEIGHTS)
    with _open(single) as f:
        return {name: single for name in f.keys() if not name.endswith(IGNORED)}


def _open(file: str):
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"--init-hf {file}: not a readable safetensors file ({e})") from None


def check_dir(path: str, mcfg: ModelConfig) -> None:
    """Before any rank starts: every tensor the model needs is in a file, with the shape
    config.json implies, and no file holds a weight this model would ignore (a bias, say).
    Reads the files' headers only. Every file read is inside the directory (`inside`),
    the tokenizer's too (a run copies them into its --export-hf directory)."""
    files = weight_files(path)
    tokenizer_files(path)
    with torch.device("meta"):      # every weight's shape, under its Hugging Face name; no memory
        state = Transformer(mcfg, seed=None).state_dict(keep_vars=True)
    # (the routing bias is no weight of a Mixtral: it is 0 there, as it starts here)
    want = {hf: tuple(t.shape)[is_stacked(name):] for name, t in state.items()
            if isinstance(t, nn.Parameter) for hf in stored_names(name, mcfg)}
    # a tied head is the embedding: a copy of it may be saved (of the embedding's shape)
    optional = {"lm_head.weight"} if mcfg.tie_embeddings else set()
    if missing := [name for name in want if name not in files and name not in optional]:
        raise ConfigError(f"--init-hf {path}: tensor {missing[0]} is in no file")
    with contextlib.ExitStack() as stack:
        opened = _open_all(stack, files.values())
        for name, file in files.items():
            if name not in opened[file].keys():
                raise ConfigError(f"--init-hf {file}: tensor {name} is listed in the index but "
                                  "not in the file")
            if name not in want:
                raise ConfigError(f"--init-hf {file}: tensor {name} is not a weight of this "
                                  "model (biases and other extras are not supported)")
            if (shape := tuple(opened[file].get_slice(name).get_shape())) != want[name]:
                raise ConfigError(f"--init-hf {file}: tensor {name} has shape {list(shape)}, "
                                  f"config.json implies {list(want[name])}")


def _open_all(stack: contextlib.ExitStack, files) -> dict:
    """Each of `files` opened (its header read), closed with `stack`."""
    return {file: stack.enter_context(_open(file)) for file in sorted(set(files))}


# ================================================================ reading: a rank's slices
def read_piece(sl, index: tuple[slice, ...], start: int, stop: int) -> torch.Tensor:
    """Elements start:stop (flattened) of the part `index` of a stored tensor (this rank's,
    `placement.local_index`), reading only what holds them: of the part's rows, only those
    the flat range start:stop touches (a ZeRO piece)."""
    row = math.prod(s.stop - s.start for s in index[1:])    # elements in one row of the part
    lo, hi = start // row, -(-stop // row)
    rows = slice(index[0].start + lo, index[0].start + hi)
    return sl[(rows, *index[1:])].reshape(-1)[start - lo * row:stop - lo * row]


class Stacked:
    """E experts' tensors (safetensors slices) read as one [E, ...] tensor, by slice as one
    of them is read: `stacked[experts, rows, cols]` reads only the experts asked for (an EP
    rank's, or of those the ones a ZeRO piece touches)."""

    def __init__(self, slices: list):
        self.slices = slices

    def get_shape(self) -> list[int]:
        return [len(self.slices), *self.slices[0].get_shape()]

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
        experts, *part = index
        return torch.stack([self.slices[e][tuple(part)]
                            for e in range(*experts.indices(len(self.slices)))])


@torch.no_grad()
def load_weights(path: str, chunks, mcfg: ModelConfig, shard_of, axes):
    """Copy the directory's weights into what this rank holds of `chunks`: for each
    parameter, its part as its placement says (`placement.local_index`, this rank's `axes`:
    `grid.axes`; an expert weight's experts too) and of that its `shard_of(p)` (all of it,
    or its ZeRO piece), read from the files by slice."""
    files, params = weight_files(path), named_params(chunks, mcfg)
    with contextlib.ExitStack() as stack:     # the headers: a slice reads nothing until indexed
        opened = _open_all(stack, [files[n] for name, _ in params
                                   for n in stored_names(name, mcfg)])
        for name, p in params:
            shard = shard_of(p)
            # whole here (plain DP; ZeRO-1/2's pieces are views of it), or ZeRO-3's piece,
            # the only copy, which may be empty
            held = p.shape == shard.shape
            start, stop = (0, p.numel()) if held else (shard.start, shard.stop)
            if start == stop:
                continue
            sl = [opened[files[n]].get_slice(n) for n in stored_names(name, mcfg)]
            sl = Stacked(sl) if is_stacked(name) else sl[0]
            piece = read_piece(sl, local_index(sl.get_shape(), placements(p), axes), start, stop)
            (p.data.view(-1) if held else shard.data).copy_(piece)


def tokenizer_file(path: str | None, flag: str = "--init-hf") -> str | None:
    """The directory's `tokenizer.json`, when it has one (inside it: `inside`)."""
    file = os.path.join(path, "tokenizer.json") if path else None
    return inside(path, "tokenizer.json", flag) if file and os.path.isfile(file) else None


def tokenizer_files(path: str | None, flag: str = "--init-hf") -> list[str]:
    """The tokenizer files (`TOKENIZER_FILES`) the directory holds, each inside it."""
    return [inside(path, name, flag) for name in TOKENIZER_FILES
            if path and os.path.isfile(os.path.join(path, name))]


# ================================================================ writing
class WriteError(RuntimeError):
    """A Hugging Face directory could not be written (a full disk, say); names the path.
    Nothing of it is left behind, and the directory it would have replaced is as it was."""


def hf_state(state: dict[str, torch.Tensor], mcfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full tensors under minipar's names -> the tensors of a Hugging Face directory, float32
    on the CPU: stacked experts as Mixtral's one tensor each; a tied head stored once, as
    the embedding (as transformers does); the routing bias (0: `to_hf`'s rule) not at all."""
    out = {}
    for name, t in state.items():
        if (mcfg.tie_embeddings and name == "lm_head.weight") or name.endswith(".expert_bias"):
            continue
        t = t.detach().to("cpu", torch.float32)
        # copies of the experts: safetensors refuses tensors that share memory
        parts = [e.clone() for e in t.unbind()] if is_stacked(name) else [t.contiguous()]
        out.update(zip(stored_names(name, mcfg), parts))
    return out


def shards(tensors: dict[str, torch.Tensor], limit: int) -> dict[str, dict]:
    """File name -> its tensors: `tensors` in order, cut into files of at most `limit` bytes
    (a bigger tensor alone), named as transformers names them; one file is WEIGHTS."""
    parts, size = [{}], 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if parts[-1] and size + n > limit:
            parts, size = parts + [{}], 0
        parts[-1][name], size = t, size + n
    n = len(parts)
    return {WEIGHTS if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors": part
            for i, part in enumerate(parts, 1)}


def save_pretrained(state: dict[str, torch.Tensor], mcfg: ModelConfig, out: str,
                    tokenizer_dir: str | None = None, shard_bytes: int = SHARD_BYTES) -> str:
    """Write `state` (full tensors under minipar's names) as a Hugging Face directory:
    config.json, the weights (model.safetensors, or shards of at most `shard_bytes` and
    their index) and, from `tokenizer_dir`, its tokenizer files. A model that is neither a
    Llama nor a Mixtral is a `ConfigError`, before anything is written.
    Atomic: written into `out.tmp<pid>`, then renamed to `out` (an older `out`, minipar's
    as its MARK says, is replaced; `checkpoint.check_out_dir` refuses anyone else's). A
    write that fails (a full disk) removes `out.tmp<pid>` and raises `WriteError`, one line
    naming the file; `out` is as it was."""
    config, files = to_hf(mcfg), shards(hf_state(state, mcfg), shard_bytes)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for part in
                                            files.values() for t in part.values())},
             "weight_map": {name: file for file, part in files.items() for name in part}}
    copied = tokenizer_files(tokenizer_dir, "--tokenizer")     # each inside its directory
    out = os.path.abspath(out)        # `--out .` too is a directory that can be renamed
    file = tmp = f"{out}.tmp{os.getpid()}"      # this process's name: nobody's file
    try:
        os.makedirs(tmp)
        with open(file := os.path.join(tmp, MARK), "w") as f:
            f.write("minipar: a Hugging Face export\n")
        for name, part in files.items():
            save_file(part, file := os.path.join(tmp, name), metadata={"format": "pt"})
        for name, content in ((CONFIG, config), (INDEX, index))[:1 + (len(files) > 1)]:
            with open(file := os.path.join(tmp, name), "w") as f:
                json.dump(content, f, indent=2)
        for source in copied:
            shutil.copy(source, file := os.path.join(tmp, os.path.basename(source)))
        file = out
        replace_dir(tmp, out)
    except (OSError, SafetensorError) as e:       # safetensors says ENOSPC in its own words
        shutil.rmtree(tmp, ignore_errors=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise WriteError(f"could not write {file}: {why}; {out} is as it was") from None
    return out


def export_run(out: str, chunks, dp, optimizer, grid, mcfg: ModelConfig,
               tokenizer_dir: str | None = None) -> None:
    """`--export-hf DIR` at the end of a run. Collective: every rank sends its slices (the
    parameters only, not AdamW's state) to rank 0, which puts the full tensors back
    together and writes the directory. A write that fails (a full disk: `save_pretrained`
    leaves nothing behind) raises `WriteError` on every rank alike, none left waiting."""
    mine = [{k: v for k, v in e.items() if k not in ADAM}
            for e in shard_entries(chunks, dp, optimizer, grid, mcfg)]
    received, failed = ([None] * grid.world_size if grid.rank == 0 else None), [None]
    with comm.paused():
        dist.gather_object(mine, received, dst=0)
        if grid.rank == 0:
            state = full_state([e for entries in received for e in entries])
            try:
                save_pretrained(state, mcfg, out, tokenizer_dir)
            except WriteError as e:
                failed[0] = f"--export-hf {out}: {e}"
        # nobody reports the run done before the directory exists, or its failure is known
        dist.broadcast_object_list(failed, src=0)
    if failed[0]:
        raise WriteError(failed[0])
