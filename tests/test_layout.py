"""The tests' own layout: no test module imports another; what two share
lives in tests/helpers.py or tests/conftest.py (h11's rule)."""

from __future__ import annotations

import ast

from tests.helpers import ROOT

TESTS = ROOT / "tests"


def imported_modules(tree: ast.Module) -> set[str]:
    """Every module an import names, at any depth (a test may import inside a function)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            # ``from tests.node import test_x`` names the test module as an alias.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_test_module_imports_another() -> None:
    offences = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in sorted(imported_modules(tree)):
            if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offences == []


def test_every_test_directory_is_a_package() -> None:
    # tests/ is a package (modules import ``tests.conftest``); a room without
    # __init__.py would be collected under another name and break that.
    missing = [
        str(d.relative_to(ROOT))
        for d in sorted({p.parent for p in TESTS.rglob("test_*.py")})
        if not (d / "__init__.py").exists()
    ]
    assert missing == []
