"""Where the tokens come from, and how a global batch is cut among ranks.

Chapter "Data parallelism".

Every layout must consume exactly the same tokens in each step, or its loss curve could not
equal the single-device one. So every rank builds the whole global batch of a step from
(seed, step) alone, and keeps its slice: DP ranks take rows, micro-batches cut those rows
again, CP ranks later take chunks of the sequence. A resumed run, given the step it stopped
at, reads the very batch it would have read.
"""
from __future__ import annotations

import os

import torch


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


class ByteText:
    """A text file read as bytes (vocabulary 256); each sequence starts at a seeded offset."""

    def __init__(self, path: str, seed: int = 0):
        with open(path, "rb") as f:
            self.data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
        self.seed = seed
        self.vocab_size = 256

    def batch(self, step: int, n_seqs: int, seq_len: int) -> torch.Tensor:
        if len(self.data) < seq_len + 2:
            raise ValueError(f"--data file has {len(self.data)} bytes, fewer than --seq-len + 2")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.data) - seq_len - 1, (n_seqs,), generator=g)
        return torch.stack([self.data[s:s + seq_len + 1] for s in starts.tolist()])


def make_source(data_path: str | None, vocab_size: int, seed: int):
    if data_path is None:
        return SyntheticTokens(vocab_size, seed)
    if not os.path.isfile(data_path):
        raise FileNotFoundError(f"--data {data_path}: no such file")
    return ByteText(data_path, seed)


def local_microbatches(batch: torch.Tensor, dp_rank: int, dp: int, n_micro: int):
    """This DP rank's rows of the global batch, cut into `n_micro` micro-batches."""
    rows = batch.chunk(dp, dim=0)[dp_rank]
    return list(rows.chunk(n_micro, dim=0))
