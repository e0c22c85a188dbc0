"""A run's result as text (the summary printed at its end), and the files
it leaves: ``summary.json``, ``report.html`` and ``history.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import history as ops
from chaos.checker import LATE_OUTSIDE_WINDOWS
from chaos.history import History
from chaos.report import render_html

# Duplicated units printed with their copies (summary.json lists more).
SHOWN_DUPLICATES = 20


def render(result: dict[str, Any]) -> str:
    lines = [*_headline(result), *_figures(result)]
    for event in result["events"]:
        lines += _event_lines(event, result)
    for reason, count in result["refusals"].items():
        lines.append(f"refused after 6 tries ({count}): {reason}")
    if result.get("garbage_failures"):
        lines.append(
            f"garbage gossip failed ({result['garbage_failures']}): the target was declared "
            "dead, or its dropped-packet counters did not rise: "
            + ", ".join(result["garbage_failed"])
        )
    lines.append("PASSED" if result["passed"] else "FAILED: an invariant broke (see above)")
    return "\n".join(lines)


def _ms(summary: dict[str, Any]) -> str:
    return (
        f"p50 {summary['p50'] * 1000:.0f} ms, p99 {summary['p99'] * 1000:.0f} ms, "
        f"max {summary['max'] * 1000:.0f} ms ({summary['count']})"
    )


def _headline(result: dict[str, Any]) -> list[str]:
    """What was asked, and what broke."""
    return [
        f"{result['scenario']} (seed {result['seed']}"
        f"{', nodes UNFENCED' if result['unfenced'] else ''}): {result['accepted']} accepted, "
        f"{result['cancelled']} cancelled ({result.get('cancels_unanswered', 0)} DELETEs "
        f"unanswered, asked again after the run), {result['refused']} refused, "
        f"{result['delivered']} delivered; accepted includes {result['occurrences']} "
        f"occurrences of {result['chains']} recurring schedules",
        f"lost {result['lost']}, early {result['early']} "
        f"(read before due {result.get('early_received', 0)}), "
        f"cancelled but delivered {result['cancelled_delivered']}, "
        f"delivered while paused {result.get('paused_delivered', 0)}, "
        f"rescheduled at the wrong time {result.get('rescheduled_wrong_time', 0)}, "
        f"duplicates {result['duplicates']} ({_kinds(result['duplicates_by_kind'])}), "
        f"stale claims {result['stale_claims']}, gone from the topic {result['vanished']}, "
        f"unexpected occurrences {result['unexpected_occurrences']}, "
        f"at the wrong destination {result.get('wrong_destination', 0)}, "
        f"DELIVERY_FAILED {result.get('delivery_failed', 0)} "
        f"(besides {result.get('delivery_failed_refused', 0)} the receiver refused, as told)",
    ]


def _figures(result: dict[str, Any]) -> list[str]:
    """The verbs, the broker's offsets, the duplicates, the network, lateness."""
    late = result.get("late_outside_windows", 0)
    shown = f" ({', '.join(result['late_outside_windows_ids'][:5])} ...)" if late else ""
    return [
        _verb_line(result),
        *receiver_lines(result),
        *flow_lines(result),
        *_broker_reuse_lines(result),
        *_duplicate_lines(result),
        f"network: {result['network']}; auth {'on' if result.get('auth') else 'off'}, "
        f"cluster keys {'on' if result.get('cluster_keys') else 'off'}",
        f"lateness overall: {_ms(result['lateness_s'])}",
        f"lateness outside fault windows: {_ms(result['lateness_outside_windows_s'])}",
        f"late by more than {LATE_OUTSIDE_WINDOWS:g} s outside each fault's intended window "
        f"(its hand-over, or all of it when nobody could work): {late}{shown}",
        "schedules in the store at the end: "
        + (", ".join(f"{k} {v}" for k, v in result.get("statuses", {}).items()) or "none"),
    ]


