"""A trained model out as a Hugging Face directory, from any layout.

Chapter "Real models in and out".

    python -m minipar.export --resume CKPT --out DIR [--tokenizer HF_DIR]

A checkpoint holds each rank's slices, each labelled with where it lies in the full tensor
(`checkpoint.py`); the full tensors are put back together (`checkpoint.full_tensor`) and
written by `hf.save_pretrained`, whatever layout saved them. `--export-hf DIR` does the same
at the end of a run (`export_run`): the ranks' slices are gathered to rank 0 instead of
read from files.
"""
from __future__ import annotations

import sys
from collections import defaultdict

import torch
import torch.distributed as dist

from . import checkpoint, comm
from .cli import Parser
from .config import ConfigError, ModelConfig
from .hf import save_pretrained

PROG = "python -m minipar.export"


def full_state(entries: list[dict]) -> dict[str, torch.Tensor]:
    """Every parameter's full tensor from the slices (`checkpoint.shard_entries`) that
    hold it, whichever ranks saved them."""
    by_name = defaultdict(list)
    for e in entries:
        by_name[e["name"]].append(e)
    return {name: checkpoint.full_tensor(es) for name, es in by_name.items()}


def checkpoint_state(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """(model, full state dict, manifest) of a saved checkpoint, in whatever layout it was
    saved. Every file is checked against the manifest's checksums as it is read."""
    step_dir = checkpoint.resolve(path)
    manifest = checkpoint.read_manifest(step_dir)
    checkpoint.check_files(step_dir, manifest)
    entries = [e for name in manifest["files"] if name.startswith("rank_")
               for e in checkpoint.load_torch(step_dir, name, manifest)["entries"]]
    return ModelConfig(**manifest["model"]), full_state(entries), manifest


def gather_state(chunks, dp, optimizer, grid, mcfg: ModelConfig) -> dict[str, torch.Tensor] | None:
    """Collective: every rank sends its slices (the parameters only, not AdamW's state) to
    rank 0, which returns the full state dict; the others return None."""
    mine = [{k: v for k, v in e.items() if k not in ("exp_avg", "exp_avg_sq")}
            for e in checkpoint.shard_entries(chunks, dp, optimizer, grid, mcfg)]
    received = [None] * grid.world_size if grid.rank == 0 else None
    with comm.paused():
        dist.gather_object(mine, received, dst=0)
    if grid.rank != 0:
        return None
    return full_state([e for entries in received for e in entries])


def export_run(out: str, chunks, dp, optimizer, grid, mcfg: ModelConfig,
               tokenizer_dir: str | None = None) -> str | None:
    """`--export-hf DIR` at the end of a run: gather, and rank 0 writes the directory."""
    state = gather_state(chunks, dp, optimizer, grid, mcfg)
    if state is not None:
        save_pretrained(state, mcfg, out, tokenizer_dir)
    with comm.paused():
        dist.barrier()          # nobody reports the run done before the directory exists
    return out if state is not None else None


def main(argv=None) -> int:
    p = Parser(prog=PROG, description="Write a minipar checkpoint (any layout) as a Hugging "
                                      "Face Llama directory.")
    p.add_argument("--resume", required=True, help="a checkpoint directory, or a --save DIR")
    p.add_argument("--out", required=True, help="the Hugging Face directory to write")
    p.add_argument("--tokenizer", default=None,
                   help="copy tokenizer.json (and its config) from this directory")
    args = p.parse_args(argv)
    try:
        mcfg, state, _ = checkpoint_state(args.resume)
        out = save_pretrained(state, mcfg, args.out, args.tokenizer)
    except ConfigError as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({mcfg.n_layers} layers, dim {mcfg.dim}, vocab {mcfg.vocab_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
