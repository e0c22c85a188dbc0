"""The HTML page of a chaos run: one self-contained file (inline SVG, no
scripts, nothing fetched) that a person can open in any browser.

Three plots share the time axis, with a dashed marker at every event:
lateness of each schedule by its due time, buckets held per node, and the
alive members each node sees.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 900, 220, 60, 30, 20
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]


def render_html(result: dict[str, Any]) -> str:
    started = float(result["started"])
    points = [(due - started, late) for due, late in result.get("lateness_points", [])]
    samples = result.get("samples", [])
    end = max(
        [float(result["settings"]["duration"]), *(t for t, _ in points), *(s["t"] for s in samples)]
    )
    events = [(float(e["at"]), str(e["step"])) for e in result["events"]]
    held, sees = _per_node(samples, "held"), _per_node(samples, "sees")
    verdict = "PASSED" if result["passed"] else "FAILED"
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in _summary(result)
    )
    event_rows = "".join(_event_row(e) for e in result["events"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>chaos: {html.escape(result["scenario"])} — {verdict}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ text-align: left; padding: 2px 12px 2px 0; }}
.verdict {{ font-weight: bold; color: {"#2ca02c" if result["passed"] else "#d62728"}; }}
svg {{ display: block; margin-bottom: 1.5em; }}
</style></head><body>
<h1>{html.escape(result["scenario"])} (seed {result["seed"]}):
<span class="verdict">{verdict}</span></h1>
<table>{rows}</table>
<h2>Events</h2>
<table><tr><th>at</th><th>step</th><th>node</th><th>cluster settled</th></tr>{event_rows}</table>
<h2>Lateness by due time (s)</h2>
{_plot("lateness", {"schedules": points}, end, events, dots=True)}
<h2>Buckets held per node</h2>
{_plot("buckets", held, end, events)}
<h2>Alive members each node sees</h2>
{_plot("members", sees, end, events)}
</body></html>
"""


def _per_node(samples: Sequence[dict[str, Any]], key: str) -> dict[str, list[tuple[float, Any]]]:
    """Each node's ``key`` (buckets held, members seen) at each sample's
    time; None where a sample has none of the node. A node is any that
    some sample names under "held" or "sees"."""
    nodes = sorted(
        {n for s in samples for n in s["held"]} | {n for s in samples for n in s["sees"]}
    )
    return {n: [(s["t"], s[key].get(n)) for s in samples] for n in nodes}


