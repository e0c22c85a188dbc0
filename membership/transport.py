"""asyncio transport: datagrams over UDP, push-pull frames over TCP on the
same port number (as memberlist does).

The transport never raises into its caller for anything a peer sent: a
packet that is too large, truncated, of an unknown version, fails the MAC,
does not decode, or comes on the wrong channel (a push-pull in a datagram,
anything but one push-pull in a stream frame: "channel") is dropped and
counted under its reason in ``dropped``.

A TCP connection carries one frame, as our sender sends (the rest of it is
not read), and must deliver it within ``STREAM_TIMEOUT``. After the 4-byte
length (refused past ``MAX_STREAM_BYTES``) the 2-byte header is judged
before a byte of the body is read: a frame of another version, or unsigned
when we hold keys (signed when we hold none), costs its sender six bytes of
our attention, not a body buffered before its MAC is checked. At most
``MAX_STREAMS_IN`` connections are read at a time: one past that is closed
unread and dropped as "busy". At most ``MAX_STREAMS_OUT`` push-pulls are
sent at a time: past that a send is dropped and counted in
``counters["streams_out_busy"]``.

Every packet (datagram or stream frame) that arrives, or begins to, counts
once in ``counters["packets_in"]`` and then either once in
``counters["packets_accepted"]`` or once under a reason in ``dropped``. A
connection refused over the cap counts as one frame (dropped, "busy"); one
closed before its first byte as none. ``counters["streams_in"]`` counts the
connections read.

Sending never raises either, and never closes the socket: a destination is
parsed (``membership.address``) before any socket call, so asyncio's fatal
error path (an ``OverflowError`` from ``sendto`` for a port of 70000 closes
the datagram transport for good) cannot be reached from a peer's input; what
the socket still refuses is counted in ``counters["send_errors"]``. Should the
datagram socket close anyway, it is bound again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from membership.address import AddressError, parse_address
from membership.codec import HEADER_BYTES, MAX_STREAM_BYTES, Codec, DecodeError
from membership.messages import Packet

FRAME = struct.Struct(">I")
# A connection's time to deliver its one frame: a silent or trickling one
# holds a slot no longer (a frame of MAX_STREAM_BYTES in it needs 7 Mbit/s).
STREAM_TIMEOUT = 5.0
# Inbound connections read at a time. Each may make us buffer a frame of up
# to MAX_STREAM_BYTES before its MAC is checked, so 16 bound that to 64 MiB;
# a cluster opens one exchange per member per push-pull interval (and one per
# joining node), far fewer at once.
MAX_STREAMS_IN = 16
# Push-pulls we send at a time: one per interval, one answer per exchange we
# receive, one per seed when joining. Past 8 at once we are being made to
# send our whole table by a flood of exchanges, or joining through a DNS seed
# naming many members: one answered exchange is enough to join, and
# Membership._join_seeds tries again the seeds it still does not know.
MAX_STREAMS_OUT = 8
# Binding the datagram socket again after it closed unexpectedly: first
# pause, doubling up to the last.
REOPEN_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

Receiver = Callable[[Packet], None]

log = logging.getLogger("membership")


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT as (host, port); ``ValueError`` when it is not one."""
    parsed = parse_address(address)
    return parsed.host, parsed.port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _destination(address: str) -> tuple[str, int]:
    """Where ``sendto``/``open_connection`` may go: an IPv4 address (the
    sockets are AF_INET) and a port in range. Members advertise IP
    addresses, so a host name here is a misconfiguration or a forgery."""
    parsed = parse_address(address)
    if parsed.ip is None or parsed.ip.version != 4:
        raise AddressError(f"{address!r:.80} is not an IPv4 address")
    return parsed.host, parsed.port


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, transport: Transport) -> None:
        self.owner = transport

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self.owner.received(data, stream=False)

    def error_received(self, exc: Exception) -> None:
        self.owner.counters["send_errors"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._datagrams_lost(self, exc)


class Transport:
    def __init__(self, codec: Codec, receiver: Receiver) -> None:
        self.codec = codec
        self.receiver = receiver
        self.counters: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._udp: asyncio.DatagramTransport | None = None
        self._protocol: _Datagrams | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._streams_in = 0  # connections being read
        self._streams_out = 0  # push-pull sends begun and not ended
        self._host = ""
        self._stopping = False
        self.port = 0
        # Peer addresses whose packets are not sent: a partition simulated in
        # process, for chaos tests where network namespaces are unavailable.
        # Empty in normal operation.
        self.blocked: frozenset[str] = frozenset()

    @property
    def udp_open(self) -> bool:
        """True while the datagram socket is bound and usable."""
        return self._udp is not None and not self._udp.is_closing()

    async def start(self, host: str, port: int) -> None:
        """Bind UDP and TCP on one port. With port 0 the OS picks the UDP
        port, and the same TCP port may be taken (an outgoing connection's
        ephemeral port): then pick again."""
        loop = asyncio.get_running_loop()
        self._stopping = False
        for attempt in range(1 if port else 20):
            udp, protocol = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, port), family=socket.AF_INET
            )
            chosen = udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(
                    self._on_stream, host, chosen, reuse_address=True, family=socket.AF_INET
                )
            except OSError:
                udp.close()
                if port or attempt == 19:
                    raise
                continue
            self._udp, self._protocol, self._host, self.port = udp, protocol, host, chosen
            return

    async def stop(self) -> None:
        self._stopping = True
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 2)
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the datagram socket closing under us --------------------------------------

    def _datagrams_lost(self, protocol: _Datagrams, exc: Exception | None) -> None:
        if self._stopping or protocol is not self._protocol:
            return
        # Nothing a peer sends should get here (see the module docstring); if
        # something does, a node deaf to probes is declared dead, so bind again.
        self.counters["udp_reopens"] += 1
        log.error("membership: the gossip UDP socket closed (%r); binding it again", exc)
        self._udp = None
        self._spawn(self._reopen())

    async def _reopen(self) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self._stopping:
            try:
                udp, protocol = await loop.create_datagram_endpoint(
                    lambda: _Datagrams(self),
                    local_addr=(self._host, self.port),
                    family=socket.AF_INET,
                )
            except Exception as exc:  # the port taken meanwhile, out of descriptors...
                delay = REOPEN_DELAYS[min(attempt, len(REOPEN_DELAYS) - 1)]
                attempt += 1
                log.error("membership: cannot bind UDP %s:%d again: %s", self._host, self.port, exc)
                await asyncio.sleep(delay)
                continue
            if self._stopping:
                udp.close()
                return
            self._udp, self._protocol = udp, protocol
            log.warning("membership: gossip UDP socket bound again on port %d", self.port)
            return

    # -- receiving -----------------------------------------------------------------

    def received(self, data: bytes, *, stream: bool) -> None:
        self.counters["packets_in"] += 1
        self.counters["bytes_in"] += len(data)
        try:
            packet = self.codec.decode(data, stream=stream)
        except DecodeError as exc:
            self.dropped[exc.reason] += 1
            return
        except Exception:  # decode raises only DecodeError; should that break, drop
            self.dropped["malformed"] += 1
            log.exception("membership: error decoding a packet")
            return
        self.counters["packets_accepted"] += 1
        try:
            self.receiver(packet)
        except Exception:  # the receiver's fault, not the peer's: count, keep the socket
            self.counters["receiver_errors"] += 1
            log.exception("membership: error handling a packet")

    def _frame_dropped(self, reason: str) -> None:
        """A stream frame that began to arrive (or a connection refused) but
        is not read to the end."""
        self.counters["packets_in"] += 1
        self.dropped[reason] += 1

    async def _on_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._streams_in >= MAX_STREAMS_IN:
            self._frame_dropped("busy")
            writer.transport.abort()  # unread: no reason to linger on it
            return
        self._streams_in += 1
        self.counters["streams_in"] += 1
        try:
            await asyncio.wait_for(self._read_frame(reader), STREAM_TIMEOUT)
        except (TimeoutError, OSError):
            self._frame_dropped("stream_error")
        except Exception:
            self._frame_dropped("stream_error")
            log.exception("membership: error reading a push-pull stream")
        finally:
            self._streams_in -= 1
            writer.close()

    async def _read_frame(self, reader: asyncio.StreamReader) -> None:
        """Read the connection's one frame, judging it on its length and
        header before its body; count it once (see the module docstring)."""
        try:
            prefix = await reader.readexactly(FRAME.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:  # part of a length, then the end
                self._frame_dropped("truncated")
            return  # else closed before a byte: no frame
        (length,) = FRAME.unpack(prefix)
        if length > MAX_STREAM_BYTES:
            self._frame_dropped("too_large")
            return
        try:
            header = await reader.readexactly(min(length, HEADER_BYTES))
            self.codec.check_header(header)
            body = await reader.readexactly(length - len(header))
        except asyncio.IncompleteReadError:
            self._frame_dropped("truncated")  # a length, then less than it said
            return
        except DecodeError as exc:
            self._frame_dropped(exc.reason)  # refused on its header: the body stays unread
            return
        self.received(header + body, stream=True)

    # -- sending -------------------------------------------------------------------

    def send(self, address: str, packet: Packet, *, reliable: bool) -> None:
        """Send ``packet`` to ``address``; never raises, never closes the socket."""
        if address in self.blocked:
            self.dropped["partitioned"] += 1
            return
        try:
            destination = _destination(address)
        except AddressError as exc:
            self.counters["send_errors"] += 1
            log.debug("membership: not sending to %s", exc)
            return
        if reliable and self._streams_out >= MAX_STREAMS_OUT:
            # Before encoding: a state exchange is up to MAX_STREAM_BYTES to
            # encode and sign, and a flood of them is what this cap is for.
            self.counters["streams_out_busy"] += 1
            return
        try:
            data = self.codec.encode(packet)
        except Exception:
            self.counters["send_errors"] += 1
            log.exception("membership: cannot encode a packet")
            return
        if reliable:
            if len(data) > MAX_STREAM_BYTES:  # every peer would refuse it
                self.counters["oversize_not_sent"] += 1
                return
            self._streams_out += 1
            # On the task's end, even when it is cancelled before it starts.
            self._spawn(self._send_stream(destination, data)).add_done_callback(self._stream_sent)
            return
        if len(data) > self.codec.max_bytes:
            self.counters["oversize_not_sent"] += 1
            return
        udp = self._udp
        if udp is None or udp.is_closing():
            self.counters["send_errors"] += 1
            return
        try:
            udp.sendto(data, destination)
        except Exception as exc:  # asyncio handles OSError itself; anything else
            self.counters["send_errors"] += 1
            log.warning("membership: sendto %s failed: %r", address, exc)
            return
        self.counters["packets_out"] += 1
        self.counters["bytes_out"] += len(data)

    def _stream_sent(self, _task: asyncio.Task[None]) -> None:
        self._streams_out -= 1

    async def _send_stream(self, destination: tuple[str, int], data: bytes) -> None:
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(*destination), STREAM_TIMEOUT
            )
        except Exception:  # refused, unreachable, timed out: the peer's problem
            self.counters["stream_connect_errors"] += 1
            return
        try:
            writer.write(FRAME.pack(len(data)) + data)
            await asyncio.wait_for(writer.drain(), STREAM_TIMEOUT)
            self.counters["streams_out"] += 1
            self.counters["bytes_out"] += len(data)
        except Exception:
            self.counters["send_errors"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
