"""docs/performance.md shows the dated figures kept beside it
(docs/performance/*.json) as tools/figures.py renders them."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

# tools/ holds scripts, not a package: load this one from its file.
_spec = importlib.util.spec_from_file_location("figures", ROOT / "tools" / "figures.py")
assert _spec is not None and _spec.loader is not None
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_the_page_is_what_the_figures_make() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "figures.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_every_figures_file_is_on_the_page_and_dated() -> None:
    text = figures.PAGE.read_text()
    assert figures.unlisted(text) == []
    names = [match["name"] for match in figures.BLOCK.finditer(text)]
    assert len(names) == len(set(names)) >= 19
    for name in names:
        assert figures.load(name)["measured"] == name[:10]


def test_a_changed_figure_makes_the_page_stale(tmp_path: Path) -> None:
    shutil.copytree(figures.FIGURES, tmp_path / "performance")
    text = figures.PAGE.read_text()
    assert figures.rendered(text, tmp_path / "performance") == text
    path = tmp_path / "performance" / "2026-11-24-delivery-aims.json"
    changed = json.loads(path.read_text())
    assert changed["rows"][0][1] == "395x (1), 1,426x (3)"
    changed["rows"][0][1] = "396x (1), 1,426x (3)"
    path.write_text(json.dumps(changed))
    page = figures.rendered(text, tmp_path / "performance")
    assert page != text and "396x (1)" in page and "395x (1)" not in page
    (tmp_path / "performance" / "2026-11-28-new.json").write_text(path.read_text())
    assert figures.unlisted(text, tmp_path / "performance") == ["2026-11-28-new.json"]


def test_a_file_whose_date_is_not_its_names_is_refused(tmp_path: Path) -> None:
    source = json.loads((figures.FIGURES / "2026-11-27-logs.json").read_text())
    (tmp_path / "2026-11-20-logs.json").write_text(json.dumps(source))
    with pytest.raises(figures.FiguresError, match="not the file's date"):
        figures.load("2026-11-20-logs.json", tmp_path)
    (tmp_path / "2026-11-27-short.json").write_text(json.dumps({**source, "rows": [["on"]]}))
    with pytest.raises(figures.FiguresError, match="a row of 3 strings"):
        figures.load("2026-11-27-short.json", tmp_path)
