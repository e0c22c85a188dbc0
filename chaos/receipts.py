"""What the webhook receiver answered, read back from its log
(``chaos/lab/receiver.py``) as the topic's records are read: each request
it took (a 2xx) a ``Delivery`` at the HTTP sink, named by the unit the
checker judges (the schedule, or for the ids in ``recurring`` one
occurrence, by its ``execute-at`` header, as the topic's reader names
records); each other answer counted by status, and the units it refused
for good (a 4xx that no node may retry: the schedule ends DELIVERY_FAILED,
as asked).

``ReceiverLog.read`` takes the lines written since its last read (a line
still being written waits for the next), so the runner can poll it while
the run goes on and once more at the end. ``receipt`` is the pure part.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.history import HTTP, Delivery, occurrence
from chaos.lab.harness import epoch

# The 4xx answers a node retries (RFC 9110's request timeout, too early,
# too many requests): any other 4xx ends the schedule.
RETRIED_4XX = (408, 425, 429)


@dataclass(frozen=True)
class Receipt:
    """One line of the log: the request's unit ("" when it named no
    schedule), the status it was answered with, whether its signatures
    held (None: not checked), and the delivery it was when a 2xx."""

    unit: str
    status: int
    signed: bool | None
    delivery: Delivery | None

    @property
    def refused(self) -> bool:
        """Refused for good: a 4xx a node must not retry."""
        return 400 <= self.status < 500 and self.status not in RETRIED_4XX


def receipt(line: Mapping[str, Any], recurring: Collection[str] = ()) -> Receipt:
    """One log line as a ``Receipt``. A request without the scheduler's
    headers (no schedule-id, or a token or attempt that is no number) is
    nobody's delivery: its unit is ""."""
    status = int(line["status"])
    schedule_id = line.get("schedule_id") or ""
    execute_at = line.get("execute_at") or ""
    try:
        token, attempt = int(line["fence_token"]), int(line["attempt"])
    except (KeyError, TypeError, ValueError):
        return Receipt("", status, line.get("signed"), None)
    unit = occurrence(schedule_id, execute_at) if schedule_id in recurring else schedule_id
    delivery = None
    if schedule_id and 200 <= status < 300:
        at = float(line["at"])
        delivery = Delivery(
            unit,
            token,
            attempt,
            at,
            digest=line.get("digest"),
            # The receiver's clock is the runner's: when it read the request
            # is when the runner had it.
            received=at,
            execute_at=epoch(execute_at),
            sink=HTTP,
        )
    return Receipt(unit, status, line.get("signed"), delivery)


class ReceiverLog:
    """The receiver's log, read as it grows."""

    def __init__(self, path: Path, recurring: Collection[str] = ()) -> None:
        self.path = path
        self.recurring = recurring
        self.deliveries: list[Delivery] = []
        self.answers: Counter[int] = Counter()  # every answer, by status
        self.refused: set[str] = set()  # units refused for good
        self.unsigned: set[str] = set()  # units a request of which failed its signatures
        self.unnamed = 0  # requests that named no schedule
        self._offset = 0

    def read(self) -> None:
        """Take the whole lines written since the last read."""
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            if line:
                self._take(receipt(json.loads(line), self.recurring))

    def _take(self, got: Receipt) -> None:
        self.answers[got.status] += 1
        if not got.unit:
            self.unnamed += 1
            return
        if got.signed is False:
            self.unsigned.add(got.unit)
        if got.delivery is not None:
            self.deliveries.append(got.delivery)
        elif got.refused:
            self.refused.add(got.unit)

    def units(self) -> set[str]:
        """The units it took a request of."""
        return {d.schedule_id for d in self.deliveries}
