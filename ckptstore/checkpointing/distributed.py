"""Collectives between the processes of one training job, as Determined's
``core_context.distributed``.

With ``size == 1`` nothing touches the network. Otherwise rank 0 (the chief) listens on
``chief_ip:port`` and every worker connects to it: a small TCP star on which objects travel as
JSON in length-prefixed frames (never pickle, so a peer cannot make another run code).

Example::

    from ckptstore.checkpointing.distributed import ProcessGroup

    # in each of 2 processes, with RANK set to 0 or 1:
    dist = ProcessGroup(rank=int(os.environ["RANK"]), size=2, port=29411)
    uuids = dist.allgather(my_value)     # the same list on every rank
    dist.close()
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time
from typing import Any

from ckptstore import errors

logger = logging.getLogger(__name__)

#: The port the chief listens on when none is given (``CKPTSTORE_DIST_PORT`` overrides it).
DEFAULT_PORT = 29411
_HEADER = struct.Struct(">I")
_MAX_FRAME = 1 << 30


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj, allow_nan=True).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise errors.CkptstoreError(
                "A peer of the distributed job closed its connection; another rank probably "
                "crashed. Check the logs of the other workers."
            )
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > _MAX_FRAME:
        raise errors.CkptstoreError(f"Refusing a {length}-byte frame from a distributed peer.")
    return json.loads(_recv_exact(sock, length))


class ProcessGroup:
    """Rank information and collectives (``allgather``, ``gather``, ``broadcast`` and their
    ``_local`` variants) for one process of a job of ``size`` processes.

    Every rank must call the same collectives in the same order. Objects must be
    JSON-serializable (tuples arrive as lists).

    Args:
        rank: this process's rank, ``0 <= rank < size``; rank 0 is the chief.
        size: the number of processes.
        local_rank: rank on this machine (default: ``rank``).
        local_size: the number of processes on this machine (default: ``size``).
        cross_rank: this machine's index (default: 0).
        cross_size: the number of machines (default: 1).
        chief_ip: the address rank 0 listens on and the others connect to.
        port: the chief's port (default ``CKPTSTORE_DIST_PORT`` or 29411).
        timeout: seconds to wait for all peers to connect. Collectives then wait as long as
            the slowest rank needs (a rank that dies closes its socket, which is detected).

    Example::

        dist = ProcessGroup(rank=0, size=1)
        assert dist.allgather("x") == ["x"]
    """

    def __init__(
        self,
        rank: int,
        size: int,
        local_rank: int | None = None,
        local_size: int | None = None,
        cross_rank: int | None = None,
        cross_size: int | None = None,
        chief_ip: str = "127.0.0.1",
        port: int | None = None,
        timeout: float = 300.0,
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise errors.InvalidConfig(f"size must be a positive int. Received: size={size!r}")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise errors.InvalidConfig(
                f"rank must be an int in [0, size={size}). Received: rank={rank!r}"
            )
        self.rank = rank
        self.size = size
        self.local_rank = rank if local_rank is None else local_rank
        self.local_size = size if local_size is None else local_size
        self.cross_rank = 0 if cross_rank is None else cross_rank
        self.cross_size = 1 if cross_size is None else cross_size
        self.chief_ip = chief_ip
        self.port = (
            port if port is not None else int(os.environ.get("CKPTSTORE_DIST_PORT", DEFAULT_PORT))
        )
        self.timeout = timeout
        self._lock = threading.RLock()
        self._server: socket.socket | None = None
        self._peers: dict[int, socket.socket] = {}  # chief: rank -> socket
        self._chief: socket.socket | None = None  # worker: socket to the chief
        self._closed = False

    @classmethod
    def single(cls) -> ProcessGroup:
        """A context for one process (no sockets)."""
        return cls(rank=0, size=1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"

    # ---- Determined's getters ----------------------------------------------------------------
    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_size(self) -> int:
        return self.local_size

    def get_cross_rank(self) -> int:
        return self.cross_rank

    def get_cross_size(self) -> int:
        return self.cross_size

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    # ---- connection --------------------------------------------------------------------------
    def _connect(self) -> None:
        if self._closed:
            raise errors.CkptstoreError("This ProcessGroup was closed; create a new one.")
        if self.size == 1 or self._server is not None or self._chief is not None:
            return
        if self.rank == 0:
            self._accept_workers()
        else:
            self._connect_to_chief()

    def _accept_workers(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.chief_ip, self.port))
        except OSError as exc:
            server.close()
            raise errors.CkptstoreError(
                f"The chief could not listen on {self.chief_ip}:{self.port} ({exc}); pick a "
                "free port with port= or CKPTSTORE_DIST_PORT."
            ) from None
        server.listen(self.size)
        server.settimeout(self.timeout)
        self._server = server
        while len(self._peers) < self.size - 1:
            try:
                conn, _addr = server.accept()
            except TimeoutError:
                raise errors.CkptstoreError(
                    f"Only {len(self._peers)} of {self.size - 1} workers connected to "
                    f"{self.chief_ip}:{self.port} within {self.timeout:.0f}s; check that every "
                    "rank started and uses the same chief_ip and port."
                ) from None
            conn.settimeout(self.timeout)  # for the hello only
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _recv(conn)
            peer_rank = hello.get("rank") if isinstance(hello, dict) else None
            if (
                not isinstance(peer_rank, int)
                or not 0 < peer_rank < self.size
                or peer_rank in self._peers
                or hello.get("size") != self.size
            ):
                conn.close()
                logger.warning("Rejected a distributed peer with hello %r.", hello)
                continue
            conn.settimeout(None)  # collectives wait as long as the slowest rank needs
            self._peers[peer_rank] = conn
        logger.debug("Chief connected to %d workers.", len(self._peers))

    def _connect_to_chief(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock = socket.create_connection((self.chief_ip, self.port), timeout=self.timeout)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise errors.CkptstoreError(
                        f"Rank {self.rank} could not connect to the chief at "
                        f"{self.chief_ip}:{self.port} within {self.timeout:.0f}s ({exc}); check "
                        "that rank 0 is running and reachable."
                    ) from None
                time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # collectives wait as long as the slowest rank needs
        _send(sock, {"rank": self.rank, "size": self.size})
        self._chief = sock

    # ---- collectives -------------------------------------------------------------------------
    # Collectives take ``stuff``, Determined's parameter name, so keyword calls work too.
    def gather(self, stuff: Any) -> list[Any] | None:
        """Every rank's ``stuff`` in rank order on the chief; None on the other ranks."""
        with self._lock:
            if self.size == 1:
                return [stuff]
            self._connect()
            if self.rank == 0:
                return [stuff] + [_recv(self._peers[r]) for r in range(1, self.size)]
            assert self._chief is not None
            _send(self._chief, stuff)
            return None

    def broadcast(self, stuff: Any) -> Any:
        """The chief's ``stuff`` on every rank (others' arguments are ignored)."""
        with self._lock:
            if self.size == 1:
                return stuff
            self._connect()
            if self.rank == 0:
                for r in range(1, self.size):
                    _send(self._peers[r], stuff)
                return stuff
            assert self._chief is not None
            return _recv(self._chief)

    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank's ``stuff`` in rank order, on every rank."""
        with self._lock:
            return self.broadcast(self.gather(stuff))

    def barrier(self) -> None:
        """Return once every rank has reached this call."""
        self.allgather(None)

    def allgather_local(self, stuff: Any) -> list[Any]:
        """The ``stuff`` of every rank on this machine, in local-rank order."""
        items = self.allgather([self.cross_rank, self.local_rank, stuff])
        mine = sorted((lr, o) for cr, lr, o in items if cr == self.cross_rank)
        return [o for _lr, o in mine]

    def gather_local(self, stuff: Any) -> list[Any] | None:
        """Like :meth:`allgather_local` but only the local chief gets the list."""
        items = self.allgather_local(stuff)
        return items if self.local_rank == 0 else None

    def broadcast_local(self, stuff: Any = None) -> Any:
        """The ``stuff`` of local rank 0 of this machine, on every rank of this machine."""
        items = self.allgather([self.cross_rank, self.local_rank, stuff])
        for cr, lr, o in items:
            if cr == self.cross_rank and lr == 0:
                return o
        raise errors.CkptstoreError(
            f"No rank has local_rank 0 on machine cross_rank={self.cross_rank}; check the "
            "local_rank/cross_rank given to every ProcessGroup."
        )

    def close(self) -> None:
        """Close the sockets. Idempotent."""
        with self._lock:
            self._closed = True
            for sock in [*self._peers.values(), self._chief, self._server]:
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass
            self._peers.clear()
            self._chief = None
            self._server = None

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DummyDistributed(ProcessGroup):
    """The one-process context: rank 0 of 1, collectives return at once.

    Example::

        assert DummyDistributed().broadcast(3) == 3
    """

    def __init__(self) -> None:
        super().__init__(rank=0, size=1)