def _summary(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The table at the top of the page: what the run was and what it found."""
    summary = [
        ("network", result.get("network", "")),
        (
            "auth; cluster keys",
            f"{'on' if result.get('auth') else 'off'}; "
            f"{'on' if result.get('cluster_keys') else 'off'}",
        ),
        ("accepted (schedules and expected occurrences)", result["accepted"]),
        (
            "recurring schedules; their occurrences",
            f"{result.get('chains', 0)}; {result.get('occurrences', 0)}",
        ),
        ("cancelled", result["cancelled"]),
        ("delivered", result["delivered"]),
        ("lost", result["lost"]),
        (
            "early (by record timestamp; read before due)",
            f"{result['early']}; {result.get('early_received', 0)}",
        ),
        ("cancelled but delivered", result["cancelled_delivered"]),
        (
            "rescheduled; paused (resumed, still paused); taken by bulk cancels, pauses",
            f"{result.get('rescheduled', 0)}; {result.get('paused', 0)} "
            f"({result.get('resumed', 0)}, {result.get('still_paused', 0)}); "
            f"{result.get('bulk_cancelled', 0)}, {result.get('bulk_paused', 0)}",
        ),
        ("delivered while paused", result.get("paused_delivered", 0)),
        (
            "rescheduled but delivered at a time it was moved off",
            result.get("rescheduled_wrong_time", 0),
        ),
        (
            "duplicates (under one claim; across a database crash)",
            f"{result['duplicates']} ({result['duplicates_same_claim']}; "
            f"{result['duplicates_across_store_crash']})",
        ),
        (
            "duplicates by kind",
            ", ".join(f"{k} {n}" for k, n in result.get("duplicates_by_kind", {}).items()),
        ),
        ("stale claims (two owners at once)", result["stale_claims"]),
        ("delivered at the wrong destination", result.get("wrong_destination", 0)),
        (
            "DELIVERY_FAILED (besides those the receiver refused, as told)",
            f"{result.get('delivery_failed', 0)} ({result.get('delivery_failed_refused', 0)})",
        ),
        ("gone from the topic by the end", result["vanished"]),
        (
            "in the topic, never served to the live reader (found at the end)",
            result.get("served_late", 0),
        ),
        (
            "offsets the broker gave two records (a broker fault: judged in no run)",
            result.get("offsets_reused", 0),
        ),
        ("unexpected occurrences (a chain doubled or drifted)", result["unexpected_occurrences"]),
        (
            "garbage gossip floods failed (target declared dead, or nothing dropped)",
            result.get("garbage_failures", 0),
        ),
        ("lateness p50 / p99 / max", _ms(result["lateness_s"])),
        ("outside fault windows", _ms(result["lateness_outside_windows_s"])),
    ]
    if result.get("unfenced"):
        summary.insert(0, ("nodes", "UNFENCED (CHAOS_MODE=unfenced): expected to fail"))
    if "receiver_answers" in result:
        answers = ", ".join(f"{k} {v}" for k, v in result["receiver_answers"].items())
        summary += [
            ("delivered by HTTP", result.get("delivered_http", 0)),
            ("receiver's answers by status", answers or "none"),
            ("receiver: signatures that did not hold", result["bad_signatures"]),
            (
                "flow-limited calls, most in a second / allowed, past the limit",
                f"{result.get('flow_limited_arrivals', 0)}, "
                f"{result.get('flow_most_in_a_period', 0)} / "
                f"{result.get('flow_allowed_in_a_period', '-')}, "
                f"{result.get('over_flow_rate', 0)}",
            ),
        ]
    return summary


def _event_row(event: dict[str, Any]) -> str:
    return (
        f"<tr><td>{event['at']:.1f} s</td><td>{html.escape(str(event['step']))}</td>"
        f"<td>{html.escape(str(event.get('node') or ''))}</td>"
        f"<td>{html.escape(_settled(event))}</td></tr>"
    )


def _ms(summary: dict[str, Any]) -> str:
    return " / ".join(
        "-" if math.isnan(summary[k]) else f"{summary[k] * 1000:.0f} ms"
        for k in ("p50", "p99", "max")
    )


def _settled(event: dict[str, Any]) -> str:
    if "skipped" in event:
        return f"skipped: {event['skipped']}"
    if "skipped_settle" in event:
        return f"not timed: {event['skipped_settle']}"
    after = event.get("settled_after_s")
    text = "did not settle" if after is None else f"after {after} s"
    garbage = event.get("garbage")
    if garbage and "passed" in garbage:
        dropped = ", ".join(f"{k} {v:g}" for k, v in garbage.get("dropped", {}).items())
        verdict = "target kept alive" if garbage["passed"] else "FAILED"
        text += f"; {garbage.get('datagrams', 0)} garbage datagrams, dropped {dropped}: {verdict}"
    return text


def _plot(
    name: str,
    series: Mapping[str, Sequence[tuple[float, float | None]]],
    end: float,
    events: Sequence[tuple[float, str]],
    *,
    dots: bool = False,
) -> str:
    values = [v for points in series.values() for _, v in points if v is not None]
    top = max(values, default=1.0) or 1.0
    inner_w, inner_h = WIDTH - LEFT - 10, HEIGHT - BOTTOM - TOP

    def x(t: float) -> float:
        return LEFT + inner_w * t / end if end else LEFT

    def y(v: float) -> float:
        return TOP + inner_h * (1 - v / top)

    parts = [
        f'<svg class="plot" data-plot="{name}" width="{WIDTH}" height="{HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{name}">',
        f'<line x1="{LEFT}" y1="{TOP + inner_h}" x2="{LEFT + inner_w}" y2="{TOP + inner_h}" '
        'stroke="#888"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + inner_h}" stroke="#888"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{top:.3g}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + inner_h}" text-anchor="end">0</text>',
        f'<text x="{LEFT + inner_w}" y="{HEIGHT - 8}" text-anchor="end">{end:.0f} s</text>',
    ]
    for at, label in events:
        parts.append(
            f'<line class="event" x1="{x(at):.1f}" y1="{TOP}" x2="{x(at):.1f}" '
            f'y2="{TOP + inner_h}" stroke="#999" stroke-dasharray="4 3">'
            f"<title>{html.escape(label)} at {at:.1f} s</title></line>"
        )
    for index, (label, points) in enumerate(sorted(series.items())):
        colour = COLOURS[index % len(COLOURS)]
        known = [(t, v) for t, v in points if v is not None]
        if dots:
            parts.extend(
                f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="1.5" fill="{colour}"/>'
                for t, v in known
            )
        elif known:
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in known)
            parts.append(
                f'<polyline class="series" fill="none" stroke="{colour}" points="{path}">'
                f"<title>{html.escape(label)}</title></polyline>"
            )
        parts.append(
            f'<text x="{LEFT + 8 + 90 * index}" y="{HEIGHT - 8}" fill="{colour}">'
            f"{html.escape(label)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
