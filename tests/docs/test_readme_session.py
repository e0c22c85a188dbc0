"""The manual's command blocks: the README's five-minute session, and the
examples of the docs' pages, run as written against a dev stack; every other
command block says why it is not run here.

In each page, the blocks under a ``<!-- session -->`` marker are one bash
script (a ``python`` block in it runs with this interpreter); each
``# →`` line after a command is what it prints (``...`` stands for anything;
a ``python`` block's come last in it, for what the whole block prints).
The test starts ``python -m node dev`` on free ports, changes only what the
README tells a user with other ports to change (the ports in the URLs,
``--bootstrap`` for ``scheduler tail``, ``SCHEDULER_URL``), runs the script
with bash, and checks each step's output against its ``# →`` lines, in order.
``scheduler`` is the console script pyproject.toml declares; here a shim runs
the same entry point with this interpreter, so the checkout under test is the
one that runs.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.ops import embedded
from tests.helpers import ROOT, Fenced, fenced_blocks

README = ROOT / "README.md"
MANUAL = (README, *sorted((ROOT / "docs").glob("*.md")))
MARKER = "<!-- session -->"
# A command block that is not run here says why, on the line above it:
# ``<!-- not run: ... -->`` (what it needs that ``make run`` is not, and
# what to substitute), or ``<!-- checked: tests/... -->`` (a test runs it).
NOT_RUN = re.compile(r"<!-- not run: \S.* -->")
CHECKED = re.compile(r"<!-- checked: (tests/\S+\.py) -->")
COMMANDS = {"sh", "bash", "shell", "console", "python"}
EXPECT = "# → "
STEP = "@@step {}@@"


def sources() -> list[Path]:
    """Every page with session blocks, each run as one script, in this order."""
    return [page for page in MANUAL if markers(page)]


def markers(page: Path) -> int:
    """The page's session markers: lines of their own (prose may name one)."""
    return sum(line.strip() == MARKER for line in page.read_text().splitlines())


@dataclass(frozen=True)
class Step:
    """What the script prints between two expectations, and the expectations."""

    commands: str
    expected: tuple[str, ...]


def session_blocks(page: Path) -> list[str]:
    """The blocks right after each session marker, as bash."""
    blocks = [b for b in fenced_blocks(page) if b.marker == MARKER]
    assert len(blocks) == markers(page), f"{page}: a marker not above a block"
    assert all(b.language in ("sh", "python") for b in blocks), f"{page}: a session of sh or python"
    return [b.text if b.language == "sh" else as_bash(b) for b in blocks]


def as_bash(block: Fenced) -> str:
    """A python block as one bash command (a here-document for this
    interpreter), its ``# →`` lines after it."""
    lines = block.text.splitlines()
    code = [line for line in lines if not line.startswith(EXPECT)]
    expected = [line for line in lines if line.startswith(EXPECT)]
    return "\n".join(["\"$PYTHON\" - <<'PY'", *code, "PY", *expected])


def steps(blocks: list[str]) -> list[Step]:
    """Cut the script at each run of ``# →`` lines: the commands before it and
    what they must print."""
    found: list[Step] = []
    commands: list[str] = []
    expected: list[str] = []
    for line in "\n".join(blocks).splitlines():
        if line.startswith(EXPECT):
            expected.append(line[len(EXPECT) :])
            continue
        if expected:
            found.append(Step("\n".join(commands), tuple(expected)))
            commands, expected = [], []
        commands.append(line)
    if expected:
        found.append(Step("\n".join(commands), tuple(expected)))
    return found


def script(found: list[Step]) -> str:
    """One bash script: each step's commands, then a marker line, so the
    output can be cut back into steps."""
    parts = []
    for n, step in enumerate(found):
        parts.append(step.commands)
        parts.append(f"printf '\\n{STEP.format(n)}\\n'")
    return "\n".join(parts) + "\n"


def pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split("...")))


def unmatched(expected: tuple[str, ...], output: str) -> list[str]:
    """The expected lines not found in ``output``, each after the one before."""
    lines = output.splitlines()
    missing, at = [], 0
    for line in expected:
        for i in range(at, len(lines)):
            if pattern(line).fullmatch(lines[i].rstrip()):
                at = i + 1
                break
        else:
            missing.append(line)
    return missing


# -- the parts, on their own ----------------------------------------------------------


def test_the_readme_has_a_session_of_several_checked_steps() -> None:
    found = steps(session_blocks(README))
    assert len(found) >= 8
    assert all(step.commands.strip() for step in found)
    assert len(steps(session_blocks(ROOT / "docs" / "api.md"))) >= 5


