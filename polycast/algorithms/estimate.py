"""How big a schedule will be, found before building it.

A schedule holds one :class:`~polycast.schedule.ir.Step` per message per rank, so most
allgather, alltoall and ring-style algorithms grow as P^2: 100,000 ranks would be billions of
steps, and building them would exhaust memory long before anyone learns why. :func:`estimate`
builds the same algorithm for two small rank counts (16 and 32, or the nearest pair it
supports), counts steps and block references, and extrapolates with the growth exponent the
pair shows. This needs no per-algorithm formula, so a newly registered algorithm is covered
too; it overestimates slowly growing terms (P log P) a little, which errs on the safe side.

:func:`check` raises :class:`TooLarge` when the estimated memory exceeds
``POLYCAST_MAX_SCHEDULE_GIB`` (default 4 GiB), naming the largest rank count that fits and
the algorithms of the same collective that would fit at this one. ``build`` calls it for
more than :data:`CHECK_ABOVE_RANKS` ranks (below that every schedule is small).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..collectives import Collective
from ..config import Config, current
from ..errors import InvalidArgument, PolycastError

CHECK_ABOVE_RANKS = 256
# Measured resident bytes of built schedules (ring/mcast allgather, bruck, rabenseifner at
# 512-1024 ranks): about 300 B per step and 130 B per block or dependency reference.
STEP_NBYTES, REF_NBYTES = 300, 130
# A compact schedule (polycast/schedule/compact.py) timed on the simulator's fast path:
# the columns plus the fast path's graph, measured at its peak (1024-rank ring allgather:
# 2.1 M steps, ~1.0 GB resident).
FAST_STEP_NBYTES = 480
# A template schedule (every rank one program up to a shift) timed position by position
# (polycast/sim/fast_stream.py): per rank its state and route, and 8 B per program position
# whose times are held at once (Template.live_positions), whatever the step count.
STREAM_RANK_NBYTES = 4096
_SAMPLES = ((16, 32), (32, 64), (8, 16), (9, 36), (12, 24), (6, 12), (4, 8))


class TooLarge(InvalidArgument):
    """A request whose work would exceed a configured limit (the message says which)."""


@dataclass(frozen=True)
class Estimate:
    collective: str
    algorithm: str
    nranks: int
    steps: float
    refs: float
    exponent: float                 # memory grows as P ** exponent
    compact: bool = False           # built as columns, timed on the fast path
    stream: bool = False            # a template, timed position by position (fast_stream)
    live: float = 0.0               # ... program positions' times it holds at once
    live_exponent: float = 0.0      # ... growing as P ** live_exponent
    walked: bool = False            # built as Steps, then timed on the fast path

    @property
    def nbytes(self) -> float:
        """Estimated resident memory of the built schedule, in bytes."""
        if self.stream:
            return self._stream_nbytes(self.nranks)
        if self.compact:
            return self.steps * FAST_STEP_NBYTES
        if self.walked:               # the Steps, and the fast path's columns and graph
            return self.steps * (STEP_NBYTES + FAST_STEP_NBYTES) + self.refs * REF_NBYTES
        return self.steps * STEP_NBYTES + self.refs * REF_NBYTES

    def _stream_nbytes(self, nranks: int) -> float:
        live = self.live * (nranks / self.nranks) ** self.live_exponent
        return nranks * (STREAM_RANK_NBYTES + 8 * live)

    def max_ranks(self, limit_nbytes: float) -> int:
        """About the largest rank count whose schedule fits ``limit_nbytes``."""
        if self.stream:               # P (C + 8 live(P)) grows monotonically: bisect
            lo, hi = 1, 1
            while self._stream_nbytes(hi) <= limit_nbytes and hi < 2**40:
                lo, hi = hi, hi * 2
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._stream_nbytes(mid) <= limit_nbytes else (lo, mid)
            return lo
        e = max(self.exponent, 1.0)
        return max(1, int(self.nranks * (limit_nbytes / self.nbytes) ** (1 / e)))


def limit_nbytes(cfg: Config | None = None) -> float:
    """POLYCAST_MAX_SCHEDULE_GIB in bytes: ``cfg``'s, else the current configuration's."""
    return (cfg or current()).max_schedule_nbytes


def _scaled(options: dict, nranks: int, sample: int) -> dict | None:
    """Options for a ``sample``-rank build standing for ``nranks`` ranks: hierarchical
    grids keep their ranks per host and scale the hosts."""
    opts = dict(options)
    rph = opts.get("ranks_per_host")
    if rph is None and "hosts" in opts and opts["hosts"]:
        rph = nranks // opts["hosts"]
    if rph is not None:
        if sample % rph:
            return None
        opts.update(hosts=sample // rph, ranks_per_host=rph)
    return opts


@lru_cache(maxsize=256)
def _sample(coll: Collective, algorithm: str, nranks: int, nchunks: int, channels: int,
            options: tuple) -> tuple[int, int, int, int, int, int] | None:
    from .registry import build
    opts = dict(options)
    for p1, p2 in _SAMPLES:
        got = []
        for p in (p1, p2):
            o = _scaled(opts, nranks, p)
            if o is None:
                break
            try:
                count = 0 if coll is Collective.BARRIER else p * nchunks * channels
                s = build(coll, algorithm, p, count, nchunks=nchunks, channels=channels, **o)
            except PolycastError:
                break
            refs = sum(len(st.blocks) + len(st.deps) + len(st.dst_blocks)
                       for prog in s.programs for st in prog)
            got.append((p, s.nsteps, refs))
        if len(got) == 2:
            return got[0] + got[1]
    return None


def estimate(collective, algorithm: str, nranks: int, nchunks: int = 1, channels: int = 1,
             compact: bool = False, stream: bool = True, **options) -> Estimate | None:
    """The estimated size of ``build(collective, algorithm, nranks, ...)``, or None when no
    small instance of the algorithm could be built to extrapolate from. ``compact``: of
    the compact form (``build(..., compact=True)``) where the algorithm has one, on the
    simulator's fast path (without one: the Steps plus the walk's columns and graph);
    ``stream``: of an algorithm whose compact form is a template
    or token multicast (:mod:`polycast.schedule.compact`), as
    the fast path's stream mode holds it (False: as columns, for the walk)."""
    coll = Collective.parse(collective)
    got = _sample(coll, algorithm, nranks, nchunks, channels,
                  tuple(sorted((k, v) for k, v in options.items())))
    if got is None:
        return None
    p1, s1, r1, p2, s2, r2 = got
    span = math.log(p2 / p1)

    def grow(a: int, b: int) -> tuple[float, float]:
        e = math.log(max(b, 1) / max(a, 1)) / span if a and b else 1.0
        e = max(e, 0.0)
        return b * (nranks / p2) ** e, e
    steps, _ = grow(s1, s2)
    refs, _ = grow(r1, r2)
    _, e_mem = grow(s1 * STEP_NBYTES + r1 * REF_NBYTES, s2 * STEP_NBYTES + r2 * REF_NBYTES)
    streamed, live, asked = False, 0.0, compact
    if compact:
        from .registry import _COMPACT, _TEMPLATES
        compact = (coll, algorithm) in _COMPACT and channels == 1 and "counts" not in options
        if compact:
            _, e_mem = grow(s1, s2)
            streamed = stream and (coll, algorithm) in _TEMPLATES
        if streamed:
            l1, l2 = (_live(coll, algorithm, p, nchunks,
                            tuple(sorted(_scaled(options, nranks, p).items())))
                      for p in (p1, p2))
            live, e_live = grow(l1, l2)
    walked = bool(asked) and not compact
    if walked:
        _, e_mem = grow(s1 * (STEP_NBYTES + FAST_STEP_NBYTES) + r1 * REF_NBYTES,
                        s2 * (STEP_NBYTES + FAST_STEP_NBYTES) + r2 * REF_NBYTES)
    return Estimate(str(coll), algorithm, nranks, steps, refs, e_mem, compact, streamed,
                    live, e_live if streamed else 0.0, walked)


