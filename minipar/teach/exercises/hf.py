"""The exercises of the hf chapter, checked (see core.py for how): the slice a TP rank reads
from a safetensors file (on real gloo ranks, against minipar's cut,
`minipar.trainer.placement.local_index`), the q/k
permutation between Meta's and Hugging Face's RoPE layouts, the loss of a model just
loaded, and the bytes the KV cache of a real generation holds."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from ...plan.config import ModelConfig, ParallelConfig
from ...plan.config import TrainConfig
from ...trainer.grid import ProcessGrid
from ...trainer.model import Transformer, apply_rope, rope_cos_sin
from ...trainer.placement import Shard, local_index
from ...runtime import generate as generation
from ...runtime.run import train
from .core import (BITWISE, Tolerance, Verdict, exercise, first_difference, function_given,
                   on_ranks, predicted, right, wrong)
from ..numbers.hf import kv_bytes_per_token

ANGLES = Tolerance(1e-4, 1e-5, "minipar's rotation angles are float32 (pos x freq), the "
                   "rest float64")

# ------------------------------------------------------------- the slice a TP rank reads
# name -> (shape, dimension TP cuts): column- and row-parallel weights, GQA's narrow k_proj,
# the vocabulary-parallel embedding, and a replicated norm gain
TENSORS = {"q_proj": ((8, 6), 0), "o_proj": ((6, 8), 1), "k_proj": ((4, 6), 0),
           "embed_tokens": ((10, 6), 0), "norm": ((6,), None)}


def _tp_slice_worker(path: str, read_tp):
    """On each rank: read every fixture tensor with the reader's function and with
    minipar's, and compare bit for bit (a read is a copy: no arithmetic to round)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    with safe_open(path, framework="pt") as f:
        for name, (shape, dim) in TENSORS.items():
            record = {} if dim is None else {"tp": Shard(dim)}
            axes = ProcessGrid(tp=size, rank=rank).axes       # this rank's, on a grid of tp
            want = f.get_slice(name)[local_index(shape, record, axes)]
            got = read_tp(f.get_slice(name), dim, rank, size)
            problem = first_difference(got, want, name, BITWISE)
            if problem:
                return f"rank {rank} of {size}: {problem}"
    return None


@exercise("hf", "implement")
def check_tp_slice(read_tp, world: int = 2) -> Verdict:
    """read_tp(sl, tp_dim, tp_rank, tp_size) -> tensor: the part of a stored tensor that TP
    rank `tp_rank` of `tp_size` holds (`sl` = safe_open(...).get_slice(name), indexed like a
    tensor: sl[a:b], sl[:, a:b]; tp_dim None: the whole tensor). Run on `world` gloo ranks
    against minipar.trainer.placement.local_index."""
    problem = function_given(read_tp)
    if problem is not None:
        return problem
    with tempfile.TemporaryDirectory(prefix="minipar-exercise-") as d:
        path = str(Path(d) / "model.safetensors")
        g = torch.Generator().manual_seed(0)
        save_file({n: torch.randn(s, generator=g) for n, (s, _) in TENSORS.items()}, path)
        return on_ranks(world, functools.partial(_tp_slice_worker, path), read_tp,
                        f"every rank of {world} read exactly its slice of {len(TENSORS)} "
                        "tensors: rows, columns, GQA's narrow K, the vocabulary, a norm.")


# ------------------------------------------------------------- Meta's RoPE layout -> HF's
def meta_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Meta's original RoPE: rotate the pairs (2i, 2i+1) of each head. x: [s, heads, d]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * inv[None, :]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    out = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    return torch.view_as_real(out).reshape(x.shape)


def hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """minipar's (and Hugging Face's) RoPE: rotate the pairs (i, i + d/2). x: [s, heads, d]."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    return apply_rope(x[None].double(), cos.double(), sin.double())[0]


def scores(wq, wk, x, positions, rope, n_heads, n_kv_heads, theta=10000.0):
    """q.k of every pair of positions, per query head, after `rope` (GQA: heads share K)."""
    d = wq.shape[0] // n_heads
    q = rope((x @ wq.T).view(len(x), n_heads, d), positions, theta)
    k = rope((x @ wk.T).view(len(x), n_kv_heads, d), positions, theta)
    k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
    return torch.einsum("shd,thd->hst", q, k)


@exercise("hf", "bug")
def check_rope_permute(permute) -> Verdict:
    """permute(w, n_heads) -> w: the rows of a q_proj or k_proj weight saved for Meta's RoPE
    (pairs (2i, 2i+1)), reordered for Hugging Face's (pairs (i, i + d/2)), so that attention
    scores do not change. Checked on head_dim 8 (for head_dim 4 the right permutation and
    its inverse coincide and would hide the classic bug) with grouped-query attention."""
    problem = function_given(permute)
    if problem is not None:
        return problem
    g = torch.Generator().manual_seed(0)
    n_heads, n_kv, d, dim = 4, 2, 8, 16
    wq, wk = (torch.randn(n * d, dim, generator=g, dtype=torch.float64) for n in (n_heads, n_kv))
    x, pos = torch.randn(6, dim, generator=g, dtype=torch.float64), torch.arange(6) * 37
    want = scores(wq, wk, x, pos, meta_rope, n_heads, n_kv)
    try:
        pq, pk = permute(wq.clone(), n_heads), permute(wk.clone(), n_kv)
    except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
        return wrong(f"permute raised {type(e).__name__}: {e}")
    for name, got, orig in (("q_proj", pq, wq), ("k_proj", pk, wk)):
        if not isinstance(got, torch.Tensor) or got.shape != orig.shape:
            return wrong(f"permute({name}) should return a tensor of shape {tuple(orig.shape)}.")
    got = scores(pq, pk, x, pos, hf_rope, n_heads, n_kv)
    problem = first_difference(got, want, "scores[head, query, key]", ANGLES)
    if problem:
        return wrong(f"after your permutation, HF's RoPE gives other attention scores than "
                     f"Meta's: {problem}")
    return right("the permuted weights give the same attention scores under HF's RoPE.")


# ------------------------------------------------------------- the loss of a fresh model
def _tiny_hf_dir(path: Path, vocab: int) -> None:
    """A small randomly initialised Llama, saved by transformers (initialised its way)."""
    import transformers   # here: heavy, and only this check needs it
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=vocab, max_position_embeddings=128,
                                   tie_word_embeddings=True, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


@functools.cache
def _first_loss(vocab: int) -> float:
    """The run the check compares with (seeded: one run per vocabulary is enough)."""
    with tempfile.TemporaryDirectory(prefix="minipar-exercise-") as d:
        _tiny_hf_dir(Path(d) / "llama", vocab)
        out = train(TrainConfig(parallel=ParallelConfig(tp=2), init_hf=str(Path(d) / "llama"),
                                steps=1, global_batch=4, seq_len=32, progress=False))
    return out["records"][0]["loss"]


@exercise("hf", "predict")
def check_initial_loss(prediction, vocab: int = 512, reveal: bool = False) -> Verdict:
    """Predict the first step's loss of a randomly initialised Hugging Face Llama with a
    vocabulary of `vocab`, loaded with --init-hf; then run that step on two TP ranks."""
    return predicted(prediction, lambda: _first_loss(vocab), "the first loss", 0.02,
                     "a random model's logits are small, not zero: the loss sits a little "
                     "above a uniform guess", reveal=reveal)


# ------------------------------------------------------------- the KV cache, measured
# A small grouped-query model (head_dim = dim / n_heads = 16, three query heads per KV head),
# run as minipar's reference model runs on a CPU: in float32.
KV_MODEL = ModelConfig(n_layers=3, dim=96, n_heads=6, n_kv_heads=2, ffn_dim=192,
                       vocab_size=256, name="kv-exercise")


@functools.cache
def measured_kv_cache(prompt_len: int, new_tokens: int) -> tuple[int, int]:
    """Run `minipar.runtime.generate.generate` on KV_MODEL for a prompt of `prompt_len` tokens and
    `new_tokens` new ones; return the bytes of every layer's cached K and V when it is done,
    and how many positions the cache holds."""
    caches = []

    class Recorded(generation.KVCache):         # the real cache, remembered when it is made
        def __init__(self, model):
            super().__init__(model)
            caches.append(self)

    model = Transformer(KV_MODEL, seed=0).eval()
    prompt = [int(t) for t in torch.randint(KV_MODEL.vocab_size, (prompt_len,),
                                            generator=torch.Generator().manual_seed(0))]
    original, generation.KVCache = generation.KVCache, Recorded
    try:
        out = list(generation.generate(model, prompt, new_tokens))
    finally:
        generation.KVCache = original
    assert len(out) == new_tokens and len(caches) == 1
    layers = caches[0].layers.values()
    return sum(c.k.nbytes + c.v.nbytes for c in layers), caches[0].length


@exercise("hf", "predict")
def check_kv_cache_bytes(prediction, prompt_len: int = 12, new_tokens: int = 5,
                         reveal: bool = False) -> Verdict:
    """Predict the bytes of the KV cache once `minipar.runtime.generate.generate` has written
    `new_tokens` tokens after a prompt of `prompt_len`, for KV_MODEL in float32 and a batch of
    one sequence; the check runs that generation and adds up the cache's tensors."""
    what = "the KV cache's bytes"
    why = "a tensor's bytes are counted exactly"
    if prediction is None and not reveal:
        return predicted(None, 0.0, what, 1e-3, why, unit="B")
    got, positions = measured_kv_cache(prompt_len, new_tokens)
    per_token = got / positions
    m = KV_MODEL
    hints = [
        (got * (positions + 1) / positions, "the last token generate picks is handed to you, "
         "but never run through the model: which positions has the cache seen?"),
        (got * m.n_heads / m.n_kv_heads, "the cache keeps only what attention reads again: "
         "K and V of the KV heads, which the query heads share."),
        (got / 2, "half of it: K and V are both kept, and the reference model computes in "
         "float32 here (4 bytes a number), not bf16."),
        (per_token, "that is one position's; the cache holds every position run so far."),
    ]
    details = (f" It holds {positions} positions, {per_token:,.0f} B each; the chapter's "
               f"Llama 3 405B keeps {kv_bytes_per_token(ModelConfig.preset('llama3-405b')) / 1e6:.1f}"
               " MB a token in bf16.")
    return predicted(prediction, got, what, 1e-3, why, unit="B", reveal=reveal, hints=hints,
                     details=details, against="what minipar's cache holds")


__all__ = [n for n in dir() if n.startswith("check_")]
