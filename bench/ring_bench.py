"""``python -m bench ring``: balance and movement of the bucket placements.

For B buckets and N = 2..100 members: the busiest member's buckets over the
mean, and the share of buckets that change owner when one member joins
(ideal 1/(N+1)) or leaves (ideal 1/N), for plain ketama and for the bounded
rendezvous placement in use. Pure computation: the figures are exact and
the same on every machine.
"""

from __future__ import annotations

from typing import Any

from ring import balance, bounded, ketama, moved


def placements(bucket_count: int, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        members = [f"node-{i}" for i in range(n)]
        grown = [*members, f"node-{n}"]
        # A member with few buckets leaving moves little, one with many moves
        # a lot: average over three leavers spread over the list.
        leavers = sorted({members[0], members[n // 2], members[-1]})
        row: dict[str, Any] = {"members": n}
        for name, place in (("ketama", ketama), ("bounded", bounded)):
            now = place(members, bucket_count)
            leaves = [
                moved(now, place([m for m in members if m != x], bucket_count)) for x in leavers
            ]
            row[name] = {
                "balance": balance(now),
                "join_moved": moved(now, place(grown, bucket_count)),
                "leave_moved": sum(leaves) / len(leaves) if n > 1 else 0.0,
            }
        rows.append(row)
    return rows


def render(result: dict[str, Any]) -> str:
    rows, bucket_count = result["rows"], result["buckets"]
    lines = [
        f"B = {bucket_count}; balance = busiest / mean; join and leave = share of buckets moved, "
        "as a multiple of the ideal 1/(N+1) and 1/N",
        f"{'N':>4} | {'ketama bal':>10} {'join x':>6} {'leave x':>7} | "
        f"{'bounded bal':>11} {'join x':>6} {'leave x':>7}",
    ]
    for row in rows:
        n = row["members"]
        k, b = row["ketama"], row["bounded"]
        lines.append(
            f"{n:>4} | {k['balance']:>10.2f} {k['join_moved'] * (n + 1):>6.2f} "
            f"{k['leave_moved'] * n:>7.2f} | {b['balance']:>11.2f} "
            f"{b['join_moved'] * (n + 1):>6.2f} {b['leave_moved'] * n:>7.2f}"
        )
    upto32 = [r for r in rows if r["members"] <= 32]
    lines.append(
        f"N <= 32: worst balance ketama {max(r['ketama']['balance'] for r in upto32):.2f}, "
        f"bounded {max(r['bounded']['balance'] for r in upto32):.2f} (aim 1.25); "
        f"joins over 1.5x ideal: ketama "
        f"{sum(r['ketama']['join_moved'] * (r['members'] + 1) > 1.5 for r in upto32)}, bounded "
        f"{sum(r['bounded']['join_moved'] * (r['members'] + 1) > 1.5 for r in upto32)} "
        f"of {len(upto32)}"
    )
    for label, subset in (("N <= 32", upto32), (f"N <= {rows[-1]['members']}", rows)):
        worst = {
            name: (
                max(r[name]["join_moved"] * (r["members"] + 1) for r in subset),
                max(r[name]["leave_moved"] * r["members"] for r in subset),
            )
            for name in ("ketama", "bounded")
        }
        lines.append(
            f"{label}: worst join x / leave x: ketama {worst['ketama'][0]:.2f} / "
            f"{worst['ketama'][1]:.2f}, bounded {worst['bounded'][0]:.2f} / "
            f"{worst['bounded'][1]:.2f}"
        )
    return "\n".join(lines)


def measure(quick: bool) -> dict[str, Any]:
    bucket_count = 256
    sizes = list(range(2, 51)) if quick else list(range(2, 101))
    return {"suite": "ring", "buckets": bucket_count, "rows": placements(bucket_count, sizes)}
