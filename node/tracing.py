"""The tracing hooks the node calls (``telemetry.py`` chooses which):
``OFF`` does nothing and imports nothing of OpenTelemetry."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

Value = TypeVar("Value")  # a header value: str (HTTP) or bytes (Kafka)


class Outgoing(Generic[Value]):
    """A delivery about to leave: the headers to send it with, and where to
    say it failed."""

    def __init__(self, headers: Sequence[tuple[str, Value]]) -> None:
        self.headers: list[tuple[str, Value]] = list(headers)

    def failed(self, reason: str) -> None:
        """Tracing off: nothing to record."""


class Tracing:
    """The hooks the node calls; this one, tracing off, does nothing."""

    enabled = False

    def current_traceparent(self) -> str | None:
        """The ``traceparent`` of the span being served, to store with a schedule."""
        return None

    @contextlib.contextmanager
    def publishing(
        self, topic: str, headers: Sequence[tuple[str, bytes]]
    ) -> Iterator[Outgoing[bytes]]:
        yield Outgoing(headers)

    @contextlib.contextmanager
    def calling(
        self, method: str, host: str, headers: Sequence[tuple[str, str]]
    ) -> Iterator[Outgoing[str]]:
        yield Outgoing(headers)

    def close(self) -> None:
        """Flush what is not exported yet."""


OFF = Tracing()
