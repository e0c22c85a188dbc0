"""What ``python -m bench`` does with the figures: print each suite's table
as it finishes, and write them all as JSON when asked (after every suite, so
a long run that stops part way keeps what it measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
