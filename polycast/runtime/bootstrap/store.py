"""A small TCP key-value store for rendezvous (the role of torch's TCPStore).

The master rank runs :class:`StoreServer` (one thread, non-blocking sockets under a
selector); every rank talks to it with :class:`StoreClient`. Keys are strings, values
bytes. ``wait`` parks the request on the server until the key is set, so nobody polls.
Every client call is bounded by a timeout and raises :class:`CollectiveTimeout` naming the
key it waited for.

Every connection starts with the challenge-response of :mod:`polycast.runtime.bootstrap.auth` (keyed
by the job secret, or by a public key without one): a client that fails it is refused and
counted (:attr:`StoreServer.refused`). Then, both directions: ``!BII`` (op or status, key
length, value length), key, value, and a 16-byte MAC of the frame under the connection's
session key and a per-direction counter (a forged, altered or replayed frame ends the
connection and is counted in :attr:`StoreServer.bad_frames`).
"""

from __future__ import annotations

import errno
import hmac
import secrets
import selectors
import socket
import struct
import threading
import time

from ...errors import CollectiveTimeout, InvalidArgument, PolycastError
from . import auth

_HDR = struct.Struct("!BII")
OP_SET, OP_GET, OP_WAIT, OP_ADD = 1, 2, 3, 4
ST_OK, ST_MISSING = 0, 1
MAX_VALUE_NBYTES = 1 << 24


class PortInUse(PolycastError):
    """The rendezvous (or another listening) port is already taken."""


def store_key(secret: bytes | None) -> bytes:
    return auth.derive(secret, "store")


def _frame_mac(session: bytes, direction: bytes, counter: int, frame) -> bytes:
    return auth.mac(session, direction, counter.to_bytes(8, "big"), frame)


class _Conn:
    """Server-side state of one client connection."""
    __slots__ = ("nonce", "session", "buf", "rx", "tx")

    def __init__(self, nonce: bytes) -> None:
        self.nonce = nonce
        self.session: bytes | None = None       # set once the client proved the key
        self.buf = bytearray()
        self.rx = self.tx = 0                   # frames received / sent (MAC counters)