def test_every_command_block_of_the_manual_runs_or_says_why_not() -> None:
    unexplained, unchecked = [], []
    for page in MANUAL:
        for block in fenced_blocks(page):
            if block.language not in COMMANDS or block.marker == MARKER:
                continue
            checked = CHECKED.fullmatch(block.marker)
            if checked is not None:
                test = ROOT / checked.group(1)
                if not test.is_file() or page.name not in test.read_text():
                    unchecked.append(f"{page.name}:{block.line} {checked.group(1)}")
            elif NOT_RUN.fullmatch(block.marker) is None:
                unexplained.append(f"{page.name}:{block.line}")
    assert unexplained == [], "blocks neither run nor saying why not"
    assert unchecked == [], "blocks naming a test that does not read their page"


def test_a_python_block_of_a_session_runs_with_this_interpreter() -> None:
    block = Fenced(README, 1, "python", "print(2 + 2)\n# → 4", MARKER)
    [step] = steps([as_bash(block)])
    assert step.expected == ("4",)
    result = subprocess.run(["bash", "-c", step.commands], env={"PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.stdout == "4\n", result.stderr


def test_a_step_that_prints_something_else_fails() -> None:
    assert unmatched(("{...} 201",), '{"id":"a"} 201') == []
    assert unmatched(("{...} 201",), '{"id":"a"} 200') == ["{...} 201"]
    assert unmatched(("a", "b"), "b\na") == ["b"]  # in order
    assert unmatched(("node-1 ... alive ...",), "node-1   alive   x") == []


def test_scheduler_is_the_console_script_of_python_m_node() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["scheduler"] == "node.ops.cli:main"


def test_python_m_node_without_the_dependencies_says_what_to_run() -> None:
    # -S: no site-packages, as the system's Python without the virtualenv.
    result = subprocess.run(
        [sys.executable, "-S", "-m", "node", "ctl", "members"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "make run" in result.stderr and ".venv/bin/scheduler" in result.stderr


# -- the session against a dev stack ----------------------------------------------------


class Stack:
    """``python -m node dev`` on free ports, until ``dev: ready``."""

    def __init__(self, data_dir: Path) -> None:
        self.http = embedded.consecutive_free_ports(3)
        self.kafka = embedded.free_port()
        gossip = embedded.consecutive_free_ports(3, (socket.SOCK_DGRAM,))
        args = ["--nodes", "3", "--http-port", str(self.http), "--gossip-port", str(gossip)]
        args += ["--mongo-port", str(embedded.free_port()), "--kafka-port", str(self.kafka)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "node", "dev", *args, "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_ready(self, within: float = 120) -> None:
        seen: list[str] = []
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(line)
            if "dev: ready" in line:
                return
        raise AssertionError("the dev stack did not start:\n" + "\n".join(seen))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def substituted(self, text: str) -> str:
        for n, port in enumerate(range(8080, 8083)):
            for host in ("localhost", "127.0.0.1"):
                text = text.replace(f"{host}:{port}", f"{host}:{self.http + n}")
        return text.replace(
            "scheduler tail ", f"scheduler tail --bootstrap 127.0.0.1:{self.kafka} "
        )


def shim(directory: Path) -> Path:
    """A ``scheduler`` on PATH that runs this checkout with this interpreter."""
    directory.mkdir()
    command = directory / "scheduler"
    root, python = shlex.quote(str(ROOT)), shlex.quote(sys.executable)
    command.write_text(f'#!/bin/sh\nPYTHONPATH={root} exec {python} -m node "$@"\n')
    command.chmod(0o755)
    return directory


@pytest.mark.slow
@pytest.mark.servers
def test_the_session_blocks_run_as_written(tmp_path: Path) -> None:
    # Where `make run` keeps its data, from where the sessions run: its
    # logs are dev-data/logs/ to them.
    stack = Stack(tmp_path / "dev-data")
    path = f"{shim(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SCHEDULER_URL": f"http://127.0.0.1:{stack.http}",
           "PYTHON": sys.executable}  # fmt: skip
    runs = []
    try:
        stack.wait_ready()
        for source in sources():
            found = steps(session_blocks(source))
            text = stack.substituted(script(found))
            # The session activates the virtualenv `make run` made; here the
            # shim stands for it.
            text = text.replace(". .venv/bin/activate\n", "")
            result = subprocess.run(
                ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", text],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            runs.append((source.name, found, result))
    finally:
        stack.stop()
    for name, found, result in runs:
        assert result.returncode == 0, (name, result.stdout + result.stderr)
        outputs = re.split(r"\n?@@step \d+@@\n", result.stdout)
        assert len(outputs) == len(found) + 1, (name, result.stdout)
        for step, output in zip(found, outputs, strict=False):
            assert unmatched(step.expected, output) == [], (name, step.commands, output)
