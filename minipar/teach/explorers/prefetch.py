"""Results computed before the reader asks: the notebook's explorers whose figure waits on a
slow search (the 4D chapter's planner, a second or more per setting on 2 cores).

Chapter "Four dimensions at once". `Prefetcher(compute)` runs `compute(*key)` on one
background thread and keeps every result: `get(key)` returns a kept result at once, waits
for one being computed, or computes it next; `warm(keys)` queues the settings one control
move away, so that the reader's next move finds its result ready. One worker, so a
speculative computation never runs beside the one the reader waits for (on a 2-core machine
two would slow each other); queued guesses the reader moved away from are dropped. The
thread starts with the first request, not at import, and is a daemon: a kernel that shuts
down does not wait for guesses.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class Prefetcher:
    """`compute(*key)`'s results by key, computed on one background thread."""

    def __init__(self, compute):
        self._compute = compute
        self._futures: dict[tuple, Future] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None

    def _work(self):
        while True:
            key, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue                      # a guess dropped before its turn
            try:
                future.set_result(self._compute(*key))
            except BaseException as e:        # noqa: BLE001 - handed to whoever asks
                future.set_exception(e)

    def _submit(self, key: tuple) -> Future:
        with self._lock:
            future = self._futures.get(key)
            if future is None or future.cancelled():
                future = self._futures[key] = Future()
                self._queue.put((key, future))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="minipar-prefetch", daemon=True)
                self._worker.start()
            return future

    def _drop_guesses(self):
        """Cancel what is queued and not started: guesses for a setting the reader left."""
        with self._lock:
            for key, future in list(self._futures.items()):
                if not future.running() and not future.done() and future.cancel():
                    del self._futures[key]

    def get(self, key: tuple):
        """The result for `key` (raises what `compute` raised): kept, being computed, or
        computed next (the queued guesses are dropped so it does not wait behind them)."""
        if key not in self._futures:
            self._drop_guesses()
        return self._submit(key).result()

    def warm(self, keys) -> None:
        """Queue `keys` (most likely first), dropping the guesses queued for an older setting."""
        self._drop_guesses()
        for key in keys:
            self._submit(key)
