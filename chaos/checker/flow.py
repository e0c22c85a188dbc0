"""Flow control's bound, from the receiver's own arrival log: the calls of
the load's flow-limited key (``chaos/load.py``, FLOW_LIMIT) arrive at most
its rate plus two slices' shares in any window of one period, however the
window falls. The starts are held to the rate plus one share
(``node/schedule/flow.py``: each slice's share is reserved in the store by
every owner at once, and a start goes within its slice or not at all); an
arrival comes a moment after its start, and under faults (the node's
network cut mid-send, the receiver paused) a moment longer: one share
more. Pure: no IO, no clock."""

from __future__ import annotations

from chaos import history as ops
from chaos.checker.finding import Finding
from chaos.history import HTTP, History, Topic

# A slice per tenth of a period (one per delivery below ten a period).
SLICES = 10


def most_allowed(rate: int) -> int:
    """The most starts a window of one period may see at ``rate``."""
    slices = min(SLICES, rate)
    share = -(-rate // slices)
    return rate + 2 * share


def over_flow_rate(history: History, topic: Topic) -> Finding:
    """The calls of a flow-limited key that arrived past what the limit
    allows in the window of one period ending with them."""
    limited: dict[str, tuple[int, float]] = {}
    for call in history.calls(ops.CREATE):
        rate, period = call.get("flowRate"), call.get("flowPeriod")
        if call.schedule is not None and rate:
            limited[call.schedule] = (int(rate), float(period or 1.0))
    arrivals = sorted(
        (d.at, d.schedule_id)
        for d in topic.deliveries
        if d.sink == HTTP and d.schedule_id in limited
    )
    if not arrivals:
        return Finding("over_flow_rate", (), {"flow_limited_arrivals": 0})
    rate, period = next(iter(limited.values()))
    allowed = most_allowed(rate)
    over: set[str] = set()
    most, start = 0, 0
    for end, (at, _unit) in enumerate(arrivals):
        while at - arrivals[start][0] >= period:
            start += 1
        count = end - start + 1
        most = max(most, count)
        if count > allowed:
            over.add(arrivals[end][1])  # the call past what the window allows
    figures = {
        "flow_limited_arrivals": len(arrivals),
        "flow_most_in_a_period": most,
        "flow_allowed_in_a_period": allowed,
    }
    return Finding("over_flow_rate", tuple(sorted(over)), figures)
