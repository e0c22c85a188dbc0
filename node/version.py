"""The version this node runs, from the installed package's metadata (one
place: ``--version`` of every CLI, ``scheduler_build_info`` and the
``Server`` of every answer read it here)."""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "bucket-scheduler"


def version() -> str:
    """The installed distribution's version; ``0+unknown`` when this tree is
    run without being installed (a bare checkout on ``PYTHONPATH``)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


VERSION = version()


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints ``bucket-scheduler VERSION`` and exits 0."""
    parser.add_argument("--version", action="version", version=f"{DISTRIBUTION} {VERSION}")
