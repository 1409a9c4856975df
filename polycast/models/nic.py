"""The SmartNIC's chunk rate: how many chunks per second a NIC (or a host) puts through the
multicast receive path, and how much NIC a link needs.

The model
---------
A receiver runs the multicast receive path — per chunk (one datagram's payload): read the
chunk id, copy the payload from the staging slot to the user buffer, set the bitmap bit,
repost receives — on ``cores`` cores of ``threads_per_core`` hardware threads at
``clock_hz``. One chunk of ``c`` bytes costs

* ``work(c) = cycles_per_chunk + cycles_per_byte * c`` **core cycles**: what the core
  issues for it. A core issues for one thread at a time, so it finishes at most
  ``clock_hz / work`` chunks per second however many threads it runs: the per-core
  issue limit;
* ``latency(c) = work(c) + stall_cycles_per_chunk`` **cycles of one thread's time**: the
  stall is waiting (memory, DMA, PCIe) during which the core issues other hardware
  threads' work. One thread alone does ``clock_hz / latency`` chunks per second.

A core running ``h`` threads does ``min(h * clock/latency, clock/work)`` chunks per second:
hardware threads hide each other's stalls until ``ceil(latency / work)`` threads saturate
the core's issue. ``T`` threads are spread evenly over the cores (each core runs
``T // cores`` or one more). The receiver sustains, with every thread::

    chunks_per_s = cores * min(threads_per_core * clock/latency, clock/work)

A link of ``L`` bit/s full of ``c``-byte chunks brings ``L / (8 c)`` chunks per second; the
receiver keeps up when its ``chunks_per_s`` is at least that. :meth:`NicModel.size_for`
answers "how much NIC does this link need": the cores (each with as many threads as it
can use) and the threads (spread over the cores) that reach the link's chunk rate, and the
cycle budget per chunk per core the link leaves.

Assumptions (what is not modelled): every chunk costs the same (no cache effects that
depend on the buffer, no bursts); chunks are independent, so any thread can take any
chunk (the allgather's streams map onto threads, as the paper maps multicast groups); no
limit shared by the whole device (memory or PCIe bandwidth, the NIC's own packet rate);
the link carries payload only (no header bytes); steady state (no start-up).
:attr:`NicModel.queue_chunks` — the receive queue a receiver that falls behind fills
before it drops — is used by the simulator (:mod:`polycast.sim.nic`), not by the rate.

Presets
-------
``bf3-dpa`` — the BlueField-3 DPA of the SC24 paper ("Network-Offloaded Bandwidth-Optimal
Broadcast and Allgather for Distributed AI"; specs/mcast-protocol.md): 16 RISC-V cores x
16 hardware threads at 1.8 GHz, 4 KiB chunks. The figures given for it are "one thread's
receive path 11.9 GiB/s" and "at most 128 threads for 1.6 Tbit/s (48.8 M chunks/s)". Taken
literally the first makes one thread fill a core, and 16 threads would do; the paper's 128
(= 16 cores x 8 threads) is reproduced when 11.9 GiB/s is a *core's* issue limit and one
thread sustains 11.9 *Gibit*/s, i.e. each thread waits (memory, DMA) seven times as long as
it works and eight hardware threads hide each other's stalls. The preset takes that reading:

* work: 1.8 GHz x 4 KiB / 11.9 GiB/s = **577 cycles per chunk** per core (3.12 M chunks/s);
  the link's budget is 589.8 cycles per chunk per core on 16 cores (the spec's "about 590
  cycles per chunk per core"), which 577 fits;
* stall: ``stall_cycles_per_chunk`` = 7 x 577 = 4039, so one thread runs 390 k chunks/s
  (11.9 Gibit/s) and 8 threads saturate a core;
* the DPA sustains 16 x 3.12 M = 49.9 M chunks/s = 1.636 Tbit/s of 4 KiB chunks and needs
  **126 threads** (8 per core on 16 cores, the last cores not quite full) for 1.6 Tbit/s:
  the paper's "at most 128".

The literal reading is ``polycast nic --preset bf3-dpa --stall-cycles 0`` (the same NIC
capacity, 16 threads). Both give 1.636 Tbit/s in all, which is all the simulator uses;
they differ in how many threads it takes. The tests check both.

``host-python`` — polycast's own receive path on this machine: the real UDP receive on
loopback (the runtime's ``recv``) plus the engine's datagram path and the placement copy
(``Engine.on_datagram`` + ``Buffers.deliver``), measured by ``bench/nic.py`` as seconds per
chunk ``a + b * c``, stored in ``polycast/models/host_python.json`` (with a built-in
fallback measured once here). One core, one thread (a Python progress thread; the GIL
hides nothing), the clock read from /proc/cpuinfo, a 64 MiB receive queue (the runtime's
SO_RCVBUF). ``--cores k`` models k offload workers.

``host-native`` — the same for the compiled datagram path (runtime/transport/_dgram.c):
recvmmsg batches, the header checks, the copy into place and the bitmap in C, plus the
engine's per-batch ``on_stream_progress``, measured by ``bench/nic.py`` in the same run as
host-python and stored in ``polycast/models/host_native.json``. One core, one thread (the
offload process's receive worker, or the rank's progress thread).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace

from ..config import current
from ..errors import InvalidArgument, UnknownName
from ..units import parse_frequency, parse_size

KIB = 1024
GIB = 1 << 30

#: A DPA core's receive rate of 4 KiB chunks (the issue limit): 11.9 GiB/s.
DPA_CORE_BYTES_PER_S = 11.9 * GIB
#: Hardware threads per core that hide each other's stalls (one thread: 11.9 Gibit/s).
DPA_THREADS_TO_FILL_CORE = 8
DPA_CLOCK_HZ = 1.8e9
DPA_CHUNK_NBYTES = 4 * KIB

#: Where bench/nic.py writes the measured host-python and host-native presets.
HOST_PYTHON_FILE = os.path.join(os.path.dirname(__file__), "host_python.json")
HOST_NATIVE_FILE = os.path.join(os.path.dirname(__file__), "host_native.json")

#: Built-in host-python data (bench/nic.py on the 2-core development machine, Xeon at
#: 2.6 GHz, Python 3.11; used when the file is missing or unreadable): seconds per chunk =
#: a + b * chunk bytes.
HOST_PYTHON_FALLBACK = {
    "seconds_per_chunk": 4.0e-6,
    "seconds_per_byte": 3.6e-10,
    "clock_hz": 2.6e9,
    "source": "built-in fallback (bench/nic.py on the development machine)",
}
#: Built-in host-native data (bench/nic.py's compiled-path rows on the same machine; used
#: when host_native.json is missing or unreadable).
HOST_NATIVE_FALLBACK = {
    "seconds_per_chunk": 0.3e-6,
    "seconds_per_byte": 0.47e-9,
    "clock_hz": 2.6e9,
    "source": "built-in fallback (bench/nic.py on the development machine)",
}
HOST_RCVBUF_NBYTES = 64 << 20      # polycast.runtime.transport.mcast.RCVBUF_NBYTES


@dataclass(frozen=True)
class NicModel:
    """A receiver's multicast receive path (see the module docstring for the model).

    Every parameter carries its unit in its name or here."""

    name: str
    clock_hz: float                        # core clock, Hz
    cores: int                             # cores running the receive path
    threads_per_core: int                  # hardware threads per core
    cycles_per_chunk: float                # core cycles issued per chunk (fixed part)
    cycles_per_byte: float = 0.0           # core cycles issued per payload byte (CPU copy)
    stall_cycles_per_chunk: float = 0.0    # cycles a thread waits per chunk, hideable
    chunk_nbytes: int = DPA_CHUNK_NBYTES   # chunk (datagram payload) bytes, the default c
    queue_chunks: int = 1024               # receive queue depth, chunks (simulator)
    source: str = ""                       # where the numbers come from

    def __post_init__(self) -> None:
        def bad(field: str, why: str):
            raise InvalidArgument(f"NIC model {self.name!r}: {field}={getattr(self, field)!r} "
                                  f"{why}")
        for f in ("clock_hz", "cycles_per_chunk"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                bad(f, "must be a number > 0")
        for f in ("cycles_per_byte", "stall_cycles_per_chunk"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                bad(f, "must be a number >= 0")
        for f in ("cores", "threads_per_core", "chunk_nbytes", "queue_chunks"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(f, "must be a whole number > 0")

    # -- per chunk ---------------------------------------------------------------------
    def _chunk(self, chunk_nbytes: int | None) -> int:
        c = self.chunk_nbytes if chunk_nbytes is None else chunk_nbytes
        if not isinstance(c, int) or c <= 0:
            raise InvalidArgument(f"chunk size must be a whole number of bytes > 0, got {c!r}")
        return c

    def work_cycles(self, chunk_nbytes: int | None = None) -> float:
        """Core cycles issued per chunk."""
        return self.cycles_per_chunk + self.cycles_per_byte * self._chunk(chunk_nbytes)

    def latency_cycles(self, chunk_nbytes: int | None = None) -> float:
        """One thread's cycles per chunk (work + stall)."""
        return self.work_cycles(chunk_nbytes) + self.stall_cycles_per_chunk

    def thread_chunks_per_s(self, chunk_nbytes: int | None = None) -> float:
        """Chunks per second of one thread alone on its core."""
        return self.clock_hz / self.latency_cycles(chunk_nbytes)

    def core_chunks_per_s(self, chunk_nbytes: int | None = None,
                          threads: int | None = None) -> float:
        """Chunks per second of one core running ``threads`` (default: all of its) threads."""
        h = self.threads_per_core if threads is None else threads
        return min(h * self.clock_hz / self.latency_cycles(chunk_nbytes),
                   self.clock_hz / self.work_cycles(chunk_nbytes))

    def threads_to_saturate_core(self, chunk_nbytes: int | None = None) -> int:
        """Hardware threads one core needs to reach its issue limit."""
        return max(1, math.ceil(self.latency_cycles(chunk_nbytes)
                                / self.work_cycles(chunk_nbytes) - 1e-9))

    # -- the whole receiver ------------------------------------------------------------
    def chunks_per_s(self, chunk_nbytes: int | None = None, threads: int | None = None,
                     cores: int | None = None) -> float:
        """Sustainable chunks per second with ``threads`` threads (default: every thread)
        spread evenly over ``cores`` cores (default: this NIC's)."""
        k = self.cores if cores is None else cores
        t = k * self.threads_per_core if threads is None else threads
        if t <= 0:
            return 0.0
        used = min(k, t)
        per, extra = divmod(t, used)
        per_core_cap = self.threads_per_core
        lo = self.core_chunks_per_s(chunk_nbytes, min(per, per_core_cap))
        hi = self.core_chunks_per_s(chunk_nbytes, min(per + 1, per_core_cap))
        return extra * hi + (used - extra) * lo

    def bytes_per_s(self, chunk_nbytes: int | None = None) -> float:
        """Sustainable payload bytes per second, every thread busy."""
        return self.chunks_per_s(chunk_nbytes) * self._chunk(chunk_nbytes)

    def gbps(self, chunk_nbytes: int | None = None) -> float:
        """Sustainable link rate, Gbit/s of payload."""
        return self.bytes_per_s(chunk_nbytes) * 8 / 1e9

    def size_for(self, link_bps: float, chunk_nbytes: int | None = None) -> NicSizing:
        """What a link of ``link_bps`` bit/s of ``chunk_nbytes``-byte chunks asks of this
        receiver."""
        if not link_bps > 0:
            raise InvalidArgument(f"link rate must be > 0 bit/s, got {link_bps!r}")
        c = self._chunk(chunk_nbytes)
        need = link_bps / (8 * c)
        have = self.chunks_per_s(c)
        core_max = self.core_chunks_per_s(c)
        tol = 1 + 1e-12
        cores_needed = max(1, math.ceil(need / core_max / tol))
        k = max(self.cores, cores_needed)
        lo, hi = 1, k * self.threads_per_core          # rate(hi) >= need on k cores
        while lo < hi:
            mid = (lo + hi) // 2
            if self.chunks_per_s(c, mid, k) * tol >= need:
                hi = mid
            else:
                lo = mid + 1
        return NicSizing(
            model=self.name, link_gbps=link_bps / 1e9, chunk_nbytes=c,
            link_chunks_per_s=need, chunks_per_s=have, gbps=have * c * 8 / 1e9,
            keeps_up=have * tol >= need, link_fraction=have / need,
            thread_chunks_per_s=self.thread_chunks_per_s(c),
            core_chunks_per_s=core_max,
            threads_to_saturate_core=self.threads_to_saturate_core(c),
            work_cycles=self.work_cycles(c), latency_cycles=self.latency_cycles(c),
            cycle_budget_per_core=self.clock_hz * self.cores / need,
            cores_needed=cores_needed, threads_needed=lo,
            cores=self.cores, threads=self.cores * self.threads_per_core)

    def with_overrides(self, **changes) -> NicModel:
        """A copy with some parameters changed (validated again)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return replace(self, **changes)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NicSizing:
    """:meth:`NicModel.size_for`'s answer. Rates in chunks/s, Gbit/s (1e9 bit/s)."""

    model: str
    link_gbps: float
    chunk_nbytes: int
    link_chunks_per_s: float        # what the link brings
    chunks_per_s: float             # what the receiver sustains (every thread)
    gbps: float                     # ... as payload Gbit/s
    keeps_up: bool
    link_fraction: float            # chunks_per_s / link_chunks_per_s
    thread_chunks_per_s: float      # one thread alone
    core_chunks_per_s: float        # one core, every thread (issue limit)
    threads_to_saturate_core: int
    work_cycles: float              # core cycles issued per chunk
    latency_cycles: float           # one thread's cycles per chunk
    cycle_budget_per_core: float    # clock * cores / link chunk rate
    cores_needed: int               # cores (each fully threaded) for the link, may exceed cores
    threads_needed: int             # threads spread over max(cores, cores_needed) cores
    cores: int                      # this receiver's
    threads: int                    # this receiver's (cores x threads per core)

    def to_json(self) -> dict:
        return asdict(self)


