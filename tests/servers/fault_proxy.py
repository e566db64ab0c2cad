"""A small fault-injecting HTTP/1.1 TCP proxy on loopback, for reliability tests.

It sits between ckptstore and an emulator (moto S3, Azurite, ...) and forwards bytes both ways.
It understands just enough HTTP/1.1 to find request boundaries on keep-alive connections
(``Content-Length`` and ``chunked`` request bodies), so faults can be aimed at *requests*:

- ``fail_next(k, status=503)``: answer the next ``k`` requests with a canned HTTP error without
  forwarding them, then close that connection;
- ``reset_next(k, after_bytes=n)``: reset (TCP RST) the connection once ``n`` bytes of the next
  ``k`` requests' exchange (request + response, both directions) went through;
- ``stall_next(k, after_bytes=n)``: after ``n`` bytes, hold the connection open and move no
  more bytes (until :meth:`FaultProxy.release_stalls`, :meth:`FaultProxy.stop` or
  ``max_stall_s``);
- ``throttle(bytes_per_s)``: a slow link in both directions;
- ``random_faults(p, seed=...)``: each request gets one of the faults above with probability
  ``p``, drawn from a seeded RNG (same seed + same request order = same faults).

The proxy runs its own asyncio event loop in a daemon thread, listens on ``127.0.0.1`` on a free
port, and every loop in it ends: stalls are bounded by ``max_stall_s`` and :meth:`stop` cancels
every connection.

Example::

    proxy = FaultProxy("127.0.0.1", 5000).start()
    try:
        proxy.fail_next(3, status=503)
        os.environ["AWS_ENDPOINT_URL"] = proxy.url   # ckptstore now talks through the proxy
        ...
    finally:
        proxy.stop()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import random
import socket
import struct
import threading
from typing import Any

__all__ = ["FaultProxy", "Fault"]

_DEFAULT_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>Injected by the ckptstore test fault proxy</Message></Error>"
)
_REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
_CHUNK = 64 * 1024
_MAX_HEAD = 1 << 20


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault aimed at one request: kind is ``"http"``, ``"reset"`` or ``"stall"``."""

    kind: str
    status: int = 503
    after_bytes: int = 0
    #: Only requests whose request line (``b"PUT /bucket/key HTTP/1.1"``) contains this.
    match: bytes | None = None
    #: Count ``after_bytes`` from the end of the request (the server got all of it), so the
    #: fault hits the response: "the request succeeded but the answer was lost".
    in_response: bool = False


class _Reset(Exception):
    """Abort the connection with a TCP RST."""


class _Close(Exception):
    """Close the connection gracefully (after a canned response or a stall)."""


class _Conn:
    def __init__(self, cid: int) -> None:
        self.id = cid
        self.bytes = 0
        self.fault: Fault | None = None
        self.fault_at = 0
        self.stalled = False
        self.client_writer: asyncio.StreamWriter | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None


