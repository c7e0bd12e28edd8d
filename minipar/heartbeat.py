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
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time

import torch.distributed as dist

PERIOD_S = 1.0
ROLL_CALL_S = 5.0       # several periods: a loaded machine may delay a beat


def node_name() -> str:
    """This process's node as torchrun numbers it (GROUP_RANK), and its host."""
    return f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()})"


class Heartbeat:
    """This rank's beat in the store, and the roll call that finds the ranks that stopped."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = 10.0):
        self.rank, self.world_size = rank, world_size
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefix = f"minipar/heartbeat/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/"
        self.store = self._connect(prefix, timeout_s)     # for the roll call
        self.store.set(f"where/{rank}", node_name())
        self._stop = threading.Event()
        beat_store = self._connect(prefix, timeout_s)     # the thread's own connection
        self._thread = threading.Thread(target=self._beat, args=(beat_store,), daemon=True)
        self._thread.start()

    def _connect(self, prefix: str, timeout_s: float):
        host, port = self.address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        return dist.PrefixStore(prefix, store)

    def _beat(self, store):
        while not self._stop.wait(PERIOD_S):
            try:
                store.add(f"beat/{self.rank}", 1)
            except Exception:       # the store is gone: the roll call will say so
                return

    def stop(self):
        self._stop.set()

    def lost(self) -> dict[int, str] | None:
        """{rank: its node} for each rank whose beat stopped; None if the store itself is
        unreachable (the node that hosts it is the lost one)."""
        try:
            before = [self.store.add(f"beat/{r}", 0) for r in range(self.world_size)]
            time.sleep(ROLL_CALL_S)
            after = [self.store.add(f"beat/{r}", 0) for r in range(self.world_size)]
            return {r: self.store.get(f"where/{r}").decode()
                    for r in range(self.world_size) if after[r] == before[r] and r != self.rank}
        except Exception:
            return None

    def explain(self, error: BaseException) -> str:
        """The failure as one line naming this rank, the lost ranks and their nodes, then
        the error that revealed it."""
        me = f"rank {self.rank} on {node_name()}"
        lost = self.lost()
        if lost is None:
            what = (f"the job's store at {self.address} is unreachable: the node that hosts "
                    f"it (torchrun's rendezvous host) is lost")
        elif lost:
            what = "lost " + ", ".join(f"rank {r} on {where}" for r, where in sorted(lost.items()))
            what += " (heartbeat stopped)"
        else:
            what = "failed; every peer's heartbeat is alive"
        first = str(error).splitlines()[0] if str(error) else ""
        return f"{me}: {what}\n{type(error).__name__}: {first}"