# -- presets ------------------------------------------------------------------------------

def bf3_dpa() -> NicModel:
    work = DPA_CLOCK_HZ * DPA_CHUNK_NBYTES / DPA_CORE_BYTES_PER_S         # 577.0 cycles
    return NicModel(
        name="bf3-dpa", clock_hz=DPA_CLOCK_HZ, cores=16, threads_per_core=16,
        cycles_per_chunk=work, stall_cycles_per_chunk=(DPA_THREADS_TO_FILL_CORE - 1) * work,
        chunk_nbytes=DPA_CHUNK_NBYTES, queue_chunks=1024,
        source="SC24 paper: BlueField-3 DPA, 16 cores x 16 threads at 1.8 GHz, a core "
               "11.9 GiB/s and a thread 11.9 Gibit/s of 4 KiB chunks")


def load_host_python(path: str | None = None) -> dict:
    """The measured host-python data (``bench/nic.py`` writes it), or the built-in fallback
    when the file is missing or malformed."""
    return _load_host(path or current().nic_host_file or HOST_PYTHON_FILE,
                      HOST_PYTHON_FALLBACK)


def load_host_native(path: str | None = None) -> dict:
    """The measured host-native data (the compiled datagram path; ``bench/nic.py``), or its
    built-in fallback."""
    return _load_host(path or HOST_NATIVE_FILE, HOST_NATIVE_FALLBACK)