def _event_lines(event: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """One fault's line, and under it what was seen while it lasted."""
    line = f"  at {event['at']:6.1f} s  {event['step']:<28} {event.get('node') or ''}"
    line += _settling(event)
    if event.get("filter_not_set_on"):
        line += f"  (gossip filter not set on {', '.join(event['filter_not_set_on'])})"
    if "clock_offset_s" in event:
        line += f"  (store clock - its clock: {event['clock_offset_s']:+g} s)"
    lines = [line]
    if "garbage" in event:
        lines.append(f"{'':13}{_garbage_line(event['garbage'])}")
    if event.get("unready"):
        failing = "; ".join(f"{k} on {', '.join(v)}" for k, v in event["unready"].items())
        lines.append(f"{'':13}/readyz failed meanwhile: {failing}")
    if "window" in event:
        window = result["windows"][event["window"]]
        lines.append(f"{'':13}lateness in its window: {_ms(window['lateness_s'])}")
    return lines


def _settling(event: dict[str, Any]) -> str:
    if "skipped" in event:
        return f"  skipped: {event['skipped']}"
    if "skipped_settle" in event:
        return f"  (not timed: {event['skipped_settle']})"
    settled = event.get("settled_after_s")
    return f"  settled after {settled} s" if settled is not None else "  did not settle"


def _garbage_line(report: dict[str, Any]) -> str:
    """A flood's figures: what was sent, what the target counted dropped, verdict."""
    if "passed" not in report:
        return "garbage: not judged"
    dropped = ", ".join(f"{k} {v:g}" for k, v in report.get("dropped", {}).items()) or "none"
    streams = sum(report.get("streams", {}).values())
    verdict = "kept alive" if report["passed"] else "FAILED"
    if report.get("declared_dead_by"):
        verdict += f", declared dead by {', '.join(report['declared_dead_by'])}"
    if report.get("suspected_by"):
        verdict += f", suspected by {', '.join(report['suspected_by'])}"
    errors = [report[k] for k in ("metrics_before", "metrics_after") if k in report]
    return (
        f"garbage: {report.get('datagrams', 0)} datagrams, {streams} streams; dropped: "
        f"{dropped}; {verdict}" + (f" ({'; '.join(errors)})" if errors else "")
    )


def _verb_line(result: dict[str, Any]) -> str:
    """What the verbs did: counts of the schedules each changed, and every
    answer they got (``verbs``), e.g. ``pause 409 in_flight 2``."""
    calls = result.get("bulk_calls", [])
    cancels = [c for c in calls if c.get("verb", ops.BULK_CANCEL) == ops.BULK_CANCEL]
    pauses = [c for c in calls if c.get("verb") == ops.BULK_PAUSE]
    answers = ", ".join(f"{k} {v}" for k, v in result.get("verbs", {}).items()) or "none"
    return (
        f"schedules changed by the verbs: {result.get('rescheduled', 0)} rescheduled, "
        f"{result.get('paused', 0)} paused ({result.get('resumed', 0)} resumed, "
        f"{result.get('still_paused', 0)} still paused at the end), "
        f"{result.get('bulk_cancelled', 0)} taken by {len(cancels)} bulk cancels "
        f"(answered {sum(_changed(c) for c in cancels)} cancelled), "
        f"{result.get('bulk_paused', 0)} by {len(pauses)} bulk pauses "
        f"(answered {sum(_changed(c) for c in pauses)} paused), "
        f"{result.get('unsettled', 0)} outcomes unsettled; answers: {answers}"
    )


def _changed(call: dict[str, Any]) -> int:
    """What a bulk verb's calls answered they changed (a report of an earlier
    release: ``cancelled``)."""
    return int(call.get("changed", call.get("cancelled", 0)))


def receiver_lines(result: dict[str, Any]) -> list[str]:
    """What the receiver answered (a run with an http share only)."""
    if "receiver_answers" not in result:
        return []
    answers = ", ".join(f"{k} {v}" for k, v in result["receiver_answers"].items()) or "none"
    bad = result["bad_signatures"]
    shown = f" ({', '.join(result['bad_signatures_ids'][:5])} ...)" if bad else ""
    taken = result.get("receiver_attempts", {})
    attempts = ", ".join(f"{k}: {v}" for k, v in taken.items()) or "none"
    return [
        f"receiver: {result.get('delivered_http', 0)} units delivered by HTTP; answers by "
        f"status: {answers}; requests taken by attempt {attempts}; "
        f"{result['receiver_refused']} units refused for good; "
        f"signatures that did not hold {bad}{shown}; requests naming no schedule "
        f"{result['receiver_unnamed']}"
    ]


def flow_lines(result: dict[str, Any]) -> list[str]:
    """The flow-limited key's calls as the receiver saw them (a run with an
    http share only)."""
    if "receiver_answers" not in result:
        return []
    return [
        f"flow control: {result.get('flow_limited_arrivals', 0)} calls of the limited key, "
        f"at most {result.get('flow_most_in_a_period', 0)} in a second (allowed "
        f"{result.get('flow_allowed_in_a_period', '-')}), "
        f"{result.get('over_flow_rate', 0)} past the limit"
    ]


def _kinds(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in by_kind.items())


def _broker_reuse_lines(result: dict[str, Any]) -> list[str]:
    """Say so when the broker served one offset with two records: it may have
    overwritten an acknowledged one, which then reads as lost."""
    reused = result.get("offsets_reused", 0)
    if not reused:
        return []
    shown = ", ".join(result["offsets_reused_ids"][:10])
    return [
        f"the broker served {reused} offsets with two different records ({shown}"
        f"{', ...' if reused > 10 else ''}): it gave an offset twice, so a record it "
        "acknowledged may have been overwritten before it was read"
    ]


def _duplicate_lines(result: dict[str, Any]) -> list[str]:
    """One line per duplicated unit, failures first: its kind, the fault
    that explains it, and each copy as token/attempt, time into the run,
    value digest and partition:offset."""
    explained = result["duplicates_explained"]
    lines = []
    for entry in explained[:SHOWN_DUPLICATES]:
        why = f" ({entry['window']})" if entry["window"] else ""
        copies = "; ".join(
            f"t{c['token']}/a{c['attempt']} at {c['at'] - result['started']:.3f} s "
            f"#{c['digest'] or '?'} {_where(c)}"
            for c in entry["copies"]
        )
        lines.append(f"  {entry['id']}: {entry['kind']}{why}: {copies}")
    if result["duplicates"] > len(lines):
        lines.append(
            f"  ... {result['duplicates'] - len(lines)} more duplicated units "
            f"(summary.json lists {len(explained)})"
        )
    return lines


def _where(copy: dict[str, Any]) -> str:
    """Where a copy arrived: partition:offset of the topic, or the receiver."""
    if copy.get("sink") == "http":
        return "http"
    return f"{copy['partition']}:{copy['offset']}"


def write(result: dict[str, Any], out: Path, history: History | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if history is not None:
        history.write(out / "history.jsonl")
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    (out / "report.html").write_text(render_html(result))
