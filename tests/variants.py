"""Many configurations in one world: start tp*cp*pp*dp ranks once and, on each, build and
step a `Trainer` per variant. Forking a world costs seconds on two cores; a variant, a
fraction of one. Shared by test_recompute.py (parity) and test_memory.py (bytes)."""
from __future__ import annotations

import functools
import json

from minipar.runtime import launch, testing
from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.trainer.step import Trainer


def _step_each(world: dict, variants: list[dict], train_kw: dict) -> list[dict]:
    """On every rank: one step of each variant; its loss, gradients and memory record."""
    out = []
    for kw in variants:
        cfg = TrainConfig(parallel=ParallelConfig(**world, **kw), steps=1, progress=False,
                          **train_kw)
        cfg.validate()
        run = Trainer(cfg, after_backward=testing.capture_grads)
        rec = run.step(0)
        out.append({"loss": rec["loss"], "grads": run.probes[0], "memory": rec["memory"]})
    return out


@functools.lru_cache(maxsize=None)
def _cached(world: str, variants: str, train_kw: str) -> list[list[dict]]:
    world_d = json.loads(world)
    n = 1
    for axis in ("tp", "cp", "pp", "dp"):
        n *= world_d.get(axis, 1)
    return launch.run(_step_each, n, world_d, json.loads(variants), json.loads(train_kw),
                      timeout_s=120)


def run_variants(world: dict, variants: list[dict], **train_kw) -> list[list[dict]]:
    """results[rank][i]: variant i's {"loss", "grads", "memory"} on that rank (cached, so
    two test files asking for the same world start it once)."""
    return _cached(json.dumps(world, sort_keys=True), json.dumps(variants, sort_keys=True),
                   json.dumps(train_kw, sort_keys=True))
