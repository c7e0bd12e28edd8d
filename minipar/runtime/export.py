"""A trained model out as a Hugging Face directory, from any layout.

Chapter "Real models in and out".

    python -m minipar.export --resume CKPT --out DIR [--tokenizer HF_DIR]

A checkpoint holds each rank's slices, each labelled with where it lies in the full tensor
(`checkpoint.py`); the full tensors are put back together (`checkpoint.full_state`) and
written by `hf.save_pretrained`, whatever layout saved them. `--export-hf DIR` does the same
at the end of a run (`hf.export_run`): the ranks' slices are gathered to rank 0 instead of
read from files. The trainer imports `hf`, never this command.
"""

import sys

import torch

from ..plan.config import ConfigError, ModelConfig
from ..plan.flags import Parser
from . import checkpoint
from .hf import save_pretrained

PROG = "python -m minipar.export"


def checkpoint_state(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """(model, full state dict, manifest) of a saved checkpoint, in whatever layout it was
    saved. Every file is checked against the manifest's checksums as it is read."""
    step_dir = checkpoint.resolve(path)
    manifest = checkpoint.read_manifest(step_dir)
    checkpoint.check_files(step_dir, manifest)
    entries = [e for name in manifest["files"] if name.startswith("rank_")
               for e in checkpoint.load_torch(step_dir, name, manifest)["entries"]]
    return ModelConfig(**manifest["model"]), checkpoint.full_state(entries), manifest


def main(argv=None) -> int:
    p = Parser(prog=PROG, description="Write a minipar checkpoint (any layout) as a Hugging "
                                      "Face Llama directory.")
    p.add_argument("--resume", required=True, help="a checkpoint directory, or a --save DIR")
    p.add_argument("--out", required=True, help="the Hugging Face directory to write")
    p.add_argument("--tokenizer", default=None,
                   help="copy tokenizer.json (and its config) from this directory")
    args = p.parse_args(argv)
    try:     # before reading anything: a file, a user's directory, an unwritable place
        checkpoint.check_out_dir("--out", args.out, replaced=True)
        mcfg, state, _ = checkpoint_state(args.resume)
        out = save_pretrained(state, mcfg, args.out, args.tokenizer)
    except ConfigError as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({mcfg.n_layers} layers, dim {mcfg.dim}, vocab {mcfg.vocab_size})")
    return 0
