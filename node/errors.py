"""The node's error hierarchy. Errors carry behaviour (is it the caller's
fault, is it worth retrying), in the spirit of aiokafka's ``retriable``.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error the node raises on purpose."""

    retriable = False


class ApiError(SchedulerError):
    """The caller's request cannot be served; rendered as the DESIGN.md error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        # HTTP headers the answer carries (Retry-After on a 429, WWW-Authenticate on a 401).
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        error: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


class ValidationFailed(ApiError):
    def __init__(self, message: str, field: str | None = None, *, status: int = 400) -> None:
        code = "payload_too_large" if status == 413 else "invalid_request"
        super().__init__(status, code, message, field)


class BucketCountMismatch(SchedulerError):
    """The database was created with another bucket count; refusing to start."""
