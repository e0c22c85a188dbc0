"""Write the tables of docs/performance.md from the dated figures beside it.

Each table of measured figures lives in ``docs/performance/DATE-NAME.json``:
when it was measured (``measured``, the date the file name starts with), at
which commit if known, by which command, what it is (``about``), its
``columns`` and its ``rows``, each cell the text the run reported (so
``≥ 60.0 (budget)`` or ``0.20`` keep their meaning and their digits). The page
names the file between markers::

    <!-- figures: 2026-11-24-delivery.json -->
    <!-- /figures -->

``python tools/figures.py`` writes each table (and a line saying when it was
measured, linking its file) between its markers; ``--check`` writes nothing
and exits 1 when the page is not what the files make, or a file is not on
the page. tests/docs/test_figures.py runs the check, so a figure is changed in its
file, and the page follows. (A generator rather than an mkdocs hook: the
page in the repository reads the same as the site, on GitHub too.)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
FIGURES = ROOT / "docs" / "performance"
BLOCK = re.compile(
    r"(<!-- figures: (?P<name>[0-9]{4}-[0-9]{2}-[0-9]{2}-[a-z0-9-]+\.json) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- /figures -->)",
    re.S,
)
FIELDS = {"measured", "commit", "command", "about", "columns", "rows"}


class FiguresError(Exception):
    """A figures file the page cannot be made from."""


def load(name: str, directory: Path = FIGURES) -> dict[str, Any]:
    figures: dict[str, Any] = json.loads((directory / name).read_text())
    if set(figures) != FIELDS:
        raise FiguresError(f"{name}: fields {sorted(figures)}, not {sorted(FIELDS)}")
    if not name.startswith(figures["measured"] + "-"):
        raise FiguresError(f"{name}: measured {figures['measured']}, not the file's date")
    width = len(figures["columns"])
    for row in figures["rows"]:
        if len(row) != width or not all(isinstance(cell, str) for cell in row):
            raise FiguresError(f"{name}: a row of {width} strings wanted, got {row}")
    return figures


def table(name: str, figures: dict[str, Any]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    rows = [line(figures["columns"]), line(["---"] * len(figures["columns"]))]
    rows += [line(row) for row in figures["rows"]]
    at = f" at {figures['commit']}" if figures["commit"] else ""
    source = (
        f"*{figures['about']}: `{figures['command']}`, measured {figures['measured']}{at} "
        f"([figures](performance/{name})).*"
    )
    return "\n".join(rows) + "\n\n" + source + "\n"


def rendered(text: str, directory: Path = FIGURES) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        return match[1] + table(name, load(name, directory)) + match[4]

    return BLOCK.sub(fill, text)


def unlisted(text: str, directory: Path = FIGURES) -> list[str]:
    """Figures files the page does not show."""
    shown = {match["name"] for match in BLOCK.finditer(text)}
    return sorted(p.name for p in directory.glob("*.json") if p.name not in shown)


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    wanted = rendered(text)
    missing = unlisted(text)
    if missing:
        print(f"{PAGE} shows no block for {', '.join(missing)}", file=sys.stderr)
        return 1
    if "--check" in argv:
        if wanted != text:
            print(f"{PAGE} is stale: run python tools/figures.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
