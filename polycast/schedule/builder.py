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
        return self._add(rank, Step(Kind.SEND, peer, buf, tuple(blocks)), deps)

    def recv(self, rank: int, peer: int, buf: str = "", blocks=(), reduce: bool = False,
             deps=()) -> int:
        self._check_peer(rank, peer)
        return self._add(rank, Step(Kind.RECV, peer, buf, tuple(blocks), reduce), deps)

    def copy(self, rank: int, buf: str, blocks, dst: str, dst_blocks=None,
             reduce: bool = False, deps=()) -> int:
        blocks = tuple(blocks)
        dst_blocks = blocks if dst_blocks is None else tuple(dst_blocks)
        if len(dst_blocks) != len(blocks):
            raise ScheduleError(f"copy on rank {rank}: {len(blocks)} source blocks but "
                                f"{len(dst_blocks)} destination blocks")
        return self._add(rank, Step(Kind.COPY, -1, buf, blocks, reduce, (), dst, dst_blocks),
                         deps)

    def mcast(self, rank: int, buf: str, blocks, deps=()) -> int:
        return self._add(rank, Step(Kind.MCAST, -1, buf, tuple(blocks)), deps)

    def mrecv(self, rank: int, root: int, buf: str, blocks, deps=()) -> int:
        self._check_peer(rank, root)
        return self._add(rank, Step(Kind.MRECV, root, buf, tuple(blocks)), deps)

    # -- internals ----------------------------------------------------------------------
    def _check_peer(self, rank: int, peer: int) -> None:
        if not (0 <= rank < self.nranks and 0 <= peer < self.nranks) or rank == peer:
            raise ScheduleError(f"{self.algorithm}: bad rank pair {rank}->{peer} "
                                f"for {self.nranks} ranks")

    def _check_blocks(self, rank: int, buf: str, blocks: tuple[int, ...]) -> None:
        if not blocks:
            return
        lay = self.layouts.get(buf)
        if lay is None:
            raise ScheduleError(f"{self.algorithm}: rank {rank} names buffer {buf!r}, "
                                f"which this schedule has no layout for")
        for b in blocks:
            if not 0 <= b < lay.nblocks:
                raise ScheduleError(f"{self.algorithm}: rank {rank} names block {b} of "
                                    f"{buf!r}, which has {lay.nblocks} blocks")

    def _add(self, rank: int, step: Step, deps) -> int:
        prog = self._programs[rank]
        idx = len(prog)
        need = set()
        for d in deps:
            if not 0 <= d < idx:
                raise ScheduleError(f"{self.algorithm}: rank {rank} step {idx} depends on "
                                    f"step {d}, which is not an earlier step")
            need.add(d)
        state = self._state[rank]
        rd, wr = step.reads(), step.writes()
        if rd:
            self._check_blocks(rank, *rd)
            for b in rd[1]:
                ent = state.get((rd[0], b))
                if ent and ent[0] >= 0:
                    need.add(ent[0])                      # read after write
        if wr:
            self._check_blocks(rank, *wr)
            for b in wr[1]:
                ent = state.get((wr[0], b))
                if ent:
                    if ent[0] >= 0:
                        need.add(ent[0])                  # write after write
                    need.update(ent[1])                   # write after read
                state[(wr[0], b)] = [idx, []]
        if rd:
            for b in rd[1]:
                ent = state.setdefault((rd[0], b), [-1, []])
                if ent[0] != idx:
                    ent[1].append(idx)
        prog.append(_with(step, deps=tuple(sorted(need))))
        return idx

    def build(self) -> Schedule:
        """Freeze the programs, numbering messages per rank pair and multicasts per root."""
        return Schedule(self.collective, self.algorithm, self.nranks, self.root, self.count,
                        self.layouts, number_messages(self._programs), dict(self.options))


def number_messages(programs) -> tuple[tuple[Step, ...], ...]:
    """Set every message step's ``tag``: its ordinal among the SENDs (RECVs) between the
    same pair of ranks, or among the MCASTs of one root, in program order."""
    out_programs = []
    for prog in programs:
        counters: dict[tuple[Kind, int], int] = {}
        out = []
        for step in prog:
            if step.kind is Kind.COPY:
                out.append(step)
                continue
            key = (step.kind, step.peer)
            tag = counters.get(key, 0)
            counters[key] = tag + 1
            out.append(_with(step, tag=tag))
        out_programs.append(tuple(out))
    return tuple(out_programs)


def _with(step: Step, **changes) -> Step:
    fields = {f: getattr(step, f) for f in Step.__slots__}
    fields.update(changes)
    return Step(**fields)
