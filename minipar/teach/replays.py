"""The runs the book replays at H100 speed (`minipar.replay`).

Each is a real run: gloo ranks forked on this machine train a small model for two steps with
`--profile`, and the replay re-times the recorded program on the Llama 3 cluster at a real
model's shapes. A run is recorded once per process (the book's build, a notebook, a test)
and kept in a temporary directory: the figures, the numbers and the exercises of a chapter
read the same recording.

What a replay lacks, and a GPU run has (the chapters say so beside each timeline): kernel
launch gaps and host overhead, stragglers and jitter, NCCL's channels competing with the
matmuls for SMs and with each other for links.
"""
from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..plan import traces
from ..plan.config import ModelConfig, ParallelConfig, TrainConfig
from ..plan.replay import Replay, analytic, replay
from ..runtime.run import train

# Llama 3's pipeline as Table 4's first row runs it: PP16, interleaved with v = 8 (one layer
# per chunk), its 32 micro-batches (16M tokens / DP64 / 8,192), TP with sequence parallelism,
# the gradients reduced in per-layer units (FSDP's). Recorded with TP2 and DP1 on 32 CPU ranks
# of a model with as many layers as chunks, replayed with TP widened to 8 and DP to 64.
# ZeRO-1: the gradients accumulate over the micro-batches and are reduce-scattered once.
# minipar's ZeRO-2 reduce-scatters every micro-batch's fp32 gradients with at most two
# buckets in flight; replayed at this scale that step is bound by DP traffic (the notes).
LLAMA3_TINY = ModelConfig(n_layers=128, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64,
                          vocab_size=256, name="llama3-shaped tiny")
_LAYER_MB = (4 * 32 * 32 + 3 * 32 * 64) * 4 / 2 / 2**20    # one layer's fp32 gradients on a TP2 rank


@dataclass(frozen=True)
class Run:
    """A run the book records and replays: its layout, and what it is replayed as."""
    layout: dict
    model: str = "llama3-8b"              # the replay's model preset
    seq_len: int = 4096
    widen: dict = field(default_factory=dict)
    global_batch: int = 8
    framework: str | None = None
    recorded_model: ModelConfig | None = None

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(**self.layout)


RUNS = {
    # one per axis chapter: the effect the chapter teaches, at H100 speed
    "data_parallel": Run(dict(dp=2, bucket_mb=0.05)),
    "data_parallel_naive": Run(dict(dp=2, bucket_mb=0)),
    "tensor_parallel": Run(dict(tp=2, sp=True)),
    "tensor_parallel_overlap": Run(dict(tp=2, sp=True, tp_overlap=True)),
    "pipeline_parallel": Run(dict(pp=4, microbatches=8)),
    "pipeline_parallel_interleaved": Run(dict(pp=4, schedule="interleaved", virtual_stages=2,
                                              microbatches=8)),
    "context_parallel": Run(dict(cp=2), seq_len=32768),
    "context_parallel_allgather": Run(dict(cp=2, cp_impl="allgather"), seq_len=32768),
    # Table 4's first row
    "llama3": Run(dict(tp=2, pp=16, sp=True, zero=1, schedule="interleaved", virtual_stages=8,
                       microbatches=32, bucket_mb=_LAYER_MB),
                  model="llama3-405b", seq_len=8192, widen={"tp": 8, "dp": 64},
                  global_batch=32, framework="llama3", recorded_model=LLAMA3_TINY),
}


@functools.lru_cache(maxsize=None)
def _directory() -> Path:
    return Path(tempfile.mkdtemp(prefix="minipar-replays-"))


@functools.lru_cache(maxsize=None)
def recorded(name: str) -> dict:
    """The trace of run `name` (recorded on first use in this process: two steps, or one for
    the 32-rank Llama 3 pipeline, whose program is the same every step)."""
    run, path = RUNS[name], _directory() / name
    steps, seq_len = (1, 16) if name == "llama3" else (2, 32)
    train(TrainConfig(parallel=run.parallel(), global_batch=run.global_batch, seq_len=seq_len,
                      steps=steps, progress=False, profile=str(path),
                      init_model=run.recorded_model))
    return traces.load(path)


@functools.lru_cache(maxsize=None)
def replayed(name: str) -> Replay:
    """Run `name` replayed at its model's shapes on H100s (the Llama 3 cluster)."""
    run = RUNS[name]
    return replay(recorded(name), "h100", run.framework, run.model, run.seq_len, run.widen)


@functools.lru_cache(maxsize=None)
def estimated(name: str):
    """The cost model's estimate of the same step (`replay.analytic`): the other derivation,
    on the target the replay ran on."""
    return analytic(replayed(name).target, recorded(name))
