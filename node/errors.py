"""The node's error hierarchy.

Errors carry behaviour, not transport: each says what went wrong (``code``),
what an HTTP edge would answer (``status_hint``, as h11's
``error_status_hint``) and whether trying again can help (``retriable``, as
aiokafka's errors do). Only ``node/api/app.py`` turns them into HTTP
responses; the store, the tenants and delivery never speak HTTP.

Each class states all three in its header::

    class RateLimited(SchedulerError, code="rate_limited", status_hint=429, retriable=True):
"""

from __future__ import annotations

from typing import ClassVar


class SchedulerError(Exception):
    """Base of every error the node raises on purpose. Abstract: raise a subclass."""

    code: ClassVar[str] = "internal"
    # What an HTTP edge answers; None: never meant to reach a caller (a 500 if it does).
    status_hint: ClassVar[int | None] = None
    retriable: ClassVar[bool] = False

    def __init_subclass__(
        cls,
        *,
        code: str | None = None,
        status_hint: int | None = None,
        retriable: bool | None = None,
        **kwargs: object,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if status_hint is not None:
            cls.status_hint = status_hint
        if retriable is not None:
            cls.retriable = retriable

    def __init__(
        self, message: str, field: str | None = None, *, retry_after: float | None = None
    ) -> None:
        if type(self) is SchedulerError:
            raise TypeError("SchedulerError is abstract: raise one of its subclasses")
        super().__init__(message)
        self.message = message
        # The request field at fault, when one is.
        self.field = field
        # Seconds after which a retry may succeed (a hint, for Retry-After).
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message

    @property
    def status(self) -> int:
        """The status hint, 500 for an error never meant to reach a caller."""
        return self.status_hint or 500

    def body(self) -> dict[str, object]:
        """The error as DESIGN.md's error shape."""
        error: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


# -- the caller's fault: nothing was changed -------------------------------------


class ValidationFailed(SchedulerError, code="invalid_request", status_hint=400):
    """A request (or part of one) is malformed; ``field`` names the part."""


class PayloadTooLarge(ValidationFailed, code="payload_too_large", status_hint=413):
    """A payload or a whole body over its limit."""


class BodyTooSlow(ValidationFailed, code="request_timeout", status_hint=408):
    """The body did not arrive within the time a body may take."""


class Unauthorized(SchedulerError, code="unauthorized", status_hint=401):
    """No API key, or an unknown or revoked one."""


class Forbidden(SchedulerError, code="forbidden", status_hint=403):
    """The key may not act for that tenant, or the route needs an admin's key."""


class ScheduleNotFound(SchedulerError, LookupError, code="not_found", status_hint=404):
    """No such schedule in the caller's tenant (another tenant's is not found either)."""


class ScheduleConflict(SchedulerError, code="conflict", status_hint=409):
    """The request contradicts what is stored (the same id with another body)
    or the state its target is in."""


class NotCancellable(SchedulerError, code="not_cancellable", status_hint=409):
    """Delivered, failed, or in flight: too late to cancel (``retry_after`` set
    when waiting can help: an occurrence of a recurring schedule in flight)."""


class InvalidState(ScheduleConflict, code="invalid_state", status_hint=409):
    """The verb does not apply to the status the schedule is in (resume a
    DELIVERED one, redrive one that has not failed)."""


class ScheduleInFlight(InvalidState, code="in_flight", status_hint=409, retriable=True):
    """An owner holds it IN_FLIGHT right now; a moment later it is PENDING
    again (a recurring schedule, a retry) or final."""


class VersionMismatch(SchedulerError, code="version_mismatch", status_hint=412):
    """If-Match named a version the schedule is no longer at."""


class TopicNotAllowed(SchedulerError, code="topic_not_allowed", status_hint=403):
    """The topic is outside the tenant's allowed prefixes."""


class UnknownTopic(SchedulerError, code="unknown_topic", status_hint=422):
    """The broker answered that the topic does not exist, and it does not
    create topics on first use: the schedule could never be delivered."""


class RateLimited(SchedulerError, code="rate_limited", status_hint=429, retriable=True):
    """Over the tenant's rate; ``retry_after`` says when a token is due."""


class QuotaExceeded(SchedulerError, code="quota_exceeded", status_hint=429, retriable=True):
    """The tenant has its maximum of PENDING schedules."""


# -- the environment's fault ------------------------------------------------------


class StoreUnavailable(SchedulerError, code="store_unavailable", status_hint=503, retriable=True):
    """MongoDB did not answer (or refused for a reason of its own): the
    operation's outcome is unknown. Retriable: the store comes back."""

    def __str__(self) -> str:
        # The caller sees the message; logs see the driver's error too.
        cause = self.__cause__
        return f"{self.message} ({type(cause).__name__}: {cause})" if cause else self.message


class ReadTimedOut(SchedulerError, code="read_timeout", status_hint=503, retriable=True):
    """A read of many schedules took longer than READ_TIMEOUT and was stopped
    (by the server, maxTimeMS): nothing changed; narrow it, or retry."""


class StoreBusy(SchedulerError, code="store_busy", status_hint=503, retriable=True):
    """The store is answering too slowly to take more now: writes already
    waiting fill the queue. Nothing was written; retry after the hint."""


class NodeBusy(SchedulerError, code="busy", status_hint=503, retriable=True):
    """This node is taking in as many large bodies as it allows at once (its
    memory is bounded by them); another node, or this one a moment later, will."""


class ChangesUnsupported(SchedulerError, code="changes_unsupported"):
    """The store offers no change stream (a standalone mongod: change streams
    need a replica set or a sharded cluster). Not retriable: the owners poll
    their buckets instead (``node/delivery/due_feed.py``)."""


class BrokerUnavailable(SchedulerError, code="broker_unavailable", retriable=True):
    """Kafka could not be reached."""


# -- refusing to start ------------------------------------------------------------


class CannotStart(SchedulerError, code="cannot_start"):
    """The node must not run as configured; the message says what to change."""


class BucketCountMismatch(CannotStart, code="bucket_count_mismatch"):
    """The database was created with another bucket count; refusing to start."""


class FormatTooNew(CannotStart, code="format_too_new"):
    """The database was written by a newer release; refusing to start."""


class IdempotenceRefused(CannotStart, code="idempotence_refused"):
    """KAFKA_IDEMPOTENCE=on, and the broker refused an idempotent producer."""


class TenantError(SchedulerError, code="tenant_error"):
    """A tenant command cannot be carried out; the message says why."""
