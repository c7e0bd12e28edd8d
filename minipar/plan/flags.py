"""Command lines generated from the config dataclasses: `python -m minipar.train`'s, and the
cost model's layout flags.

Chapter "One model, sixteen thousand GPUs". Every flag is a field of `ParallelConfig` or
`TrainConfig` (`config.opt`): its name, type, default and help are written once, there.
`add_flags` makes a parser group of a dataclass's fields (another command may declare its
own defaults for them), `parse` reads them back. A bad flag is one line on stderr
naming it, and exit status 2 (`Parser`), before any rank starts. Torch-free: the cost
model builds its command line here too.
"""

import argparse
from dataclasses import fields

from .config import ParallelConfig, TrainConfig, flag_of

PROG = "python -m minipar.train"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr, `PROG: error: ...` (a subclass may
    leave out the PROG), and exit status 2: no usage block to scroll past."""

    prog_in_errors = True

    def error(self, message):
        self.exit(2, f"{self.prog + ': ' if self.prog_in_errors else ''}error: {message}\n")


class Chosen(str):
    """A command's default left to the program: None on the command line, chosen later from
    the other flags; its text says how (in --help). A switch chosen so becomes --x / --no-x."""

def add_flags(group, cls, only=None, defaults: dict | None = None) -> None:
    """One flag per `opt` field of dataclass `cls` (or of those named in `only`, in that
    order), typed by the field, with its default and help. `defaults` replaces a field's
    default for this command: {name: value}, or {name: Chosen(how)}."""
    by_name, defaults = {f.name: f for f in fields(cls) if "help" in f.metadata}, defaults or {}
    for name in only or by_name:
        meta, default = dict(by_name[name].metadata), defaults.get(name, by_name[name].default)
        if name in defaults:        # this command's own default, said in its help
            meta["help"] += f" (default: {default})"
            default = None if isinstance(default, Chosen) else default
        if isinstance(by_name[name].default, bool):     # a switch
            meta["action"] = (argparse.BooleanOptionalAction if default is None else
                              "store_false" if default else "store_true")
        elif by_name[name].default is not None:     # typed by its default (None: a string)
            meta.setdefault("type", type(by_name[name].default))
        # the flag leaves `meta` before argparse reads the rest of it (its type, help, action)
        group.add_argument(meta.pop("flag", flag_of(name)), dest=name, default=default, **meta)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
               description="Train a Llama-style model on tp*cp*pp*dp ranks: local gloo "
                           "processes, or the torchrun world.",
               epilog="Signals: SIGTERM, SIGHUP, SIGUSR1 (Slurm's --signal) or Ctrl-C stop every "
                      "rank at the next step boundary (with --save, after a checkpoint there; a "
                      "second one stops at once), one line, exit 128+signal (143, 130). Under "
                      "torchrun, start the agent as `python -m minipar.torchrun` for the same.")
    add_flags(p.add_argument_group("layout (ParallelConfig)"), ParallelConfig)
    add_flags(p.add_argument_group("run (TrainConfig)"), TrainConfig)
    return p


def parse(argv=None) -> TrainConfig:
    """The run the flags describe (exits 2 on a malformed flag): the layout's flags make its
    `ParallelConfig`, the others are `TrainConfig`'s own fields."""
    given = vars(build_parser().parse_args(argv))
    layout = ParallelConfig(**{f.name: given.pop(f.name) for f in fields(ParallelConfig)})
    return TrainConfig(parallel=layout, **given)
