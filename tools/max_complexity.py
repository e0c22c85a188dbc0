"""Fail when a function is more complex than the project allows.

``python tools/max_complexity.py LIMIT DIR...``: every function and method
in the Python files under each DIR whose cyclomatic complexity (radon's
count, which adds boolean operators and comprehensions to McCabe's) is
over LIMIT is listed, and the exit status is 1. A function that grew past
the limit is one to split where its decisions are, not to raise the limit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from radon.complexity import cc_visit


def over(limit: int, roots: list[str]) -> list[str]:
    found = []
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            for block in cc_visit(path.read_text()):
                if block.complexity > limit:
                    found.append(f"{path}:{block.lineno} {block.fullname} {block.complexity}")
    return found


def main(argv: list[str]) -> int:
    limit, roots = int(argv[0]), argv[1:]
    found = over(limit, roots)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} functions over a cyclomatic complexity of {limit}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
