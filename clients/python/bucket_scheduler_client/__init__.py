"""A typed client of the bucket scheduler's HTTP API.

    from bucket_scheduler_client import Client
    c = Client("http://127.0.0.1:8080", api_key=None)
    s = c.create(topic="payments", execute_at=when, payload={"order": 42})
    s = c.patch(s, payload={"order": 43})         # If-Match from s.version
    for x in c.list(label="order=42", limit=100): # every page, lazily
        ...

``AsyncClient`` is the same, awaited. Errors mirror the API's codes
(``errors``); 503s and 429s are retried as ``Retry`` says; ``webhooks``
verifies what the scheduler delivers over HTTP.
"""

from bucket_scheduler_client._async import AsyncClient
from bucket_scheduler_client._core import (
    NO_RETRY,
    ROUTES,
    ListFilters,
    NewSchedule,
    Retry,
    SchedulePatch,
    Selector,
)
from bucket_scheduler_client._sync import Client
from bucket_scheduler_client.errors import (
    ERRORS,
    ApiError,
    Busy,
    ClientError,
    Conflict,
    Forbidden,
    HttpError,
    InFlight,
    Internal,
    InvalidRequest,
    InvalidState,
    MethodNotAllowed,
    NotCancellable,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ReadTimeout,
    RequestTimeout,
    StoreBusy,
    StoreUnavailable,
    TopicNotAllowed,
    TransportError,
    Unauthorized,
    UnknownTopic,
    VersionMismatch,
)
from bucket_scheduler_client.models import (
    Attempt,
    BatchItem,
    BatchResult,
    BulkResult,
    FlowControl,
    Health,
    History,
    HttpTarget,
    Occurrence,
    Page,
    Recurrence,
    RetryPolicy,
    Schedule,
)
from bucket_scheduler_client.webhooks import Delivery, Verifier, WebhookVerificationError

__all__ = [
    "ERRORS",
    "NO_RETRY",
    "ROUTES",
    "ApiError",
    "AsyncClient",
    "Attempt",
    "BatchItem",
    "BatchResult",
    "BulkResult",
    "Busy",
    "Client",
    "ClientError",
    "Conflict",
    "Delivery",
    "FlowControl",
    "Forbidden",
    "Health",
    "History",
    "HttpError",
    "HttpTarget",
    "InFlight",
    "Internal",
    "InvalidRequest",
    "InvalidState",
    "ListFilters",
    "MethodNotAllowed",
    "NewSchedule",
    "NotCancellable",
    "NotFound",
    "Occurrence",
    "Page",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "ReadTimeout",
    "Recurrence",
    "RequestTimeout",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "SchedulePatch",
    "Selector",
    "StoreBusy",
    "StoreUnavailable",
    "TopicNotAllowed",
    "TransportError",
    "Unauthorized",
    "UnknownTopic",
    "Verifier",
    "VersionMismatch",
    "WebhookVerificationError",
]
