"""What each kind of fault is, as the player plays it and the checker
judges it. Pure data."""

from __future__ import annotations

# Failure detection at the lan preset (p99 about 8 s) plus the lease TTL (6 s),
# with room to spare.
RECOVERY_ALLOWANCE = 20.0
# Faults of the servers themselves: no node is their target.
SERVER_FAULTS = ("crash-store", "pause-broker", "crash-broker")
# Faults of the broker: inside their windows a producer may resend a batch
# the stalled broker had stored after all (``chaos.checker``: producer_retry).
# (``lose-broker-acks``: the simulation's, ``chaos/sim/``; a real broker
# loses an ack only by accident.)
BROKER_FAULTS = ("pause-broker", "crash-broker", "cut-broker", "lose-broker-acks")
# Faults that stop the work of every node while they last: late deliveries
# are intended for as long. Any other fault is one node's, or a split the
# leases ride out: the others take its work within the recovery allowance,
# and a unit due after that must not be late (``late_outside_windows``).
CLUSTER_FAULTS = (*SERVER_FAULTS, "split", "slow-store")
# The ends of faults the player notes (a heal, a resume, a reconnect) and a
# node added: not faults, so no recovery allowance of their own.
NOT_FAULTS = ("start", "resume", "heal", "reconnect", "receiver-up")
# Faults of the webhook receiver, every http target's endpoint: while they
# last no node can deliver by HTTP (deliveries to the topic go on), and
# inside their windows a request the receiver took may come again under
# the same claim (a probe of an open circuit that timed out spent no
# attempt: ``chaos.checker``'s deferred_publish, for HTTP).
RECEIVER_FAULTS = ("receiver-down", "receiver-503", "receiver-slow", "receiver-400")
# How long HTTP deliveries may take to catch up after a receiver fault
# ends: a node's circuit to the receiver, opened by its failures, waits up
# to 10 s before its next probe (HTTP_BREAKER_COOLDOWN, doubled after each
# failed probe up to HTTP_BREAKER_COOLDOWN_MAX), then the backlog the fault
# left drains, oldest first, HTTP_MAX_PER_HOST calls at a time per node,
# beside the load that keeps coming: a share of the fault's own length
# (http-outage's 3 minutes at 10 calls a second left some 1,800, which took
# 50 to 100 s on this 2-core machine running the whole cluster), then the
# recovery allowance. (A 503's Retry-After is waited on top: the fault's own.)
RECEIVER_CIRCUIT_WAIT = 10.0
RECEIVER_DRAIN_SHARE = 0.6


def receiver_recovery(lasting: float) -> float:
    """After a receiver fault of ``lasting`` seconds, how long its HTTP
    deliveries may take to be on time again."""
    return RECEIVER_CIRCUIT_WAIT + RECEIVER_DRAIN_SHARE * lasting + RECOVERY_ALLOWANCE
