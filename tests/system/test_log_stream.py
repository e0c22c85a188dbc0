"""One log stream (node/logs.py): every byte a node writes to stderr is a JSON
line with timestamp, level, logger, node and event, its libraries' lines
and its exceptions included; the access log (node/api/observe.py) writes
one line per call, probes only when asked.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from node import logs
from node.ops import embedded
from tests.conftest import HOST, EmbeddedServers, NodeFactory, wait_until
from tests.node_process import NodeProcess
from tests.tcp_cut import CuttableRelay

REQUIRED = ("timestamp", "level", "logger", "node", "event")


def _assert_one_stream(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` is a JSON object with the required fields."""
    parsed = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}") from None
        assert isinstance(entry, dict), line
        missing = [name for name in REQUIRED if name not in entry]
        assert not missing, f"line {number} lacks {missing}: {line}"
        assert entry["timestamp"].endswith("Z"), line  # UTC
        datetime.fromisoformat(entry["timestamp"])
        parsed.append(entry)
    return parsed


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """``logs.configure`` into a buffer; everything it changed put back."""
    stream = io.StringIO()
    saved_structlog = structlog.get_config()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_levels = {name: logging.getLogger(name).level for name in logs.OWN_PACKAGES}
    saved_hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    logs.configure("json", "info", "node-x", stream=stream)
    # The node's module-level loggers must not keep this buffer once done.
    structlog.configure(cache_logger_on_first_use=False)
    try:
        yield stream
    finally:
        structlog.configure(**saved_structlog)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)
        logging.captureWarnings(False)
        sys.excepthook, threading.excepthook, sys.unraisablehook = saved_hooks


def test_the_nodes_and_the_libraries_lines_are_one_json_stream(configured: io.StringIO) -> None:
    own = structlog.get_logger("node.delivery.poller")
    own.info("schedule delivered", schedule_id="s-1")
    own.debug("below the level: not written")
    logging.getLogger("aiokafka.conn").warning("Unable connect to node with id %s", 1)
    logging.getLogger("pymongo.serverSelection").info("a library's info: not written")
    logging.getLogger("aiohttp.server").error("Error handling request")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
    lines = _assert_one_stream(configured.getvalue())
    assert [(line["logger"], line["level"]) for line in lines] == [
        ("node.delivery.poller", "info"),
        ("aiokafka.conn", "warning"),
        ("aiohttp.server", "error"),
        ("py.warnings", "warning"),
    ]
    assert lines[0]["schedule_id"] == "s-1" and lines[0]["node"] == "node-x"
    assert lines[1]["event"] == "Unable connect to node with id 1"


def test_an_exception_is_a_structured_field_without_local_variables(
    configured: io.StringIO,
) -> None:
    api_key = "sk-must-never-be-logged"
    try:
        raise ValueError(f"bad value {len(api_key)}")
    except ValueError:
        structlog.get_logger("node.api.app").exception("unexpected error")
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    text = configured.getvalue()
    assert "sk-must-never-be-logged" not in text
    assert "Traceback" not in text
    lines = _assert_one_stream(text)
    assert len(lines) == 2
    for line in lines:
        [raised] = line["exception"]
        assert raised["exc_type"] == "ValueError"
        assert raised["frames"] and "locals" not in raised["frames"][-1]


def test_a_threads_exception_and_an_ignored_one_are_log_lines(configured: io.StringIO) -> None:
    thread = threading.Thread(target=lambda: 1 / 0, name="resolver")
    thread.start()
    thread.join()

    class Finaliser:
        def __del__(self) -> None:
            raise RuntimeError("raised in a finaliser")

    Finaliser()
    lines = _assert_one_stream(configured.getvalue())
    by_type = {line["exception"][0]["exc_type"]: line for line in lines}
    assert by_type["ZeroDivisionError"]["thread"] == "resolver"
    assert by_type["ZeroDivisionError"]["level"] == "error"
    assert by_type["RuntimeError"]["level"] == "warning"


def test_a_line_written_while_serving_a_call_has_its_request_id(
    configured: io.StringIO,
) -> None:
    with structlog.contextvars.bound_contextvars(request_id="r-9"):
        structlog.get_logger("node.api.schedules").info("schedule accepted")
        logging.getLogger("pymongo").warning("a driver's warning during the call")
    lines = _assert_one_stream(configured.getvalue())
    assert [line["request_id"] for line in lines] == ["r-9", "r-9"]


