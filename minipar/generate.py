"""Text from a model: sampling, one token at a time, with a KV cache.

Chapter "Real models in and out".

    python -m minipar.generate --init-hf DIR --prompt "Pipeline" --max-new-tokens 80
    python -m minipar.generate --resume CKPT --prompt "Pipeline" --temperature 0.8 --top-k 40

A decoder writes by repeating one step: run the tokens so far, take the logits of the last
position, pick a token, append it. Run naively, step t recomputes all t positions. With a
`KVCache` the keys and values of earlier positions are kept, so a step runs only the new
token (`model.py`): the prompt once ("prefill"), then one position per token ("decode").

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
from tokenizers import Tokenizer

from .cli import Parser
from .config import ConfigError
from .export import checkpoint_state
from .hf import CONFIG, load_model, tokenizer_file
from .model import KVCache, Transformer, hf_name

PROG = "python -m minipar.generate"


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
    cache = KVCache()
    tokens = torch.tensor([prompt])              # prefill: the whole prompt once
    for _ in range(max_new_tokens):
        logits = model(tokens, cache=cache)[:, -1]
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
    model.load_hf_state_dict({hf_name(k): v for k, v in state.items()})
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
    print(args.prompt, end="", flush=True)
    ids = generate(model, codec.encode(args.prompt), args.max_new_tokens, args.temperature,
                   args.top_k, args.seed, stop)
    for piece in stream(codec, ids):
        print(piece, end="", flush=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
