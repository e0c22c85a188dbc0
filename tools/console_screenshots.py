"""Take the console's screenshots for docs/console.md.

``python tools/console_screenshots.py [--out docs/images]``: starts the
embedded store and broker and two nodes (``chaos.lab.cluster.LocalCluster``,
auth off), stores a few example schedules, then drives the distribution's
Chromium (Playwright) through the console and writes one PNG per view:
the schedule browser, a schedule's page, a stale version's 412 (the top of
the page), a bulk verb's dry run (that part of the page) and the cluster
view. Everything it started is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.sync_api import FloatRect, Page, ViewportSize, expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.lab.cluster import LocalCluster  # noqa: E402

VIEWPORT: ViewportSize = {"width": 1180, "height": 760}
SETTLE_WITHIN = 90.0  # seconds: a hang guard for the two nodes' placement


def call(url: str, method: str = "GET", body: Any = None, **headers: str) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def at(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat(timespec="seconds").replace("+00:00", "Z")


def example_schedules(url: str) -> None:
    """Schedules of two teams in several states, one with a label and a
    payload that hold markup (the console shows them as text)."""
    hour = timedelta(hours=1)
    for n in range(1, 7):
        call(
            url + "/v1/schedules",
            "POST",
            {
                "id": f"invoice-{n}:reminder",
                "topic": "billing.reminders",
                "executeAt": at(n * hour),
                "key": f"customer-{100 + n}",
                "labels": {"team": "billing", "campaign": "november"},
                "payload": {"invoice": n, "customer": 100 + n, "action": "remind"},
            },
        )
    call(
        url + "/v1/schedules",
        "POST",
        {
            "id": "invoice-7:reminder",
            "topic": "billing.reminders",
            "executeAt": at(-timedelta(seconds=1)),
            "labels": {"team": "billing"},
            "payload": {"invoice": 7},
        },
    )
    call(
        url + "/v1/schedules",
        "POST",
        {
            "id": "digest:weekly",
            "topic": "search.digests",
            "recurrence": {"cron": "0 9 * * MON", "timeZone": "Europe/Berlin"},
            "labels": {"team": "search"},
            "payload": {"digest": "weekly"},
        },
    )
    call(
        url + "/v1/schedules",
        "POST",
        {
            "id": "note-1",
            "topic": "billing.reminders",
            "executeAt": at(3 * hour),
            "labels": {"team": "billing", "note": "<script>alert(1)</script>"},
            "payload": {"html": "<img src=x onerror=alert(1)>"},
        },
    )
    call(url + "/v1/schedules/invoice-3:reminder:pause", "POST")
    call(url + "/v1/schedules/invoice-6:reminder", "DELETE")


def wait_settled(cluster: LocalCluster) -> None:
    deadline = time.monotonic() + SETTLE_WITHIN
    while not cluster.settled():
        if time.monotonic() > deadline:
            raise RuntimeError("the nodes did not settle:\n" + cluster.describe())
        time.sleep(0.2)


def shoot(page: Page, base: str, out: Path) -> list[Path]:
    written = []

    def save(name: str, part: str | None = None, height: int | None = None) -> None:
        """The viewport, one element of the page (``part``), or the top
        ``height`` pixels: a few hundred KB for all of them."""
        path = out / f"console-{name}.png"
        if part is not None:
            page.locator(part).screenshot(path=str(path))
        elif height is not None:
            clip: FloatRect = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height}
            page.screenshot(path=str(path), clip=clip)
        else:
            page.screenshot(path=str(path))
        written.append(path)

    page.goto(base + "/")
    page.fill("#filters [name=label]", "team=billing")
    page.click("#search")
    expect(page.locator("#rows tr")).to_have_count(8)
    expect(page.locator("#counts")).to_contain_text("PENDING")
    save("schedules")

    page.click("#rows a:text-is('invoice-2:reminder')")
    expect(page.locator("#s-status")).to_have_text("PENDING")
    save("schedule")

    # A change behind the page's back, then a pause from the page: the 412.
    call(base + "/v1/schedules/invoice-2:reminder", "PATCH", {"payload": {"invoice": 2}})
    page.click("#s-actions [data-verb=pause]")
    expect(page.locator("#s-message")).to_contain_text("changed since this page showed")
    save("stale", height=230)

    page.click("#tab-schedules")
    page.select_option("#bulk-verb", "pause")
    page.click("#bulk-count")
    expect(page.locator("#bulk-confirm")).to_be_visible()
    save("bulk", part="#bulk")

    page.click("#tab-cluster")
    expect(page.locator("#members tr[data-state=alive]")).to_have_count(2)
    expect(page.locator("#status-counts")).to_contain_text("buckets)")
    save("cluster")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no Chromium on this machine (apt-get install chromium)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="console-shots-") as scratch:
        cluster = LocalCluster(Path(scratch))
        try:
            cluster.start_servers()
            for name in ("node-1", "node-2"):
                cluster.start_node(name)
            for name in ("node-1", "node-2"):
                cluster.wait_ready(name)
            wait_settled(cluster)
            base = cluster.nodes["node-1"].url
            example_schedules(base)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=["--no-sandbox"]
                )
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    for path in shoot(page, base, args.out):
                        print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB")
                finally:
                    browser.close()
        finally:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
