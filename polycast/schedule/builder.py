"""Build schedules step by step, with data-hazard dependencies inferred.

Algorithm generators emit each rank's steps in a valid program order; the builder adds the
dependencies that the data requires (read-after-write, write-after-read and
write-after-write on every block) so that everything else may overlap. Generators add
explicit ``deps`` only for ordering the data does not show (tokens, flow control).
"""

from __future__ import annotations

from ..collectives import Collective
from ..errors import ScheduleError
from .ir import Kind, Layout, Schedule, Step


class Builder:
    def __init__(self, collective: Collective, nranks: int, root: int, count: int,
                 algorithm: str, layouts: dict[str, Layout], **options) -> None:
        self.collective, self.nranks, self.root, self.count = collective, nranks, root, count
        self.algorithm, self.layouts, self.options = algorithm, dict(layouts), options
        self._programs: list[list[Step]] = [[] for _ in range(nranks)]
        # per rank: (buf, block) -> [last writer index or -1, reader indices since]
        self._state: list[dict[tuple[str, int], list]] = [{} for _ in range(nranks)]
        # per rank: (kind, peer) -> messages numbered so far (the steps' tags)
        self._tags: list[dict[tuple[Kind, int], int]] = [{} for _ in range(nranks)]

    # -- helpers for generators ---------------------------------------------------------
    def blocks(self, buf: str, part: int | None = None) -> tuple[int, ...]:
        """All blocks of ``buf``, or those of one part."""
        lay = self.layouts[buf]
        if part is None:
            return tuple(range(lay.nblocks))
        return tuple(range(part * lay.sub, (part + 1) * lay.sub))

    def parts(self, buf: str, parts) -> tuple[int, ...]:
        """The blocks of several parts, in order."""
        sub = self.layouts[buf].sub
        return tuple(b for p in parts for b in range(p * sub, (p + 1) * sub))

    def last(self, rank: int) -> int:
        """Index of ``rank``'s most recent step, or -1."""
        return len(self._programs[rank]) - 1

    # -- steps --------------------------------------------------------------------------
    def send(self, rank: int, peer: int, buf: str = "", blocks=(), deps=()) -> int:
        self._check_peer(rank, peer)
        return self._add(rank, Kind.SEND, peer, buf, tuple(blocks), False, deps)

    def recv(self, rank: int, peer: int, buf: str = "", blocks=(), reduce: bool = False,
             deps=()) -> int:
        self._check_peer(rank, peer)
        return self._add(rank, Kind.RECV, peer, buf, tuple(blocks), reduce, deps)

    def copy(self, rank: int, buf: str, blocks, dst: str, dst_blocks=None,
             reduce: bool = False, deps=()) -> int:
        blocks = tuple(blocks)
        dst_blocks = blocks if dst_blocks is None else tuple(dst_blocks)
        if len(dst_blocks) != len(blocks):
            raise ScheduleError(f"copy on rank {rank}: {len(blocks)} source blocks but "
                                f"{len(dst_blocks)} destination blocks")
        return self._add(rank, Kind.COPY, -1, buf, blocks, reduce, deps, dst, dst_blocks)

    def mcast(self, rank: int, buf: str, blocks, deps=()) -> int:
        return self._add(rank, Kind.MCAST, -1, buf, tuple(blocks), False, deps)

    def mrecv(self, rank: int, root: int, buf: str, blocks, deps=()) -> int:
        self._check_peer(rank, root)
        return self._add(rank, Kind.MRECV, root, buf, tuple(blocks), False, deps)

    # -- internals ----------------------------------------------------------------------
    def _check_peer(self, rank: int, peer: int) -> None:
        if not (0 <= rank < self.nranks and 0 <= peer < self.nranks) or rank == peer:
            raise ScheduleError(f"{self.algorithm}: bad rank pair {rank}->{peer} "
                                f"for {self.nranks} ranks")

    def _check_blocks(self, rank: int, buf: str, blocks: tuple[int, ...]) -> None:
        lay = self.layouts.get(buf)
        if lay is None:
            raise ScheduleError(f"{self.algorithm}: rank {rank} names buffer {buf!r}, "
                                f"which this schedule has no layout for")
        if min(blocks) < 0 or max(blocks) >= lay.nblocks:
            bad = next(b for b in blocks if not 0 <= b < lay.nblocks)
            raise ScheduleError(f"{self.algorithm}: rank {rank} names block {bad} of "
                                f"{buf!r}, which has {lay.nblocks} blocks")

    def _add(self, rank: int, kind: Kind, peer: int, buf: str, blocks: tuple[int, ...],
             reduce: bool, deps, dst: str = "", dst_blocks: tuple[int, ...] = ()) -> int:
        prog = self._programs[rank]
        idx = len(prog)
        need = set(deps)
        if need and (min(need) < 0 or max(need) >= idx):
            bad = next(d for d in need if not 0 <= d < idx)
            raise ScheduleError(f"{self.algorithm}: rank {rank} step {idx} depends on "
                                f"step {bad}, which is not an earlier step")
        state = self._state[rank]
        # what the step reads and writes (Step.reads/writes, inlined: this is the hot path)
        if kind is Kind.COPY:
            rd, wr, wbuf, wblocks = blocks, dst_blocks, dst, dst_blocks
        elif kind is Kind.SEND or kind is Kind.MCAST:
            rd, wr, wbuf, wblocks = blocks, (), "", ()
        else:
            rd, wr, wbuf, wblocks = (), blocks, buf, blocks
        if rd:
            self._check_blocks(rank, buf, rd)
            for b in rd:
                ent = state.get((buf, b))
                if ent and ent[0] >= 0:
                    need.add(ent[0])                      # read after write
        if wr:
            self._check_blocks(rank, wbuf, wblocks)
            for b in wblocks:
                key = (wbuf, b)
                ent = state.get(key)
                if ent:
                    if ent[0] >= 0:
                        need.add(ent[0])                  # write after write
                    need.update(ent[1])                   # write after read
                state[key] = [idx, []]
        for b in rd:
            ent = state.get((buf, b))
            if ent is None:
                state[(buf, b)] = [-1, [idx]]
            elif ent[0] != idx:
                ent[1].append(idx)
        tag = -1
        if kind is not Kind.COPY:       # messages: ordinal within (kind, peer), see ir.py
            counters = self._tags[rank]
            tag = counters.get((kind, peer), 0)
            counters[(kind, peer)] = tag + 1
        prog.append(Step(kind, peer, buf, blocks, reduce, tuple(sorted(need)), dst,
                         dst_blocks, tag))
        return idx

    def build(self) -> Schedule:
        """Freeze the programs (tags were numbered as steps were added)."""
        return Schedule(self.collective, self.algorithm, self.nranks, self.root, self.count,
                        self.layouts, tuple(tuple(p) for p in self._programs),
                        dict(self.options))


def number_messages(programs) -> tuple[tuple[Step, ...], ...]:
    """Set every message step's ``tag``: its ordinal among the SENDs (RECVs) between the
    same pair of ranks, or among the MCASTs of one root, in program order (for programs
    assembled outside a Builder, e.g. by concatenating channel instances)."""
    out_programs = []
    for prog in programs:
        counters: dict[tuple[Kind, int], int] = {}
        out = []
        for st in prog:
            if st.kind is not Kind.COPY:
                tag = counters.get((st.kind, st.peer), 0)
                counters[(st.kind, st.peer)] = tag + 1
                st = Step(st.kind, st.peer, st.buf, st.blocks, st.reduce, st.deps, st.dst,
                          st.dst_blocks, tag)
            out.append(st)
        out_programs.append(tuple(out))
    return tuple(out_programs)
