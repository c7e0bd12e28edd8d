"""Hugging Face directories in and out: `config.json` plus safetensors, read a slice per rank.

Chapter "Real models in and out".

Every Llama is published as a directory: `config.json` (the shape: `model_config` reads it
into a `ModelConfig` and refuses any field this model does not implement, `to_hf` writes
it back) and the weights in safetensors files,
one `model.safetensors` or several shards listed by `model.safetensors.index.json`
(tensor name -> file). A safetensors file is a JSON header (each tensor's name, dtype,
shape and byte offsets) followed by the raw bytes, so a reader can fetch *part* of a
tensor without reading the rest: `safe_open(file).get_slice(name)[rows, cols]`.

That is how a rank loads its piece (`load_weights`): tensor parallelism tells it which rows
(column-parallel, the vocabulary) or columns (row-parallel) of each matrix it holds, the
pipeline stage which layers, ZeRO which flat range of those. Each rank reads exactly those
bytes and nothing else, which is how the 810 GB of a 405B checkpoint get onto 16K GPUs:
no rank ever holds the whole model. (Here the slices are copied into a model that
`parallelize` first initialised from the seed; a 405B loader builds it on the meta device.)

Going out (`save_pretrained`), the full tensors are written under Hugging Face's names with a
`config.json` that `LlamaForCausalLM.from_pretrained` reads; the directory is written
under a temporary name and renamed into place, like a checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .checkpoint import named_params, replace_dir
from .config import ConfigError, ModelConfig, TrainConfig
from .model import Transformer, hf_name
from .parallel.data import Shard

WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
IGNORED = ("rotary_emb.inv_freq",)     # a buffer older transformers saved: computed, not learned


# ================================================================ config.json <-> ModelConfig
# The config.json fields that must be present, and the values minipar's Llama implements of
# those that change the architecture. Anything else is another model.
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
            "vocab_size")
SUPPORTED = {
    "model_type": ("llama",),
    "hidden_act": ("silu",),                # SwiGLU's gate
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "attention_dropout": (0, 0.0),          # minipar has no dropout
}
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")


def rope_parameters(hf: dict) -> dict:
    """The rotary embedding's parameters: transformers 5's `rope_parameters`, or the older
    top-level `rope_theta` and `rope_scaling`."""
    rope = dict(hf.get("rope_parameters") or {})
    if hf.get("rope_scaling"):
        rope = {**hf["rope_scaling"], **rope}
    if "rope_theta" in hf and "rope_theta" not in rope:
        rope["rope_theta"] = hf["rope_theta"]
    return rope


def llama3_rope_fields(rope: dict) -> dict:
    """ModelConfig's fields for Llama 3.1's RoPE scaling, from Hugging Face's parameters."""
    if rope.get("rope_type", rope.get("type")) != "llama3":
        return {}
    return dict(rope_factor=float(rope["factor"]),
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_len=int(rope["original_max_position_embeddings"]))


def config_problems(hf: dict) -> list[str]:
    """Each field of a Hugging Face Llama config that this model does not implement."""
    out = [f"missing field {k!r}" for k in REQUIRED if k not in hf]
    for key, allowed in SUPPORTED.items():
        if key in hf and hf[key] not in allowed:
            out.append(f"{key}={hf[key]!r} is not supported (minipar's Llama has {allowed[0]!r})")
    arch = hf.get("architectures")
    if arch and arch != ["LlamaForCausalLM"]:
        out.append(f"architectures={arch} is not supported (only LlamaForCausalLM)")
    rope = rope_parameters(hf)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        out.append(f"rope_scaling: rope_type={rope_type!r} is not supported (plain RoPE, or "
                   "Llama 3.1's 'llama3')")
    elif rope_type == "llama3":
        out += [f"rope_scaling: rope_type 'llama3' needs {k!r}" for k in LLAMA3_ROPE_KEYS
                if k not in rope]
    if "hidden_size" in hf and "num_attention_heads" in hf:
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
        if hf.get("head_dim") not in (None, head_dim):
            out.append(f"head_dim={hf['head_dim']} is not supported: minipar's is hidden_size / "
                       f"num_attention_heads = {head_dim}")
    return out


