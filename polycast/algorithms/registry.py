"""The algorithm registry: ``(collective, name) -> generator of schedules``.

A generator is a function ``gen(spec: Spec) -> Schedule``. Registering it is all it takes
for the verifier, the traffic table, the simulator, the runtime and the CLI to use it.
Names are short lowercase words shared by every interface (``ring``, ``dbtree``, ``mcast``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Callable

from ..collectives import Collective, check_rank_args
from ..errors import InvalidArgument, UnknownName, Unsupported
from ..schedule.builder import Builder, number_messages
from ..schedule.ir import Layout, Schedule, Step
from ..schedule.vector import check_counts
from . import estimate


@dataclass(frozen=True)
class Spec:
    """What a generator is asked to build. ``count`` follows the collective's convention
    (see :mod:`polycast.collectives`); ``nchunks`` is the pipelining depth (blocks per part);
    ``options`` holds algorithm parameters (``roots``, ``hosts``, ``ranks_per_host``,
    ``pattern``, ...)."""

    collective: Collective
    nranks: int
    count: int
    root: int = 0
    nchunks: int = 1
    options: dict = field(default_factory=dict)

    def opt(self, name: str, default=None):
        return self.options.get(name, default)

    @property
    def counts(self):
        """A vector call's counts (polycast.schedule.vector), or None for a uniform one."""
        return self.options.get("counts")

    def builder(self, algorithm: str, send: Layout | None, recv: Layout | None,
                tmp: Layout | None = None, **options) -> Builder:
        layouts = {n: l for n, l in (("send", send), ("recv", recv), ("tmp", tmp)) if l}
        return Builder(self.collective, self.nranks, self.root, self.count, algorithm,
                       layouts, nchunks=self.nchunks, **{**self.options, **options})


@dataclass(frozen=True)
class Algorithm:
    collective: Collective
    name: str
    generate: Callable[[Spec], Schedule]
    summary: str
    min_ranks: int = 1
    power_of_two: bool = False            # only for P = 2^k
    multicast: bool = False               # needs a multicast-capable network
    hierarchical: bool = False            # needs hosts / ranks_per_host
    innet: bool = False                   # the network reduces (SHARP-like): its sends to one
    #                                       destination are combined in the switches (simulator);
    #                                       elsewhere they run as the plain point-to-point schedule
    options: tuple[str, ...] = ()         # option names beyond nchunks/channels; "counts":
    #                                       builds the vector form (Allgatherv, ...) too

    def unsupported_reason(self, nranks: int, options: dict | None = None) -> str | None:
        if nranks < self.min_ranks:
            return f"needs at least {self.min_ranks} ranks"
        if self.power_of_two and nranks & (nranks - 1):
            return "needs a power-of-two number of ranks"
        if self.hierarchical:
            o = options or {}
            h, r = o.get("hosts"), o.get("ranks_per_host")
            if h is None and r is None:
                return None     # the generator defaults to one host per rank
            if h is not None and r is not None and h * r != nranks:
                return f"hosts x ranks_per_host = {h}x{r} is not {nranks} ranks"
        return None


_REGISTRY: dict[tuple[Collective, str], Algorithm] = {}
_COMPACT: dict[tuple[Collective, str], Callable] = {}
_TEMPLATES: set[tuple[Collective, str]] = set()     # of _COMPACT: give a streamed form


def register(collective: Collective | str, name: str, summary: str, **flags):
    """Decorator: ``@register("allgather", "ring", "one neighbour per step")``."""
    coll = Collective.parse(collective)

    def deco(fn: Callable[[Spec], Schedule]):
        key = (coll, name)
        if key in _REGISTRY:
            raise RuntimeError(f"algorithm {name!r} registered twice for {coll}")
        _REGISTRY[key] = Algorithm(coll, name, fn, summary, **flags)
        return fn
    return deco


def register_compact(collective: Collective | str, name: str, template: bool = False):
    """Decorator: a vectorised generator of registered algorithm ``name``'s columns
    (:mod:`polycast.schedule.compact`), for ``build(..., compact=True)``. It must give
    exactly the columns of the algorithm's own schedule (tests/test_compact.py).
    ``template``: it gives a form the simulator streams in O(P) memory (a
    :class:`~polycast.schedule.compact.Template` or ``TokenMulticast``)."""
    coll = Collective.parse(collective)

    def deco(fn):
        if template:
            _TEMPLATES.add((coll, name))
        _COMPACT[(coll, name)] = fn
        return fn
    return deco


def algorithms(collective: Collective | str | None = None) -> list[Algorithm]:
    """Every registered algorithm (of one collective), in registration order."""
    if collective is None:
        return list(_REGISTRY.values())
    coll = Collective.parse(collective)
    return [a for (c, _), a in _REGISTRY.items() if c is coll]


def get(collective: Collective | str, name: str) -> Algorithm:
    coll = Collective.parse(collective)
    algo = _REGISTRY.get((coll, name))
    if algo is None:
        raise UnknownName(f"algorithm for {coll}", name, [a.name for a in algorithms(coll)])
    return algo


