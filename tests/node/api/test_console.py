"""The operator console every node serves at /, against a real node on the
embedded store and broker: its files and their headers, then the page in a
real headless browser (Debian's Chromium, driven by Playwright): find a
schedule by label, open it, pause it, meet a stale version's 412, change it,
bulk-pause by label after a dry run; a delivered one's history, a large
payload shown in part, a cancel; stored text never runs as script; with
auth on, the key goes as a Bearer token and a tenant that is not an admin
sees no cluster view. The three-node cluster view is tests/node/api/test_cluster_page.py's.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, Request, async_playwright, expect

from node.api.cluster import CONTENT_SECURITY_POLICY
from node.store.tenants import TenantStore
from node.tenants.model import Tenant
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, unique, wait_until
from tests.helpers import ROOT

STATIC = ROOT / "node" / "api" / "static"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium on this machine: `make test` installs the distribution's "
    "package (apt-get install chromium) where it runs as root with apt",
)
WAIT_MS = 30_000  # a hang guard, far above what a healthy run needs
expect.set_options(timeout=WAIT_MS)
FAR = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
PREVIEW_CHARS = 2000  # console.js: the payload a schedule's page shows
# Stored text that would run if it ever reached the page as HTML.
SCRIPT = "<script>window.__pwned=1</script>"
IMAGE = "<img src=x onerror=window.__pwned=1>"


def schedule(topic: str, schedule_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": schedule_id, "topic": topic, "executeAt": FAR, "payload": {"n": 1}, **fields}


async def status_of(node: NodeHandle, schedule_id: str) -> tuple[str, int]:
    status, body = await node.request("GET", f"/v1/schedules/{schedule_id}")
    assert status == 200, body
    return body["status"], body["version"]


class Watched:
    """A page, with what went wrong on it: script errors, and every console
    error (a Content-Security-Policy violation is reported there)."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[Request] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)
        page.on("request", lambda request: self.requests.append(request))

    def _console(self, message: ConsoleMessage) -> None:
        # A refused call (401, 403, 412) is logged by the browser as a failed
        # resource load: an answer, not a fault of the page.
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.errors.append(message.text)

    async def pwned(self) -> bool:
        return bool(await self.page.evaluate("window.__pwned !== undefined"))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert CHROMIUM is not None
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            await launched.close()


# -- the files ------------------------------------------------------------------


