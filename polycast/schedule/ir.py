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
    """How a buffer of ``nelems`` elements is cut into ``parts * sub`` blocks."""

    nelems: int
    parts: int = 1
    sub: int = 1

    @property
    def nblocks(self) -> int:
        return self.parts * self.sub

    def block_range(self, b: int) -> tuple[int, int]:
        """Element range ``[start, stop)`` of block ``b``."""
        p, s = divmod(b, self.sub)
        n, parts, sub = self.nelems, self.parts, self.sub
        lo, hi = p * n // parts, (p + 1) * n // parts
        w = hi - lo
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


@dataclass(frozen=True)
class Schedule:
    """Per-rank programs for one collective call. Pure data; see the module docstring."""

    collective: Collective
    algorithm: str
    nranks: int
    root: int
    count: int                          # elements, per the collective's convention
    layouts: dict[str, Layout]          # buffer name -> layout (only buffers in use)
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

    def step_nelems(self, step: Step) -> int:
        """Elements a step moves (0 for control messages)."""
        if not step.blocks:
            return 0
        return self.layouts[step.buf].nelems_of(step.blocks)

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return (f"{self.collective} {self.algorithm} P={self.nranks} root={self.root} "
                f"count={self.count}" + (f" ({opts})" if opts else ""))
