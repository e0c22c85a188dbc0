"""``AsyncClient``: the API over httpx, awaited: ``Client``'s methods, each a coroutine
(``list`` and ``pages`` async iterators)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Unpack

import httpx

from bucket_scheduler_client import _core
from bucket_scheduler_client._core import (
    CONSOLE_FILES,
    OF_SCHEDULE,
    Call,
    IfMatch,
    ListFilters,
    NewSchedule,
    Retry,
    SchedulePatch,
    Selector,
    Version,
)
from bucket_scheduler_client.errors import ApiError, ClientError, TransportError
from bucket_scheduler_client.models import (
    BatchResult,
    BulkResult,
    Health,
    History,
    Page,
    Schedule,
    decode,
)

# Called before each wait for another try: (the try that failed, counted
# from 1; the seconds about to be waited; what went wrong).
OnRetry = Callable[[int, float, ClientError], None]


class AsyncClient:
    """A node's API, awaited: as ``Client``.

    ``api_key``: a tenant's key when the node has auth on. ``tenant``: with
    auth off, the tenant whose schedules the calls name (default: the
    node's default tenant). ``retry``: when a call is sent again
    (``Retry``; ``Retry(attempts=1)`` never). ``on_retry``: told of each
    retry before its wait."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        tenant: str | None = None,
        timeout: float = 10.0,
        retry: Retry | None = None,
        on_retry: OnRetry | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.tenant = tenant
        self.retry_policy = Retry() if retry is None else retry
        self.on_retry = on_retry
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={**_core.auth_headers(api_key), **(headers or {})},
            timeout=timeout,
            transport=transport,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending ----------------------------------------------------------------------

    async def _send(self, call: Call, idempotent: bool) -> httpx.Response:
        """The answer, sent again as ``retry`` allows; a refusal raised."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=tuple(call.query),
                    content=call.payload(),
                    headers={
                        **({"Content-Type": "application/json"} if call.body is not None else {}),
                        **call.headers,
                    },
                )
            except httpx.TransportError as exc:
                error: ClientError = TransportError(f"no answer from {self.url}: {exc!r}")
                sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                wait = None if sent and not idempotent else self.retry_policy.delay(attempt, None)
                if wait is None:
                    raise error from exc
            else:
                if response.is_success:
                    return response
                error = _core.refusal(response.status_code, response.headers, response.content)
                assert isinstance(error, ApiError)
                wait = self.retry_policy.wait_after(attempt, error)
                if wait is None:
                    raise error
            if self.on_retry is not None:
                self.on_retry(attempt, wait, error)
            await asyncio.sleep(wait)

    async def _json(self, call: Call, idempotent: bool = True) -> Any:
        return _core.json_of((await self._send(call, idempotent)).content)

    async def _schedule(self, call: Call, idempotent: bool = True) -> Schedule:
        response = await self._send(call, idempotent)
        return _core.schedule_of(response.headers, _core.json_of(response.content))

    def _one(self, method: str, schedule: Schedule | str, suffix: str = "", **more: Any) -> Call:
        return Call(
            method,
            _core.schedule_path(schedule, suffix),
            query=_core.tenant_query(self.tenant),
            **more,
        )

    # -- schedules --------------------------------------------------------------------

    async def create(self, **fields: Unpack[NewSchedule]) -> Schedule:
        """Schedule a message; an id is made for it unless given, so a
        create sent again (a retry) is the same create. The 201 (or the
        200 of the same id and body again) with its ETag."""
        body = _core.create_body(fields)
        return await self._schedule(Call("POST", "/v1/schedules", body=body))

    async def create_batch(self, items: Sequence[NewSchedule]) -> BatchResult:
        """Up to 1,000 creates in one call, each answered on its own."""
        body = _core.batch_body(items)
        return decode(BatchResult, await self._json(Call("POST", "/v1/schedules:batch", body=body)))

    async def get(self, schedule: Schedule | str) -> Schedule:
        return await self._schedule(self._one("GET", schedule))

    async def patch(
        self,
        schedule: Schedule | str,
        *,
        if_match: IfMatch | Version = OF_SCHEDULE,
        **fields: Unpack[SchedulePatch],
    ) -> Schedule:
        """Change the fields given. Given a ``Schedule``, only if it is
        still at that version (If-Match; a 412 ``VersionMismatch`` if not);
        ``if_match=None`` changes it whatever its version."""
        headers = _core.if_match_header(_core.patch_if_match(schedule, if_match))
        call = self._one("PATCH", schedule, body=_core.patch_body(fields), headers=headers)
        return await self._schedule(call, idempotent=False)

    async def cancel(self, schedule: Schedule | str, *, if_match: IfMatch = None) -> Schedule:
        """Cancel a PENDING or PAUSED schedule (a cancelled one again: 200)."""
        headers = _core.if_match_header(if_match)
        return await self._schedule(self._one("DELETE", schedule, headers=headers))

    async def _verb(self, verb: str, schedule: Schedule | str, if_match: IfMatch) -> Schedule:
        headers = _core.if_match_header(if_match)
        # Sent again after a broken connection only where a repeat changes
        # nothing: a second redrive of a redriven schedule would be a 409.
        idempotent = verb in ("pause", "resume")
        return await self._schedule(
            self._one("POST", schedule, f":{verb}", headers=headers), idempotent
        )

    async def pause(self, schedule: Schedule | str, *, if_match: IfMatch = None) -> Schedule:
        """PENDING -> PAUSED: never due until resumed."""
        return await self._verb("pause", schedule, if_match)

    async def resume(self, schedule: Schedule | str, *, if_match: IfMatch = None) -> Schedule:
        """PAUSED -> PENDING (or EXPIRED, past its deadline)."""
        return await self._verb("resume", schedule, if_match)

    async def trigger(self, schedule: Schedule | str, *, if_match: IfMatch = None) -> Schedule:
        """A PENDING schedule is due now."""
        return await self._verb("trigger", schedule, if_match)

    async def retry(self, schedule: Schedule | str, *, if_match: IfMatch = None) -> Schedule:
        """Redrive a DELIVERY_FAILED schedule: PENDING, due now, attempts 0."""
        return await self._verb("retry", schedule, if_match)

    async def history(self, schedule: Schedule | str, *, limit: int | None = None) -> History:
        query = [("limit", str(limit))] if limit is not None else []
        call = self._one("GET", schedule, "/history")
        return decode(History, await self._json(Call("GET", call.path, query=call.query + query)))

    async def list_page(
        self,
        *,
        limit: int | None = None,
        after: str | None = None,
        counts: bool = False,
        **filters: Unpack[ListFilters],
    ) -> Page:
        """One page of the schedules matching every filter; ``limit`` per page."""
        call = _core.list_call(self.tenant, filters, limit, after, counts)
        return decode(Page, await self._json(call))

    async def pages(
        self, *, limit: int | None = None, after: str | None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Page]:
        """Every page, fetched as it is reached."""
        while True:
            page = await self.list_page(limit=limit, after=after, **filters)
            yield page
            if page.next is None:
                return
            after = page.next

    async def list(
        self, *, limit: int | None = None, after: str | None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Schedule]:
        """Every schedule matching the filters, page after page (``limit``
        a page), lazily."""
        async for page in self.pages(limit=limit, after=after, **filters):
            for schedule in page.schedules:
                yield schedule

    async def bulk(
        self, verb: str, *, dry_run: bool = False, **selector: Unpack[Selector]
    ) -> BulkResult:
        """One call of cancel, pause, resume or retry by selector: call
        again while the answer says ``more``."""
        return decode(BulkResult, await self._json(_core.bulk_call(verb, selector, dry_run)))

    # -- the cluster and the node -----------------------------------------------------

    async def cluster(self) -> dict[str, Any]:
        return dict(await self._json(Call("GET", "/v1/cluster")))

    async def backlog(self) -> dict[str, Any]:
        return dict(await self._json(Call("GET", "/v1/cluster/backlog")))

    async def counts(self) -> dict[str, Any]:
        return dict(await self._json(Call("GET", "/v1/cluster/counts")))

    async def drain(self) -> dict[str, Any]:
        """This node hands every lease over and leaves the cluster (admin)."""
        return dict(await self._json(Call("POST", "/v1/admin/drain"), idempotent=False))

    async def partition(self, blocked: Sequence[str]) -> dict[str, Any]:
        """Chaos testing only: drop gossip to these peers."""
        body = {"blocked": builtins.list(blocked)}
        return dict(await self._json(Call("PUT", "/v1/chaos/partition", body=body)))

    async def wake(
        self,
        bucket: int,
        due_at: datetime | str,
        *,
        sender: str | None = None,
        cluster_key: bytes | None = None,
    ) -> bool:
        """Between nodes: a schedule in one of the node's buckets falls due soon."""
        call = _core.wake_call(bucket, due_at, sender, datetime.now(UTC), cluster_key)
        return bool((await self._json(call)).get("woken"))

    async def openapi(self) -> dict[str, Any]:
        return dict(await self._json(Call("GET", "/v1/openapi.json")))

    async def console(self) -> str:
        """The operator console's page (HTML)."""
        return (await self._send(Call("GET", "/"), True)).text

    async def console_file(self, name: str) -> str:
        """One of the console's files: ``console.js`` or ``console.css``."""
        if name not in CONSOLE_FILES:
            raise ValueError(f"name must be one of {', '.join(CONSOLE_FILES)}")
        return (await self._send(Call("GET", f"/{name}"), True)).text

    async def metrics(self) -> str:
        return (await self._send(Call("GET", "/metrics"), True)).text

    async def _health(self, path: str) -> Health:
        try:
            response = await self._http.get(path)
        except httpx.TransportError as exc:
            raise TransportError(f"no answer from {self.url}: {exc!r}") from exc
        body = _core.json_of(response.content)
        return Health(response.status_code == 200, response.status_code, body or {})

    async def healthz(self) -> Health:
        return await self._health("/healthz")

    async def readyz(self) -> Health:
        return await self._health("/readyz")
