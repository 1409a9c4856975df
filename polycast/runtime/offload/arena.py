"""Registered memory: one shared file per rank, mapped by the rank, the offload process and
its multicast workers, so a buffer is named by its byte offset and used in place.

The rank allocates from it (``comm.empty()``: :meth:`RankArena.array`; staging copies for
ordinary arrays: :meth:`RankArena.alloc`) with a first-fit free list; an array's block is
given back when the array (and every view of it) is garbage. The file is sparse: memory is
used only where written.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
import weakref

import numpy as np

from ...errors import InvalidArgument
from ..transport.shm import SHM_DIR

ALIGN = 64                          # a cache line: every allocation starts on one
def shm_path(what: str) -> str:
    return os.path.join(SHM_DIR, f"polycast-off-{os.getpid()}-{secrets.token_hex(4)}-{what}")


class Arena:
    """A mapped arena (``create`` on the rank's side, else attach to an existing file)."""

    def __init__(self, path: str, nbytes: int, create: bool) -> None:
        self.path, self.nbytes = path, nbytes
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            self._mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self._mm, np.uint8)
        self.base = self.bytes.ctypes.data

    def view(self, offset: int, nbytes: int, dtype) -> np.ndarray:
        """The arena's bytes [offset, offset+nbytes) as a flat array of ``dtype``."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise InvalidArgument(f"arena range {offset}+{nbytes} outside its "
                                  f"{self.nbytes} bytes")
        return self.bytes[offset:offset + nbytes].view(dtype)

    def locate(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(byte offset, nbytes) of a C-contiguous array that lies in this arena."""
        if not arr.flags.c_contiguous:
            return None
        addr = arr.__array_interface__["data"][0]
        off = addr - self.base
        if 0 <= off and off + arr.nbytes <= self.nbytes:
            return off, arr.nbytes
        return None

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.bytes = None
        try:
            self._mm.close()
        except BufferError:
            pass                    # arrays still alive: the mapping goes with them


class RankArena(Arena):
    """The rank's side: allocation of registered arrays and staging blocks."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(shm_path("arena"), nbytes, True)
        self._lock = threading.Lock()
        self._free: list[list[int]] = [[0, nbytes]]      # [offset, size], by offset
        self._used: dict[int, int] = {}
        self.used_nbytes = 0

    def alloc(self, nbytes: int) -> int | None:
        """A block of at least ``nbytes``: its offset, or None when the arena is full."""
        size = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        with self._lock:
            for i, (off, n) in enumerate(self._free):
                if n >= size:
                    if n == size:
                        del self._free[i]
                    else:
                        self._free[i] = [off + size, n - size]
                    self._used[off] = size
                    self.used_nbytes += size
                    return off
        return None

    def free(self, offset: int) -> None:
        with self._lock:
            size = self._used.pop(offset, None)
            if size is None:
                return
            self.used_nbytes -= size
            free = self._free
            # insert in offset order, merging with neighbours
            i = 0
            while i < len(free) and free[i][0] < offset:
                i += 1
            free.insert(i, [offset, size])
            if i + 1 < len(free) and offset + size == free[i + 1][0]:
                free[i][1] += free.pop(i + 1)[1]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:
                free[i - 1][1] += free.pop(i)[1]

    def array(self, shape, dtype) -> np.ndarray:
        """A new array in registered memory (freed when it and its views are garbage)."""
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if np.ndim(shape) else int(shape)
        if count < 0:
            raise InvalidArgument(f"shape {shape!r} has a negative size")
        nbytes = count * dt.itemsize
        off = self.alloc(nbytes)
        if off is None:
            raise InvalidArgument(
                f"the offload arena has no room for {nbytes} more bytes ({self.used_nbytes} "
                f"of {self.nbytes} in use): free arrays or raise POLYCAST_OFFLOAD_ARENA")
        block = _Block(self, off, nbytes)
        weakref.finalize(block, self.free, off)
        return np.asarray(block).view(dt).reshape(shape)


class _Block:
    """Owner of one allocation: every array and view made of it keeps it alive (numpy
    collapses view chains onto ndarray owners, so a finalizer on the array itself would
    fire while a slice of it still points into the block)."""

    def __init__(self, arena: RankArena, offset: int, nbytes: int) -> None:
        self._arena = arena                 # the mapping outlives every block
        self.__array_interface__ = {"data": (arena.base + offset, False),
                                    "shape": (nbytes,), "typestr": "|u1", "version": 3}
