"""OpenTelemetry traces, opt-in: off unless ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, and then only if the
``otel`` extra is installed (``pip install bucket-scheduler[otel]``).

Off, nothing of OpenTelemetry is imported and every hook here is a no-op.
On (``node/otel.py``), a node exports spans over OTLP for its API calls
(the official aiohttp server instrumentation), its store calls (the
official pymongo instrumentation) and each delivery: a Kafka publish or an
HTTP call, each the child of the context stored with the schedule (the
create's or last PATCH's span), whose ``traceparent`` it passes on. The
standard ``OTEL_*`` variables (sampler, batch delays, headers) apply as the
SDK reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from node.errors import CannotStart
from node.tracing import OFF, Tracing

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


def start(node_id: str, version: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """Tracing as the environment asks: ``OFF``, or exporting over OTLP.
    Call before the node makes its store clients (the pymongo listener is
    registered for clients made after it)."""
    if not wanted(environ):
        return OFF
    try:
        from node.otel import OtelTracing
    except ImportError as exc:
        raise CannotStart(
            f"{ENDPOINT_VARIABLES[0]} is set but OpenTelemetry is not installed ({exc.name}): "
            "install bucket-scheduler[otel], or unset it"
        ) from None
    return OtelTracing(node_id, version)
