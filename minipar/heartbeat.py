"""Which peer is gone: a heartbeat through the job's store, for ranks started by torchrun.

Chapter "From a laptop to a cluster".

When a node dies, its peers learn it from a collective that fails ("Connection closed by
peer 10.0.0.7:41234") or times out. That says *that* something died, not *who*. Locally the
launcher sees its children exit; under torchrun no one process sees every rank. So each
rank, from a background thread, adds 1 to a counter of its own in the store the job already
has (torchrun's, at MASTER_ADDR:MASTER_PORT) every `PERIOD_S`. After a failure, a rank
reads every counter twice, `ROLL_CALL_S` apart: the ranks whose counter stood still are the
lost ones, and the node each one announced at start names where they were. A rank blocked
in a collective keeps beating (the wait releases the GIL), so it is not mistaken for lost.
Counters, not clocks: the nodes' clocks need not agree.

Two more things the counters tell. While the job runs, rank 0 watches every peer's counter
(and rank 1 watches rank 0's): a rank silent for `SILENT_S` is named on stderr at once, and
one silent for the whole collective timeout ends the job, named, even where gloo would wait
for it forever (a stopped peer keeps its connections open). And a rank that still beats but
never joined the collective its peers timed out in (stuck in Python, outside any
collective) did not mark itself failed in the store: the roll call names it too.
"""
from __future__ import annotations

import datetime
import math
import os
import socket
import sys
import threading
import time

import torch.distributed as dist

PERIOD_S = 1.0
ROLL_CALL_S = 5.0       # several periods: a loaded machine may delay a beat
SILENT_S = 5.0          # a watched rank silent this long is named at once (the job goes on)


def node_name() -> str:
    """This process's node as torchrun numbers it (GROUP_RANK), and its host."""
    return f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()})"


