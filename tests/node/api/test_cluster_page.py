"""The console's cluster view (every node serves the console at /), in a
real headless browser (Debian's Chromium, driven by Playwright) against three
real node processes: it shows the three members and the bucket ownership,
says which figures are this node's, and follows a kill. The rest of the
console is tests/node/api/test_console.py's."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from chaos.lab.cluster import LocalCluster
from chaos.lab.harness import until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.servers,  # three node processes and Chromium
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium on this machine: `make test` installs the distribution's "
        "package (apt-get install chromium) where it runs as root with apt",
    ),
]
WAIT_MS = 60_000  # a hang guard, far above what a healthy run needs


async def test_the_page_shows_three_members_and_follows_a_kill(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start_servers()
        names = ["node-1", "node-2", "node-3"]
        for name in names:
            cluster.start_node(name)
        await asyncio.gather(*(asyncio.to_thread(cluster.wait_ready, n) for n in names))
        await until(cluster.settled, 90, "the three nodes to settle")
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            # Predicates are functions, not expressions: the console's policy
            # has no 'unsafe-eval', and Playwright evaluates an expression with eval.
            await page.goto(cluster.nodes["node-1"].url + "/#/cluster")

            await page.wait_for_function(
                "() => document.querySelectorAll('#members tr[data-state=alive]').length === 3",
                timeout=WAIT_MS,
            )
            assert await page.locator("#self").text_content() == "node-1"
            assert await page.locator("#buckets div").count() == 256
            # The counts come from the store's leases as the page last read
            # them: on a loaded machine a lease may lapse and be taken again
            # between two refreshes, so wait for a refresh that shows every
            # bucket held, spread over all three members.
            await page.wait_for_function(
                "() => { const held = [...document.querySelectorAll('#members tr')]"
                ".map(r => Number(r.children[4].textContent));"
                " return held.length === 3 && held.every(n => n > 0)"
                " && held.reduce((a, b) => a + b, 0) === 256; }",
                timeout=WAIT_MS,
            )
            owners = await page.eval_on_selector_all(
                "#buckets div", "cells => new Set(cells.map(c => c.style.background)).size"
            )
            assert owners == 3
            assert "schedules" in (await page.locator("#backlog-total").text_content() or "")
            # Which figures are the cluster's and which this node's, said on the page.
            scopes = await page.eval_on_selector_all(
                "#view-cluster h2",
                "hs => hs.map(h => [h.querySelector('.scope')?.textContent, h.textContent])",
            )
            assert [scope for scope, _ in scopes] == ["cluster"] * 2 + ["this node"] * 4
            due_now = next(text for _, text in scopes if "Due now" in text)
            assert "this node's buckets" in due_now
            # Counts by status, every status named, from this node's buckets.
            await page.wait_for_function(
                "() => document.getElementById('status-counts').textContent.includes('buckets)')",
                timeout=WAIT_MS,
            )
            counts = await page.locator("#status-counts").text_content() or ""
            assert all(f"{status} " in counts for status in ("PENDING", "PAUSED", "EXPIRED"))

            cluster.kill("node-3")
            # The page refreshes by itself: node-3 leaves the alive set, and
            # its buckets go to the other two.
            await page.wait_for_function(
                "() => document.querySelector('#members tr[data-member=\"node-3\"]')"
                "?.dataset.state !== 'alive'",
                timeout=WAIT_MS,
            )
            await page.wait_for_function(
                "() => [...document.querySelectorAll('#buckets div')]"
                ".every(c => !c.title.includes('node-3'))",
                timeout=WAIT_MS,
            )
            assert errors == []
            await browser.close()
    finally:
        cluster.close()
