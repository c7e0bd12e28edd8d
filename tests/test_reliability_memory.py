"""Memory, third pass (issue 30): the preflight reads cgroup v1 and v2, counts a step's batch
and activations and a tokenized --data file, and refuses a run that cannot fit in one line,
before any rank starts; a bytes --data file is memory-mapped, 1 B a token, never int64."""
from __future__ import annotations

import functools
import subprocess
import sys
import time

import pytest
import torch

from minipar.runtime import preflight
from minipar.plan.config import ConfigError, ModelConfig, ParallelConfig, TrainConfig
from minipar.trainer.tokens import TextTokens, make_source
from minipar.plan.flops import param_count
from minipar.plan.memory import FP32, memory_of_rank

GiB = 2**30
V1_NO_LIMIT = 9223372036854771712          # what cgroup v1 writes for "no limit"


def cgroup(root, version: int, limit, usage: int = 0):
    """A fake cgroup file system under `root`: v2's memory.max / memory.current at its top,
    v1's memory controller in memory/."""
    names = ("memory.max", "memory.current") if version == 2 else \
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")
    (root / "memory").mkdir(parents=True, exist_ok=True)
    for name, value in zip(names, (limit, usage)):
        (root / name).write_text(f"{value}\n")
    return str(root)


def under_limit(monkeypatch, root):
    """The preflight sees the fake cgroup at `root` as this machine's."""
    monkeypatch.setattr(preflight, "available_ram", functools.partial(preflight.available_ram, root))


def test_available_ram_reads_cgroup_v1_and_v2(tmp_path):
    machine = preflight.available_ram(str(tmp_path / "none"))      # MemAvailable alone
    assert machine > GiB
    assert preflight.available_ram(cgroup(tmp_path / "v1", 1, GiB, 100)) == GiB - 100
    assert preflight.available_ram(cgroup(tmp_path / "v2", 2, 2 * GiB, GiB)) == GiB
    # "no limit": v1's huge number and v2's "max" leave the machine's own figure
    assert preflight.available_ram(cgroup(tmp_path / "v1no", 1, V1_NO_LIMIT, GiB)) \
        == pytest.approx(machine, rel=0.1)
    assert preflight.available_ram(cgroup(tmp_path / "v2no", 2, "max", GiB)) \
        == pytest.approx(machine, rel=0.1)


@pytest.mark.parametrize("version", [1, 2])
def test_a_1b_model_in_a_1gib_cgroup_is_refused_naming_need_and_limit(tmp_path, monkeypatch, version):
    under_limit(monkeypatch, cgroup(tmp_path, version, GiB))
    with pytest.raises(ConfigError) as e:
        preflight.check_run(TrainConfig(model="llama3.2-1b"))
    msg = str(e.value)
    assert msg.startswith("--model llama3.2-1b needs at least") and "\n" not in msg
    assert "GiB of RAM" in msg and "but 1.0 GiB is available" in msg
    need = float(msg.split("needs at least ")[1].split()[0])
    # 16 B a weight (weights, gradients, AdamW's m and v), then the batch and activations
    assert need > 16 * param_count(ModelConfig.preset("llama3.2-1b")) / GiB


def test_a_step_counts_the_batch_and_activations():
    """The int64 batch, and the activations the memory model counts for the stage
    (`plan.memory.memory_of_rank`, minipar's tensors in float32): more micro-batches, fewer
    tokens each; full recompute keeps a layer's input (and one layer recomputed)."""
    base = TrainConfig(global_batch=64)
    model = base.model_config()

    def step(cfg):
        return preflight.stage_bytes(model, cfg, 0, 4)[2]
    batch = 64 * 33 * 8
    acts = memory_of_rank(model, base.parallel, FP32, 32, 64, 0)["activations"]
    assert step(base) == batch + int(acts)
    assert acts > 64 * 32 * 8 * 4 * 128 * 4       # tokens x layers x SwiGLU's 4 ffn x 4 B, and more
    four = TrainConfig(global_batch=64, parallel=ParallelConfig(microbatches=4))
    assert step(four) - batch == pytest.approx(acts / 4, rel=1e-3)
    full = TrainConfig(global_batch=64, parallel=ParallelConfig(recompute="full"))
    assert step(full) - batch < acts / 4


