"""The link between a rank and the offload process (and between the offload process and
a worker): two shared-memory rings, one per direction, and a Unix socket for doorbells
and liveness.

Frames are the rings' own (:class:`polycast.runtime.transport.shm.Ring`): the header part carries a
descriptor (:mod:`.descriptors`), the payload part optional bytes (a pickled schedule, an
error's text). A writer that finds the reader asleep sends one byte over the socket; a
reader that frees ring space a blocked writer waits for does the same. End of file on the
socket means the other process is gone: the one signal of death, so a blocked wait always
ends (every select is bounded as well).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading

from ...errors import InvalidArgument, PolycastError
from ..transport.shm import Ring

RING_NBYTES = 1 << 18           # descriptors are ~100 bytes; schedules travel in pieces
BELL = b"b"


def socket_name(master_addr: str, master_port: int) -> bytes:
    """The offload process's abstract socket for this job on this host (Linux's abstract
    namespace: no file to leak, one per network namespace)."""
    return f"\0polycast-offload-{os.getuid()}-{master_addr}-{master_port}".encode()


def check_platform() -> None:
    if not sys.platform.startswith("linux"):
        raise InvalidArgument("progress='offload' needs Linux (abstract Unix sockets, "
                              f"SO_PEERCRED); this is {sys.platform}")


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end; raises PolycastError unless it runs as
    this user (the socket's name is guessable; the secret travels over it)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid():
        raise PolycastError(f"offload socket peer (pid {pid}) runs as uid {uid}, not "
                            f"{os.getuid()}: refused")
    return pid


def send_line(sock: socket.socket, obj) -> None:
    """One JSON line (the hello and its answer, before the rings are in use)."""
    import json
    sock.sendall(json.dumps(obj).encode() + b"\n")


def recv_line(sock: socket.socket, timeout: float, limit: int = 1 << 20):
    import json
    import time
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer on the offload socket")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the other side closed the offload socket")
        data += chunk
        if len(data) > limit:
            raise PolycastError("offload hello too long")
    return json.loads(data)


class Channel:
    """One end: we write ``ring_out``, read ``ring_in``; ``sock`` carries doorbells.
    ``send`` may be called from any thread; ``poll`` and ``wait`` from one thread."""

    def __init__(self, sock: socket.socket, ring_out: Ring, ring_in: Ring) -> None:
        self.sock, self.ring_out, self.ring_in = sock, ring_out, ring_in
        sock.setblocking(False)
        self._wlock = threading.Lock()
        self.closed = False           # the other side is gone (EOF) or we closed

    # -- writing ------------------------------------------------------------------------
    def send(self, blob: bytes, payload: bytes = b"") -> None:
        with self._wlock:
            if self.closed:
                return
            views = [payload] if payload else []
            self.ring_out.enqueue(len(blob), blob, views, len(payload), None)
            self._flush_locked()

    def flush(self) -> None:
        """Write what a full ring held back (call when the reader rang)."""
        with self._wlock:
            if not self.closed and self.ring_out.want_write:
                self._flush_locked()

    def _flush_locked(self) -> None:
        _, bell = self.ring_out.flush()
        if bell:
            self.bell()

    def bell(self) -> None:
        try:
            self.sock.send(BELL)
        except (BlockingIOError, InterruptedError):
            pass                    # bells already pending: the reader will look
        except OSError:
            pass                    # gone: the reader side of this socket will see EOF

    # -- reading ------------------------------------------------------------------------
    def poll(self, max_frames: int = 64) -> list[tuple[bytes, bytes]]:
        """Descriptors waiting, as (descriptor, payload bytes)."""
        ring = self.ring_in
        if not ring.pending_input():
            if ring.want_bell:
                ring.want_bell = False
                self.bell()
            return []
        frames: list = []
        want = ring.poll(frames, max_frames)
        out = []
        for _, header, payload, _key in frames:
            out.append((header, bytes(payload) if payload is not None else b""))
        frames.clear()                  # views die here: their frames go back to the writer
        if want or ring.want_bell:
            ring.want_bell = False
            self.bell()
        return out

    def pending(self) -> bool:
        return self.ring_in.pending_input()

    def drain_socket(self) -> bool:
        """Read doorbells; False once the other side has closed."""
        while True:
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self.closed = True
                return False
            if not data:
                self.closed = True
                return False

    def wait(self, timeout: float) -> bool:
        """Sleep until input may be there, at most ``timeout`` seconds. False when the
        other side is gone."""
        ring = self.ring_in
        ring.set_sleeping(True)
        try:
            if ring.pending_input():
                return True
            try:
                ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            except (OSError, ValueError):
                self.closed = True
                return False
        finally:
            ring.set_sleeping(False)
        if ready:
            ok = self.drain_socket()
            self.flush()
            return ok
        return True

    def close(self) -> None:
        with self._wlock:
            self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        for ring in (self.ring_out, self.ring_in):
            try:
                ring.close()
            except Exception:           # noqa: BLE001 - closing on the way out
                pass