@lru_cache(maxsize=64)
def _live(coll: Collective, algorithm: str, nranks: int, nchunks: int, options: tuple) -> int:
    """held_per_rank() of a small instance's stream form (for how a stream grows)."""
    from .registry import _COMPACT, Spec
    t = _COMPACT[(coll, algorithm)](Spec(coll, nranks, nranks * nchunks, 0, nchunks,
                                         dict(options)))
    return t.held_per_rank()


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**40:.1f} TiB" if nbytes >= 2**40 else f"{nbytes / 2**30:.1f} GiB"


def check(collective, algorithm: str, nranks: int, nchunks: int = 1, channels: int = 1,
          compact: bool = False, *, limit: float | None = None, stream: bool = True,
          why: str = "", **options) -> Estimate | None:
    """Raise :class:`TooLarge` if the schedule would not fit ``limit`` bytes (default
    :func:`limit_nbytes`; ``compact``: as the simulator's fast path holds it, where the
    algorithm has a compact form; ``stream``: see :func:`estimate`; ``why``: a reason to
    put first in the message)."""
    if nranks <= CHECK_ABOVE_RANKS:
        return None
    est = estimate(collective, algorithm, nranks, nchunks, channels, compact, stream,
                   **options)
    limit = limit_nbytes() if limit is None else limit
    if est is None or est.nbytes <= limit:
        return est
    from .registry import algorithms
    fits = []
    for other in algorithms(collective):
        if other.name == algorithm or set(options) - set(other.options):
            continue
        if other.unsupported_reason(nranks, options or None):
            continue
        o = estimate(collective, other.name, nranks, nchunks, channels, compact, stream,
                     **options)
        if o is not None and o.nbytes <= limit:
            fits.append(other.name)
    cheaper = f"at most about {est.max_ranks(limit):,} ranks with {algorithm}"
    if fits:
        cheaper += f", or {', '.join(fits)} at {nranks:,} ranks"
    if nchunks > 1 or channels > 1:
        cheaper += ", or fewer --nchunks/--channels"
    raise TooLarge(
        why + f"{est.collective} {algorithm!r} on {nranks:,} ranks would build a schedule of about "
        f"{est.steps:.2g} steps (~{_gib(est.nbytes)}), over the limit of "
        f"{_gib(limit)} (POLYCAST_MAX_SCHEDULE_GIB); cheaper: {cheaper}")
