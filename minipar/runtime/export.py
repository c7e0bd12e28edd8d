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
from ..plan.pipes import closed_pipe_exit
from . import checkpoint
from .hf import WriteError, check_model_memory, save_pretrained

PROG = "python -m minipar.export"


def checkpoint_state(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """(model, full state dict, manifest) of a saved checkpoint, in whatever layout it was
    saved. Nothing is taken on trust, and each check comes before what it guards: the
    manifest as a whole (`read_manifest`: layout, files, the model's fields), the model's
    size against the RAM before any tensor exists (`hf.check_model_memory`: a
    manifest may claim 70B parameters), every file's checksum, then every slice's name,
    shape and range against that model (`checkpoint.check_contents`: a manifest saying
    dim=128 over 64-wide tensors would export a config.json the weights contradict)."""
    step_dir = checkpoint.resolve(path)
    manifest = checkpoint.read_manifest(step_dir)
    model = checkpoint.manifest_model(manifest, f"checkpoint file {step_dir}")
    check_model_memory(model, f"--resume {path}")
    checkpoint.check_files(step_dir, manifest)
    return model, checkpoint.check_contents(step_dir, manifest, model), manifest


def main(argv=None) -> int:
    p = Parser(prog=PROG, description="Write a minipar checkpoint (any layout) as a Hugging "
                                      "Face Llama or Mixtral directory.")
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
    except WriteError as e:     # a full disk: nothing left behind, the old --out kept
        print(f"{PROG}: error: --out {args.out}: {e}", file=sys.stderr)
        return 1
    try:
        print(f"wrote {out} ({mcfg.n_layers} layers, dim {mcfg.dim}, vocab {mcfg.vocab_size})",
              flush=True)
    except BrokenPipeError:     # the directory is written: a reader who has gone changes nothing
        closed_pipe_exit()
    return 0