def _load_host(path: str, fallback: dict) -> dict:
    try:
        with open(path) as fh:
            data = json.load(fh)
        a, b, hz = (float(data[k]) for k in ("seconds_per_chunk", "seconds_per_byte",
                                             "clock_hz"))
        if not (a > 0 and b >= 0 and hz > 0):
            raise ValueError("non-positive cost")
        data.setdefault("source", path)
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return dict(fallback)


def _host(name: str, d: dict, what: str) -> NicModel:
    hz = float(d["clock_hz"])
    chunk = DPA_CHUNK_NBYTES
    return NicModel(
        name=name, clock_hz=hz, cores=1, threads_per_core=1,
        cycles_per_chunk=float(d["seconds_per_chunk"]) * hz,
        cycles_per_byte=float(d["seconds_per_byte"]) * hz,
        chunk_nbytes=chunk, queue_chunks=HOST_RCVBUF_NBYTES // chunk,
        source=f"polycast's measured {what} ({d.get('source', '?')})")


def host_python(path: str | None = None) -> NicModel:
    return _host("host-python", load_host_python(path), "Python receive path")


def host_native(path: str | None = None) -> NicModel:
    return _host("host-native", load_host_native(path), "compiled receive path")


PRESETS = {"bf3-dpa": bf3_dpa, "host-python": host_python, "host-native": host_native}


