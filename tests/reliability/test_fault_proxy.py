"""The fault proxy itself, against a tiny keep-alive HTTP/1.1 server on loopback."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import socket
import threading
import time

import pytest

from tests.servers.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _reply(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # /bytes/N -> N deterministic bytes
        self.seen.append(f"GET {self.path}")
        n = int(self.path.rsplit("/", 1)[1])
        self._reply(_payload(n))

    def do_HEAD(self) -> None:
        self.seen.append(f"HEAD {self.path}")
        self._reply(b"")

    def do_PUT(self) -> None:  # answers the sha256 of the body it received
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if len(body) == int(self.headers.get("Content-Length", len(body))):
            self.seen.append(f"PUT {self.path}")
        self._reply(hashlib.sha256(body).hexdigest().encode())


def _payload(n: int) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n]


@pytest.fixture()
def upstream():
    _Handler.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture()
def proxy(upstream):
    p = FaultProxy("127.0.0.1", upstream.server_address[1], max_stall_s=20).start()
    yield p
    p.stop()


def _conn(proxy: FaultProxy, timeout: float = 10) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)


def _get(conn: http.client.HTTPConnection, n: int) -> tuple[int, bytes]:
    conn.request("GET", f"/bytes/{n}")
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_listens_on_loopback_only(proxy):
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"
    assert proxy._server.sockets[0].getsockname()[0] == "127.0.0.1"


def test_passthrough_keeps_alive_and_counts_requests(proxy, upstream):
    conn = _conn(proxy)
    assert _get(conn, 100_000) == (200, _payload(100_000))
    body = b"x" * 300_000
    conn.request("PUT", "/obj", body=body)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == hashlib.sha256(body).hexdigest().encode()
    conn.request("PUT", "/chunked", body=iter([b"ab", b"cd" * 5000]), encode_chunked=True)
    resp = conn.getresponse()
    assert resp.read() == hashlib.sha256(b"ab" + b"cd" * 5000).hexdigest().encode()
    conn.request("HEAD", "/head")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    assert _get(conn, 10) == (200, _payload(10))
    conn.close()
    stats = proxy.stats
    assert stats["connections"] == 1
    assert stats["requests"] == 5
    assert sum(stats["faults"].values()) == 0
    assert len(_Handler.seen) == 5


def test_http_error_burst_is_answered_without_forwarding(proxy):
    proxy.fail_next(2, status=503)
    statuses = []
    for _ in range(3):
        conn = _conn(proxy)
        conn.request("PUT", "/obj", body=b"payload")
        resp = conn.getresponse()
        statuses.append(resp.status)
        resp.read()
        conn.close()
    assert statuses == [503, 503, 200]
    assert _Handler.seen == ["PUT /obj"]  # the two failed requests never reached the server
    assert proxy.stats["faults"]["http"] == 2


def test_http_500_on_keep_alive_closes_connection(proxy):
    conn = _conn(proxy)
    assert _get(conn, 10)[0] == 200
    proxy.fail_next(1, status=500)
    status, body = _get(conn, 10)
    assert status == 500 and b"Injected" in body
    # http.client reconnects transparently for the next request on a closed connection.
    assert _get(conn, 10) == (200, _payload(10))
    assert proxy.stats["connections"] == 2


def test_expect_100_continue_gets_error_before_body(proxy):
    proxy.fail_next(1, status=503)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(
            b"PUT /obj HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 503 ")
    assert _Handler.seen == []


def test_reset_after_bytes_truncates_the_response(proxy):
    proxy.reset_next(1, after_bytes=5000)
    conn = _conn(proxy)
    with pytest.raises((ConnectionError, http.client.IncompleteRead, http.client.HTTPException)):
        status, body = _get(conn, 1_000_000)
    conn.close()
    assert proxy.stats["faults"]["reset"] == 1
    assert proxy.stats["bytes"] <= 5000
    # the next request goes through untouched
    conn = _conn(proxy)
    assert _get(conn, 1000) == (200, _payload(1000))


def test_reset_during_upload(proxy):
    proxy.reset_next(1, after_bytes=2000)
    conn = _conn(proxy)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        conn.request("PUT", "/big", body=b"z" * 2_000_000)
        conn.getresponse().read()
    assert proxy.stats["faults"]["reset"] == 1
    assert _Handler.seen == []  # the server never got a whole request


def test_stall_holds_until_client_timeout_then_releases(proxy):
    proxy.stall_next(1, after_bytes=3000)
    conn = _conn(proxy, timeout=0.5)
    with pytest.raises((TimeoutError, socket.timeout)):
        _get(conn, 1_000_000)
    conn.close()
    assert proxy.stats["faults"]["stall"] == 1
    proxy.release_stalls()
    assert _get(_conn(proxy), 100) == (200, _payload(100))


def test_stop_ends_stalled_connections(upstream):
    proxy = FaultProxy("127.0.0.1", upstream.server_address[1], max_stall_s=600).start()
    proxy.stall_next(5)
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    sock.sendall(b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\n\r\n")
    while proxy.stats["faults"]["stall"] == 0:
        time.sleep(0.01)
    proxy.stop()  # must not wait for max_stall_s
    assert sock.recv(100) == b""  # closed, no bytes
    sock.close()
    assert not any(t.name == "fault-proxy" for t in threading.enumerate())


def test_throttle_delivers_intact_data_slowly(proxy):
    proxy.throttle(200_000)
    start = time.monotonic()
    assert _get(_conn(proxy), 40_000) == (200, _payload(40_000))
    # a lower bound only (the proxy sleeps at least bytes/rate); never an upper bound
    assert time.monotonic() - start >= 40_000 / 200_000 * 0.9
    assert proxy.stats["throttle_sleeps"] >= 4
    proxy.throttle(None)
    with pytest.raises(ValueError, match="bytes_per_s"):
        proxy.throttle(0)


def _outcomes(proxy: FaultProxy, n: int) -> list[str]:
    out = []
    for _ in range(n):
        conn = _conn(proxy, timeout=5)
        try:
            status, body = _get(conn, 20_000)
            out.append("ok" if status == 200 and body == _payload(20_000) else str(status))
        except (ConnectionError, http.client.HTTPException):
            out.append("reset")
        finally:
            conn.close()
    return out


def test_random_faults_are_reproducible_with_a_seed(upstream):
    runs = []
    for _ in range(2):
        with FaultProxy("127.0.0.1", upstream.server_address[1]) as proxy:
            proxy.random_faults(0.5, seed=1234, kinds=("http", "reset"), max_after_bytes=4000)
            runs.append(_outcomes(proxy, 20))
    assert runs[0] == runs[1]
    assert {"ok", "503", "reset"} <= set(runs[0])
    with pytest.raises(ValueError, match="p must be"):
        FaultProxy("127.0.0.1", 1).random_faults(2.0)


def test_clear_drops_pending_faults(proxy):
    proxy.fail_next(10)
    proxy.random_faults(1.0)
    proxy.clear()
    assert _get(_conn(proxy), 10) == (200, _payload(10))


def test_upstream_down_closes_client(upstream):
    port = upstream.server_address[1]
    upstream.shutdown()
    upstream.server_close()
    with FaultProxy("127.0.0.1", port) as proxy:
        conn = _conn(proxy, timeout=5)
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            _get(conn, 10)


def test_faults_aimed_at_matching_requests(proxy):
    proxy.fail_next(1, status=500, match="PUT /target")
    conn = _conn(proxy)
    assert _get(conn, 10) == (200, _payload(10))  # not matching: forwarded
    conn.request("PUT", "/other", body=b"a")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read()
    assert proxy.pending == 1
    conn.request("PUT", "/target", body=b"a")
    resp = conn.getresponse()
    assert resp.status == 500 and resp.read()
    assert proxy.pending == 0


def test_reset_in_response_after_the_server_acted(proxy):
    proxy.reset_next(1, after_bytes=0, match="PUT ", in_response=True)
    conn = _conn(proxy)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        conn.request("PUT", "/acted", body=b"q" * 1000)
        conn.getresponse().read()
    assert _Handler.seen == ["PUT /acted"]  # the server got the whole request
    assert proxy.stats["faults"]["reset"] == 1