class FaultProxy:
    """A loopback TCP proxy to ``upstream_host:upstream_port`` with switchable faults.

    Args:
        upstream_host: host of the real server (loopback).
        upstream_port: port of the real server.
        max_stall_s: the longest a stalled connection is held before it is closed.

    Example::

        with FaultProxy("127.0.0.1", 9000) as proxy:
            proxy.reset_next(1, after_bytes=4096)
            requests_through(proxy.url)
            assert proxy.stats["faults"]["reset"] == 1
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, max_stall_s: float = 60.0):
        self.upstream_host = upstream_host
        self.upstream_port = int(upstream_port)
        self.max_stall_s = float(max_stall_s)
        self.port = 0
        self._lock = threading.Lock()
        self._queue: collections.deque[Fault] = collections.deque()
        self._rate: float | None = None
        self._random_p = 0.0
        self._random_kinds: tuple[Fault, ...] = ()
        self._rng = random.Random(0)
        self._stats: dict[str, Any] = {}
        self._reset_stats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._release: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._next_id = 0

    # ---- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` of the proxy."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        """Listen on a free loopback port in a daemon thread; returns self."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._release = asyncio.Event()
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, "127.0.0.1", 0, limit=_MAX_HEAD)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # pragma: no cover - start-up failure
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if error:
            raise RuntimeError(f"fault proxy could not start: {error[0]!r}")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            if self._release is not None:
                self._release.set()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)
            if self._server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._server.wait_closed(), 5)

        if loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(shutdown(), loop)
            with contextlib.suppress(Exception):
                fut.result(15)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
        self._thread = None
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- fault controls (thread-safe) ------------------------------------------------------------
    def fail_next(self, count: int = 1, status: int = 503, *, match: str | None = None) -> None:
        """Answer the next ``count`` requests with HTTP ``status`` (not forwarded). With
        ``match``, only requests whose request line contains it (e.g. ``"PUT "`` or a key)."""
        self._enqueue(count, Fault("http", status=status, match=_b(match)))

    def reset_next(
        self,
        count: int = 1,
        after_bytes: int = 0,
        *,
        match: str | None = None,
        in_response: bool = False,
    ) -> None:
        """Reset the connection after ``after_bytes`` bytes of each of the next ``count``
        (matching) requests' exchange (request + response). With ``in_response`` the bytes
        are counted from the end of the request: the server acted on it, the answer is lost."""
        fault = Fault("reset", after_bytes=after_bytes, match=_b(match), in_response=in_response)
        self._enqueue(count, fault)

    def stall_next(self, count: int = 1, after_bytes: int = 0, *, match: str | None = None) -> None:
        """Stop moving bytes after ``after_bytes`` bytes of each of the next ``count``
        (matching) requests' exchange; the connection stays open until released."""
        self._enqueue(count, Fault("stall", after_bytes=after_bytes, match=_b(match)))

    def _enqueue(self, count: int, fault: Fault) -> None:
        with self._lock:
            self._queue.extend(fault for _ in range(count))

    @property
    def pending(self) -> int:
        """Queued faults not yet used."""
        with self._lock:
            return len(self._queue)

    def throttle(self, bytes_per_s: float | None) -> None:
        """Limit every connection to ``bytes_per_s`` in each direction (None: unlimited)."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be > 0 or None. Received: {bytes_per_s!r}")
        with self._lock:
            self._rate = bytes_per_s

    def random_faults(
        self,
        p: float,
        *,
        seed: int = 0,
        kinds: tuple[str, ...] = ("http", "reset"),
        status: int = 503,
        max_after_bytes: int = 8192,
    ) -> None:
        """Give each request a fault with probability ``p`` (a seeded RNG picks which)."""
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1]. Received: p={p!r}")
        with self._lock:
            self._rng = random.Random(seed)
            self._random_p = p
            self._random_kinds = tuple(
                Fault(k, status=status, after_bytes=max_after_bytes) for k in kinds
            )

    def clear(self) -> None:
        """Drop queued and random faults and the throttle; release stalled connections."""
        with self._lock:
            self._queue.clear()
            self._random_p = 0.0
            self._rate = None
        self.release_stalls()

    def release_stalls(self) -> None:
        """Let every stalled connection go (it is closed)."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None and loop.is_running():

            def rearm() -> None:
                event.set()
                self._release = asyncio.Event()

            loop.call_soon_threadsafe(rearm)

    @property
    def stats(self) -> dict[str, Any]:
        """A copy of the counters: connections, requests, bytes, faults (by kind)."""
        with self._lock:
            out = dict(self._stats)
            out["faults"] = collections.Counter(self._stats["faults"])
            return out

    def reset_stats(self) -> None:
        """Zero every counter."""
        with self._lock:
            self._reset_stats()

    def _reset_stats(self) -> None:
        self._stats = {
            "connections": 0,
            "requests": 0,
            "bytes": 0,
            "throttle_sleeps": 0,
            "faults": collections.Counter(),
        }

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _count_fault(self, kind: str) -> None:
        with self._lock:
            self._stats["faults"][kind] += 1

    def _fault_for_next_request(self, request_line: bytes) -> Fault | None:
        with self._lock:
            self._stats["requests"] += 1
            for i, fault in enumerate(self._queue):
                if fault.match is None or fault.match in request_line:
                    del self._queue[i]
                    return fault
            if self._random_p and self._random_kinds and self._rng.random() < self._random_p:
                fault = self._rng.choice(self._random_kinds)
                if fault.kind in ("reset", "stall"):
                    fault = dataclasses.replace(
                        fault, after_bytes=self._rng.randrange(0, fault.after_bytes + 1)
                    )
                return fault
            return None

    # ---- the connection handler ------------------------------------------------------------------
    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._next_id += 1
        conn = _Conn(self._next_id)
        conn.client_writer = cwriter
        self._count("connections")
        uwriter = None
        reset = False
        try:
            try:
                ureader, uwriter = await asyncio.wait_for(
                    asyncio.open_connection(
                        self.upstream_host, self.upstream_port, limit=_MAX_HEAD
                    ),
                    10,
                )
            except (OSError, asyncio.TimeoutError):
                return
            conn.upstream_writer = uwriter
            up = asyncio.ensure_future(self._pump_requests(conn, creader, uwriter, cwriter))
            down = asyncio.ensure_future(self._pump_raw(conn, ureader, cwriter))
            try:
                done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                up.cancel()
                down.cancel()
                raise
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(BaseException):
                    await t
            for t in done:
                if not t.cancelled() and isinstance(t.exception(), _Reset):
                    reset = True
        except asyncio.CancelledError:
            pass
        finally:
            for writer in (cwriter, uwriter):
                if writer is None:
                    continue
                if reset:
                    _abort_with_rst(writer)
                else:
                    with contextlib.suppress(Exception):
                        writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pump_raw(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                return
            await self._move(conn, data, writer)

    async def _pump_requests(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        uwriter: asyncio.StreamWriter,
        cwriter: asyncio.StreamWriter,
    ) -> None:
        """Forward requests one by one, deciding a fault for each at its start."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    await self._move(conn, exc.partial, uwriter)
                return
            except asyncio.LimitOverrunError:
                # Not HTTP as we know it: forward everything raw from here on.
                await self._pump_raw(conn, reader, uwriter)
                return
            method, length, chunked, expect = _parse_head(head)
            fault = self._fault_for_next_request(head.split(b"\r\n", 1)[0])
            conn.fault = None
            if fault is not None and fault.kind == "http":
                self._count_fault("http")
                if not expect:
                    await _drain_body(reader, length, chunked)
                await _send_canned(cwriter, fault.status, head_only=(method == "HEAD"))
                raise _Close()
            if fault is not None and not fault.in_response:
                conn.fault = fault
                conn.fault_at = conn.bytes + fault.after_bytes
            await self._move(conn, head, uwriter)
            if chunked:
                await self._forward_chunked(conn, reader, uwriter)
            else:
                remaining = length
                while remaining > 0:
                    data = await reader.read(min(_CHUNK, remaining))
                    if not data:
                        return
                    remaining -= len(data)
                    await self._move(conn, data, uwriter)
            if fault is not None and fault.in_response:
                # After Expect: 100-continue the body may still follow; count from here anyway.
                conn.fault = fault
                conn.fault_at = conn.bytes + fault.after_bytes

    async def _forward_chunked(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            line = await reader.readuntil(b"\r\n")
            await self._move(conn, line, writer)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = await reader.readuntil(b"\r\n")
                    await self._move(conn, trailer, writer)
                    if trailer == b"\r\n":
                        return
            remaining = size + 2  # data + CRLF
            while remaining > 0:
                data = await reader.read(min(_CHUNK, remaining))
                if not data:
                    return
                remaining -= len(data)
                await self._move(conn, data, writer)

    async def _move(self, conn: _Conn, data: bytes, writer: asyncio.StreamWriter) -> None:
        """Write ``data`` honouring the throttle and the connection's armed fault."""
        view = memoryview(data)
        if conn.stalled:
            await self._hold()
        while len(view):
            piece = view
            fault = conn.fault
            if fault is not None:
                room = conn.fault_at - conn.bytes
                if room <= 0:
                    await self._trigger(conn, fault)
                piece = view[:room]
            with self._lock:
                rate = self._rate
            if rate:
                step = max(1, int(rate / 20))
                piece = piece[:step]
                self._count("throttle_sleeps")
                await asyncio.sleep(len(piece) / rate)
            writer.write(bytes(piece))
            await writer.drain()
            conn.bytes += len(piece)
            self._count("bytes", len(piece))
            view = view[len(piece) :]
        fault = conn.fault
        if fault is not None and conn.bytes >= conn.fault_at and fault.kind == "reset":
            await self._trigger(conn, fault)

    async def _trigger(self, conn: _Conn, fault: Fault) -> None:
        conn.fault = None
        self._count_fault(fault.kind)
        if fault.kind == "reset":
            raise _Reset()
        conn.stalled = True
        await self._hold()

    async def _hold(self) -> None:
        """A stall: move nothing until released / stopped / ``max_stall_s``, then close."""
        release = self._release
        assert release is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(release.wait(), self.max_stall_s)
        raise _Close()


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _parse_head(head: bytes) -> tuple[str, int, bool, bool]:
    """(method, content length, chunked?, expects 100-continue?) of a request head."""
    lines = head.split(b"\r\n")
    method = lines[0].split(b" ", 1)[0].decode("latin-1", "replace").upper()
    length, chunked, expect = 0, False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"expect" and value == b"100-continue":
            expect = True
    return method, length, chunked, expect


async def _drain_body(reader: asyncio.StreamReader, length: int, chunked: bool) -> None:
    if chunked:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            await reader.readexactly(size + 2)
    remaining = length
    while remaining > 0:
        data = await reader.read(min(_CHUNK, remaining))
        if not data:
            return
        remaining -= len(data)


async def _send_canned(writer: asyncio.StreamWriter, status: int, *, head_only: bool) -> None:
    reason = _REASONS.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(_DEFAULT_BODY)}\r\n"
        "x-ms-error-code: ServerBusy\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    writer.write(head if head_only else head + _DEFAULT_BODY)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0 so the peer sees a connection reset, not a clean EOF."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
