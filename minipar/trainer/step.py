"""One training step: what every rank computes between two optimizer updates.

Chapter "From a laptop to a cluster". The same seed, model and global batch give the same
loss curve for every layout: each rank builds the same full model from the seed and keeps
its piece (`parallelize`), reads the same global batch and keeps its slice (`local_batch`),
and the loss is a sum over tokens divided by the *global* token count, so summing gradients
over ranks gives exactly the single-device gradient.

`Trainer.step` is one optimizer step. The loop around it, and everything around the loop
(starting the ranks and restarting them, checkpoints, the log, traces, export, the command
line) is the runtime's (`minipar/runtime/run.py`): the trainer never reads a file or a
signal of its own, it is handed what it needs.
"""

import math
import time
from typing import Callable

import torch
import torch.distributed as dist

from ..plan.config import TrainConfig
from ..plan.flops import mfu
from . import comm, events, profile
from .grid import ProcessGrid
from .memory_meter import ActivationMeter, fullest_rank, state_bytes
from .model import MoE
from .parallel.context import shard_sequence
from .parallel.experts import balance_experts
from .parallel.pipeline import pipeline_forward_backward
from .parallelize import parallelize
from .tokens import local_microbatches, make_source


# ---------------------------------------------------------------- the optimizer
def adamw(pairs, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over what this rank updates: whole parameters, or (ZeRO) its shards of them,
    which is all that "sharding the optimizer state" means. Weight decay on matrices only,
    not on norms, as in Llama; a shard is flat, so ask its parameter."""
    decay = [x for x, p in pairs if p.dim() >= 2]
    no_decay = [x for x, p in pairs if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=1e-8)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr over `decay_steps`.

    Its length is set by its own flags, never by --steps, so a run stopped at step 50 and
    resumed follows the schedule it would have followed.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.decay_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * t))


def clip_grad_norm_(dp, grid: ProcessGrid, max_norm: float) -> float:
    """Scale every gradient this rank holds so that the global norm is at most `max_norm`;
    return the norm before clipping. Copies of one gradient (over DP without ZeRO, over TP
    for norms, a tied embedding) are counted once: `grid.counts`."""
    sq = torch.zeros((), dtype=torch.float64, device=comm.device())
    for g, p in dp.grads():
        if grid.counts(p, dp.holds_replicas):
            sq += g.detach().double().pow(2).sum()
    comm.all_reduce(sq, grid.world)
    norm = sq.sqrt().item()
    if 0 < max_norm < norm + 1e-6:        # --clip 0: off
        for g, _ in dp.grads():
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def global_loss(loss: torch.Tensor, grid: ProcessGrid) -> float:
    """Every rank holds part of the loss (its tokens; the last pipeline stage only), and
    the TP ranks of a group all hold the same part: count it once and sum."""
    loss = loss if grid.tp.rank == 0 else torch.zeros_like(loss)
    with comm.paused():
        comm.all_reduce(loss, grid.world)
    return loss.item()


# --skip-nonfinite skips at most this many steps in a row: one more ends the run (exit 1).
# A spike skips a step or two; a run whose every step is NaN has NaN weights, and skipping
# on would only burn the rest of its time and then exit 0.
MAX_SKIPPED_IN_ROW = 3


class NonFinite(RuntimeError):
    """The loss or the gradient norm of a step is NaN or infinite (and not --skip-nonfinite,
    or one step more than it skips in a row). Both numbers are all-reduced, so every rank
    raises it at the same step."""

    def __init__(self, step: int, loss: float, norm: float, in_row: int = 0):
        super().__init__(f"step {step}: loss {loss} / gradient norm {norm} is not finite; " + (
            f"stopped: the {in_row} steps before it were not finite either, and "
            f"--skip-nonfinite skips at most {MAX_SKIPPED_IN_ROW} in a row (the weights are "
            "likely NaN; resume from a checkpoint before them)" if in_row else
            "stopped before the update (--skip-nonfinite skips such steps)"))
        self.step = step


def check_finite(step: int, loss: float, norm: float, skip: bool, in_row: int = 0) -> bool:
    """True when the step may update the weights: every rank decides the same, since both
    numbers are all-reduced. All stop (`NonFinite`), or all skip the update (`skip`, after
    `in_row` skipped steps: at most `MAX_SKIPPED_IN_ROW` of them)."""
    if math.isfinite(loss) and math.isfinite(norm):
        return True
    if skip and in_row < MAX_SKIPPED_IN_ROW:
        return False
    raise NonFinite(step, loss, norm, in_row if skip else 0)


# ---------------------------------------------------------------- one step
def local_batch(batch: torch.Tensor, grid: ProcessGrid, microbatches: int) -> list:
    """This rank's share of a global batch [b, s+1]: its data-parallel rows cut into
    micro-batches, each as (tokens, targets, positions) of its context-parallel chunks, each
    a tensor of its own (not a view of the batch: what autograd saves of one micro-batch is
    then that micro-batch's alone, and the activation meter sees it go with it)."""
    rows = local_microbatches(batch, grid.dp.rank, grid.dp.size, microbatches)
    return [tuple(t.clone() for t in shard_sequence(mb[:, :-1], mb[:, 1:], grid.cp)) for mb in rows]


def forward_backward(model, micro, n_tokens, pcfg, grid) -> torch.Tensor:
    """Every micro-batch (tokens, targets, positions) forward and backward; returns this
    rank's share of the loss."""
    if pcfg.pp > 1:
        return pipeline_forward_backward(model.chunks, micro, model.loss_fn, n_tokens,
                                         model.dp, pcfg, grid)
    total = torch.zeros((), device=micro[0][0].device)
    for i, (x, y, pos) in enumerate(micro):
        model.dp.set_last_microbatch(i == len(micro) - 1)
        with events.span(f"F mb{i}", kind="F", microbatch=i):
            loss = model.loss_fn(model.chunks[0](x, pos), y) / n_tokens
        with events.span(f"B mb{i}", kind="B", microbatch=i):
            loss.backward()
        total += loss.detach()
    return total


class Trainer:
    """One rank's share of a run: its place in the grid, its piece of the model, its
    optimizer and its data. `step(i)` is one optimizer step, the loop's body."""

    def __init__(self, cfg: TrainConfig, load_weights: Callable | None = None,
                 tokenizer: str | None = None, after_backward: Callable | None = None):
        self.cfg, self.pcfg, self.mcfg = cfg, cfg.parallel, cfg.model_config()
        p = self.pcfg
        self.grid = ProcessGrid(p.tp, p.cp, p.pp, p.dp, dist.get_rank(), p.ep).init_groups()
        self.device = comm.device()
        self.model = parallelize(self.mcfg, p, self.grid, cfg.seed, self.device)
        # the balance loss per sequence of the step, added once over TP (its ranks route alike)
        aux = self.mcfg.moe_aux_loss / cfg.global_batch if self.grid.tp.rank == 0 else 0.0
        for moe in (m for c in self.model.chunks for m in c.modules() if isinstance(m, MoE)):
            moe.aux_weight = aux
        if load_weights:     # the runtime's reader of saved weights (--init-hf): my slices
            load_weights(self.model.chunks, self.mcfg, self.model.dp.shard_of, self.grid.axes)
        if cfg.dtype == "bf16" or (cfg.dtype == "auto" and self.device.type == "cuda"):
            # mixed precision: weights, gradients and optimizer state stay fp32 (the master
            # copy); matmuls run in bf16 inside each chunk's forward
            for m in self.model.chunks:
                m.forward = torch.autocast(self.device.type, dtype=torch.bfloat16)(m.forward)
        self.optimizer = adamw(self.model.dp.optimizer_params(), cfg.lr, cfg.weight_decay)
        self.source = make_source(cfg.data, self.mcfg.vocab_size, cfg.seed, tokenizer)
        self.n_tokens = cfg.global_batch * cfg.seq_len
        if cfg.profile:
            profile.trace_layers(self.model.chunks)     # per-layer spans while recording
        # a look at the reduced gradients before clipping (the tests'), called on every rank
        # as after_backward(step, chunks, dp, grid); what it returns is kept by step
        self.after_backward, self.probes = after_backward, {}
        self.skipped_in_row = 0      # --skip-nonfinite: the steps skipped since the last update

    def step(self, step: int) -> dict:
        """One optimizer step: this rank's micro-batches forward and backward, the
        gradients summed over dp x cp, clipped and applied. Returns the step's record."""
        cfg, grid, dp = self.cfg, self.grid, self.model.dp
        comm.LOG.reset()
        t0 = time.perf_counter()
        batch = self.source.batch(step, cfg.global_batch, cfg.seq_len).to(self.device)
        micro = local_batch(batch, grid, self.pcfg.microbatches)
        dp.start_step()
        with ActivationMeter() as saved:     # what autograd keeps for the backward
            loss = forward_backward(self.model, micro, self.n_tokens, self.pcfg, grid)
        dp.finish_backward()          # every gradient summed over dp x cp (or my shard of it)
        self.probe(step)
        norm, lr = clip_grad_norm_(dp, grid, cfg.clip), lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = global_loss(loss, grid)      # the same number on every rank, as is the norm
        finite = check_finite(step, loss, norm, cfg.skip_nonfinite, self.skipped_in_row)
        self.skipped_in_row = 0 if finite else self.skipped_in_row + 1
        with events.span("optimizer", kind="optimizer"):
            if finite:                # else: --skip-nonfinite, no update from this batch
                self.optimizer.step()
        dp.after_optimizer_step()     # ZeRO 1/2: every rank gathers the updated weights
        balance_experts(self.model.chunks, grid.dp_cp, self.mcfg.moe_bias_rate * finite)
        rec = self.record(step, loss, norm, lr, time.perf_counter() - t0)
        rec.update({} if finite else {"skipped": True})
        rec["memory"] = fullest_rank({**self.memory_bytes(), "activations": saved.peak}, grid)
        return rec

    def probe(self, step: int):
        """`after_backward`'s look at the reduced gradients, kept in `probes` by step."""
        if self.after_backward is not None:
            out = self.after_backward(step, self.model.chunks, self.model.dp, self.grid)
            if out is not None:
                self.probes[step] = out

    def record(self, step: int, loss: float, norm: float, lr: float, dt: float) -> dict:
        """The `--log-json` object of one step. On a CPU the measured peak is the whole
        machine's, which the forked ranks share; on GPUs each rank has a peak of its own."""
        tps = self.n_tokens / dt
        n_dev = self.grid.world_size if self.device.type == "cuda" else 1
        return {"step": step, "loss": loss, "grad_norm": norm, "lr": lr, "step_time_s": dt,
                "tokens_per_s": tps, "comm": comm.LOG.summary(),
                "mfu": mfu(tps, self.mcfg, self.cfg.seq_len, self.cfg.peak_flops, n_dev)}

    def weights_finite(self) -> bool:
        """Every weight of every rank is finite. Collective: all ranks get the same answer."""
        bad = any(not torch.isfinite(self.model.dp.shard_of(p).data).all()
                  for m in self.model.chunks for p in m.parameters())
        flag = torch.tensor(float(bad), device=self.device)
        with comm.paused():
            comm.all_reduce(flag, self.grid.world, op="max")
        return not flag.item()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in parameters, gradients and optimizer state, counted
        from the tensors themselves, between steps (`memory.state_bytes`)."""
        return state_bytes(self.model.dp, self.optimizer, self.device)
