"""Every closed form of the book, written once, one file per chapter: bytes on the wire,
bubbles, stage splits, memory.

Chapters: each file belongs to the chapter it is named after, read in the book's order:

    collectives.py         the bytes of each collective (ring)
    collective_time.py     alpha-beta times, the all-reduce algorithms (chapter "Collectives")
    data_parallel.py       DP and ZeRO bytes per step, the buckets' all-reduces in time
    tensor_parallel.py     TP bytes per layer, embedding, head, loss and norms
    pipeline_parallel.py   the bubble of each schedule, p2p bytes
    context_parallel.py    ring, all-gather and Ulysses bytes
    memory.py              what each ZeRO stage keeps, activations saved per layer, the
                           micro-batches a schedule keeps in flight
    failures.py            the checkpoint interval (Young, Daly) and the time it wastes

(The parameter count and FLOPs of the model itself are `minipar.plan.flops`.) Pure arithmetic on
numbers and configs, never torch, so the book and the cost model import it anywhere. This
file imports nothing: a module takes the one file it needs.
"""