class StoreServer:
    """Serves the store on ``(host, port)`` from a daemon thread until :meth:`close`.
    ``secret``: the job's master key (:func:`polycast.runtime.bootstrap.auth.secret_from_env`)."""

    def __init__(self, host: str, port: int, secret: bytes | None = None) -> None:
        self._key = store_key(secret)
        self.refused = 0            # clients that failed the handshake
        self.bad_frames = 0         # frames with a wrong MAC or malformed (connection ended)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"rendezvous port {host}:{port} is already in use (another job, or a "
                    "previous run still shutting down): choose another MASTER_PORT / "
                    "POLYCAST_MASTER_PORT (`polycast run --port`)") from None
            raise PolycastError(f"cannot listen on {host}:{port} for rendezvous: {exc}") from None
        self._sock.listen(256)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._data: dict[str, bytes] = {}
        self._waiters: dict[str, list[socket.socket]] = {}
        self._conns: dict[socket.socket, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="polycast-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()
        self._wake_w.close()

    # -- server loop -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=1.0):
                sock = key.fileobj
                if sock is self._sock:
                    self._accept()
                elif sock is self._wake_r:
                    sock.recv(64)
                else:
                    self._readable(sock)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(True)      # replies are small: a blocking sendall is brief
            conn.settimeout(5.0)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state = _Conn(secrets.token_bytes(auth.NONCE_NBYTES))
            try:
                conn.sendall(state.nonce)       # the challenge
            except OSError:
                conn.close()
                continue
            self._conns[conn] = state
            self._sel.register(conn, selectors.EVENT_READ)

    def _drop(self, conn: socket.socket) -> None:
        self._sel.unregister(conn)
        self._conns.pop(conn, None)
        for lst in self._waiters.values():
            while conn in lst:
                lst.remove(conn)
        conn.close()

    def _readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        state = self._conns[conn]
        buf = state.buf
        buf += data
        if state.session is None and not self._authenticate(conn, state):
            return
        while len(buf) >= _HDR.size:
            op, klen, vlen = _HDR.unpack_from(buf)
            if vlen > MAX_VALUE_NBYTES or klen > 4096:
                self.bad_frames += 1
                self._drop(conn)
                return
            end = _HDR.size + klen + vlen
            if len(buf) < end + auth.MAC_NBYTES:
                return
            want = _frame_mac(state.session, b"c", state.rx, memoryview(buf)[:end])
            if not hmac.compare_digest(want, bytes(buf[end:end + auth.MAC_NBYTES])):
                self.bad_frames += 1
                self._drop(conn)
                return
            state.rx += 1
            try:
                key = bytes(buf[_HDR.size:_HDR.size + klen]).decode()
            except UnicodeDecodeError:
                self.bad_frames += 1
                self._drop(conn)
                return
            value = bytes(buf[_HDR.size + klen:end])
            del buf[:end + auth.MAC_NBYTES]
            try:
                self._handle(conn, op, key, value)
            except ValueError:          # e.g. ADD of a value that is not a number
                self.bad_frames += 1
                self._drop(conn)
                return
            if conn not in self._conns:
                return

    def _authenticate(self, conn: socket.socket, state: _Conn) -> bool:
        """The client's answer to the challenge: its nonce and proof. False until it is
        complete and right (a wrong one ends the connection)."""
        n = auth.NONCE_NBYTES + auth.MAC_NBYTES
        if len(state.buf) < n:
            return False
        theirs = bytes(state.buf[:auth.NONCE_NBYTES])
        proof = bytes(state.buf[auth.NONCE_NBYTES:n])
        del state.buf[:n]
        if not hmac.compare_digest(proof, auth.mac(self._key, b"client", b"store",
                                                        state.nonce, theirs)):
            self.refused += 1
            try:
                conn.sendall(b"\0" * auth.MAC_NBYTES)
            except OSError:
                pass
            self._drop(conn)
            return False
        try:
            conn.sendall(auth.mac(self._key, b"server", b"store", theirs, state.nonce))
        except OSError:
            self._drop(conn)
            return False
        state.session = auth.derive(self._key, "session", b"store", state.nonce, theirs)
        return True

    def _reply(self, conn: socket.socket, status: int, key: str, value: bytes) -> None:
        state = self._conns.get(conn)
        if state is None:
            return
        k = key.encode()
        frame = _HDR.pack(status, len(k), len(value)) + k + value
        try:
            conn.sendall(frame + _frame_mac(state.session, b"s", state.tx, frame))
            state.tx += 1
        except OSError:
            pass

    def _handle(self, conn: socket.socket, op: int, key: str, value: bytes) -> None:
        if op == OP_SET:
            self._data[key] = value
            for waiter in self._waiters.pop(key, []):
                self._reply(waiter, ST_OK, key, value)
            self._reply(conn, ST_OK, key, b"")
        elif op == OP_GET:
            if key in self._data:
                self._reply(conn, ST_OK, key, self._data[key])
            else:
                self._reply(conn, ST_MISSING, key, b"")
        elif op == OP_WAIT:
            if key in self._data:
                self._reply(conn, ST_OK, key, self._data[key])
            else:
                self._waiters.setdefault(key, []).append(conn)
        elif op == OP_ADD:
            new = int(self._data.get(key, b"0")) + int(value)
            self._data[key] = str(new).encode()
            self._reply(conn, ST_OK, key, self._data[key])
            for waiter in self._waiters.pop(key, []):
                self._reply(waiter, ST_OK, key, self._data[key])
        else:
            self._drop(conn)


class StoreClient:
    """Blocking client; connects (retrying until ``timeout_seconds``) on construction."""

    def __init__(self, host: str, port: int, timeout_seconds: float = 60.0,
                 secret: bytes | None = None) -> None:
        if timeout_seconds <= 0:
            raise InvalidArgument(f"timeout_seconds must be > 0, got {timeout_seconds}")
        self.host, self.port, self.timeout_seconds = host, port, timeout_seconds
        deadline = time.monotonic() + timeout_seconds
        delay = 0.01
        while True:
            try:
                self._sock = socket.create_connection(
                    (host, port), timeout=max(0.05, min(2.0, deadline - time.monotonic())))
                break
            except OSError as exc:
                if time.monotonic() + delay >= deadline:
                    raise CollectiveTimeout(
                        f"rendezvous: could not reach the store at {host}:{port} within "
                        f"{timeout_seconds:g} s ({exc}); is the master rank running and "
                        "MASTER_ADDR/MASTER_PORT right?") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(max(0.05, min(10.0, deadline - time.monotonic())))
        try:
            self._session = auth.connect_handshake(self._sock, store_key(secret), b"store")
        except (auth.AuthenticationFailed, OSError) as exc:
            self._sock.close()
            raise auth.AuthenticationFailed(
                f"rendezvous: the store at {host}:{port} refused this rank or could not "
                f"prove it belongs to this job: {auth.ENV} must be set to the same value on "
                f"every rank, or on none ({exc})") from None
        self._rx = self._tx = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, op: int, key: str, value: bytes, timeout: float | None) -> tuple[int, bytes]:
        k = key.encode()
        timeout = self.timeout_seconds if timeout is None else timeout
        with self._lock:
            self._sock.settimeout(timeout)
            try:
                frame = _HDR.pack(op, len(k), len(value)) + k + value
                self._sock.sendall(frame + _frame_mac(self._session, b"c", self._tx, frame))
                self._tx += 1
                hdr = self._recv_exact(_HDR.size)
                status, klen, vlen = _HDR.unpack(hdr)
                if vlen > MAX_VALUE_NBYTES or klen > 4096:
                    self._sock.close()
                    raise PolycastError(f"rendezvous: the store at {self.host}:{self.port} "
                                        f"sent a malformed reply ({klen}, {vlen} bytes)")
                body = self._recv_exact(klen + vlen)
                proof = self._recv_exact(auth.MAC_NBYTES)
                if not hmac.compare_digest(
                        proof, _frame_mac(self._session, b"s", self._rx, hdr + body)):
                    self._sock.close()
                    raise auth.AuthenticationFailed(
                        f"rendezvous: a reply from the store at {self.host}:{self.port} "
                        "failed its MAC (altered or not from the store)")
                self._rx += 1
            except (socket.timeout, TimeoutError):
                # The reply may still come: this connection is out of step now.
                self._sock.close()
                raise CollectiveTimeout(
                    f"rendezvous: key {key!r} not available from the store at "
                    f"{self.host}:{self.port} within {timeout:g} s (a rank did not arrive?)"
                ) from None
            except OSError as exc:
                raise PolycastError(f"rendezvous store at {self.host}:{self.port} "
                                    f"failed: {exc}") from None
        return status, body[klen:]

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            r = self._sock.recv_into(view[got:])
            if r == 0:
                raise OSError("connection closed by the store")
            got += r
        return bytes(buf)

    def set(self, key: str, value: bytes | str) -> None:
        if isinstance(value, str):
            value = value.encode()
        self._call(OP_SET, key, bytes(value), None)

    def get(self, key: str) -> bytes | None:
        """The value, or None if the key is not set (never waits)."""
        status, value = self._call(OP_GET, key, b"", None)
        return value if status == ST_OK else None

    def wait(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for some rank to set it."""
        _, value = self._call(OP_WAIT, key, b"", timeout)
        return value

    def add(self, key: str, amount: int = 1) -> int:
        _, value = self._call(OP_ADD, key, str(int(amount)).encode(), None)
        return int(value)
