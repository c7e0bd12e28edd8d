"""Who is gone: one heartbeat for every rank, forked by minipar or started by torchrun.

Chapter "Failures at scale".

When a rank dies, its peers learn it from a collective that fails ("Connection closed by
peer 10.0.0.7:41234") or times out. That says *that* something died, not *who*. Worse, a
rank that is stopped (SIGSTOP, a debugger) or stuck in Python keeps its connections open:
its peers wait for it until the collective timeout, and gloo may wait for a stopped peer
forever. So every rank beats: a thread adds 1 to a counter of its own on a *board* every
`PERIOD_S`. A rank blocked in a collective keeps beating (the wait releases the GIL); a
stopped or wedged one does not. Counters, not clocks: the nodes' clocks need not agree,
and a watcher counts silence in periods of its own, so a watcher that was itself suspended
(Ctrl-Z stops the whole job) does not take everyone for silent when it wakes.

The board is wherever every rank and its watcher can reach. Ranks that `launch.run_local`
forks beat into memory they share with the launcher (`SharedBoard`), which watches them
all; it also knows their processes, so it can tell a stopped rank from a slow one
(`LauncherWatch`). Under torchrun no process sees every rank: the ranks beat into the job's
store, which torchrun's agent hosts at MASTER_ADDR:MASTER_PORT (`StoreBoard`), rank 0
watches every peer and rank 1 watches rank 0 (`StoreHeartbeat`).

Three readings of the counters name the rank at fault:
- **The watch**, while the job runs: a rank silent for `SILENT_S` is named on stderr at
  once (the job goes on: it may yet beat again), and one silent for the whole collective
  timeout ends the job, named.
- **The roll call**, after a failure: the ranks whose counter stood still are the lost
  ones. The launcher has watched them all along; under torchrun the failing rank reads
  every counter twice, `ROLL_CALL_S` apart, and the node each rank announced at start says
  where the lost ones were.
- **The absent**: when the first error says a rank waited until the collective timeout,
  the ranks that still beat but never reported a failure are the ones that never joined
  that collective (stuck in Python, outside any collective).
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

PERIOD_S = 0.5          # one beat
SILENT_S = 4.0          # a watched rank silent this long is named at once (loaded 2-core margin)
ROLL_CALL_S = 5.0       # several periods: a loaded machine may delay a beat


def timed_out(error: BaseException) -> bool:
    """The error says this rank waited for a peer until the collective timeout.

    Read from the message because nothing else tells it: gloo raises the same bare
    RuntimeError for a peer that closed its connection ("Connection closed by peer") and
    for one that never came ("Timed out waiting 60000ms for recv operation")."""
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


class SharedBoard:
    """One counter per rank in shared memory: made by the launcher before it forks the
    ranks, so they write where it reads, with no connection to make or lose."""

    def __init__(self, ctx, world_size: int):
        self.counts = ctx.Array("q", world_size, lock=False)   # one writer per slot

    def beat(self, rank: int):
        self.counts[rank] += 1

    def count(self, rank: int) -> int:
        return self.counts[rank]


class StoreBoard:
    """One counter per rank in the job's store at `address`, the one torchrun's agent
    hosts for its workers. Keys are per attempt: a torchrun restart starts afresh."""

    def __init__(self, address: str, timeout_s: float = 10.0):
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        self.store = dist.PrefixStore(
            f"minipar/heartbeat/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/", store)

    def beat(self, rank: int):
        self.store.add(f"beat/{rank}", 1)

    def count(self, rank: int) -> int:
        return self.store.add(f"beat/{rank}", 0)


class Heartbeat:
    """`rank`'s beat on `board` (`rank` None: a watcher that does not beat), and the watch
    on the ranks `watched`. What the watch does about a silent rank is three methods that
    a watcher defines: `suspect` (is this silence a hang?), `warn` (named at once) and
    `hang` (silent for the whole collective timeout)."""

    def __init__(self, rank: int | None, board, watched=(), collective_timeout_s=None,
                 period_s: float = PERIOD_S, silent_s: float = SILENT_S):
        self.rank, self.board, self.watched = rank, board, list(watched)
        self.collective_timeout_s, self.period_s, self.silent_s = collective_timeout_s, period_s, silent_s
        self.ticks, self.seen, self._warned = 0, {}, set()  # seen: rank -> (count, tick it moved)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period_s):
            try:
                if self.rank is not None:
                    self.board.beat(self.rank)
                self._watch()
            except Exception:       # the board is gone with its node: the roll call says so
                return

    def _watch(self):
        self.ticks += 1
        for r in self.watched:
            count = self.board.count(r)
            if count != self.seen.get(r, (None,))[0]:
                self.seen[r] = (count, self.ticks)
                self._warned.discard(r)          # it beats again: name it again if it stops
            elif count and self.silence(r) >= self.silent_s and self.suspect(r):
                if r not in self._warned:
                    self._warned.add(r)
                    self.warn(r, self.silence(r))
                elif self.silence(r) >= (self.collective_timeout_s or math.inf):
                    self.hang(r, self.silence(r))

    def silence(self, rank: int) -> float:
        """Seconds since the watch last saw `rank`'s counter move, in the watch's periods."""
        return (self.ticks - self.seen[rank][1]) * self.period_s if rank in self.seen else 0.0

    def stop(self):
        self._stop.set()


class StoreHeartbeat(Heartbeat):
    """A torchrun rank's heartbeat: its beat and its watch in the job's store, and, when it
    fails, the roll call that names the lost (or absent) ranks and their nodes."""

    def __init__(self, rank: int, world_size: int, collective_timeout_s: float | None = None,
                 period_s: float = PERIOD_S, silent_s: float = SILENT_S,
                 roll_call_s: float = ROLL_CALL_S):
        self.world_size, self.roll_call_s, self.warnings = world_size, roll_call_s, []
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        board = StoreBoard(self.address)
        self.store = board.store
        self.store.set(f"where/{rank}", node_name())
        # rank 0 watches every peer and rank 1 watches rank 0: O(world size) reads of the
        # store per period for the whole job, not O(world size squared)
        watched = range(1, world_size) if rank == 0 else [0] if rank == 1 else []
        super().__init__(rank, board, watched, collective_timeout_s, period_s, silent_s)

    def where(self, rank: int) -> str:
        return self.store.get(f"where/{rank}").decode()     # set before its first beat

    def suspect(self, rank: int) -> bool:
        return not self.store.check([f"ended/{rank}"])      # silent because it is done

    def warn(self, rank: int, silent: float):
        until = f" ({self.collective_timeout_s:g} s)" if self.collective_timeout_s else ""
        self.warnings.append(f"minipar: rank {self.rank}: rank {rank} on {self.where(rank)} has "
                             f"not beaten for {silent:.0f} s (stopped, or its node is lost); the "
                             f"job ends at the collective timeout{until} unless it beats again")
        print(self.warnings[-1], file=sys.stderr, flush=True)

    def hang(self, rank: int, silent: float):
        """End this rank, naming the silent one, so that torchrun ends the job: gloo can
        wait forever on a stopped peer whose connections stay open."""
        print(f"minipar: error: rank {self.rank} on {node_name()}: rank {rank} on "
              f"{self.where(rank)} hung: no heartbeat for {silent:.0f} s, the collective "
              "timeout (stopped, or its node is lost); ending this rank so that torchrun "
              "ends the job", file=sys.stderr, flush=True)
        os._exit(1)

    def stop(self, how: str = "ended"):
        """This rank returned ("ended": it stops beating, and its watchers stop watching
        it), or failed ("failed": it beats on, so that no peer's roll call takes it for lost)."""
        if how == "ended":
            super().stop()
        try:
            self.store.set(f"{how}/{self.rank}", "1")
        except Exception:
            pass          # the store is gone with its node: nobody is watching

    def roll_call(self) -> tuple[dict[int, str], dict[int, str]] | None:
        """Read every peer's counter twice, `roll_call_s` apart: ({rank: its node} of the
        lost ones, whose counter stood still; {rank: its node} of those that beat but did
        not fail). None if the store itself is unreachable: the node that hosts it is lost."""
        peers = [r for r in range(self.world_size) if r != self.rank]
        try:
            before = [self.board.count(r) for r in peers]
            time.sleep(self.roll_call_s)       # the peers that failed too mark themselves
            moved = {r for r, b in zip(peers, before) if self.board.count(r) != b}
            absent = [r for r in moved if not self.store.check([f"failed/{r}"])]
            return ({r: self.where(r) for r in peers if r not in moved},
                    {r: self.where(r) for r in absent})
        except Exception:
            return None

    def explain(self, error: BaseException) -> str:
        """This rank failed with `error`: one line naming it, the lost ranks (or the absent
        ones) and their nodes, then the error that revealed it."""
        self.stop("failed")
        roll = self.roll_call()
        lost, absent = roll or ({}, {})
        named = ", ".join(f"rank {r} on {w}" for r, w in sorted((lost or absent).items()))
        if roll is None:
            what = (f"the job's store at {self.address} is unreachable: the node that hosts "
                    f"it (torchrun's rendezvous host) is lost")
        elif lost:
            what = f"lost {named} (heartbeat stopped)"
        elif absent and timed_out(error):
            what = (f"timed out waiting for {named}, which never joined the collective "
                    "(heartbeat alive: stuck outside it)")
        else:
            what = "failed; every peer's heartbeat is alive"
        first = str(error).splitlines()[0] if str(error) else ""
        return f"rank {self.rank} on {node_name()}: {what}\n{type(error).__name__}: {first}"


class LauncherWatch(Heartbeat):
    """The local launcher's watch on the ranks it forked (`procs`), on their shared board.
    It knows their processes, so it tells a stopped rank (SIGSTOP, a debugger) from one
    that is only slow: a busy machine can delay a running rank's beat for seconds (a long
    op holding the GIL), so only a stopped rank is named while the job runs, by its pid."""

    def __init__(self, procs, board: SharedBoard, collective_timeout_s: float):
        self.pids, self.hung = [p.pid for p in procs], None
        super().__init__(None, board, range(len(procs)), collective_timeout_s)

    def suspect(self, rank: int) -> bool:
        return process_state(self.pids[rank]) == "T"

    def warn(self, rank: int, silent: float):
        print(f"minipar: rank {rank} (pid {self.pids[rank]}) is stopped (SIGSTOP or a "
              f"debugger): no heartbeat for {silent:.0f} s; the job ends at the collective "
              f"timeout ({self.collective_timeout_s:g} s) unless it continues",
              file=sys.stderr, flush=True)

    def hang(self, rank: int, silent: float):
        self.hung = rank        # the launcher ends the job: gloo may wait for it forever

    def culprits(self, waiting: list[int], waited: bool) -> dict[int, str]:
        """{rank: why} for the ranks the others waited for, among `waiting` (alive, without
        a result or an error): those whose heartbeat stopped; else, when the first error
        was a timeout (`waited`), those that beat but never joined the collective."""
        silent = {}
        for r in waiting:
            state, s = process_state(self.pids[r]), self.silence(r)
            if state == "T" or s > min(self.silent_s, self.collective_timeout_s):
                what = "stopped (SIGSTOP or a debugger)" if state == "T" else "not responding"
                silent[r] = f"pid {self.pids[r]}, {what}: no heartbeat for {s:.0f} s"
        return silent or {r: f"pid {self.pids[r]}, running and beating but never joined the "
                             "collective its peers timed out in" for r in waiting if waited}


def node_name() -> str:
    """This process's node as torchrun numbers it (GROUP_RANK), and its host."""
    return f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()})"


def process_state(pid: int) -> str:
    """Linux's one-letter state of a process: R running, S sleeping, T stopped..."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"
