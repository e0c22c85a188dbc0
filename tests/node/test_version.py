"""node.version: every command line says which release it is, from the
installed package's metadata."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from node import version
from tests.helpers import ROOT

# The tree under test: each command must run this code, not another copy.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

COMMANDS = [
    "node",
    "chaos",
    "chaos.lab.receiver",
    "membership",
    "bench",
    "bench.baselines",
    "bench.leases_bench",
    "bench.receiver",
]


def python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_version_is_the_installed_distributions() -> None:
    assert metadata.version("bucket-scheduler") == version.VERSION
    ran = python("-c", "import node; print(node.__file__)")
    assert Path(ran.stdout.strip()) == ROOT / "node" / "__init__.py"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_line_prints_its_version(command: str) -> None:
    ran = python("-m", command, "--version")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"bucket-scheduler {metadata.version('bucket-scheduler')}\n"
