"""The multicast datagram path: the compiled helper, when there is one, and its glue.

``polycast/runtime/transport/_dgram.c`` (built by pip where a C compiler exists; setup.py)
reads datagrams in batches (recvmmsg; UDP GRO segments split), checks each header and, with
a job secret, its MAC, and places the chunks of the streams the engine opened
(``OpenStream``) straight into the receive buffer, setting their bits; it reports what it
placed per stream once per batch, and hands every datagram it does not understand to the
engine untouched (early, stale, foreign, forged, malformed: the engine decides and counts).
It sends in batches too (sendmmsg, UDP GSO where the kernel takes it), when the engine's
pacing says. Without it (no compiler, or the configuration's ``dgram=0`` test hook,
polycast.config.Hooks) runtime/driver/datagrams.py runs the same protocol in Python, one
datagram at a time through ``Engine.on_datagram``. Chosen once per driver; POLYCAST_DEBUG=INFO
says which.
"""

from __future__ import annotations

import array
import os

from .layout import read_defines
from .native import load

#: The helper's interface version this source calls (_dgram_abi.h, which _dgram.c exports
#: as ``_dgram.ABI``): a helper that says otherwise is refused and the Python path runs.
ABI = read_defines(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "_dgram_abi.h"))["DGRAM_ABI"]

_dgram, why_not = load("polycast.runtime.transport._dgram", "the datagram helper", abi=ABI)

#: Datagrams one read takes before the progress thread does other work.
READ_BATCH = 256
#: While a stream is mid-way, a read naps GAP_US (without the GIL) and takes what came
#: meanwhile in one batch, up to LINGER_US in all (less when the caller has a timer or a
#: paced datagram due sooner), ending at a nap that brought nothing. A paced stream trickles
#: in (8.9 KB every 36 us at 2 Gbit/s) and a wake-up costs more than the datagrams it
#: brings: profiled at a 2 Gbit/s pace, the receiver's CPU went to waking (a nap, a
#: recvmmsg, and the progress loop's look-around), not to bytes. A stream that completes
#: or sends its EOS ends the wait at once; its last datagram may wait out one nap.
LINGER_US = 5000.0
GAP_US = 1000.0
#: Datagrams of at least this payload are read straight into their predicted place
#: (Placer(landing=True)): one copy, the kernel's, instead of two. Smaller ones gain
#: nothing from it (bench/nic.py: 1428 B chunks 1.5-1.6 us either way; 8928 B 3.3 vs 3.9;
#: 60000 B 15.8 vs 26 us).
LANDING_MIN_NBYTES = 4096

def in_use(hooks) -> bool:
    """Whether a job with these test hooks (polycast.config.Hooks) runs the compiled path:
    it is built, and the ``dgram=0`` hook (same-run comparisons: bench/mcast_path.py,
    bench/offload.py) does not ask for the Python path."""
    return _dgram is not None and hooks.dgram


def available() -> bool:
    return _dgram is not None


def describe(native: bool) -> str:
    """One line for POLYCAST_DEBUG=INFO."""
    if native:
        return ("multicast datagrams: compiled path (recvmmsg/GRO, sendmmsg/GSO, placement "
                "in C: polycast.runtime.transport._dgram)")
    return f"multicast datagrams: Python path ({why_not or 'test hook dgram=0'})"


def send(sock, addr: tuple[str, int], items: list) -> int:
    """Send ``items`` ([(header, payload or None)]) to ``addr``; how many left (the rest
    would block)."""
    return _dgram.send(sock.fileno(), addr, items)


#: Chunks one send_chunks call takes (the helper's bound).
SEND_CHUNKS_MAX = 1024


def send_chunks(sock, addr: tuple[str, int], args: list, c0: int, c1: int) -> int:
    """Send chunks ``[c0, c1)`` of a stream (at most SEND_CHUNKS_MAX), the helper building
    each MCAST_DATA datagram (header, MAC with a secret) from the buffer in place. ``args``:
    [secret, comm, seq, src, sig, ordinal, buffer, runs_bytes(runs), itemsize, chunk_elems,
    nelems, ...]. Returns how many left (the rest would block)."""
    return _dgram.send_chunks(sock.fileno(), addr, *args[:11], c0, c1)


