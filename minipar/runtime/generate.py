"""Text from a model: sampling, one token at a time, with a KV cache.

Chapter "Real models in and out".

    python -m minipar.generate --init-hf DIR --prompt "Pipeline" --max-new-tokens 80
    python -m minipar.generate --resume CKPT --prompt "Pipeline" --temperature 0.8 --top-k 40

A decoder writes by repeating one step: run the tokens so far, take the logits of the last
position, pick a token, append it. Run naively, step t recomputes all t positions. With a
`KVCache` the keys and values of earlier positions are kept, so a step runs only the new
token: the prompt once ("prefill"), then one position per token ("decode"). The cache is
each layer's attention core while generating (`Attention.core`, the seam context
parallelism swaps too), so the reference model knows nothing of it.

Picking: `--temperature 0` is greedy (the most likely token, what `transformers`' `generate`
does without sampling: the tests check they agree token for token); otherwise softmax(logits
/ T) over the `--top-k` most likely tokens, drawn with a generator seeded by `--seed`.
Generation runs on the single-device reference model: one process, no layout.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from safetensors.torch import load_file
from tokenizers import Tokenizer

from ..plan.config import ConfigError, refuse
from ..plan.flags import Parser
from ..plan.pipes import quiet_on_closed_pipe
from ..trainer.model import Transformer
from .export import checkpoint_state
from .hf import (CONFIG, check_dir, check_model_memory, hf_name, inside, is_stacked,
                 read_config, stored_names, tokenizer_file, weight_files)

PROG = "python -m minipar.generate"


# ---------------------------------------------------------------- the KV cache
def cached_attention(q, k, v):
    """Attention of the s newest positions (q) over all t positions so far (k, v), when
    decoding with a `KVCache`: query i sits at position t - s + i and sees keys up to it."""
    s, t = q.shape[1], k.shape[1]
    mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(diagonal=t - s)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


class LayerCache:
    """One layer's keys and values of every position seen so far, [b, t, kv_heads, d]. It
    is the layer's attention core while generating: it appends the new positions' keys and
    values, then attends over all of them."""

    def __init__(self):
        self.k = self.v = None

    def __call__(self, q, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        return cached_attention(q, self.k, self.v)


class KVCache:
    """Generation's memory: each layer's keys and values of the tokens so far. With it, one
    more token costs one position's projections and one row of attention, not a forward
    pass over the whole prefix again. Training never uses it (it sees all positions at once).

    `with KVCache(model) as cache:` makes each layer's `LayerCache` its attention core;
    `cache(tokens)` runs the tokens that follow the `cache.length` cached ones."""

    def __init__(self, model: Transformer):
        self.model, self.length = model, 0      # the next token's position
        self.layers = {i: LayerCache() for i in model.layers}

    def __enter__(self):
        self.cores = {i: b.self_attn.core for i, b in self.model.layers.items()}
        for i, block in self.model.layers.items():
            block.self_attn.core = self.layers[i]
        return self

    def __exit__(self, *exc):
        for i, block in self.model.layers.items():
            block.self_attn.core = self.cores[i]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(self.length, self.length + tokens.shape[1])
        self.length += tokens.shape[1]
        return self.model(tokens, positions)


# ---------------------------------------------------------------- choosing a token
def pick(logits: torch.Tensor, temperature: float, top_k: int | None,
         generator: torch.Generator) -> torch.Tensor:
    """One token id per row of `logits` [b, vocab]: greedy at temperature 0, else sampled."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:      # only the k most likely tokens stay candidates
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: Transformer, prompt: list[int], max_new_tokens: int,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
             stop: frozenset[int] = frozenset()) -> Iterator[int]:
    """Yield each new token as soon as it is chosen (so that the caller can stream it);
    end early after a token of `stop` (the model's end-of-sequence ids)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([prompt])              # prefill: the whole prompt once
    with KVCache(model) as cache:
        for _ in range(max_new_tokens):
            logits = cache(tokens)[:, -1]
            if not logits.isfinite().all():     # no token is most likely, nor sampled
                raise FloatingPointError(f"the logits at position {cache.length - 1} are not "
                                         "finite (NaN or inf)")
            tokens = pick(logits, temperature, top_k, generator)[:, None]   # decode: one position
            yield int(tokens)
            if int(tokens) in stop:
                return


# ---------------------------------------------------------------- text <-> tokens
class Codec:
    """Text to token ids and back: a `tokenizer.json`, or raw UTF-8 bytes (vocabulary 256)."""

    def __init__(self, tokenizer: str | None = None):
        self.tokenizer = Tokenizer.from_file(tokenizer) if tokenizer else None
        self.file = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids if self.tokenizer else list(text.encode())

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer:
            return self.tokenizer.decode(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def stream(codec: Codec, ids: Iterator[int]) -> Iterator[str]:
    """The text of the new tokens, piece by piece. A character can span several tokens (a
    UTF-8 byte each, or pieces of a word): hold back a piece that ends mid-character."""
    done, shown = [], ""
    for i in ids:
        done.append(i)
        text = codec.decode(done)
        if not text.endswith("\ufffd") and len(text) > len(shown):
            yield text[len(shown):]
            shown = text
    text = codec.decode(done)
    if len(text) > len(shown):
        yield text[len(shown):]


# ---------------------------------------------------------------- the command
def load_hf_state_dict(model: Transformer, sd: dict[str, torch.Tensor]):
    """Load a state dict under Hugging Face names into `model` (only the layers it holds);
    a tied head saved once, as the embedding, is filled from it."""
    ours = {name: sd[hf_name(name)] for name in model.state_dict() if hf_name(name) in sd}
    if model.cfg.tie_embeddings and "lm_head.weight" not in ours and "embed_tokens.weight" in ours:
        ours["lm_head.weight"] = ours["embed_tokens.weight"]
    return model.load_state_dict(ours)


def minipar_state(sd: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
    """The inverse of `hf.hf_state`, for what `model` holds (a whole model or a stage): each of
    its weights found in `sd` (Hugging Face's names), experts stacked again, a tied head
    from the embedding saved once; a buffer (the routing bias) as `model` has it."""
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        names = stored_names(name, model.cfg)
        if not isinstance(t, nn.Parameter):
            out[name] = t.detach()
        elif all(n in sd for n in names):
            out[name] = torch.stack([sd[n] for n in names]) if is_stacked(name) else sd[names[0]]
    if model.cfg.tie_embeddings and "lm_head.weight" not in out and "embed_tokens.weight" in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def load_model(path: str) -> Transformer:
    """The single-device model of a Hugging Face directory (generation, tests): every
    tensor of every file, checked first. (The trainer reads a slice per rank instead:
    `hf.load_weights`.)"""
    mcfg = read_config(path)
    # config.json's sizes bounded before anything is built (`check_dir` builds on meta):
    # the files' tensors and the model's
    check_model_memory(mcfg, f"--init-hf {path}/{CONFIG}", copies=2)
    check_dir(path, mcfg)
    model = Transformer(mcfg, seed=None)
    sd = {name: t for file in set(weight_files(path).values()) for name, t in load_file(file).items()}
    model.load_state_dict(minipar_state(sd, model))     # a Mixtral's experts stacked again
    return model


def load(init_hf: str | None, resume: str | None, tokenizer: str | None):
    """(model, codec, end-of-sequence ids) from a Hugging Face directory or a minipar checkpoint."""
    tokenizer = tokenizer and tokenizer_of(tokenizer)
    if init_hf:
        model = load_model(init_hf)        # checks the directory first
        with open(inside(init_hf, CONFIG)) as f:
            eos = json.load(f).get("eos_token_id")
        # one id or a list of them (anything else in the field is no token id)
        stop = frozenset(i for i in (eos if isinstance(eos, list) else [eos]) if type(i) is int)
        return model, codec_of(tokenizer or tokenizer_file(init_hf)), stop
    mcfg, state, manifest = checkpoint_state(resume)
    model = Transformer(mcfg, seed=None)
    load_hf_state_dict(model, {hf_name(k): v for k, v in state.items()})
    # a run started from --init-hf DIR trained on DIR's tokens
    tokenizer = tokenizer or tokenizer_file(manifest.get("train", {}).get("init_hf"))
    return model, codec_of(tokenizer), frozenset()


def tokenizer_of(path: str) -> str:
    """--tokenizer's file: DIR/tokenizer.json, or the file named."""
    if not os.path.exists(path):
        raise ConfigError(f"--tokenizer {path}: no such file or directory")
    if os.path.isdir(path) and not tokenizer_file(path, "--tokenizer"):
        raise ConfigError(f"--tokenizer {path}: no tokenizer.json in the directory")
    return tokenizer_file(path, "--tokenizer") or path


def codec_of(tokenizer: str | None) -> Codec:
    """The `Codec` of a tokenizer.json (None: bytes); one that does not parse is a ConfigError."""
    try:
        return Codec(tokenizer)
    except Exception as e:      # the tokenizers library raises plain Exceptions
        raise ConfigError(f"tokenizer {tokenizer}: unreadable: {str(e).splitlines()[0]}") from None


def unfit(model: Transformer, codec: Codec, prompt: list[int], args) -> list[str]:
    """What this model cannot do, found before the first token: ids past its vocabulary, a
    sequence past the positions it attends over (the prompt's mask alone is prompt^2 bytes),
    weights that are not numbers."""
    cfg, vocab = model.cfg, codec.tokenizer.get_vocab_size() if codec.tokenizer else 256
    max_new_tokens, source = args.max_new_tokens, args.init_hf or args.resume
    out = [f"tokenizer {codec.file}: its vocabulary of {vocab} tokens exceeds the model's "
           f"vocab_size={cfg.vocab_size}"] if codec.tokenizer and vocab > cfg.vocab_size else []
    if not codec.tokenizer and max(prompt) >= cfg.vocab_size:
        out.append(f"--prompt: byte {max(prompt)} is past the model's vocab_size={cfg.vocab_size}"
                   " (pass --tokenizer)")
    if len(prompt) + max_new_tokens > cfg.max_seq_len:
        out.append(f"--prompt of {len(prompt)} tokens + --max-new-tokens {max_new_tokens} = "
                   f"{len(prompt) + max_new_tokens} positions exceed the model's max_seq_len="
                   f"{cfg.max_seq_len}")
    if not all(p.isfinite().all() for p in model.parameters()):
        out.append(f"{source}: the weights are not finite (NaN or inf): no token can be chosen")
    return out


def parse(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="Sample text from a model.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--init-hf", help="a Hugging Face Llama directory")
    src.add_argument("--resume", help="a minipar checkpoint (any layout), or a --save DIR")
    p.add_argument("--tokenizer", help="a directory with tokenizer.json, or the file "
                                       "(default: the model's, else bytes)")
    p.add_argument("--prompt", default="The ", help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def problems(args) -> list[str]:
    out = []
    if args.max_new_tokens < 0:
        out.append(f"--max-new-tokens {args.max_new_tokens} must be >= 0")
    if not 0 <= args.temperature < math.inf:        # NaN compares False with everything
        out.append(f"--temperature {args.temperature} must be >= 0 and finite (0 = greedy)")
    if not 0 <= args.seed < 2**64:
        out.append(f"--seed {args.seed} must be in [0, 2**64) (torch's generators' seeds)")
    if args.top_k is not None and args.top_k < 1:
        out.append(f"--top-k {args.top_k} must be >= 1")
    if not args.prompt:
        out.append("--prompt must not be empty")
    return out


def main(argv=None) -> int:
    args = parse(argv)
    # Ctrl-C stops it even where SIGINT came ignored (a shell's background job, nohup):
    # Python raises KeyboardInterrupt only if it found SIGINT not ignored at start
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return write(args)
    except KeyboardInterrupt:       # Ctrl-C: one line and 128 + SIGINT, as the trainer
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except FloatingPointError as e:
        print(f"\n{PROG}: error: {e}", file=sys.stderr)
        return 1


@quiet_on_closed_pipe
def write(args) -> int:
    """Check the flags, load the model, check it can continue the prompt, then stream."""
    try:
        refuse(problems(args))
        model, codec, stop = load(args.init_hf, args.resume, args.tokenizer)
        prompt = codec.encode(args.prompt)
        refuse(unfit(model, codec, prompt, args))
    except (ConfigError, OSError, ValueError) as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    if n < 100e6:      # say why before the reader wonders (stdout stays the text alone)
        print(f"{PROG}: note: a {n / 1e6:.1f}M-parameter model writes gibberish; fluent text "
              "takes billions of parameters and tokens; this shows the mechanics", file=sys.stderr)
    # a reader that has gone (`| head -c 20`) ends the text quietly (`quiet_on_closed_pipe`)
    print(args.prompt, end="", flush=True)
    ids = generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                   stop)
    for piece in stream(codec, ids):
        print(piece, end="", flush=True)
    print(flush=True)
    return 0