def nic_preset(name: str) -> NicModel:
    try:
        return PRESETS[name]()
    except KeyError:
        raise UnknownName("NIC preset", name, PRESETS) from None


# -- "--nic" strings ----------------------------------------------------------------------

_KEYS = {
    # key: (field, parser)
    "clock": ("clock_hz", parse_frequency),
    "cores": ("cores", None),
    "threads": ("threads_per_core", None),
    "threads_per_core": ("threads_per_core", None),
    "cycles": ("cycles_per_chunk", float),
    "cycles_per_chunk": ("cycles_per_chunk", float),
    "cycles_per_byte": ("cycles_per_byte", float),
    "stall": ("stall_cycles_per_chunk", float),
    "stall_cycles": ("stall_cycles_per_chunk", float),
    "chunk": ("chunk_nbytes", None),
    "queue": ("queue_chunks", None),
}


def parse_count(text: str, what: str) -> int:
    """A whole number > 0 (cores, threads, queue depth)."""
    try:
        v = int(str(text).strip())
    except ValueError:
        raise InvalidArgument(f"{what} must be a whole number > 0, got {text!r}") from None
    if v <= 0:
        raise InvalidArgument(f"{what} must be a whole number > 0, got {text!r}")
    return v


def parse_cycles(text: str, what: str, allow_zero: bool = False) -> float:
    """Cycles: a plain number, optionally followed by ``cycles``."""
    s = str(text).strip().lower().removesuffix("cycles").strip()
    try:
        v = float(s)
    except ValueError:
        raise InvalidArgument(f"{what} must be a number of cycles, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise InvalidArgument(f"{what} must be {'>= 0' if allow_zero else '> 0'} cycles, "
                              f"got {text!r}")
    return v