def test_the_console_format_stays_for_humans() -> None:
    stream = io.StringIO()
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    try:
        logs.configure("console", "info", "node-x", stream=stream)
        structlog.get_logger("node.process").info("node started", http="127.0.0.1:8080")
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.captureWarnings(False)
        sys.excepthook, threading.excepthook, sys.unraisablehook = hooks
    text = stream.getvalue()
    assert "node started" in text and "http=127.0.0.1:8080" in text and "node=node-x" in text
    with pytest.raises(ValueError):
        json.loads(text)


# -- a real node with its drivers in trouble ------------------------------------


async def test_a_node_whose_store_times_out_and_broker_is_gone_writes_only_json(
    servers: EmbeddedServers, database_name: str, tmp_path: Path
) -> None:
    """The store behind a black hole at first (its driver times out), then
    reachable; the broker's port closed (its driver cannot connect). Every
    byte on the node's stderr parses, and the drivers' own lines are there."""
    store_host, store_port = servers.mongo_uri.split("//")[1].split("/")[0].split(":")
    relay = CuttableRelay((store_host, int(store_port)))
    await relay.start(HOST)
    relay.cut()
    dead_broker = f"{HOST}:{embedded.free_port(HOST)}"
    node = NodeProcess(
        tmp_path / "node.log",
        MONGO_URI=f"mongodb://{HOST}:{relay.port}/?directConnection=true&serverSelectionTimeoutMS=500",
        MONGO_DATABASE=database_name,
        KAFKA_BOOTSTRAP=dead_broker,
    )
    await node.start()
    try:

        def waiting_for(what: str) -> bool:
            return any(
                line.get("event") == f"waiting for the {what}" for line in _parsed(node.text())
            )

        async def store_timed_out() -> bool:
            return waiting_for("store")

        await wait_until(store_timed_out, 60, "the store's timeout to be logged")
        relay.heal()

        async def broker_refused() -> bool:
            lines = _parsed(node.text())
            return waiting_for("broker") and any(
                line.get("logger", "").startswith("aiokafka") for line in lines
            )

        await wait_until(broker_refused, 90, "the broker's driver to log its failure")
    finally:
        code = await node.stop()
        await relay.stop()
    lines = _assert_one_stream(node.text())
    assert code == 0
    assert {line["node"] for line in lines} == {"proc-a"}
    assert any(line["logger"].startswith("aiokafka") for line in lines)
    assert not any("Traceback" in json.dumps(line) for line in lines)


def _parsed(text: str) -> list[dict[str, Any]]:
    """The complete lines so far (the last may be half written)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# -- the access log -----------------------------------------------------------------


async def _calls(node: Any) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/v1/cluster", "/v1/nowhere"):
        await node.request("GET", path)


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("on", {("/v1/cluster", 200), ("unmatched", 404)}),
        (
            "all",
            {
                ("/healthz", 200),
                ("/readyz", 200),
                ("/metrics", 200),
                ("/v1/cluster", 200),
                ("unmatched", 404),
            },
        ),
        ("off", set()),
    ],
)
async def test_the_access_log_writes_one_line_per_call_probes_only_when_asked(
    start_node: NodeFactory, mode: str, logged: set[tuple[str, int]]
) -> None:
    node = await start_node(access_log=mode)
    with structlog.testing.capture_logs() as captured:
        await _calls(node)
    lines = [line for line in captured if line["event"] == "request"]
    assert {(line["route"], line["status"]) for line in lines} == logged
    assert len(lines) == len(logged)
    for line in lines:
        assert line["method"] == "GET" and line["remote"] == "127.0.0.1"
        assert line["duration_ms"] >= 0 and line["bytes"] > 0
        assert "/v1/nowhere" not in json.dumps(line)  # the template, never the raw path


async def test_an_access_line_names_the_route_template_and_the_callers_tenant(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    with structlog.testing.capture_logs() as captured:
        await node.request("GET", "/v1/schedules/some-id-1")
    [line] = [line for line in captured if line["event"] == "request"]
    assert line["route"] == "/v1/schedules/{schedule_id}" and line["status"] == 404
    assert "some-id-1" not in json.dumps(line)
