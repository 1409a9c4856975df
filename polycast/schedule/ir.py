"""The schedule IR: per-rank programs of steps over numbered blocks of buffers.

A :class:`Schedule` is pure data. For every rank it holds an ordered tuple of
:class:`Step`; each step names the earlier steps of the same rank it depends on
(``deps``, indices into that rank's program). Program order is a valid execution order;
the runtime and the simulator may run a step as soon as all its deps are complete, so
independent steps overlap.

Buffers and blocks
------------------
Each rank has up to three buffers: ``send`` (input), ``recv`` (output) and ``tmp`` (scratch
the schedule asks for). A buffer of ``nelems`` elements is cut by a :class:`Layout`
``(parts, sub)`` into ``parts * sub`` blocks: part ``p`` covers elements
``[p*n//parts, (p+1)*n//parts)`` and is cut the same way into ``sub`` pieces; block
``b = p*sub + s``. Sizes need not divide: pieces differ by at most one element, and may be
empty. Steps name blocks, never byte offsets, so one schedule serves any element size.

Uneven (vector) layouts: ``Layout.uneven(counts, sub)`` gives part ``p`` exactly
``counts[p]`` elements (packed in part order; zeros allowed), each part still cut into
``sub`` near-equal pieces. When a buffer's size differs between ranks (Allgatherv's send,
Alltoallv's rows), the schedule holds a :class:`PerRank` layout: one Layout per rank, all
with the same ``parts`` and ``sub`` so that steps name the same blocks everywhere and only
their element ranges differ. ``layout.on(rank)`` is the rank's Layout in both cases
(``Schedule.layout(buf, rank)``). The vector counts of such a schedule are in
``options["counts"]`` (so they are part of the call's signature: ranks passing different
counts mismatch); see :func:`vector_sizes` for what they mean per collective.

Matching
--------
The k-th SEND from rank a to rank b (in a's program order) is received by the k-th RECV
from a in b's program order; ``tag`` holds that ordinal. The k-th MCAST of rank r is
received by the k-th MRECV(peer=r) of every other rank. A SEND/RECV with no blocks is a
control message (a token, a barrier signal) and carries no payload.

Completion rules (the "runtime's ordering rules" the verifier assumes)
----------------------------------------------------------------------
* A step starts when all its deps are complete.
* SEND completes once its payload has been handed off (the buffer may be reused); sends
  never wait for the receiver's RECV to be posted (receivers buffer early messages).
* RECV completes once the payload has been placed (copied or reduced) into its blocks.
* MCAST completes once all its datagrams were sent; MRECV completes once every block it
  names holds the root's data (the reliable-multicast protocol recovers losses).
* COPY runs synchronously.
* A reducing RECV or COPY stores ``incoming op local`` (MPI's ``invec op inoutvec``: the
  arriving or copied data is the left operand). Only scans rely on the order (their ops
  need not commute; the verifier checks they combine in rank order).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

from ..collectives import Collective

BUFFERS = ("send", "recv", "tmp")


class Kind(enum.IntEnum):
    SEND = 0    # blocks of `buf` -> `peer`
    RECV = 1    # `peer` -> blocks of `buf` (overwrite, or combine when `reduce`)
    COPY = 2    # local: blocks of `buf` -> blocks `dst_blocks` of `dst` (or combine)
    MCAST = 3   # blocks of `buf` -> every other rank, over (unreliable) multicast
    MRECV = 4   # the multicast of rank `peer` -> blocks of `buf`

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Step:
    kind: Kind
    peer: int = -1                    # SEND/RECV: the other rank; MRECV: the multicast root
    buf: str = ""                     # buffer read (SEND/MCAST/COPY) or written (RECV/MRECV)
    blocks: tuple[int, ...] = ()
    reduce: bool = False              # RECV/COPY: combine with the collective's op
    deps: tuple[int, ...] = ()        # indices of earlier steps of this rank
    dst: str = ""                     # COPY: destination buffer
    dst_blocks: tuple[int, ...] = ()  # COPY: destination blocks (same number as `blocks`)
    tag: int = -1                     # SEND/RECV: ordinal among messages of this pair;
    #                                   MCAST/MRECV: ordinal among this root's multicasts

    @property
    def is_control(self) -> bool:
        """A message that carries no data (a token or synchronisation signal)."""
        return not self.blocks

    def reads(self) -> tuple[str, tuple[int, ...]] | None:
        if self.kind in (Kind.SEND, Kind.MCAST, Kind.COPY) and self.blocks:
            return self.buf, self.blocks
        return None

    def writes(self) -> tuple[str, tuple[int, ...]] | None:
        if self.kind in (Kind.RECV, Kind.MRECV) and self.blocks:
            return self.buf, self.blocks
        if self.kind is Kind.COPY and self.dst_blocks:
            return self.dst, self.dst_blocks
        return None


@dataclass(frozen=True, slots=True)
class Layout:
    """How a buffer of ``nelems`` elements is cut into ``parts * sub`` blocks: near-equal
    parts, or exactly ``counts[p]`` elements in part ``p`` when ``counts`` is given."""

    nelems: int
    parts: int = 1
    sub: int = 1
    counts: tuple[int, ...] | None = None
    _starts: tuple[int, ...] | None = field(default=None, init=False, repr=False,
                                            compare=False)

    def __post_init__(self) -> None:
        if self.counts is not None:
            if len(self.counts) != self.parts or sum(self.counts) != self.nelems \
                    or min(self.counts, default=0) < 0:
                raise ValueError(f"uneven layout: counts {self.counts} do not make "
                                 f"{self.parts} parts of {self.nelems} elements")
            starts = [0]
            for c in self.counts:
                starts.append(starts[-1] + c)
            object.__setattr__(self, "_starts", tuple(starts))

    @classmethod
    def uneven(cls, counts, sub: int = 1) -> "Layout":
        """Part ``p`` holds exactly ``counts[p]`` elements (packed in part order)."""
        counts = tuple(int(c) for c in counts)
        return cls(sum(counts), len(counts), sub, counts)

    @property
    def nblocks(self) -> int:
        return self.parts * self.sub

    def on(self, rank: int) -> "Layout":
        """This layout as rank ``rank`` sees it (the same on every rank)."""
        return self

    def with_sub(self, sub: int) -> "Layout":
        """The same parts, each cut into ``sub`` pieces."""
        return Layout(self.nelems, self.parts, sub, self.counts)

    def block_range(self, b: int) -> tuple[int, int]:
        """Element range ``[start, stop)`` of block ``b``."""
        p, s = divmod(b, self.sub)
        if self._starts is None:
            n, parts = self.nelems, self.parts
            lo, hi = p * n // parts, (p + 1) * n // parts
        else:
            lo, hi = self._starts[p], self._starts[p + 1]
        w, sub = hi - lo, self.sub
        return lo + s * w // sub, lo + (s + 1) * w // sub

    def block_len(self, b: int) -> int:
        start, stop = self.block_range(b)
        return stop - start

    def runs(self, blocks: tuple[int, ...]) -> list[tuple[int, int]]:
        """Element ranges of ``blocks``, adjacent ranges merged (for scatter/gather I/O)."""
        out: list[tuple[int, int]] = []
        for b in blocks:
            start, stop = self.block_range(b)
            if stop == start:
                continue
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], stop)
            else:
                out.append((start, stop))
        return out

    def nelems_of(self, blocks: tuple[int, ...]) -> int:
        return sum(self.block_len(b) for b in blocks)


@dataclass(frozen=True, slots=True)
class PerRank:
    """A buffer whose size differs between ranks (a vector collective's send or recv):
    one :class:`Layout` per rank, all cut into the same ``parts * sub`` blocks, so steps
    name blocks alike on every rank. Element ranges come from ``on(rank)``."""

    layouts: tuple[Layout, ...]

    def __post_init__(self) -> None:
        shapes = {(l.parts, l.sub) for l in self.layouts}
        if len(shapes) != 1:
            raise ValueError(f"per-rank layouts must share parts and sub, got {shapes}")

    @property
    def parts(self) -> int:
        return self.layouts[0].parts

    @property
    def sub(self) -> int:
        return self.layouts[0].sub

    @property
    def nblocks(self) -> int:
        return self.layouts[0].nblocks

    def on(self, rank: int) -> Layout:
        return self.layouts[rank]

    def with_sub(self, sub: int) -> "PerRank":
        return PerRank(tuple(l.with_sub(sub) for l in self.layouts))


def per_rank(layouts) -> "Layout | PerRank":
    """One Layout when every rank's is the same, else a :class:`PerRank`."""
    layouts = tuple(layouts)
    return layouts[0] if all(l == layouts[0] for l in layouts) else PerRank(layouts)


@dataclass(frozen=True)
class Schedule:
    """Per-rank programs for one collective call. Pure data; see the module docstring."""

    collective: Collective
    algorithm: str
    nranks: int
    root: int
    count: int                          # elements, per the collective's convention
    layouts: dict[str, "Layout | PerRank"]  # buffer name -> layout (only buffers in use)
    programs: tuple[tuple[Step, ...], ...]
    options: dict = field(default_factory=dict)   # the generator's parameters, for display

    def program(self, rank: int) -> tuple[Step, ...]:
        return self.programs[rank]

    @cached_property
    def nsteps(self) -> int:
        return sum(len(p) for p in self.programs)

    @property
    def uses_multicast(self) -> bool:
        return any(s.kind in (Kind.MCAST, Kind.MRECV) for p in self.programs for s in p)

    def layout(self, buf: str, rank: int) -> Layout:
        """Rank ``rank``'s layout of buffer ``buf``."""
        return self.layouts[buf].on(rank)

    @property
    def counts(self):
        """A vector schedule's counts (see :func:`vector_sizes`), or None."""
        return self.options.get("counts")

    def step_nelems(self, step: Step, rank: int | None = None) -> int:
        """Elements a step of ``rank`` moves (0 for control messages); ``rank`` may be
        left out when the step's buffer is cut alike on every rank."""
        if not step.blocks:
            return 0
        lay = self.layouts[step.buf]
        if rank is None:
            if isinstance(lay, PerRank):
                raise ValueError(f"{step.buf!r} differs per rank: say which rank's step")
            return lay.nelems_of(step.blocks)
        return lay.on(rank).nelems_of(step.blocks)

    def describe(self) -> str:
        opts = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.options.items()))
        return (f"{self.collective} {self.algorithm} P={self.nranks} root={self.root} "
                f"count={self.count}" + (f" ({opts})" if opts else ""))


def _short(v) -> str:
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."
