"""One log stream per node: every line on stderr is one JSON object (or, with
``LOG_FORMAT=console``, one readable line), whoever wrote it.

The node's own loggers (``structlog.get_logger(__name__)``) and the standard
library's (aiohttp, aiokafka, pymongo, asyncio, ``warnings``) go through one
``logging`` handler whose ``ProcessorFormatter`` renders both alike, so a log
shipper's JSON parser never meets a line it cannot read. Every line has
``timestamp`` (UTC, ISO 8601), ``level``, ``logger`` (the module), ``node``
and ``event``; a line written while a request is served also has its
``request_id`` (bound by the API's middleware). An exception is a structured
``exception`` field (type, value, frames), never a bare traceback: uncaught
ones, a thread's, and the "exception ignored" of a finaliser are logged too.

Libraries log at WARNING and above only: their INFO is a flood (pymongo's
every command) and says nothing an operator acts on.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import MutableMapping
from types import TracebackType
from typing import Any, TextIO

import structlog

# The node's own packages: logged at the configured level. Every other
# logger (the libraries') at LIBRARY_LEVEL and above.
OWN_PACKAGES = ("node", "membership", "ring")
LIBRARY_LEVEL = logging.WARNING

_log = structlog.get_logger(__name__)
# An exception as data: its type, value and frames, never the frames' local
# variables (they hold API keys, payloads and signing secrets).
_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False, max_frames=30)
)


class _ModuleLogger(structlog.WriteLogger):
    """structlog's fastest logger, named by its module (for ``logger``)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NodeField:
    """Adds ``node`` to every line. A processor, not a context variable: a
    library's thread (a DNS lookup, a monitor) has no copy of the context."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event.setdefault("node", self.node_id)
        return event


def configure(
    fmt: str = "json", level: str = "info", node_id: str | None = None, stream: TextIO | None = None
) -> None:
    """Send every log line of this process to ``stream`` (stderr) in ``fmt``."""
    out = stream if stream is not None else sys.stderr
    threshold = logging.getLevelNamesMapping()[level.upper()]
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    if node_id is not None:
        shared.append(_NodeField(node_id))
    renderer: list[structlog.typing.Processor]
    if fmt == "json":
        renderer = [_TRACEBACKS, structlog.processors.JSONRenderer()]
    else:
        renderer = [
            structlog.dev.ConsoleRenderer(
                colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        ]
    # The libraries' records: the standard library's handler, rendered alike.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LIBRARY_LEVEL)
    for package in OWN_PACKAGES:
        logging.getLogger(package).setLevel(threshold)
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger
    # The node's own lines skip the standard library (half the cost of a
    # line through it: the access log and the delivery lines are many).
    # Each goes out as one write, as the handler's do, so none interleave.
    structlog.configure(
        processors=[*shared, *renderer],
        logger_factory=lambda *names: _ModuleLogger(out, str(names[0]) if names else ""),
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        cache_logger_on_first_use=True,
    )
    _route_uncaught()


def _route_uncaught() -> None:
    """Exceptions nobody caught become log lines, not tracebacks on stderr."""

    def uncaught(
        kind: type[BaseException], value: BaseException, trace: TracebackType | None
    ) -> None:
        _log.critical("uncaught exception", exc_info=(kind, value, trace))

    def in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None:
            return
        _log.error(
            "uncaught exception in a thread",
            thread=getattr(args.thread, "name", None),
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    def unraisable(hook: Any) -> None:
        # A finaliser or callback that raised where nobody could catch it (an
        # unclosed client's __del__, say): worth a look, nobody must act now.
        _log.warning(
            hook.err_msg or "exception ignored",
            object=repr(hook.object)[:200],
            exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback),
        )

    sys.excepthook = uncaught
    threading.excepthook = in_thread
    sys.unraisablehook = unraisable
