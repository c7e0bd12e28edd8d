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
import os
import sys
from typing import Iterator

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from .cli import Parser
from .config import ConfigError
from .export import checkpoint_state
from .hf import CONFIG, hf_name, load_hf_state_dict, load_model, tokenizer_file
from .model import Transformer

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
            tokens = pick(logits, temperature, top_k, generator)[:, None]   # decode: one position
            yield int(tokens)
            if int(tokens) in stop:
                return


# ---------------------------------------------------------------- text <-> tokens
class Codec:
    """Text to token ids and back: a `tokenizer.json`, or raw UTF-8 bytes (vocabulary 256)."""

    def __init__(self, tokenizer: str | None = None):
        self.tokenizer = Tokenizer.from_file(tokenizer) if tokenizer else None

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
def load(init_hf: str | None, resume: str | None, tokenizer: str | None):
    """(model, codec, end-of-sequence ids) from a Hugging Face directory or a minipar checkpoint."""
    if init_hf:
        model = load_model(init_hf)        # checks the directory first
        with open(os.path.join(init_hf, CONFIG)) as f:
            eos = json.load(f).get("eos_token_id")
        stop = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return model, Codec(tokenizer or tokenizer_file(init_hf)), stop
    mcfg, state, manifest = checkpoint_state(resume)
    model = Transformer(mcfg, seed=None)
    load_hf_state_dict(model, {hf_name(k): v for k, v in state.items()})
    # a run started from --init-hf DIR trained on DIR's tokens
    tokenizer = tokenizer or tokenizer_file(manifest.get("train", {}).get("init_hf"))
    return model, Codec(tokenizer), frozenset()


def parse(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="Sample text from a model.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--init-hf", help="a Hugging Face Llama directory")
    src.add_argument("--resume", help="a minipar checkpoint (any layout), or a --save DIR")
    p.add_argument("--tokenizer", help="a directory with tokenizer.json (default: the model's, else bytes)")
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
    if args.temperature < 0:
        out.append(f"--temperature {args.temperature} must be >= 0 (0 = greedy)")
    if args.top_k is not None and args.top_k < 1:
        out.append(f"--top-k {args.top_k} must be >= 1")
    if not args.prompt:
        out.append("--prompt must not be empty")
    return out


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if problems(args):
            raise ConfigError(*problems(args))
        model, codec, stop = load(args.init_hf, args.resume, args.tokenizer)
    except (ConfigError, OSError, ValueError) as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    if n < 100e6:      # say why before the reader wonders (stdout stays the text alone)
        print(f"{PROG}: note: a {n / 1e6:.1f}M-parameter model writes gibberish; fluent text "
              "takes billions of parameters and tokens; this shows the mechanics", file=sys.stderr)
    print(args.prompt, end="", flush=True)
    ids = generate(model, codec.encode(args.prompt), args.max_new_tokens, args.temperature,
                   args.top_k, args.seed, stop)
    for piece in stream(codec, ids):
        print(piece, end="", flush=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
