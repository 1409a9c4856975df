"""Single-copy messages between processes on one host: Linux cross-memory attach (CMA).

A large DATA to a peer on the same host does not go through the shared-memory ring byte by
byte (copied in by the writer, out by the reader). The writer puts a small descriptor in the
ring -- where its payload lies in its own memory -- and the reader copies the bytes straight
from there into its destination with ``process_vm_readv(2)``: one copy, done by the kernel,
without the GIL. The writer's buffer stays untouched until the reader says it is done (the
driver reports the send complete only on the reader's acknowledgement, :mod:`.driver.peers`).

The reader gets a :class:`RemotePayload` in place of bytes. The engine never looks inside a
payload of a DATA frame: it puts it in a ``Deliver`` (``Buffers.deliver`` calls
:meth:`RemotePayload.read_into`, straight into the destination's runs) or keeps it with
``engine.early.own`` (:meth:`RemotePayload.own` reads it into memory of its own). Whatever is
still unread when the frame's handling ends is read then (:meth:`RemotePayload.finish`), so a
writer never waits on a message the reader holds for later.

Reading another process's memory needs the kernel's ptrace permission (same user, no Yama
restriction, no seccomp filter refusing the call). Nothing is assumed: at connect time the
reader of each ring reads a random word from its writer (:func:`probe`) and writes the
verdict into the ring; the writer sends descriptors only when it says yes. Off by
the ``cma=0`` test hook (polycast.config.Hooks), off Linux, without ``process_vm_readv`` in libc, and with a job secret
(every frame's MAC covers its bytes, which then never cross the ring).

A writer that dies while its message is read makes ``process_vm_readv`` fail with ESRCH
(the kernel checks the process under the lock that keeps its memory alive): the read raises
:class:`~polycast.errors.PeerLost`, never reads freed memory, never hangs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

import numpy as np

from .lazy import LazyPayload

# Frames carrying a descriptor (seq, address, nbytes) followed by the engine header; an
# acknowledgement carries the seqs the reader is done with (not in order: a pulled DATA is
# read when its RECV starts, engine/rendezvous.py).
DESC = struct.Struct("<QQQ")
ACK = struct.Struct("<Q")
# Smaller messages go through the ring. One process_vm_readv beats the ring's two numpy copies
# at every size (in one process, load ~12: 64 KiB 7 vs 18 us, 512 KiB 22 vs 37 us, 4 MiB 1.0 vs
# 2.0 ms), but a descriptor also costs an acknowledgement frame each way and makes the
# sender's completion wait for the reader to run: 64 KiB broadcasts on 4 ranks measured
# slower single-copy (best of 200 calls 0.08-0.17 vs 0.42-0.45 GB/s). The threshold is
# POLYCAST_CMA_MIN_NBYTES (polycast.config: 512 KiB by default).
_IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load(name: str = "process_vm_readv"):
    if not sys.platform.startswith("linux"):
        return None, f"not Linux ({sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError) as exc:
        return None, f"{name} not in the C library ({exc})"
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
    return fn, None


_readv, _load_error = _load()
# The kernel grants process_vm_writev on exactly the terms of process_vm_readv (the same
# ptrace access check on the target), so a peer we may read we may also write.
_writev, _ = _load("process_vm_writev")

# What a peer reads to prove it may read us: 8 random bytes at a fixed address.
_PROBE = ctypes.create_string_buffer(os.urandom(8), 8)


def disabled_reason(secret: bytes | None = None, enabled: bool = True) -> str | None:
    """Why single-copy cannot be offered by this process, or None (``enabled``: the
    configuration's ``cma`` test hook)."""
    if not enabled:
        return "the cma=0 test hook"
    if _load_error is not None:
        return _load_error
    if secret:
        return "a job secret is set (every frame's MAC covers its bytes)"
    return None


def probe_info() -> list:
    """What peers need to probe us: [address, the 8 bytes there as hex]."""
    return [ctypes.addressof(_PROBE), _PROBE.raw.hex()]


def probe(pid: int, info) -> str | None:
    """Try to read a peer's probe word; None when it works, else why not."""
    if not pid:
        return "the peer's pid is not known here (another pid namespace)"
    try:
        addr, magic = int(info[0]), bytes.fromhex(info[1])
    except (TypeError, ValueError, IndexError):
        return "the peer did not publish a probe address"
    got = ctypes.create_string_buffer(len(magic))
    try:
        read(pid, [(ctypes.addressof(got), len(magic))], [(addr, len(magic))])
    except OSError as exc:
        return f"process_vm_readv refused: {exc.strerror or exc}"
    if got.raw != magic:
        return "process_vm_readv read the wrong bytes"
    return None


def _iovecs(ranges):
    arr = (_Iovec * len(ranges))()
    for i, (a, n) in enumerate(ranges):
        arr[i].base, arr[i].len = a, n
    return arr


def _skip(ranges, nbytes: int) -> list:
    """``ranges`` without their first ``nbytes`` bytes."""
    out = []
    for a, n in ranges:
        if nbytes >= n:
            nbytes -= n
            continue
        out.append((a + nbytes, n - nbytes))
        nbytes = 0
    return out


def read(pid: int, local: list, remote: list) -> None:
    """Copy the bytes of ``remote`` (address, nbytes) ranges of process ``pid`` into the
    ``local`` ranges (equal totals). Raises OSError (errno set) on failure."""
    _move(_readv, "process_vm_readv", pid, local, remote)


def can_write() -> bool:
    """Whether :func:`write` is there (libc has ``process_vm_writev``)."""
    return _writev is not None


def write(pid: int, local: list, remote: list) -> None:
    """Copy the bytes of our ``local`` (address, nbytes) ranges into the ``remote`` ranges
    of process ``pid`` (equal totals): :func:`read` the other way round, for a peer that
    waits while we fill its buffer. Raises OSError (errno set) on failure."""
    if _writev is None:
        raise OSError(errno.ENOSYS, "process_vm_writev is not in the C library")
    _move(_writev, "process_vm_writev", pid, local, remote)


def _move(fn, name: str, pid: int, local: list, remote: list) -> None:
    total = sum(n for _, n in local)
    done = 0
    while done < total:
        lo, re_ = _skip(local, done)[:_IOV_MAX], _skip(remote, done)[:_IOV_MAX]
        got = fn(pid, _iovecs(lo), len(lo), _iovecs(re_), len(re_), 0)
        if got < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        if got == 0:
            raise OSError(errno.EFAULT, f"{name} made no progress")
        done += got


def address_of(view) -> int:
    """The address of a contiguous bytes-like object (kept alive by the caller)."""
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0]