def build(collective: Collective | str, algorithm: str, nranks: int, count: int,
          root: int = 0, nchunks: int = 1, channels: int = 1, compact: bool = False, *,
          max_schedule_nbytes: float | None = None, **options) -> Schedule:
    """Generate the schedule of ``algorithm`` for one call (the single entry point).
    ``compact``: a :class:`~polycast.schedule.compact.CompactSchedule` (columns from the
    algorithm's vectorised generator, Step programs built only when asked for) where the
    algorithm has one for this call, else the ordinary schedule. ``max_schedule_nbytes``:
    refuse (TooLarge) a schedule estimated to need more memory (default:
    POLYCAST_MAX_SCHEDULE_GIB of the current configuration)."""
    coll = Collective.parse(collective)
    check_rank_args(nranks, root, count)
    if not isinstance(nchunks, int) or nchunks < 1:
        raise InvalidArgument(f"nchunks must be a positive integer, got {nchunks!r}")
    if not isinstance(channels, int) or channels < 1:
        raise InvalidArgument(f"channels must be a positive integer, got {channels!r}")
    algo = get(coll, algorithm)
    if "counts" in options and options["counts"] is None:
        del options["counts"]                   # the uniform call
    unknown = set(options) - set(algo.options)
    if unknown:
        raise InvalidArgument(
            f"{coll} {algorithm} takes no option(s) {sorted(unknown)}; its options: "
            f"{', '.join(('nchunks', 'channels') + algo.options)}")
    if options.get("counts") is not None:
        # A vector call (polycast.schedule.vector): the counts, as tuples, are the schedule's
        # options, hence part of the call's signature; ``count`` becomes the largest.
        options["counts"] = counts = check_counts(coll, nranks, options["counts"])
        flat = [c for row in counts for c in row] if coll is Collective.ALLTOALL else counts
        count = max(flat, default=0)
    reason = algo.unsupported_reason(nranks, options)
    if reason:
        raise Unsupported(f"{coll} algorithm {algorithm!r} {reason} (asked for {nranks}); "
                          f"valid for {nranks} ranks: "
                          f"{', '.join(supported(coll, nranks)) or 'none'}")
    spec = Spec(coll, nranks, count, root, nchunks, dict(options))
    gen = _COMPACT.get((coll, algorithm)) if compact else None
    if gen is not None and channels == 1 and options.get("counts") is None and nranks > 1:
        if nranks > estimate.CHECK_ABOVE_RANKS:    # as columns, timed on the fast path
            estimate.check(coll, algorithm, nranks, nchunks, channels, compact=True,
                           limit=max_schedule_nbytes, **options)
        try:
            cols = gen(spec)
        except NotImplementedError:
            cols = None
        if cols is not None:
            from ..schedule.compact import CompactSchedule
            return CompactSchedule(
                coll, algorithm, nranks, root, count,
                {"nchunks": nchunks, **spec.options, **cols.options}, cols,
                lambda: build(coll, algorithm, nranks, count, root, nchunks, channels,
                              max_schedule_nbytes=max_schedule_nbytes, **options))
    if nranks > estimate.CHECK_ABOVE_RANKS:    # refuse what would not fit in memory
        estimate.check(coll, algorithm, nranks, nchunks, channels,   # counts: same shape
                       compact, limit=max_schedule_nbytes,
                       **{k: v for k, v in options.items() if k != "counts"})
    # Schedules are millions of small immutable objects at 1024 ranks; the cyclic garbage
    # collector would rescan them all repeatedly (15-40 % of build time) and finds nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sched = algo.generate(spec)
        if channels > 1:
            sched = split_channels(sched, channels)
    finally:
        if was_enabled:
            gc.enable()
    return sched


def supported(collective: Collective | str, nranks: int, options: dict | None = None
              ) -> list[str]:
    return [a.name for a in algorithms(collective)
            if a.unsupported_reason(nranks, options) is None]


def split_channels(base: Schedule, channels: int) -> Schedule:
    """Run ``channels`` independent instances of a schedule on disjoint slices of every part.

    As NCCL's channels: each part of each buffer is cut into ``channels`` contiguous slices
    and instance ``ch`` works on slice ``ch`` of every part. Block ``(p, s)`` of instance
    ``ch`` becomes block ``(p, ch*sub + s)`` of a layout with ``sub*channels`` pieces.
    """
    layouts = {n: l.with_sub(l.sub * channels) for n, l in base.layouts.items()}
    programs = []
    for prog in base.programs:
        out: list[Step] = []
        for ch in range(channels):
            off = len(out)

            def mapb(buf: str, blocks: tuple[int, ...]) -> tuple[int, ...]:
                if not blocks:
                    return blocks
                sub = base.layouts[buf].sub
                return tuple((b // sub) * sub * channels + ch * sub + b % sub for b in blocks)

            for st in prog:
                out.append(Step(st.kind, st.peer, st.buf, mapb(st.buf, st.blocks), st.reduce,
                                tuple(d + off for d in st.deps), st.dst,
                                mapb(st.dst, st.dst_blocks), -1))
        programs.append(out)
    return Schedule(base.collective, base.algorithm, base.nranks, base.root, base.count,
                    layouts, number_messages(programs), {**base.options, "channels": channels})
