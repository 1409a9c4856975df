"""Estimates: one algorithm of one collective, at one size, on one communicator and fabric.

An algorithm's terms come from its schedule (:mod:`polycast.planner.analyze`), built at the
communicator's size when that is cheap. A schedule whose step count grows past
``STEP_BUDGET`` (a ring at a thousand ranks has millions of steps) is analysed at three
smaller rank counts on the same fabric and each term extrapolated along
``c0 + c1 log2 P + c2 P`` -- the growth laws of trees, butterflies and rings -- so any
registered algorithm still gets an estimate, marked as extrapolated.

Pipelining: an algorithm is estimated at ``nchunks`` 1, 2, 4, ... 32 (blocks no smaller
than the fabric's ``min_chunk_nbytes``) and keeps the fastest; larger values stop being
tried once doubling stops paying (a ring gains nothing from cutting its steps).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..algorithms import build, get
from ..collectives import Collective
from .analyze import Terms, analyze
from .fabric import CommShape, Fabric

STEP_BUDGET = 24_000            # steps analysed exactly; more are extrapolated
NCHUNKS = (1, 2, 4, 8, 16, 32)
MIN_CHUNK_NBYTES = 64 << 10     # default smallest pipelined block


@dataclass(frozen=True)
class Estimate:
    """One candidate's predicted time, and how it was obtained."""

    algorithm: str
    nchunks: int
    seconds: float
    latency_s: float            # the time of an empty message through it
    gbps: float                 # effective rate for large sizes (Gbit/s of S)
    bound: str                  # "latency" or the resource bounding its busiest phase
    how: str                    # "schedule P=..." or "extrapolated from P=..."
    path: str = "engine"        # "engine" or "symm"
    fanout: int = 1             # most ranks one rank sends to at once

    def describe(self) -> str:
        k = f", nchunks {self.nchunks}" if self.nchunks > 1 else ""
        return (f"{self.algorithm}{k}: {_fmt_s(self.seconds)} (latency "
                f"{_fmt_s(self.latency_s)}, {self.gbps:.1f} Gbit/s, {self.bound}; {self.how})")