def model_config(hf: dict, source: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of a Hugging Face `LlamaConfig` (its `to_dict()` or config.json).
    A field this model does not implement is a `ConfigError` naming it (`config_problems`):
    better no run than a quiet run of another model."""
    out = config_problems(hf)
    if out:
        raise ConfigError(f"{source}: {'; '.join(out)}")
    heads, rope = hf["num_attention_heads"], rope_parameters(hf)
    return ModelConfig(
        n_layers=hf["num_hidden_layers"], dim=hf["hidden_size"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads, ffn_dim=hf["intermediate_size"],
        vocab_size=hf["vocab_size"], max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", 10000.0)), **llama3_rope_fields(rope),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        name=hf.get("_name_or_path") or "hf")


def read_config(path: str) -> ModelConfig:
    """The model of a Hugging Face directory, from its config.json (`--init-hf DIR`)."""
    file = os.path.join(path, CONFIG)
    if not os.path.isdir(path):
        raise ConfigError(f"--init-hf {path}: no such directory")
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
    reads and `transformers.LlamaConfig(**d)` accepts."""
    return dict(
        architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="float32",
        num_hidden_layers=mcfg.n_layers, hidden_size=mcfg.dim,
        num_attention_heads=mcfg.n_heads, num_key_value_heads=mcfg.n_kv_heads,
        intermediate_size=mcfg.ffn_dim, vocab_size=mcfg.vocab_size,
        max_position_embeddings=mcfg.max_seq_len, rope_theta=mcfg.rope_theta,
        rms_norm_eps=mcfg.norm_eps, tie_word_embeddings=mcfg.tie_embeddings,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope_scaling=None if mcfg.llama3_rope is None else dict(
            rope_type="llama3", factor=mcfg.rope_factor,
            low_freq_factor=mcfg.rope_low_freq_factor,
            high_freq_factor=mcfg.rope_high_freq_factor,
            original_max_position_embeddings=mcfg.rope_original_max_len),
    )


# ================================================================ reading: where and what
def weight_files(path: str) -> dict[str, str]:
    """Tensor name -> the file that holds it: the index's `weight_map`, or every tensor of
    the single `model.safetensors`. A file the index names must exist."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"--init-hf {index}: unreadable index: {e!r}") from None
        for file in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(path, file)):
                raise ConfigError(f"--init-hf {path}: {file} is named by {INDEX} but absent")
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, WEIGHTS)
    if not os.path.isfile(single):
        raise ConfigError(f"--init-hf {path}: neither {WEIGHTS} nor {INDEX} in the directory")
    with _open(single) as f:
        return {name: single for name in f.keys()}


def _open(file: str):
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"--init-hf {file}: not a readable safetensors file ({e})") from None


def expected_shapes(mcfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of this model under its Hugging Face name, with its shape (the model
    is built on the meta device: shapes, no memory)."""
    with torch.device("meta"):
        model = Transformer(mcfg, seed=None)
    return {hf_name(k): tuple(v.shape) for k, v in model.state_dict().items()}


def check_dir(path: str, mcfg: ModelConfig) -> None:
    """Before any rank starts: every tensor the model needs is in a file, with the shape
    config.json implies, and no file holds a weight this model would ignore (a bias, say).
    Reads the files' headers only."""
    files = weight_files(path)
    want = expected_shapes(mcfg)
    if mcfg.tie_embeddings:         # the head is the embedding; a copy of it may be saved
        want.pop("lm_head.weight")
    for name, shape in want.items():
        if name not in files:
            raise ConfigError(f"--init-hf {path}: tensor {name} is in no file")
    by_file: dict[str, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with _open(file) as f:
            present = set(f.keys())
            for name in names:
                _check_tensor(f, file, name, present, want, mcfg)


def _check_tensor(f, file: str, name: str, present: set, want: dict, mcfg: ModelConfig):
    if name.endswith(IGNORED):
        return
    if name not in present:
        raise ConfigError(f"--init-hf {file}: tensor {name} is listed in the index but not in the file")
    shape = tuple(f.get_slice(name).get_shape())
    if name == "lm_head.weight" and mcfg.tie_embeddings:
        expected = want["model.embed_tokens.weight"]
    elif name not in want:
        raise ConfigError(f"--init-hf {file}: tensor {name} is not a weight of this Llama "
                          "(biases and other extras are not supported)")
    else:
        expected = want[name]
    if shape != expected:
        raise ConfigError(f"--init-hf {file}: tensor {name} has shape {list(shape)}, "
                          f"config.json implies {list(expected)}")


# ================================================================ reading: a rank's slices
def read_piece(sl, local_shape, tp_dim: int | None, tp_rank: int, tp_size: int,
               start: int, stop: int) -> torch.Tensor:
    """Elements start:stop (flattened) of this TP rank's part of a stored tensor, reading
    only what holds them: the TP rank's rows or columns, and of those only the rows that
    the flat range start:stop touches (a ZeRO piece)."""
    index = [slice(None)] * len(sl.get_shape())
    if tp_dim is not None:               # cut as `tensor.shard_param` cuts: contiguous chunks
        n = sl.get_shape()[tp_dim] // tp_size
        index[tp_dim] = slice(tp_rank * n, (tp_rank + 1) * n)
    row = math.prod(local_shape[1:])     # elements in one row of the TP-local tensor
    lo, hi = start // row, -(-stop // row)
    first = index[0].start or 0
    index[0] = slice(first + lo, first + hi)
    return sl[tuple(index)].reshape(-1)[start - lo * row:stop - lo * row]


def whole(p: torch.nn.Parameter) -> Shard:
    """A rank that holds all of `p` (no ZeRO): the `shard_of` of the single device."""
    return Shard(p.shape, 0, p.numel(), p.data.view(-1), p)


@torch.no_grad()
def load_weights(path: str, chunks, mcfg: ModelConfig, shard_of=whole,
                 tp_rank: int = 0, tp_size: int = 1) -> None:
    """Copy the directory's weights into what this rank holds of `chunks`: for each
    parameter, its tensor-parallel part (`_tp_dim`, set by `tensor.shard_param`) and of that
    its `shard_of(p)` (all of it, or its ZeRO piece), read from the file by slice."""
    files = weight_files(path)
    handles = {}
    try:
        for name, p in named_params(chunks, mcfg):
            file = files[hf_name(name)]
            if file not in handles:
                handles[file] = _open(file).__enter__()
            shard = shard_of(p)
            # whole here (plain DP; ZeRO-1/2's pieces are views of it), or ZeRO-3's piece,
            # the only copy, which may be empty
            held = p.shape == shard.shape
            start, stop = (0, p.numel()) if held else (shard.start, shard.stop)
            if start == stop:
                continue
            tp_dim = getattr(p, "_tp_dim", None)
            tp = (tp_rank, tp_size) if tp_dim is not None else (0, 1)
            piece = read_piece(handles[file].get_slice(hf_name(name)), shard.shape, tp_dim,
                               *tp, start, stop)
            (p.data.view(-1) if held else shard.data).copy_(piece)
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)


def load_model(path: str) -> Transformer:
    """The single-device model of a Hugging Face directory (generation, tests)."""
    mcfg = read_config(path)
    check_dir(path, mcfg)
    model = Transformer(mcfg, seed=None)
    load_weights(path, [model], mcfg)
    return model


def tokenizer_file(path: str | None) -> str | None:
    """The directory's `tokenizer.json`, when it has one."""
    file = os.path.join(path, "tokenizer.json") if path else None
    return file if file and os.path.isfile(file) else None


# ================================================================ writing
def save_pretrained(state: dict[str, torch.Tensor], mcfg: ModelConfig, out: str,
                    tokenizer_dir: str | None = None) -> str:
    """Write `state` (full tensors under minipar's names) as a Hugging Face directory:
    config.json, model.safetensors and, from `tokenizer_dir`, its tokenizer files.
    Atomic: written into `out.tmp`, then renamed to `out` (an older `out` is replaced)."""
    tensors = {hf_name(k): v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
    if mcfg.tie_embeddings:       # one tensor, stored once, as transformers does
        tensors.pop("lm_head.weight", None)
    out = os.path.normpath(out)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(tmp, CONFIG), "w") as f:
        json.dump(to_hf(mcfg), f, indent=2)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        if os.path.isfile(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), tmp)
    replace_dir(tmp, out)
    return out
