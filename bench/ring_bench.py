"""``python -m bench ring``: balance and movement of the bucket placements.

For B = 256 (the default ``BUCKETS``) and B = 4096 (about 32 buckets a
member at 128, the manual's sizing for clusters that large) buckets and N = 2..128 members
(``--quick``: 2..50), named node-0 .. node-(N-1), for plain ketama and for
the bounded rendezvous placement in use:

* balance: the busiest member's buckets over the mean B/N. The aim is at most
  1.25, that is at most ``floor(1.25 B/N)`` buckets for anyone; where
  ``ceil(B/N)`` is more than that (N = 107..127 at B = 256, where B/N is
  between 2 and 2.4 and someone must hold 3) the aim is the optimum,
  ``ceil(B/N)``. ``bound`` is whichever applies.
* join: the share of buckets whose owner changes when node-N joins, over the
  ideal 1/(N+1); leave: the same when one member leaves, over the ideal 1/N,
  for three leavers (the first, middle and last member). The aim is at most
  1.5 for the join and for each leaver.

Pure computation: the figures are exact and the same on every machine.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ring import balance, bounded, ketama, moved

BALANCE_AIM = 1.25
MOVE_AIM = 1.5
PLACEMENTS = (("ketama", ketama), ("bounded", bounded))
# Worst figures are reported up to each of these sizes.
SPANS = (32, 64, 128)


def bound(members: int, bucket_count: int) -> int:
    """The most buckets the busiest member may hold: ``floor(1.25 B/N)``, or the
    optimum ``ceil(B/N)`` where that is more."""
    return max(math.floor(BALANCE_AIM * bucket_count / members), -(-bucket_count // members))


def placements(bucket_count: int, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        members = [f"node-{i}" for i in range(n)]
        grown = [*members, f"node-{n}"]
        # A member with few buckets leaving moves little, one with many moves
        # a lot: three leavers spread over the list, each held to the aim.
        leavers = sorted({members[0], members[n // 2], members[-1]})
        most = bound(n, bucket_count)
        row: dict[str, Any] = {
            "members": n,
            "bound": most,
            "bound_balance": most / (bucket_count / n),
            "bound_is_optimum": most > math.floor(BALANCE_AIM * bucket_count / n),
        }
        for name, place in PLACEMENTS:
            now = place(members, bucket_count)
            leaves = [
                moved(now, place([m for m in members if m != x], bucket_count)) for x in leavers
            ]
            join = moved(now, place(grown, bucket_count))
            busiest = max(Counter(now).values())
            row[name] = {
                # Over the mean of the members that hold buckets (ring.balance) ...
                "balance": balance(now),
                # ... and over B/N, which the aim is about (they differ when a
                # member holds nothing).
                "balance_of_n": busiest / (bucket_count / n),
                "busiest": busiest,
                "join_moved": join,
                # The mean of the three, as before; the worst is what the aim is about.
                "leave_moved": sum(leaves) / len(leaves),
                "leave_moved_each": dict(zip(leavers, leaves, strict=True)),
                "leave_moved_worst": max(leaves),
                "balance_ok": busiest <= most,
                "join_ok": join * (n + 1) <= MOVE_AIM + 1e-9,
                "leave_ok": max(leaves) * n <= MOVE_AIM + 1e-9,
            }
        rows.append(row)
    return rows


def _multiples(row: dict[str, Any], name: str) -> tuple[float, float]:
    n, r = row["members"], row[name]
    return r["join_moved"] * (n + 1), r["leave_moved_worst"] * n


def _met(row: dict[str, Any], name: str) -> bool:
    r = row[name]
    return bool(r["balance_ok"] and r["join_ok"] and r["leave_ok"])


def render(result: dict[str, Any]) -> str:
    return "\n\n".join(_render_run(run) for run in result["runs"])


def _render_run(result: dict[str, Any]) -> str:
    rows, bucket_count = result["rows"], result["buckets"]
    names = [name for name, _ in PLACEMENTS]
    lines = [
        f"B = {bucket_count}; busiest = most buckets on one member, bound = the most allowed "
        f"(floor({BALANCE_AIM} B/N), or ceil(B/N) where that is more: marked !); "
        f"bal = busiest / (B/N); join x, leave x = buckets moved over the ideal B/(N+1), B/N "
        f"(leave: the worst of the first, middle and last member); aim {MOVE_AIM}; "
        "ok = all three aims met",
        f"{'N':>4} {'bound':>6} |"
        + "|".join(
            f" {name + ' busiest':>15} {'bal':>5} {'join x':>6} {'leave x':>7} {'ok':>3} "
            for name in names
        ),
    ]
    for row in rows:
        n = row["members"]
        mark = "!" if row["bound_is_optimum"] else " "
        cells = []
        for name in names:
            r = row[name]
            join_x, leave_x = _multiples(row, name)
            cells.append(
                f" {r['busiest']:>15} {r['balance_of_n']:>5.2f} {join_x:>6.2f} {leave_x:>7.2f} "
                f"{'yes' if _met(row, name) else 'NO':>3} "
            )
        lines.append(f"{n:>4} {row['bound']:>5}{mark} |" + "|".join(cells))
    shown: set[int] = set()
    for span in SPANS:
        subset = [r for r in rows if r["members"] <= span]
        if not subset or subset[-1]["members"] in shown:
            continue
        shown.add(subset[-1]["members"])
        label = f"N <= {subset[-1]['members']}"
        parts = []
        for name in names:
            joins = max(_multiples(r, name)[0] for r in subset)
            leaves = max(_multiples(r, name)[1] for r in subset)
            worst_balance = max(r[name]["balance_of_n"] for r in subset)
            over = sum(not r[name]["balance_ok"] for r in subset)
            met = sum(_met(r, name) for r in subset)
            parts.append(
                f"{name} join x {joins:.2f}, leave x {leaves:.2f}, balance {worst_balance:.2f} "
                f"({over} over bound), all aims met at {met} of {len(subset)} sizes"
            )
        lines.append(f"{label}: " + "; ".join(parts))
    return "\n".join(lines)


# The default, and a count that leaves a member of 128 some 32 buckets: with
# fewer than about 8 per member, balance within 1.25x cannot be had at all
# (at B = 256 a member of 107..127 holds 2 or 3, where 3 is up to 1.46x the
# mean), and near 8-16 a newcomer's share varies by more than half of it.
BUCKET_COUNTS = (256, 4096)


def measure(quick: bool) -> dict[str, Any]:
    sizes = list(range(2, 51)) if quick else list(range(2, 129))
    runs = [{"buckets": b, "rows": placements(b, sizes)} for b in BUCKET_COUNTS]
    return {"suite": "ring", "runs": runs}