class Heartbeat:
    """This rank's beat in the store, and the roll call that finds the ranks that stopped."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = 10.0,
                 collective_timeout_s: float | None = None, period_s: float = PERIOD_S,
                 silent_s: float = SILENT_S, roll_call_s: float = ROLL_CALL_S):
        self.rank, self.world_size = rank, world_size
        self.period_s, self.silent_s, self.roll_call_s = period_s, silent_s, roll_call_s
        self.collective_timeout_s = collective_timeout_s
        self.warnings: list[str] = []        # what the watch said, in order
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefix = f"minipar/heartbeat/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/"
        self.store = self._connect(prefix, timeout_s)     # for the roll call
        self.store.set(f"where/{rank}", node_name())
        self._stop, self._warned = threading.Event(), set()
        beat_store = self._connect(prefix, timeout_s)     # the thread's own connection
        self._thread = threading.Thread(target=self._beat, args=(beat_store,), daemon=True)
        self._thread.start()

    def _connect(self, prefix: str, timeout_s: float):
        host, port = self.address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        return dist.PrefixStore(prefix, store)

    def _beat(self, store):
        seen: dict[int, tuple[int, float]] = {}    # rank -> (its count, when it last moved)
        while not self._stop.wait(self.period_s):
            try:
                store.add(f"beat/{self.rank}", 1)
                self._watch(store, seen)
            except Exception:       # the store is gone: the roll call will say so
                return

    def watched(self) -> list[int]:
        """Rank 0 watches every peer and rank 1 watches rank 0: O(world size) reads of the
        store per period for the whole job, not O(world size squared)."""
        if self.rank == 0:
            return list(range(1, self.world_size))
        return [0] if self.rank == 1 else []

    def _watch(self, store, seen: dict):
        now = time.monotonic()
        for r in self.watched():
            count = store.add(f"beat/{r}", 0)
            if r not in seen or count != seen[r][0]:
                seen[r] = (count, now)
                self._warned.discard(r)      # it beats again: name it again if it stops
            elif now - seen[r][1] >= self.silent_s and store.check([f"ended/{r}"]):
                continue                     # silent because it is done, not hung
            elif count and now - seen[r][1] >= self.silent_s and r not in self._warned:
                self._warned.add(r)      # count > 0: it has beaten, so where/r is set
                self.warn(r, store.get(f"where/{r}").decode(), now - seen[r][1])
            elif r in self._warned and now - seen[r][1] >= (self.collective_timeout_s or math.inf):
                self.hang(r, store.get(f"where/{r}").decode(), now - seen[r][1])

    def warn(self, rank: int, where: str, silent: float):
        until = (f" ({self.collective_timeout_s:g} s)" if self.collective_timeout_s else "")
        line = (f"minipar: rank {self.rank}: rank {rank} on {where} has not beaten for "
                f"{silent:.0f} s (stopped, or its node is lost); the job ends at the "
                f"collective timeout{until} unless it beats again")
        self.warnings.append(line)
        print(line, file=sys.stderr, flush=True)

    def stop(self):
        """This rank is done (returned or failed): its watchers stop watching it."""
        self._stop.set()
        try:
            self.store.set(f"ended/{self.rank}", "1")
        except Exception:
            pass          # the store is gone with its node: nobody is watching

    def lost(self) -> dict[int, str] | None:
        """{rank: its node} for each rank whose beat stopped; None if the store itself is
        unreachable (the node that hosts it is the lost one)."""
        try:
            before = [self.store.add(f"beat/{r}", 0) for r in range(self.world_size)]
            time.sleep(self.roll_call_s)
            after = [self.store.add(f"beat/{r}", 0) for r in range(self.world_size)]
            return {r: self.store.get(f"where/{r}").decode()
                    for r in range(self.world_size) if after[r] == before[r] and r != self.rank}
        except Exception:
            return None

    def hang(self, rank: int, where: str, silent: float):
        """A watched rank silent for the whole collective timeout: end this rank, naming
        it, so that torchrun ends the job. Its peers may never time out on their own: gloo
        can wait forever on a stopped peer whose connections stay open."""
        print(f"minipar: error: rank {self.rank} on {node_name()}: rank {rank} on {where} hung: "
              f"no heartbeat for {silent:.0f} s, the collective timeout (stopped, or its node "
              "is lost); ending this rank so that torchrun ends the job", file=sys.stderr,
              flush=True)
        os._exit(1)

    def _mark_failed(self):
        try:
            self.store.set(f"failed/{self.rank}", "1")
        except Exception:
            pass          # the store is gone: lost() says so

    def absent(self) -> dict[int, str]:
        """{rank: its node} for each peer that beats but has not failed: after a timeout,
        the ranks that never joined the collective (call after the roll call, so that the
        peers that timed out too have had time to mark themselves failed)."""
        try:
            return {r: self.store.get(f"where/{r}").decode() for r in range(self.world_size)
                    if r != self.rank and not self.store.check([f"failed/{r}"])}
        except Exception:
            return {}

    def explain(self, error: BaseException) -> str:
        """The failure as one line naming this rank, the lost ranks and their nodes, then
        the error that revealed it."""
        me = f"rank {self.rank} on {node_name()}"
        self._mark_failed()
        lost = self.lost()
        absent = self.absent() if not lost and "timed out" in str(error).lower() else {}
        if lost is None:
            what = (f"the job's store at {self.address} is unreachable: the node that hosts "
                    f"it (torchrun's rendezvous host) is lost")
        elif lost:
            what = "lost " + ", ".join(f"rank {r} on {where}" for r, where in sorted(lost.items()))
            what += " (heartbeat stopped)"
        elif absent:
            what = ("timed out waiting for " + ", ".join(
                f"rank {r} on {where}" for r, where in sorted(absent.items()))
                + ", which never joined the collective (heartbeat alive: stuck outside it)")
        else:
            what = "failed; every peer's heartbeat is alive"
        first = str(error).splitlines()[0] if str(error) else ""
        return f"{me}: {what}\n{type(error).__name__}: {first}"