def test_a_global_batch_too_big_is_refused_naming_the_flags(monkeypatch):
    with pytest.raises(ConfigError, match=r"^--global-batch 4000000 x --seq-len 32 needs at "
                       r"least \d+\.\d GiB of RAM, .* for the batch and one micro-batch's "
                       r"activations \(--microbatches 1\)"):
        preflight.check_run(TrainConfig(global_batch=4_000_000))
    monkeypatch.setattr(preflight, "available_ram", lambda: None)     # unknown: no refusal
    preflight.check_memory(TrainConfig(global_batch=4_000_000))


def test_the_cli_refuses_a_huge_global_batch_in_seconds():
    """Before: a minute building the batch, then a 32.8 GB allocation failed in a rank."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "minipar.train", "--global-batch", "4000000",
                          "--steps", "1", "--no-progress"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "error: --global-batch 4000000 x --seq-len 32 needs at least" in line
    assert time.monotonic() - t0 < 30


def test_a_bytes_data_file_is_memory_mapped_with_the_same_tokens(tmp_path):
    """uint8, not an int64 copy (8 B a byte, on every rank); the windows are the ones the
    int64 text gave (same loss curves), cast to int64 for the embedding."""
    raw = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(1),
                        dtype=torch.uint8)
    path = tmp_path / "text.bin"
    path.write_bytes(raw.numpy().tobytes())
    src = make_source(str(path), 256, seed=3)
    assert src.data.dtype == torch.uint8 and len(src.data) == 5000
    old = TextTokens(raw.long(), seed=3)
    for step in range(4):
        got = src.batch(step, 4, 32)
        assert got.dtype == torch.long and torch.equal(got, old.batch(step, 4, 32))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_large_bytes_data_file_costs_no_memory(tmp_path, monkeypatch):
    """256 MiB of --data: mapped, not read (before: 256 MiB read, 2 GiB as int64); and the
    preflight does not count it against a 1 GiB cgroup."""
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(256 * 2**20)
    before = rss()
    src = make_source(str(big), 256, 0)
    src.batch(0, 8, 32)
    assert rss() - before < 64 * 2**20
    under_limit(monkeypatch, cgroup(tmp_path / "cg", 1, GiB))
    preflight.check_memory(TrainConfig(data=str(big), parallel=ParallelConfig(dp=2)))


def test_a_tokenized_data_file_too_big_is_refused_naming_data_and_bytes(tmp_path, monkeypatch):
    """Each rank reads a tokenized text whole: 1 GiB of it on 2 ranks in 1 GiB is refused."""
    from hf_llama import train_tokenizer
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    train_tokenizer("the cat sat on the mat " * 50).save(str(hf_dir / "tokenizer.json"))
    text = tmp_path / "corpus.txt"
    with open(text, "wb") as f:
        f.truncate(GiB)
    cfg = TrainConfig(data=str(text), init_hf=str(hf_dir), parallel=ParallelConfig(dp=2),
                      init_model=ModelConfig(vocab_size=320))
    under_limit(monkeypatch, cgroup(tmp_path / "cg", 2, GiB))
    with pytest.raises(ConfigError, match=rf"^--data {text} needs at least 2\.0 GiB of RAM, "
                       r"2\.0 GiB of it for the 1,073,741,824 bytes of text tokenized by each "
                       r"of its 2 rank\(s\) on this machine, but 1\.0 GiB is available$"):
        preflight.check_memory(cfg)


def test_on_a_gpu_the_batch_and_activations_are_counted_per_gpu(monkeypatch):
    """On CUDA the step lives on the GPU (bf16 activations, 2 B): compared with one GPU's
    memory, not the RAM."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("Props", (), {"total_memory": 80 * GiB}))
    with pytest.raises(ConfigError, match=r"^--global-batch 4000000 x --seq-len 32 needs at "
                       r"least \d+\.\d GiB per GPU, .* in this layout, but a GPU has 80\.0 GiB$"):
        preflight.check_memory(TrainConfig(global_batch=4_000_000))
    preflight.check_memory(TrainConfig(global_batch=4096))
