"""A tiny Hugging Face Llama (or Mixtral) directory, built offline (tests of hf.py, export.py,
generate.py)."""
from __future__ import annotations

from pathlib import Path

import torch

CORPUS = Path(__file__).resolve().parents[1] / "data" / "minipar_book.txt"


def llama_config(tie: bool = False, **kw):
    transformers = __import__("transformers")
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=4,       # GQA: 2 queries per KV head
                vocab_size=320, max_position_embeddings=128, rope_theta=10000.0,
                rms_norm_eps=1e-5, tie_word_embeddings=tie,
                # peaked logits: greedy decoding has no near-ties for float noise to flip
                initializer_range=0.2,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaConfig(**{**base, **kw})


def train_tokenizer(text: str, vocab_size: int = 320):
    """A byte-level BPE tokenizer learnt from `text` (offline, in a second): the 256 bytes
    and vocab_size - 256 merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


def make_hf_llama(path: Path, tie: bool = False, shard_kb: int = 40, tokenizer: bool = True,
                  seed: int = 0, **kw) -> Path:
    """save_pretrained a seeded random Llama into `path`, cut into several safetensors
    shards (`max_shard_size`), with a tokenizer.json learnt from the book."""
    transformers = __import__("transformers")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(llama_config(tie, **kw)).eval()
    model.save_pretrained(path, max_shard_size=f"{shard_kb}KB")
    if tokenizer:
        train_tokenizer(CORPUS.read_text()[:40_000]).save(str(path / "tokenizer.json"))
    return path


def mixtral_config(**kw):
    """A tiny Mixtral: 4 experts, 2 per token, a RoPE base other than Mixtral's default (so
    that a config.json which lost it would show)."""
    transformers = __import__("transformers")
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=4, vocab_size=320,
                max_position_embeddings=128, num_local_experts=4, num_experts_per_tok=2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.MixtralConfig(**{**base, **kw})


def make_hf_mixtral(path: Path, shard_kb: int = 40, seed: int = 0, **kw) -> Path:
    """save_pretrained a seeded random Mixtral into `path` in several safetensors shards
    (transformers writes Mistral's layout: `block_sparse_moe`, one tensor per expert matrix)."""
    transformers = __import__("transformers")
    torch.manual_seed(seed)
    model = transformers.MixtralForCausalLM(mixtral_config(**kw)).eval()
    model.save_pretrained(path, max_shard_size=f"{shard_kb}KB")
    return path
