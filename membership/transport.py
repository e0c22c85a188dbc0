"""asyncio transport: datagrams over UDP, push-pull frames over TCP on the
same port number (as memberlist does).

The transport never raises into its caller for anything a peer sent: a
packet that is too large, truncated, of an unknown version, fails the MAC or
does not decode is dropped and counted under its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
from collections import Counter
from collections.abc import Callable

from membership.codec import MAX_STREAM_BYTES, Codec, DecodeError
from membership.messages import Packet

FRAME = struct.Struct(">I")
STREAM_TIMEOUT = 5.0

Receiver = Callable[[Packet], None]


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, transport: Transport) -> None:
        self.owner = transport

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self.owner.received(data, stream=False)

    def error_received(self, exc: Exception) -> None:
        self.owner.counters["send_errors"] += 1


class Transport:
    def __init__(self, codec: Codec, receiver: Receiver) -> None:
        self.codec = codec
        self.receiver = receiver
        self.counters: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        # Peer addresses whose packets are not sent: a partition simulated in
        # process, for chaos tests where network namespaces are unavailable.
        # Empty in normal operation.
        self.blocked: frozenset[str] = frozenset()

    async def start(self, host: str, port: int) -> None:
        """Bind UDP and TCP on one port. With port 0 the OS picks the UDP
        port, and the same TCP port may be taken (an outgoing connection's
        ephemeral port): then pick again."""
        loop = asyncio.get_running_loop()
        for attempt in range(1 if port else 20):
            udp, _ = await loop.create_datagram_endpoint(
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
            self._udp, self.port = udp, chosen
            return

    async def stop(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 2)
        for task in list(self._tasks):
            task.cancel()

    # -- receiving -----------------------------------------------------------------

    def received(self, data: bytes, *, stream: bool) -> None:
        self.counters["packets_in"] += 1
        self.counters["bytes_in"] += len(data)
        try:
            packet = self.codec.decode(data, stream=stream)
        except DecodeError as exc:
            self.dropped[exc.reason] += 1
            return
        self.receiver(packet)

    async def _on_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await asyncio.wait_for(reader.readexactly(FRAME.size), STREAM_TIMEOUT)
                (length,) = FRAME.unpack(header)
                if length > MAX_STREAM_BYTES:
                    self.dropped["too_large"] += 1
                    return
                data = await asyncio.wait_for(reader.readexactly(length), STREAM_TIMEOUT)
                self.received(data, stream=True)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.dropped["truncated"] += 1
        except (TimeoutError, OSError):
            self.dropped["stream_error"] += 1
        finally:
            writer.close()

    # -- sending -------------------------------------------------------------------

    def send(self, address: str, packet: Packet, *, reliable: bool) -> None:
        if address in self.blocked:
            self.dropped["partitioned"] += 1
            return
        data = self.codec.encode(packet)
        if reliable:
            task = asyncio.create_task(self._send_stream(address, data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if len(data) > self.codec.max_bytes:
            self.counters["oversize_not_sent"] += 1
            return
        host, port = split_address(address)
        if self._udp is None or not is_ip(host):
            # Members advertise IP addresses; a name here is a misconfiguration.
            self.counters["send_errors"] += 1
            return
        self.counters["packets_out"] += 1
        self.counters["bytes_out"] += len(data)
        self._udp.sendto(data, (host, port))

    async def _send_stream(self, address: str, data: bytes) -> None:
        host, port = split_address(address)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), STREAM_TIMEOUT
            )
        except (OSError, TimeoutError):
            self.counters["stream_connect_errors"] += 1
            return
        try:
            writer.write(FRAME.pack(len(data)) + data)
            await asyncio.wait_for(writer.drain(), STREAM_TIMEOUT)
            self.counters["streams_out"] += 1
            self.counters["bytes_out"] += len(data)
        except (OSError, TimeoutError):
            self.counters["send_errors"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