def runs_bytes(runs) -> bytes:
    """Element runs [(a, b), ...] as the helper takes them (packed int64 pairs)."""
    return array.array("q", [x for run in runs for x in run]).tobytes()


def ranges_of(packed: bytes) -> list[tuple[int, int]]:
    """The helper's chunk ranges (packed uint64 pairs) as [(c0, c1), ...]."""
    flat = array.array("Q")
    flat.frombytes(packed)
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


class Placer:
    """The streams this process's engines opened, placed by the helper.

    A key starts with ``(comm, seq, root, ordinal)`` (the header's fields); more items tell
    copies of one stream apart (the offload worker's local rank: each rank's copy goes to
    its own arena). Each open copy has a handle, and keeps its buffer alive until closed."""

    def __init__(self, secret: bytes | None, landing: bool = False) -> None:
        self._p = _dgram.Placer(secret)
        # Read datagrams straight into their predicted place: for sockets that carry one
        # stream at a time (a root's group); interleaved streams miss and fall back.
        self._p.set_landing(landing)
        self._handles: dict[tuple, int] = {}
        self._keys: dict[int, tuple] = {}
        self._next = 1

    def watch(self, sock) -> bool:
        """Ask the kernel to coalesce this socket's datagrams (UDP GRO); True if it will."""
        return self._p.set_gro(sock.fileno())

    def open(self, key: tuple, sig: int, buffer, runs, chunk_elems: int, nchunks: int,
             base_nbytes: int = 0, itemsize: int | None = None) -> int:
        """Place stream ``key``'s chunks into ``buffer`` (a numpy array, or a writable
        buffer with ``itemsize``) from now on; returns its handle."""
        comm, seq, root, ordinal = key[:4]
        handle = self._next
        self._next += 1
        isz = itemsize or buffer.itemsize
        nelems = sum(b - a for a, b in runs)
        self._p.open(handle, comm, seq & 0xFFFFFFFF, root, ordinal, sig, buffer, base_nbytes,
                     runs_bytes(runs), isz, chunk_elems, nchunks, nelems)
        self._handles[key] = handle
        self._keys[handle] = key
        return handle

    def handle(self, key: tuple) -> int | None:
        return self._handles.get(key)

    def key(self, handle: int) -> tuple | None:
        return self._keys.get(handle)

    def close(self, key: tuple) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None:
            self._keys.pop(handle, None)
            self._p.close(handle)

    def hold(self, key: tuple, on: bool) -> None:
        handle = self._handles.get(key)
        if handle is not None:
            self._p.set_hold(handle, on)

    def write(self, key: tuple, offset: int, payload) -> tuple[int, int] | None:
        """Recovered bytes of an open stream: placed; the chunk range, or None."""
        handle = self._handles.get(key)
        return None if handle is None else self._p.write(handle, offset, payload)

    def recv(self, sock, max_datagrams: int = READ_BATCH, linger_us: float = LINGER_US,
             gap_us: float = GAP_US, watch: tuple = ()):
        """(progress [(key, ranges, eos)], up [(bytes, placed)], consumed, nbytes,
        {drop reason: count}) — the drops being duplicate chunks and repeated EOS, counted
        under the engine's names. While a stream is mid-way it waits for more of it (up to
        ``linger_us``, ``gap_us`` at a time) unless a descriptor of ``watch`` is readable."""
        return self._progress(self._p.recv(sock.fileno(), max_datagrams, linger_us, gap_us,
                                           watch))

    def feed(self, data):
        return self._progress(self._p.feed(data))

    def _progress(self, got):
        prog, up, n, nbytes, dups, dup_eos = got
        keys = self._keys
        drops = {}
        if dups:
            drops["duplicate"] = dups
        if dup_eos:
            drops["duplicate_eos"] = dup_eos
        return ([(keys[h], ranges_of(r), eos) for h, r, eos in prog if h in keys], up, n,
                nbytes, drops)

    def counters(self) -> dict:
        return self._p.counters()