def test_the_console_has_no_inline_script_or_style_and_never_writes_html() -> None:
    html = (STATIC / "console.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/console.js" defer>']
    assert "<style" not in html and " style=" not in html
    assert re.search(r"\son[a-z]+\s*=", html) is None  # no inline event handler
    script = (STATIC / "console.js").read_text()
    for writer in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert writer not in script, writer


async def test_the_files_carry_a_strict_policy_and_no_other_path_serves_a_file(
    start_node: NodeFactory,
) -> None:
    node = await start_node(auth="on")  # the console's files need no key
    for path, content_type in (
        ("/", "text/html"),
        ("/console.js", "text/javascript"),
        ("/console.css", "text/css"),
    ):
        async with node.session.get(node.url + path) as response:
            assert response.status == 200, path
            assert response.content_type == content_type, path
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Referrer-Policy"] == "no-referrer"
    policy = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    # A fixed list of files, not a directory: nothing else answers.
    for path in (
        "/console.html",
        "/static/console.js",
        "/cluster.html",
        "/console.js/",
        "/%2e%2e/cluster.py",
        "/..%2fcluster.py",
    ):
        async with node.session.get(node.url + path) as response:
            assert response.status in {401, 404}, path
            assert "Content-Security-Policy" not in response.headers, path


# -- in the browser, auth off -----------------------------------------------------


@needs_chromium
async def test_find_open_pause_a_stale_version_and_a_bulk_pause(
    start_node: NodeFactory, browser: Browser
) -> None:
    node = await start_node()
    topic = unique("console")
    for schedule_id, extra in (
        ("invoice-1", {}),
        ("invoice-2", {}),
        ("other-1", {"labels": {"team": "search"}}),
        (
            "hostile-1",
            {
                "labels": {"team": "billing", "note": SCRIPT, "img": IMAGE},
                "key": IMAGE,
                "payload": {"html": IMAGE, "script": SCRIPT},
            },
        ),
    ):
        body = schedule(topic, schedule_id, **{"labels": {"team": "billing"}, **extra})
        status, answer = await node.request("POST", "/v1/schedules", json=body)
        assert status == 201, answer

    watched = Watched(await browser.new_page())
    page = watched.page
    await page.goto(node.url + "/")
    # Find by label: the three of team billing, counted by status.
    await page.fill("#filters [name=label]", "team=billing")
    await page.click("#search")
    await expect(page.locator("#rows tr")).to_have_count(3)
    await expect(page.locator("#counts")).to_have_text("Matches by status: PENDING 3")
    # The hostile labels are text, not markup, and nothing they hold ran.
    hostile = page.locator("#rows tr[data-id='hostile-1'] .label")
    for text in (f"img={IMAGE}", f"note={SCRIPT}", "team=billing"):
        await expect(hostile.filter(has_text=text)).to_have_count(1)
    assert await page.locator("main img, main script").count() == 0
    assert not await watched.pwned()

    # Open one, and pause it: the API has it PAUSED.
    await page.click("#rows a:text-is('invoice-1')")
    _, version = await status_of(node, "invoice-1")
    await expect(page.locator("#s-status")).to_have_text("PENDING")
    await expect(page.locator("#s-version")).to_have_text(str(version))
    await expect(page.locator("#s-payload")).to_contain_text('"n": 1')
    await page.click("#s-actions [data-verb=pause]")
    await expect(page.locator("#s-status")).to_have_text("PAUSED")
    await expect(page.locator("#s-message")).to_contain_text("Paused")
    status, paused_version = await status_of(node, "invoice-1")
    assert status == "PAUSED" and paused_version > version
    await expect(page.locator("#s-version")).to_have_text(str(paused_version))

    # Changed behind the page's back: its resume names the version it shows,
    # gets a 412, says so, and shows the schedule as it now is.
    status, _ = await node.request("PATCH", "/v1/schedules/invoice-1", json={"payload": {"n": 2}})
    assert status == 200
    await page.click("#s-actions [data-verb=resume]")
    message = page.locator("#s-message")
    await expect(message).to_contain_text(
        f"changed since this page showed version {paused_version}"
    )
    status, now_version = await status_of(node, "invoice-1")
    assert status == "PAUSED" and now_version == paused_version + 1  # the resume changed nothing
    await expect(page.locator("#s-version")).to_have_text(str(now_version))
    await expect(page.locator("#s-payload")).to_contain_text('"n": 2')
    # At the version shown now, the same button works.
    await page.click("#s-actions [data-verb=resume]")
    await expect(page.locator("#s-status")).to_have_text("PENDING")
    assert (await status_of(node, "invoice-1"))[0] == "PENDING"

    # A PATCH of the payload from the page's form.
    await page.fill("#s-edit [name=payload]", '{"n": 3, "note": "from the console"}')
    await page.click("#s-save")
    await expect(page.locator("#s-message")).to_contain_text("Changed")
    _, body = await node.request("GET", "/v1/schedules/invoice-1")
    assert body["payload"] == {"n": 3, "note": "from the console"}

    # The hostile one's page: its labels, key and payload shown as text.
    await page.goto(node.url + "/#/schedule/default/hostile-1")
    await expect(page.locator("#s-id")).to_have_text("hostile-1")
    await expect(page.locator("#s-field-rows [data-field=key] td")).to_have_text(IMAGE)
    await expect(page.locator("#s-field-rows [data-field=labels] td")).to_contain_text(SCRIPT)
    await expect(page.locator("#s-payload")).to_contain_text(SCRIPT)
    await expect(page.locator("#s-payload")).to_contain_text(IMAGE)
    assert await page.locator("main img, main script").count() == 0
    assert not await watched.pwned()

    # Bulk: a dry run counts, changes nothing, and asks; then the pause.
    await page.click("#tab-schedules")
    await page.select_option("#bulk-verb", "pause")
    await page.click("#bulk-count")
    await expect(page.locator("#bulk-result")).to_have_text(
        "3 schedules match and would be changed by pause."
    )
    statuses = [(await status_of(node, s))[0] for s in ("invoice-1", "invoice-2", "hostile-1")]
    assert statuses == ["PENDING"] * 3
    await expect(page.locator("#bulk-confirm")).to_have_text("Yes, pause 3 schedules")
    await page.click("#bulk-confirm")
    await expect(page.locator("#bulk-result")).to_have_text("pause: 3 matched, 3 changed.")
    statuses = [(await status_of(node, s))[0] for s in ("invoice-1", "invoice-2", "hostile-1")]
    assert statuses == ["PAUSED"] * 3
    assert (await status_of(node, "other-1"))[0] == "PENDING"  # another label: untouched
    # The page lists them again (the counts are kept 10 s on a node: not them).
    await expect(page.locator("#rows tr .status")).to_have_text(["PAUSED"] * 3)

    assert not await watched.pwned()
    assert watched.errors == []


@needs_chromium
async def test_a_page_shows_the_history_a_bounded_payload_and_cancels(
    start_node: NodeFactory, browser: Browser
) -> None:
    node = await start_node()
    topic = unique("console")
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    due_now = {"id": "due-1", "topic": topic, "executeAt": now, "payload": {"n": 1}}
    payload = {"text": "x" * (3 * PREVIEW_CHARS)}
    big = schedule(topic, "big-1", payload=payload)
    for body in (due_now, big):
        status, answer = await node.request("POST", "/v1/schedules", json=body)
        assert status == 201, answer

    async def delivered() -> bool:
        return (await status_of(node, "due-1"))[0] == "DELIVERED"

    await wait_until(delivered, what="due-1 delivered")
    watched = Watched(await browser.new_page())
    page = watched.page
    # A delivered one: its history, and no verb it cannot take.
    await page.goto(node.url + "/#/schedule/default/due-1")
    await expect(page.locator("#s-status")).to_have_text("DELIVERED")
    await expect(page.locator("#s-history tr")).to_have_count(1)
    await expect(page.locator("#s-history tr td").nth(3)).to_have_text("delivered")
    for verb in ("pause", "resume", "trigger", "retry", "cancel"):
        await expect(page.locator(f"#s-actions [data-verb={verb}]")).to_be_disabled()
    await expect(page.locator("#s-edit")).to_be_hidden()

    # A large payload: the first PREVIEW_CHARS characters, and its size.
    await page.goto(node.url + "/#/schedule/default/big-1")
    await expect(page.locator("#s-payload-size")).to_have_text(
        f"{len(json.dumps(payload, separators=(',', ':')))} bytes of JSON; "
        f"the first {PREVIEW_CHARS} characters shown"
    )
    shown = await page.locator("#s-payload").text_content() or ""
    assert len(shown) <= PREVIEW_CHARS + 2 and shown.endswith("…")
    await expect(page.locator("#s-edit [name=payload]")).to_be_disabled()
    await expect(page.locator("#s-history")).to_contain_text("No delivery attempt yet.")

    await page.click("#s-actions [data-verb=cancel]")
    await expect(page.locator("#s-status")).to_have_text("CANCELLED")
    assert (await status_of(node, "big-1"))[0] == "CANCELLED"
    assert watched.errors == []


FILTER_INPUTS = ("label", "key", "topic", "host", "dueAfter", "dueBefore", "tenant")


async def search(page: Page, **given: str) -> None:
    """Fill the browser's filters (the others emptied) and search."""
    for name in FILTER_INPUTS:
        await page.fill(f"#filters [name={name}]", given.get(name, ""))
    for name in ("status", "destination"):
        await page.select_option(f"#filters [name={name}]", given.get(name, ""))
    await page.click("#search")


def local(moment: datetime) -> str:
    """A time as a datetime-local input takes it (the page's zone is UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


@needs_chromium
async def test_the_filters_are_the_listings(start_node: NodeFactory, browser: Browser) -> None:
    node = await start_node()
    first, second = unique("console"), unique("console")
    now = datetime.now(UTC)
    for schedule_id, topic, key, hours in (
        ("a-1", first, "k-1", 1),
        ("a-2", second, "k-2", 3),
        ("a-3", first, "k-3", 5),
    ):
        at = (now + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")
        body = schedule(topic, schedule_id, key=key, executeAt=at)
        status, answer = await node.request("POST", "/v1/schedules", json=body)
        assert status == 201, answer
    status, _ = await node.request("POST", "/v1/schedules/a-3:pause")
    assert status == 200

    watched = Watched(await browser.new_page(timezone_id="UTC"))
    page = watched.page
    await page.goto(node.url + "/")
    await expect(page.locator("#rows tr")).to_have_count(3)
    rows = page.locator("#rows tr")
    await search(page, status="PAUSED")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-id", "a-3")
    await search(page, key="k-2")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-id", "a-2")
    await search(page, topic=first)
    await expect(rows).to_have_count(2)
    await expect(page.locator("#counts")).to_have_text("Matches by status: PENDING 1 · PAUSED 1")
    await search(
        page, dueAfter=local(now + timedelta(hours=2)), dueBefore=local(now + timedelta(hours=4))
    )
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-id", "a-2")
    await search(page, topic=first, destination="http")
    await expect(rows).to_have_count(0)
    await expect(page.locator("#empty")).to_be_visible()
    assert watched.errors == []


# -- in the browser, auth on ------------------------------------------------------


@pytest.fixture
async def tenants(servers: EmbeddedServers, database_name: str) -> AsyncIterator[TenantStore]:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(servers.mongo_uri, tz_aware=True)
    store = TenantStore(client[database_name])
    await store.prepare()
    yield store
    await client.close()


@needs_chromium
async def test_with_auth_the_key_goes_as_bearer_and_only_an_admin_sees_the_cluster(
    start_node: NodeFactory, tenants: TenantStore, browser: Browser
) -> None:
    now = datetime.now(UTC)
    billing = await tenants.add(Tenant(name="billing"), now)
    operator = await tenants.add(Tenant(name="ops", admin=True), now)
    node = await start_node(auth="on")
    topic = unique("console")
    status, answer = await node.request(
        "POST",
        "/v1/schedules",
        json=schedule(topic, "invoice-9", labels={"team": "billing"}),
        headers={"Authorization": f"Bearer {billing}"},
    )
    assert status == 201, answer

    watched = Watched(await browser.new_page())
    page = watched.page
    await page.goto(node.url + "/")
    await expect(page.locator("#notice")).to_contain_text("enter an API key")
    await expect(page.locator("#tab-cluster")).to_be_hidden()

    # A tenant's key: its schedules, no cluster view.
    keyed_from = len(watched.requests)
    await page.fill("#key-input", billing)
    await page.click("#key-form button[type=submit]")
    await expect(page.locator("#rows tr[data-id='invoice-9']")).to_have_count(1)
    await expect(page.locator("#key-state")).to_contain_text(billing[-4:])
    assert await page.evaluate("sessionStorage.getItem('scheduler-key')") == billing
    await expect(page.locator("#tab-cluster")).to_be_hidden()
    await page.goto(node.url + "/#/cluster")
    await expect(page.locator("#notice")).to_contain_text("needs an admin tenant's API key")
    await expect(page.locator("#view-cluster")).to_be_hidden()
    await expect(page.locator("#drain")).to_be_hidden()
    await expect(page.locator("#members tr")).to_have_count(0)
    await expect(page.locator("#view-schedules")).to_be_visible()
    await page.click("#rows a:text-is('invoice-9')")
    await page.click("#s-actions [data-verb=pause]")
    await expect(page.locator("#s-status")).to_have_text("PAUSED")
    calls = [r for r in watched.requests[keyed_from:] if "/v1/" in r.url]
    assert {r.method for r in calls} >= {"GET", "POST"}
    for call in calls:
        headers = await call.all_headers()
        assert headers.get("authorization") == f"Bearer {billing}", call.url
        assert "cookie" not in headers, call.url

    # An admin tenant's key: the cluster view, with the drain.
    await page.click("#key-forget")
    await page.fill("#key-input", operator)
    await page.click("#key-form button[type=submit]")
    await expect(page.locator("#tab-cluster")).to_be_visible()
    await page.click("#tab-cluster")
    await expect(page.locator("#members tr[data-state=alive]")).to_have_count(1)
    await expect(page.locator("#drain")).to_be_visible()
    assert watched.errors == []
