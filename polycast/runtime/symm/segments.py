"""Collective shared-memory allocations: every rank creates a /dev/shm segment and maps
every peer's (raw files, not ``multiprocessing.shared_memory``: its resource tracker on
Python < 3.13 unlinks and warns about segments other processes own). Each rank unlinks its
own as soon as every rank has mapped it; on any failure every rank unlinks every rank's,
so /dev/shm holds nothing once an allocation returns or raises."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from ...errors import PolycastError
from ..transport.shm import SHM_DIR


def _populate_flags() -> int:
    return mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def _open_map(path: str, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        elif os.fstat(fd).st_size < nbytes:
            raise PolycastError(f"{path} holds {os.fstat(fd).st_size} bytes, "
                                f"expected {nbytes}")
        # Populate the page tables now, not on the first collective (~1 us per page).
        return mmap.mmap(fd, nbytes, flags=_populate_flags())
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass        # the user still holds an array on it: the mapping goes with that array


@dataclass
class Segment:
    """One collective allocation: this rank's mapping and every peer's."""
    index: int
    nbytes: int
    maps: list                      # mmap per rank (ours included)
    bases: list[int] = field(default_factory=list)      # address of each mapping

    def view(self, rank: int, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        return np.ndarray((count,), dtype, self.maps[rank], offset)


def segment_path(job_id: str, comm_id: int, tag: str, rank: int) -> str:
    """Where rank ``rank``'s segment of allocation ``tag`` lives while it is being mapped.
    Every rank can name every peer's, so survivors can remove a dead peer's segment."""
    return os.path.join(SHM_DIR, f"polycast-{job_id}-symm-{comm_id:x}-{tag}-{rank}")


def _map_collectively(comm, nbytes: int, tag: str) -> list:
    """Every rank creates a segment of ``nbytes``; all map all; each unlinks its own as soon
    as everyone has mapped it. On any failure (a rank that cannot create or map, a peer
    lost on the way) every rank raises and unlinks *every* rank's segment, so a peer that
    died after creating its own leaks nothing either. Returns the mmap per rank."""
    job = comm._driver.world.job_id
    paths = [segment_path(job, comm.id, tag, p) for p in range(comm.size)]
    maps: list = [None] * comm.size
    done = False
    try:
        err = None
        try:
            maps[comm.rank] = _open_map(paths[comm.rank], max(nbytes, 1), True)
        except OSError as exc:
            err = f"rank {comm.rank} cannot create {paths[comm.rank]}: {exc}"
        errors = [e for e in comm.allgather(err) if e]      # also: every segment exists
        if errors:
            raise PolycastError("symmetric allocation failed: " + "; ".join(errors))
        try:
            for p in range(comm.size):
                if p != comm.rank:
                    maps[p] = _open_map(paths[p], max(nbytes, 1), False)
        except (OSError, PolycastError) as exc:
            err = f"rank {comm.rank} cannot map a peer's segment: {exc}"
        errors = [e for e in comm.allgather(err) if e]      # also: everyone has mapped
        if errors:
            raise PolycastError("symmetric allocation failed: " + "; ".join(errors))
        done = True
        return maps
    except BaseException:
        for m in maps:
            if m is not None:
                _close(m)
        raise
    finally:
        for p in ([comm.rank] if done else range(comm.size)):
            _unlink(paths[p])
