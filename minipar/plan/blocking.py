"""Every rank's program run until it blocks: the one simulator of the book's pipelines.

Chapter "Pipeline parallelism". Each rank runs the items of its program in order, each as
soon as its rank is free and what it waits for has happened on another rank (an activation,
a gradient, a message). A rank that must wait stops; the others run as far as they can, and
the sweep starts again, until no rank can move. Then every item has its start and end time,
or the ranks left with items wait for something that never comes: a deadlock.

Only the items' meaning differs between the three that ask: `schedules.simulate` times a
schedule's F, B and W actions (the bubble, and the order of `p2p_plan`),
`schedule_analysis.check_p2p_plan` runs a program of sends and receives that block until
their partner comes, and `replay.simulate` times a recorded step's computations, posts and
waits on a target machine.
"""


def run_until_blocked(programs: dict, start) -> dict:
    """Run `programs` ({rank: its items, in order}); each rank's clock starts at 0.

    `start(rank, item, clock)` is called when `item` is the next of `rank`, free since
    `clock`: it returns the item's (start, end), and does what running it means to the
    caller, or None while the item waits for another rank. Returns {rank: [(start, end) of
    each item run]}: a rank with fewer spans than items is stuck at the first without one.
    """
    spans = {r: [] for r in programs}
    moved = True
    while moved:                                   # sweep the ranks until none can move
        moved = False
        for r, prog in programs.items():
            done = spans[r]
            while len(done) < len(prog):           # rank r runs as far as it can go
                span = start(r, prog[len(done)], done[-1][1] if done else 0.0)
                if span is None:
                    break
                done.append(span)
                moved = True
    return spans


def stuck(programs: dict, spans: dict) -> dict:
    """{rank: the item it waits at} for every rank that did not finish its program."""
    return {r: prog[len(spans[r])] for r, prog in programs.items() if len(spans[r]) < len(prog)}
