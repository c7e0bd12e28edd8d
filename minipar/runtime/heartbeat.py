"""Who is gone: one heartbeat for every rank, forked by minipar or started by torchrun.

Chapter "Failures at scale".

When a rank dies, its peers learn it from a collective that fails ("Connection closed by
peer 10.0.0.7:41234") or times out. That says *that* something died, not *who*. Worse, a
rank that is stopped (SIGSTOP, a debugger) or stuck in Python keeps its connections open:
its peers wait for it until the collective timeout, and gloo may wait for a stopped peer
forever. So every rank beats: a thread adds 1 to a counter of its own every `PERIOD_S`. A
rank blocked in a collective keeps beating (the wait releases the GIL); a stopped or wedged
one does not. Counters, not clocks: the nodes' clocks need not agree, and a watcher counts
silence in periods of its own, so a watcher that was itself suspended (Ctrl-Z stops the
whole job) does not take everyone for silent when it wakes.

The counters live where every rank and its watcher can reach them. The ranks that
`launch.run_local` forks beat into memory they share with the launcher, which watches them
all; it also knows their processes, so it can tell a stopped rank from a slow one and name
it by its pid (`LauncherWatch`). Under torchrun no process sees every rank: the ranks beat
into the job's store, which torchrun's agent hosts at MASTER_ADDR:MASTER_PORT, rank 0
watches every peer and rank 1 watches rank 0, and each rank writes there which node it is
on (`StoreHeartbeat`). Both are one `Heartbeat`: the same beat, the same watch. (Why not
the store for forked ranks too, the launcher hosting it as the agent does? Measured with
torch 2.13 on two cores: eight ranks connecting to a fresh TCPStore at once stall for 5 s
now and then, and a store started before the fork can hang the children for good. Shared
memory has no connection to make or lose.)

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
import contextlib
import datetime
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
    return any(word in str(error).lower() for word in ("timed out", "timeout"))


class Heartbeat:
    """`rank`'s beat (`rank` None: a watcher that does not beat), and the watch on the ranks
    `watched`. Here the counters are `counts`, shared memory (an array with one slot per
    rank, made before the fork); `StoreHeartbeat` keeps them in a store instead. What the
    watch does about a silent rank is three methods that a watcher defines: `suspect` (is
    this silence a hang?), `warning` (the line that names it at once, on stderr and in
    `warnings`) and `hang` (silent for the whole collective timeout)."""

    def __init__(self, rank: int | None, counts, watched=(), collective_timeout_s=None,
                 period_s: float = PERIOD_S, silent_s: float = SILENT_S):
        self.rank, self.counts, self.watched = rank, counts, list(watched)
        self.period_s, self.silent_s, self.warnings = period_s, silent_s, []
        self.collective_timeout_s = collective_timeout_s
        # seen: rank -> (its count, the tick it moved)
        self._stop, self.ticks, self.seen, self._warned = threading.Event(), 0, {}, set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def beat(self):
        self.counts[self.rank] += 1          # one writer per slot: no lock

    def count(self, rank: int) -> int:
        return self.counts[rank]

    def _run(self):
        # the first beat at once: a rank may stop within its first period. An error: the
        # store is gone with its node, and the roll call says so
        with contextlib.suppress(Exception):
            while not self._stop.is_set():
                if self.rank is not None:
                    self.beat()
                self._watch()
                self._stop.wait(self.period_s)

    def _watch(self):
        self.ticks += 1
        for r in self.watched:
            count = self.count(r)
            if count != self.seen.get(r, (None,))[0]:
                self.seen[r] = (count, self.ticks)
                self._warned.discard(r)          # it beats again: name it again if it stops
            elif count and self.silence(r) >= self.silent_s and self.suspect(r):
                if r not in self._warned:
                    self._warned.add(r)
                    self.warnings.append(self.warning(r, self.silence(r)))
                    print(self.warnings[-1], file=sys.stderr, flush=True)
                elif self.silence(r) >= self.collective_timeout_s:
                    self.hang(r, self.silence(r))

    def silence(self, rank: int) -> float:
        """Seconds since the watch last saw `rank`'s counter move, in the watch's periods."""
        return (self.ticks - self.seen[rank][1]) * self.period_s if rank in self.seen else 0.0

    def stop(self):
        self._stop.set()


class StoreHeartbeat(Heartbeat):
    """A torchrun rank's heartbeat: its beat and its watch in the job's store, and, when it
    fails, the roll call that names the lost (or absent) ranks and their nodes."""

    def __init__(self, rank: int, world_size: int, collective_timeout_s: float,
                 roll_call_s: float = ROLL_CALL_S, **periods):
        self.peers, self.roll_call_s = [r for r in range(world_size) if r != rank], roll_call_s
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.address = f"{host}:{port}"
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")   # a restart starts afresh
        self.store = dist.PrefixStore(
            f"minipar/heartbeat/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/", store)
        self.store.set(f"where/{rank}", node_name())
        # rank 0 watches every peer and rank 1 watches rank 0: O(world size) reads of the
        # store per period for the whole job, not O(world size squared)
        watched = range(1, world_size) if rank == 0 else [0] if rank == 1 else []
        super().__init__(rank, None, watched, collective_timeout_s, **periods)

    def beat(self):
        self.store.add(f"beat/{self.rank}", 1)

    def count(self, rank: int) -> int:
        return self.store.add(f"beat/{rank}", 0)

    def where(self, rank: int) -> str:
        return self.store.get(f"where/{rank}").decode()     # set before its first beat

    def suspect(self, rank: int) -> bool:
        return not self.store.check([f"ended/{rank}"])      # silent because it is done

    def warning(self, rank: int, silent: float) -> str:
        return (f"minipar: rank {self.rank}: rank {rank} on {self.where(rank)} has not beaten for "
                f"{silent:.0f} s (stopped, or its node is lost); the job ends at the collective "
                f"timeout ({self.collective_timeout_s:g} s) unless it beats again")

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
        with contextlib.suppress(Exception):    # the store is gone with its node: nobody watches
            self.store.set(f"{how}/{self.rank}", "1")

    def roll_call(self) -> tuple[dict[int, str], dict[int, str]] | None:
        """Read every peer's counter twice, `roll_call_s` apart: ({rank: its node} of the
        lost ones, whose counter stood still; {rank: its node} of those that beat but did
        not fail). None if the store itself is unreachable: the node that hosts it is lost."""
        with contextlib.suppress(Exception):   # the store is unreachable: None
            before = [self.count(r) for r in self.peers]
            time.sleep(self.roll_call_s)       # the peers that failed too mark themselves
            moved = {r for r, b in zip(self.peers, before) if self.count(r) != b}
            return ({r: self.where(r) for r in self.peers if r not in moved},
                    {r: self.where(r) for r in moved if not self.store.check([f"failed/{r}"])})
        return None

    def explain(self, error: BaseException) -> str:
        """This rank failed with `error`: one line naming it, the lost ranks (or the absent
        ones) and their nodes, then the error that revealed it."""
        self.stop("failed")
        roll = self.roll_call()
        lost, absent = roll or ({}, {})
        named = ", ".join(f"rank {r} on {w}" for r, w in sorted((lost or absent).items()))
        what = "failed; every peer's heartbeat is alive"
        if roll is None:
            what = (f"the job's store at {self.address} is unreachable: the node that hosts "
                    f"it (torchrun's rendezvous host) is lost")
        elif lost:
            what = f"lost {named} (heartbeat stopped)"
        elif absent and timed_out(error):
            what = (f"timed out waiting for {named}, which never joined the collective "
                    "(heartbeat alive: stuck outside it)")
        first = str(error).splitlines()[0] if str(error) else ""
        return f"rank {self.rank} on {node_name()}: {what}\n{type(error).__name__}: {first}"


class LauncherWatch(Heartbeat):
    """The local launcher's watch on the ranks it forked (`procs`), on their shared `counts`.
    It knows their processes, so it tells a stopped rank (SIGSTOP, a debugger) from one
    that is only slow: a busy machine can delay a running rank's beat for seconds (a long
    op holding the GIL), so only a stopped rank is named while the job runs, by its pid."""

    def __init__(self, procs, counts, collective_timeout_s: float):
        self.pids, self.hung = [p.pid for p in procs], None
        super().__init__(None, counts, range(len(procs)), collective_timeout_s)

    def suspect(self, rank: int) -> bool:
        return process_state(self.pids[rank]) == "T"

    def warning(self, rank: int, silent: float) -> str:
        return (f"minipar: rank {rank} (pid {self.pids[rank]}) is stopped (SIGSTOP or a debugger): "
                f"no heartbeat for {silent:.0f} s; the job ends at the collective timeout "
                f"({self.collective_timeout_s:g} s) unless it continues")

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
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
    return "?"
