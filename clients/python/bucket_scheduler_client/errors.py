"""The client's errors: one class per error code the API answers, in the
server's own hierarchy (``node/errors.py``), each saying whether trying
again can help (``retriable``).

Every refusal is an :class:`ApiError` carrying the status, the code, the
message, the field at fault and the ``Retry-After`` hint; a call that got no
answer at all is a :class:`TransportError`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ClientError(Exception):
    """Base of everything this package raises on purpose."""


class TransportError(ClientError):
    """No answer: the node could not be reached, or the connection broke.
    The outcome of a write is unknown (a create may be sent again: its id
    makes it idempotent)."""


class ApiError(ClientError):
    """The node answered with an error: ``{"error": {"code", "message", "field"}}``."""

    # The code this class stands for ("" for this base alone).
    code: ClassVar[str] = ""
    retriable: ClassVar[bool] = False

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # The code as answered (a subclass's own, or one this client does not know yet).
        self.error_code = code or type(self).code or HttpError.code
        self.field = field
        self.retry_after = retry_after
        self.request_id = request_id
        self.body = body

    def __str__(self) -> str:
        field = f" (field {self.field})" if self.field else ""
        return f"HTTP {self.status} {self.error_code}: {self.message}{field}"


# -- the caller's fault: nothing was changed -------------------------------------


class InvalidRequest(ApiError):
    code = "invalid_request"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"


class RequestTimeout(InvalidRequest):
    code = "request_timeout"


class Unauthorized(ApiError):
    code = "unauthorized"


class Forbidden(ApiError):
    code = "forbidden"


class TopicNotAllowed(ApiError):
    code = "topic_not_allowed"


class NotFound(ApiError, LookupError):
    code = "not_found"


class MethodNotAllowed(ApiError):
    code = "method_not_allowed"


class Conflict(ApiError):
    code = "conflict"


class NotCancellable(ApiError):
    code = "not_cancellable"


class InvalidState(Conflict):
    code = "invalid_state"


class InFlight(InvalidState):
    """An owner is publishing the schedule right now; ``retry_after`` says when to try again."""

    code = "in_flight"
    retriable = True


class VersionMismatch(ApiError):
    """If-Match named a version the schedule is no longer at: read it again."""

    code = "version_mismatch"


class UnknownTopic(ApiError):
    code = "unknown_topic"


class RateLimited(ApiError):
    code = "rate_limited"
    retriable = True


class QuotaExceeded(ApiError):
    code = "quota_exceeded"
    retriable = True


# -- the node's or its environment's fault ----------------------------------------


class StoreUnavailable(ApiError):
    code = "store_unavailable"
    retriable = True


class StoreBusy(ApiError):
    code = "store_busy"
    retriable = True


class Busy(ApiError):
    code = "busy"
    retriable = True


class ReadTimeout(ApiError):
    code = "read_timeout"
    retriable = True


class Internal(ApiError):
    code = "internal"


class HttpError(ApiError):
    """Any other refusal by the HTTP server itself."""

    code = "http_error"


def _codes(root: type[ApiError]) -> dict[str, type[ApiError]]:
    found = {root.code: root} if root.code else {}
    for sub in root.__subclasses__():
        found.update(_codes(sub))
    return found


# Every error code the client knows, and its class: derived from the
# hierarchy (as aiokafka builds its table), not a list kept by hand.
ERRORS: dict[str, type[ApiError]] = _codes(ApiError)


def error_for(
    status: int,
    body: Any,
    *,
    retry_after: float | None = None,
    request_id: str | None = None,
) -> ApiError:
    """The error an answer of ``status`` with ``body`` stands for."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message")
    field = error.get("field")
    cls = ERRORS.get(code or "", HttpError)
    return cls(
        status,
        message if isinstance(message, str) else f"HTTP {status}",
        code=code or "http_error",
        field=field if isinstance(field, str) else None,
        retry_after=retry_after,
        request_id=request_id,
        body=body,
    )