def _fmt_s(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"


def algorithm_options(coll: Collective, algorithm: str, shape: CommShape) -> dict:
    """Options an algorithm is built with for this communicator (hierarchical ones get
    its hosts x ranks per host)."""
    if get(coll, algorithm).hierarchical:
        return {"hosts": shape.hosts, "ranks_per_host": shape.ranks_per_host}
    return {}


class _TermsCache:
    """Analyses are pure functions of (schedule parameters, fabric): kept in an LRU."""

    def __init__(self, size: int = 2048) -> None:
        self._d: OrderedDict = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
            return hit

    def put(self, key, value) -> None:
        with self._lock:
            self._d[key] = value
            if len(self._d) > self._size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


_CACHE = _TermsCache()
_STEPS = _TermsCache(4096)
_BUILT = _TermsCache(4)          # the last schedules built (counted, then analysed)


def _build(coll: Collective, algorithm: str, P: int, nchunks: int, options: dict, root=0):
    key = (coll, algorithm, P, nchunks, tuple(sorted(options.items())), root)
    s = _BUILT.get(key)
    if s is None:
        s = build(coll, algorithm, P, _count(coll, P, nchunks), root=root, nchunks=nchunks,
                  **options)
        _BUILT.put(key, s)
    return s


def _count(coll: Collective, P: int, nchunks: int) -> int:
    # Elements enough that every block is non-empty and the same size.
    return P * nchunks * 64


def exact_terms(coll: Collective, algorithm: str, P: int, nchunks: int, options: dict,
                fabric: Fabric, root: int = 0) -> Terms:
    key = ("exact", coll, algorithm, P, nchunks, tuple(sorted(options.items())), root,
           fabric.key)
    hit = _CACHE.get(key)
    if hit is None:
        sched = _build(coll, algorithm, P, nchunks, options, root)
        hit = analyze(sched, fabric, innet=get(coll, algorithm).innet)
        _CACHE.put(key, hit)
        if nchunks == 1:
            _STEPS.put((coll, algorithm, P, 1, tuple(sorted(options.items()))), sched.nsteps)
    return hit


def steps_at(coll: Collective, algorithm: str, P: int, nchunks: int, options: dict) -> int:
    """Steps of the schedule, about: counted at one chunk when P <= 64 (cheap), else
    predicted from the two largest smaller rank counts along their growth (a ring's P^2,
    a tree's P log P); pipelining multiplies the messages by the depth at most."""
    okey = (coll, algorithm, P, 1, tuple(sorted(options.items())))
    n = _STEPS.get(okey)
    if n is None:
        if P <= 64:
            n = _build(coll, algorithm, P, 1, options).nsteps
        else:
            pts = smaller(coll, algorithm, P, options, 2, most=64)
            if len(pts) < 2:
                return 1 << 62
            a, b = (steps_at(coll, algorithm, q, 1, _scaled(options, q)) for q in pts)
            growth = math.log(max(b, 1) / max(a, 1)) / math.log(pts[1] / pts[0])
            n = int(b * (P / pts[1]) ** max(growth, 1.0))
        _STEPS.put(okey, n)
    return n * nchunks


def _scaled(options: dict, P: int) -> dict:
    """Hierarchical options at a smaller rank count: same ranks per host, fewer hosts."""
    if "ranks_per_host" in options:
        return {**options, "hosts": max(1, P // options["ranks_per_host"])}
    return options


def smaller(coll: Collective, algorithm: str, P: int, options: dict, n: int,
            most: int | None = None) -> list[int]:
    """Up to ``n`` rank counts below P (at most ``most``), ascending, each about half the
    next, that the algorithm supports: P/2, P/4, ... or powers of two (whole hosts for
    hierarchical algorithms)."""
    algo = get(coll, algorithm)
    R = options.get("ranks_per_host", 1)
    cands = {P >> j for j in range(1, 12)} | {1 << j for j in range(1, 12)}
    out = []
    for q in sorted(cands, reverse=True):
        if q >= P or q < 2 or q % R or (most is not None and q > most):
            continue
        if out and q > out[-1] * 0.6:
            continue        # keep the samples about a factor 2 apart
        if algo.unsupported_reason(q, _scaled(options, q)) is None:
            out.append(q)
        if len(out) == n:
            break
    return sorted(out)


def terms(coll: Collective, algorithm: str, P: int, nchunks: int, options: dict,
          fabric: Fabric, root: int = 0) -> tuple[Terms, str]:
    """The algorithm's terms at P (exact, or extrapolated when the schedule is too big to
    analyse quickly) and how they were obtained."""
    if P <= 64 or steps_at(coll, algorithm, P, nchunks, options) <= STEP_BUDGET:
        return (exact_terms(coll, algorithm, P, nchunks, options, fabric, root),
                f"schedule at P={P}")
    key = ("extra", coll, algorithm, P, nchunks, tuple(sorted(options.items())), fabric.key)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    # The three largest smaller rank counts whose schedules fit the budget.
    pts = [q for q in smaller(coll, algorithm, P, options, 12)
           if steps_at(coll, algorithm, q, nchunks, _scaled(options, q)) <= STEP_BUDGET][-3:]
    samples = [exact_terms(coll, algorithm, q, nchunks, _scaled(options, q), fabric)
               for q in pts]
    res = (_extrapolate(pts, samples, P), f"extrapolated from P={','.join(map(str, pts))}")
    _CACHE.put(key, res)
    return res


def _extrapolate(pts: list[int], samples: list[Terms], P: int) -> Terms:
    """Fit the latency line and the bandwidth line of ``samples`` along
    ``c0 + c1 log2 P + c2 P`` and evaluate at P (never below the largest sample)."""
    lat = [max(t.lines, key=lambda ln: (ln[0], ln[1])) for t in samples]
    bw = [max(t.lines, key=lambda ln: (ln[1], ln[0])) for t in samples]
    lines = []
    for series in (lat, bw):
        a = _fit([ln[0] for ln in series], pts, P)
        b = _fit([ln[1] for ln in series], pts, P)
        lines.append((a, b))
    last = samples[-1]
    ratio = P / pts[-1]
    return Terms(tuple(sorted(set(lines))), int(last.hops * ratio) if last.hops else 0,
                 int(last.phases * ratio), int(last.messages * ratio),
                 int(last.host_messages * ratio), last.host_bytes_per_byte, last.bound,
                 max(last.fanout, round(_fit([float(t.fanout) for t in samples], pts, P))))


def _fit(ys: list[float], xs: list[int], x: int) -> float:
    """Exact fit through the samples on the basis (1, log2 P, P) (fewer terms with fewer
    samples); never below the last sample, never above linear growth from it."""
    n = len(xs)
    basis = [lambda p: 1.0, lambda p: math.log2(p), lambda p: float(p)][:n]
    A = [[f(p) for f in basis] for p in xs]
    coef = _solve(A, ys)
    val = sum(c * f(x) for c, f in zip(coef, basis)) if coef else ys[-1]
    lo = ys[-1]
    hi = ys[-1] * x / xs[-1] if ys[-1] > 0 else ys[-1]
    return min(max(val, lo), max(hi, lo))


def _solve(A, y):
    n = len(A)
    M = [row[:] + [v] for row, v in zip(A, y)]
    for i in range(n):
        piv = max(range(i, n), key=lambda r: abs(M[r][i]))
        if abs(M[piv][i]) < 1e-300:
            return None
        M[i], M[piv] = M[piv], M[i]
        for r in range(n):
            if r != i:
                f = M[r][i] / M[i][i]
                for c in range(i, n + 1):
                    M[r][c] -= f * M[i][c]
    return [M[i][n] / M[i][i] for i in range(n)]


def estimate(coll: Collective, algorithm: str, nbytes: int, shape: CommShape,
             fabric: Fabric, root: int = 0, nchunks: int | None = None) -> Estimate:
    """The algorithm's best estimate over pipelining depths (or at ``nchunks``)."""
    P = shape.nranks
    opts = algorithm_options(coll, algorithm, shape)
    if nchunks is not None:
        choices = (nchunks,)
    else:
        choices = _nchunks_choices(coll, algorithm, nbytes, P, opts, fabric)
    best: Estimate | None = None
    for k in choices:
        t, how = terms(coll, algorithm, P, k, opts, fabric, root)
        secs = t.time(nbytes, fabric)
        if best is not None and secs >= best.seconds * 0.98:
            break           # pipelining deeper stopped paying
        slope = t.seconds_per_byte
        gbps = 8 / slope / 1e9 if slope > 0 else math.inf
        bound = "latency" if t.latency_s >= nbytes * slope else t.bound
        best = Estimate(algorithm, k, secs, t.latency_s, gbps, bound, how, fanout=t.fanout)
    return best


def _nchunks_choices(coll: Collective, algorithm: str, nbytes: int, P: int, options: dict,
                     fabric: Fabric) -> tuple[int, ...]:
    if get(coll, algorithm).multicast or nbytes <= 0:
        return (1,)         # multicast streams are cut into datagrams already
    minimum = fabric.min_chunk_nbytes or MIN_CHUNK_NBYTES
    part = nbytes / parts(coll, algorithm, P, options)
    # Depths whose schedule (at up to 64 ranks) is cheap to analyse: a ring cut into 32
    # chunks has hundreds of thousands of steps and gains next to nothing from it.
    q = min(P, 64)
    oq = _scaled(options, q) if q < P else options
    return tuple(k for k in NCHUNKS if k == 1 or (
        part / k >= minimum and steps_at(coll, algorithm, q, k, oq) <= STEP_BUDGET))


def parts(coll: Collective, algorithm: str, P: int, options: dict) -> int:
    """Parts of the schedule's largest buffer (P for a ring, 2 for a double tree, 1 for a
    chain): a pipelined block is a part cut into nchunks. Read from builds at P <= 16
    (layouts scale with P or not at all)."""
    key = ("parts", coll, algorithm, P, tuple(sorted(options.items())))
    hit = _STEPS.get(key)
    if hit is None:
        if P <= 16:
            s = build(coll, algorithm, P, _count(coll, P, 1), **options)
            hit = max((lay.parts for lay in s.layouts.values()), default=1)
        else:
            q = smaller(coll, algorithm, P, options, 1, most=16)
            small = parts(coll, algorithm, q[0], _scaled(options, q[0])) if q else 1
            hit = max(1, small * P // q[0]) if q and small >= q[0] else small
        _STEPS.put(key, hit)
    return hit
