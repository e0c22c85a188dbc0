"""Where a payload lives in a schedule's document: inline when small, in a
field of its own when large, so that the reads that hold many schedules at
once (the owner's due reads, listings) can leave the large ones behind.

An owner's book of due work holds up to ``BATCH_SIZE x 4`` schedules; with
payloads of up to 256 KiB inline that is half a gigabyte, for a node whose
pod may have 512 MiB. Split this way, a due read costs at most
INLINE_PAYLOAD_BYTES of payload per schedule, and the poller fetches the
large payloads of the schedules it has claimed just before it publishes
them, a few megabytes at a time (``node/delivery/poller.py``).

``payloadBytes`` says how large the payload is, wherever it lives. A
document stored before the split has its payload inline whatever its size
and no ``payloadBytes``; it reads the same.

Pure: no IO.
"""

from __future__ import annotations

from typing import Any

INLINE = "payload"
LARGE = "largePayload"
SIZE = "payloadBytes"
# Payloads up to this size stay in the document's main field: nearly every
# one (a reminder, a timeout, a notification is a few hundred bytes), while
# a full book of due work stays within tens of megabytes.
INLINE_PAYLOAD_BYTES = 8 * 1024


def payload_fields(payload: bytes) -> tuple[dict[str, Any], frozenset[str]]:
    """The fields that store ``payload`` (to set), and the field it must
    not also be in (to remove, when a change moves it from one to the other)."""
    if len(payload) <= INLINE_PAYLOAD_BYTES:
        return {INLINE: payload, SIZE: len(payload)}, frozenset({LARGE})
    return {LARGE: payload, SIZE: len(payload)}, frozenset({INLINE})


def payload_size(doc: dict[str, Any]) -> int:
    """The payload's size in bytes, loaded or not."""
    size = doc.get(SIZE)
    if size is not None:
        return int(size)
    return len(doc.get(INLINE) or doc.get(LARGE) or b"")


def needs_fetch(doc: dict[str, Any]) -> bool:
    """A document read without its large payload (a due read leaves it out)."""
    return INLINE not in doc and LARGE not in doc and payload_size(doc) > 0


def payload_of(doc: dict[str, Any]) -> bytes:
    """The payload's bytes; the document must hold them (``needs_fetch`` False)."""
    if INLINE in doc:
        return bytes(doc[INLINE] or b"")
    if LARGE in doc:
        return bytes(doc[LARGE])
    if payload_size(doc):
        raise ValueError(f"schedule {doc.get('_id')!r} was read without its payload")
    return b""