def parse_chunk(text: str) -> int:
    """A chunk size with its unit (``4KiB``, ``4096B``): > 0 bytes."""
    s = str(text).strip()
    if not s or s[-1].isdigit():
        raise InvalidArgument(f"chunk size {text!r} needs a unit, e.g. 4KiB or 4096B")
    n = parse_size(s)
    if n <= 0:
        raise InvalidArgument(f"chunk size must be > 0 bytes, got {text!r}")
    return n


def _value(key: str, text: str):
    field, _ = _KEYS[key]
    if field in ("cores", "threads_per_core", "queue_chunks"):
        return parse_count(text, key)
    if field == "chunk_nbytes":
        return parse_chunk(text)
    if field == "clock_hz":
        return parse_frequency(text)
    return parse_cycles(text, key, allow_zero=field != "cycles_per_chunk")


def parse_nic(text: str) -> NicModel:
    """``bf3-dpa``, ``host-python``, a preset with changes (``bf3-dpa:cores=8,queue=4096``)
    or parameters alone (``clock=1.8GHz,cores=16,threads=16,cycles=590,chunk=4KiB``;
    ``clock``, ``cores`` and ``cycles`` required)."""
    s = str(text).strip()
    name, sep, params = s.partition(":")
    if "=" in name:                       # parameters only
        name, params = "", s
    base = nic_preset(name) if name else None
    kv = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        k, eq, v = item.partition("=")
        k = k.strip().lower().replace("-", "_")
        if not eq or not v.strip():
            raise InvalidArgument(f"--nic wants KEY=VALUE items, got {item!r}")
        if k not in _KEYS:
            raise UnknownName("NIC parameter", k, _KEYS)
        kv[_KEYS[k][0]] = _value(k, v.strip())
    if base is not None:
        return replace(base, name=s if kv else base.name, **kv)
    missing = [k for k, f in (("clock", "clock_hz"), ("cores", "cores"),
                              ("cycles", "cycles_per_chunk")) if f not in kv]
    if missing:
        raise InvalidArgument(f"--nic {s!r}: missing {', '.join(missing)} (or start from a "
                              f"preset: {', '.join(PRESETS)})")
    kv.setdefault("threads_per_core", 1)
    return NicModel(name=s, source="--nic parameters", **kv)
