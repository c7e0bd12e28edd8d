"""Expert parallelism's bytes. Chapter "Experts: the fifth axis".

A token routed to k experts is sent once to each expert that another EP rank holds
(dispatch) and its k outputs come back the same way (combine): an all-to-all whose sizes
are the routing's counts. A rank sends what it keeps for itself over no wire.
"""


def all_to_all_wire_bytes(send_counts: list[int], rank: int, bytes_per_item: int) -> int:
    """Bytes `rank` puts on the wire in one all-to-all that sends send_counts[j] items to
    rank j: everything but its own share."""
    return sum(c for j, c in enumerate(send_counts) if j != rank) * bytes_per_item


def dispatch_bytes(tokens: int, top_k: int, ep: int, dim: int, act_bytes: int) -> float:
    """Expected bytes one EP rank sends in one dispatch of `tokens` tokens when routing is
    uniform: each of its tokens' k copies lands on another rank with probability (ep-1)/ep.
    The combine sends the same back; the backward repeats both."""
    return tokens * top_k * (ep - 1) / ep * dim * act_bytes
