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

import os

import torch
from tokenizers import Tokenizer


class SyntheticTokens:
    """A seeded Markov chain over the vocabulary: learnable (the loss falls visibly from
    log(vocab) towards the chain's entropy) yet needing no download."""

    def __init__(self, vocab_size: int, seed: int = 0, branching: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.seed = vocab_size, seed
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
    """A text as one long row of token ids, kept in the smallest dtype that holds them
    (uint8 bytes, int32 ids: an int64 copy of a big file on every rank would not fit); each
    sequence starts at a seeded offset, its window cast to int64 for the embedding. It
    needs seq_len + 2 tokens or more (`preflight.check_data` says so before any rank starts)."""

    def __init__(self, tokens: torch.Tensor, seed: int = 0):
        self.data, self.seed = tokens, seed

    def batch(self, step: int, n_seqs: int, seq_len: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.data) - seq_len - 1, (n_seqs,), generator=g)
        return torch.stack([self.data[s:s + seq_len + 1] for s in starts.tolist()]).long()


class TokenizedText(TextTokens):
    """A text file cut into tokens by a Hugging Face `tokenizer.json` (the `tokenizers`
    library, offline): the vocabulary a Llama was trained with."""

    def __init__(self, path: str, tokenizer_file: str, seed: int = 0):
        self.tokenizer = Tokenizer.from_file(tokenizer_file)
        with open(path, encoding="utf-8") as f:
            ids = self.tokenizer.encode(f.read(), add_special_tokens=False).ids
        super().__init__(torch.tensor(ids, dtype=torch.int32), seed)


def make_source(data_path: str | None, vocab_size: int, seed: int,
                tokenizer_file: str | None = None):
    """Synthetic tokens; or the --data file, through `tokenizer_file` or else read as bytes
    (vocabulary 256: no tokenizer needed). Its rules, `preflight.check_data`, are checked
    before any rank starts."""
    if data_path is None:
        return SyntheticTokens(vocab_size, seed)
    if tokenizer_file:
        return TokenizedText(data_path, tokenizer_file, seed)
    # memory-mapped: nothing read up front, and the ranks share the pages the kernel reads
    return TextTokens(torch.from_file(data_path, size=os.path.getsize(data_path),
                                      dtype=torch.uint8), seed)


def local_microbatches(batch: torch.Tensor, dp_rank: int, dp: int, n_micro: int):
    """This DP rank's rows of the global batch, cut into `n_micro` micro-batches."""
    return list(batch.chunk(dp, dim=0)[dp_rank].chunk(n_micro, dim=0))
