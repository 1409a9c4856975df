"""Futex wake-ups between processes on one host (Linux), through ctypes.

A ring's reader that goes to sleep waits on a 32-bit counter in the ring's shared control
block; the writer bumps the counter after each frame and, when the reader said it sleeps,
wakes it with one ``FUTEX_WAKE`` (~1.5 us here) instead of a doorbell frame over TCP
(a ``sendmsg``, the loopback stack, an epoll wake-up and a ``recv`` on the other side).
A sleeper waits on all its rings' counters at once with ``futex_waitv`` (Linux 5.16+),
plus a private counter its own process bumps to hand it a command.

A lost wake-up (the writer missed the sleeping flag: x86 may let the reader's store of the
flag pass its load of the ring head) costs a bounded wait, never a hang: every wait has a
timeout, and the writer bumps the counter unconditionally, so a sleeper whose expected
value is stale returns at once.

With the compiled helper (:mod:`polycast.runtime.transport.native`) the wake and the wait are direct
system calls from C (the wait with the GIL released) instead of ctypes calls.

``available()`` says whether this works here (Linux, a C library with ``syscall``,
``futex_waitv`` answering); the ``futex=0`` test hook (polycast.config.Hooks) turns its use
off (the TCP doorbells remain).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time

from . import native as _native

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
SYS_FUTEX_WAITV = 449           # the same number on every architecture (generic table)
FUTEX_WAKE = 1
FUTEX_PRIVATE_FLAG = 128
FUTEX2_SIZE_U32 = 0x02
FUTEX2_PRIVATE = 128
CLOCK_MONOTONIC = 1
MAX_WAITERS = 128               # the kernel's bound for one futex_waitv


class _Waitv(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


_syscall = None
_futex_nr = None
_why_not: str | None = None


def _probe() -> str | None:
    global _syscall, _futex_nr
    if not sys.platform.startswith("linux"):
        return f"futexes are Linux's; this is {sys.platform}"
    if sys.byteorder != "little":
        return "the rings' counters are the low half of a u64: little-endian only"
    nr = _SYS_FUTEX.get(platform.machine().lower())
    if nr is None:
        return f"no futex syscall number known for {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError) as exc:
        return f"no syscall() in the C library: {exc}"
    fn.restype = ctypes.c_long
    # futex_waitv with no futexes: EINVAL where it exists, ENOSYS where it does not.
    ctypes.set_errno(0)
    if fn(SYS_FUTEX_WAITV, None, 0, 0, None, CLOCK_MONOTONIC) != -1 or \
            ctypes.get_errno() != errno.EINVAL:
        return "futex_waitv is not available (Linux 5.16+)"
    _syscall, _futex_nr = fn, nr
    return None


def available() -> bool:
    global _why_not
    if _syscall is None and _why_not is None:
        _why_not = _probe() or ""
    return _syscall is not None


def unavailable_reason() -> str | None:
    available()
    return _why_not or None


def wake(addr: int, nwaiters: int = 1) -> None:
    """Wake up to ``nwaiters`` processes sleeping on the u32 at address ``addr`` (in
    memory shared between processes)."""
    _syscall(_futex_nr, ctypes.c_void_p(addr), FUTEX_WAKE, nwaiters, None, None, 0)


def wake_private(addr: int, nwaiters: int = 1) -> None:
    """Wake up to ``nwaiters`` threads of this process sleeping on the u32 at ``addr``."""
    _syscall(_futex_nr, ctypes.c_void_p(addr), FUTEX_WAKE | FUTEX_PRIVATE_FLAG, nwaiters,
             None, None, 0)


if _native.ring is not None:
    _c_wake = _native.ring.futex_wake

    def wake(addr: int, nwaiters: int = 1) -> None:          # noqa: F811 (compiled)
        """Wake up to ``nwaiters`` processes sleeping on the u32 at address ``addr`` (in
        memory shared between processes)."""
        _c_wake(addr, nwaiters, False)

    def wake_private(addr: int, nwaiters: int = 1) -> None:  # noqa: F811 (compiled)
        """Wake up to ``nwaiters`` threads of this process sleeping on the u32 at ``addr``."""
        _c_wake(addr, nwaiters, True)


class WaitSet:
    """Waits on several u32 counters at once: ``wait(values, timeout)`` sleeps until one
    of them differs from the value given for it, a wake-up comes, or the timeout."""

    def __init__(self, addrs: list[tuple[int, bool]]) -> None:
        """``addrs``: (address, private) per counter; private ones live in this process
        only (cheaper hashing in the kernel)."""
        if len(addrs) > MAX_WAITERS:
            raise ValueError(f"futex_waitv takes at most {MAX_WAITERS} counters")
        self.n = len(addrs)
        self._arr = (_Waitv * max(1, self.n))()
        for i, (addr, private) in enumerate(addrs):
            self._arr[i].uaddr = addr
            self._arr[i].flags = FUTEX2_SIZE_U32 | (FUTEX2_PRIVATE if private else 0)
        self._ts = _Timespec()
        self._ts_ref = ctypes.byref(self._ts)
        self._addr = ctypes.addressof(self._arr)
        self._c_wait = _native.ring.futex_waitv if _native.ring is not None else None

    def wait(self, values: list[int], timeout_seconds: float) -> None:
        arr = self._arr
        for i, v in enumerate(values):
            arr[i].val = v
        if self._c_wait is not None:
            self._c_wait(self._addr, self.n, timeout_seconds)
            return
        deadline = time.clock_gettime(time.CLOCK_MONOTONIC) + max(0.0, timeout_seconds)
        sec = int(deadline)
        self._ts.sec, self._ts.nsec = sec, int((deadline - sec) * 1e9)
        _syscall(SYS_FUTEX_WAITV, arr, self.n, 0, self._ts_ref, CLOCK_MONOTONIC)
