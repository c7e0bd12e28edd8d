"""Where the tokens come from, and how a global batch is cut among ranks.

Chapter "Data parallelism".

Every layout must consume exactly the same tokens in each step, or its loss curve could not
equal the single-device one. So every rank builds the whole global batch of a step from
(seed, step) alone, and keeps its slice: DP ranks take rows, micro-batches cut those rows
again, CP ranks later take chunks of the sequence. A resumed run, given the step it stopped
at, reads the very batch it would have read.

The tokens are synthetic, or a text (`--data FILE`) read as bytes, or, when `--init-hf DIR`
holds a `tokenizer.json`, cut into that model's tokens (chapter "Real models in and out").
"""
from __future__ import annotations

import os

import torch
from tokenizers import Tokenizer

from .config import ConfigError


class SyntheticTokens:
    """A seeded Markov chain over the vocabulary: learnable (the loss falls visibly from
    log(vocab) towards the chain's entropy) yet needing no download."""

    def __init__(self, vocab_size: int, seed: int = 0, branching: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.seed = seed
        # each token has `branching` likely successors, with unequal probabilities
        self.next_tokens = torch.randint(0, vocab_size, (vocab_size, branching), generator=g)
        self.next_probs = torch.softmax(torch.randn(vocab_size, branching, generator=g) * 2, -1)

    def batch(self, step: int, n_seqs: int, seq_len: int) -> torch.Tensor:
        """Tokens [n_seqs, seq_len + 1] for this step (inputs and shifted targets)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        out = torch.empty(n_seqs, seq_len + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, self.vocab_size, (n_seqs,), generator=g)
        for t in range(seq_len):
            choice = torch.multinomial(self.next_probs[out[:, t]], 1, generator=g).squeeze(1)
            out[:, t + 1] = self.next_tokens[out[:, t], choice]
        return out


class TextTokens:
    """A text as one long row of token ids; each sequence starts at a seeded offset."""

    def __init__(self, tokens: torch.Tensor, seed: int = 0):
        self.data, self.seed = tokens, seed

    def batch(self, step: int, n_seqs: int, seq_len: int) -> torch.Tensor:
        if len(self.data) < seq_len + 2:
            raise ValueError(f"--data file has {len(self.data)} tokens, fewer than --seq-len + 2")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.data) - seq_len - 1, (n_seqs,), generator=g)
        return torch.stack([self.data[s:s + seq_len + 1] for s in starts.tolist()])


class ByteText(TextTokens):
    """A text file read as bytes (vocabulary 256): no tokenizer needed."""

    def __init__(self, path: str, seed: int = 0):
        with open(path, "rb") as f:
            super().__init__(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long(), seed)
        self.vocab_size = 256


class TokenizedText(TextTokens):
    """A text file cut into tokens by a Hugging Face `tokenizer.json` (the `tokenizers`
    library, offline): the vocabulary a Llama was trained with."""

    def __init__(self, path: str, tokenizer_file: str, seed: int = 0):
        self.tokenizer = Tokenizer.from_file(tokenizer_file)
        with open(path, encoding="utf-8") as f:
            ids = self.tokenizer.encode(f.read(), add_special_tokens=False).ids
        super().__init__(torch.tensor(ids, dtype=torch.long), seed)
        self.vocab_size = self.tokenizer.get_vocab_size()


def make_source(data_path: str | None, vocab_size: int, seed: int, tokenizer_file: str | None = None):
    """Synthetic tokens; or the --data file, as bytes or through `tokenizer_file`."""
    if data_path is None:
        return SyntheticTokens(vocab_size, seed)
    if not os.path.isfile(data_path):
        raise FileNotFoundError(f"--data {data_path}: no such file")
    if tokenizer_file:
        return TokenizedText(data_path, tokenizer_file, seed)
    return ByteText(data_path, seed)


def check_text(data_path: str, vocab_size: int, tokenizer_file: str | None = None) -> None:
    """Before any rank starts: the --data file exists and its tokens fit the vocabulary."""
    if not os.path.isfile(data_path):
        raise ConfigError(f"--data {data_path}: no such file")
    if tokenizer_file is None:
        if vocab_size < 256:
            raise ConfigError("--data trains on bytes and needs a vocabulary of at least 256")
        return
    try:
        n = Tokenizer.from_file(tokenizer_file).get_vocab_size()
    except Exception as e:  # noqa: BLE001 - the library raises its own exception types
        raise ConfigError(f"--init-hf {tokenizer_file}: unreadable tokenizer: {e}") from None
    if n > vocab_size:
        raise ConfigError(f"--init-hf {tokenizer_file}: the tokenizer has {n} tokens, more than "
                          f"the model's vocab_size={vocab_size}")


def local_microbatches(batch: torch.Tensor, dp_rank: int, dp: int, n_micro: int):
    """This DP rank's rows of the global batch, cut into `n_micro` micro-batches."""
    rows = batch.chunk(dp, dim=0)[dp_rank]
    return list(rows.chunk(n_micro, dim=0))