class RemotePayload(LazyPayload):
    """``nbytes`` bytes at ``addr`` in process ``pid`` (rank ``src``), readable until
    :meth:`finish`, after that only what was kept (``own``/finish's own read) is; or, held
    (:meth:`hold`), until read or released."""

    __slots__ = ("pid", "addr", "seq")
    piecewise = True
    holdable = True     # the writer keeps its memory until our acknowledgement

    def __init__(self, src: int, pid: int, addr: int, nbytes: int, seq: int = 0) -> None:
        super().__init__(src, nbytes)
        self.pid, self.addr = pid, addr
        self.seq = seq      # the writer's number for it, which our acknowledgement names

    def read_elsewhere(self) -> None:
        """A held payload the compiled replay (runtime/driver/_replay.c) read and acknowledged
        itself: nothing is left to read or to say."""
        self.used = self.closed = True
        self.holding = False
        self.on_done = None

    def _read(self, ranges) -> None:
        read(self.pid, ranges, [(self.addr, self.nbytes)])

    def _read_at(self, offset: int, ranges) -> None:
        read(self.pid, ranges, [(self.addr + offset, sum(n for _, n in ranges))])

    def _why(self, exc: OSError) -> str:
        size = f"{self.nbytes} bytes"
        if exc.errno == errno.ESRCH:
            return (f"the process (pid {self.pid}) exited while its {size} message was "
                    f"being read (process_vm_readv: ESRCH)")
        return f"reading its {size} message failed (process_vm_readv: {exc.strerror or exc})"
