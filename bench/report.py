"""What every suite does with its figures: print them, and write them as JSON
when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def publish(result: Any, text: str, out: Path | None) -> int:
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {out}")
    return 0
