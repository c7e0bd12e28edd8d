"""Results computed before the reader asks: the notebook's explorers whose figure waits on a
slow search (the 4D chapter's planner, a second or more per setting on 2 cores).

Chapter "Four dimensions at once". `Prefetcher(compute)` keeps every result it computed.
`warm(keys)` guesses: it hands the settings one control move away to one background
process, so that the reader's next move finds its result ready. `get(key)` returns a kept
result at once, waits for a guess already running for it, or else computes it here and now
and drops the guesses still queued (they were for a setting the reader left).

A process and not a thread: the kernel's own thread must answer the slider and draw the PNG
while a guess runs, and a thread planning in pure Python would hold the interpreter's lock
the kernel needs (measured in JupyterLab on 2 cores: warm redraws of 4-11 s behind a
guessing thread, under 2 s with the guess in its own process). One worker, so guesses never
take both cores. `compute` must be a module-level function (the process imports it).
"""
from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool


class Prefetcher:
    """`compute(*key)`'s results by key: the reader's computed in the caller, guesses in
    one background process."""

    def __init__(self, compute):
        self._compute = compute
        self._kept: dict[tuple, object] = {}
        self._guesses: dict[tuple, Future] = {}
        self._pool: ProcessPoolExecutor | None | bool = None   # False: guessing stopped

    def get(self, key: tuple):
        """The result for `key` (raises what `compute` raised)."""
        if key in self._kept:
            return self._kept[key]
        guess = self._guesses.pop(key, None)
        self._drop_guesses()
        result = None
        if guess is not None and not guess.cancel():      # running or done: its result
            try:
                result = guess.result()
            except Exception:                             # noqa: BLE001 - raised again below
                guess = None
        if guess is None or guess.cancelled():
            result = self._compute(*key)                  # here, where its error is the reader's
        self._kept[key] = result
        return result

    def warm(self, keys) -> None:
        """Guess `keys` (most likely first), dropping the guesses queued for an older setting."""
        self._drop_guesses()
        for key in keys:
            if self._pool is not False and key not in self._kept and key not in self._guesses:
                try:
                    self._guesses[key] = self._worker().submit(self._compute, *key)
                except BrokenProcessPool:   # the worker died or could not start: no more guesses
                    self._pool = False

    def _drop_guesses(self) -> None:
        """Cancel the guesses not started; keep those that finished."""
        for key, future in list(self._guesses.items()):
            if future.cancel() or future.done():
                del self._guesses[key]
                if not future.cancelled() and future.exception() is None:
                    self._kept[key] = future.result()

    def _worker(self) -> ProcessPoolExecutor:
        # spawn, not fork: the kernel has threads of its own, which a fork would copy mid-lock;
        # the worker ignores Ctrl-C, which JupyterLab's interrupt sends the kernel's whole group
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=signal.signal,
                                             initargs=(signal.SIGINT, signal.SIG_IGN))
        return self._pool
