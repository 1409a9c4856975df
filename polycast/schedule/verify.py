"""The verifier: symbolic execution of a schedule.

It proves, for one schedule, that

* every step is well formed (known buffers, blocks in range, deps point backwards, no
  reduction in a collective without an op, copies of equal sizes);
* every receive is matched: the k-th SEND a->b by the k-th RECV from a at b, every MCAST of
  a root by an MRECV on every other rank, with equal block counts and element sizes;
* no data race inside a rank: any two steps that touch the same block, one of them writing,
  are ordered by dependencies (so any execution the runtime may choose gives one result);
* no deadlock under the ordering rules of :mod:`polycast.schedule.ir` (eager sends): the
  graph of dependencies plus send->receive edges has no cycle;
* no rank sends data it does not hold;
* every rank ends with exactly the right data: each output block holds the right origin
  block, and for reductions combines exactly one contribution from every rank; for a scan
  (whose op need not commute) every combination joins two adjacent runs of ranks with the
  incoming one on the left (a reducing step stores ``incoming op local``, MPI's
  ``invec op inoutvec``), so the result is the op over ranks in rank order;
* for a barrier, every rank's completion causally follows every rank's entry.

Values are symbolic: a block holds ``(origin_block, rank_mask)`` — the index of the input
block it came from and the set of ranks whose contributions it combines.
"""

from __future__ import annotations

from ..collectives import Collective
from ..errors import ScheduleError
from .graph import Node, global_order, match_messages
from ..errors import InvalidArgument
from .ir import Kind, Layout, PerRank, Schedule, Step
from .vector import check_counts, vector_sizes


def verify(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` naming rank, step and problem, or return ``None``."""
    _Verifier(schedule).run()


class _Verifier:
    def __init__(self, s: Schedule) -> None:
        self.s = s
        self.P = s.nranks
        self.root_only_recv = s.collective in (Collective.REDUCE, Collective.GATHER)
        self.ordered = s.collective.ordered

    def fail(self, msg: str, rank: int | None = None, idx: int | None = None) -> None:
        where = ""
        if rank is not None:
            where = f" rank {rank}"
            if idx is not None:
                step = self.s.programs[rank][idx]
                where += f" step {idx} ({step.kind}"
                if step.peer >= 0:
                    where += f" peer {step.peer}"
                where += ")"
        raise ScheduleError(f"{self.s.describe()}:{where}: {msg}")

    # ------------------------------------------------------------------------------------
    def run(self) -> None:
        s = self.s
        if len(s.programs) != self.P:
            self.fail(f"{len(s.programs)} programs for {self.P} ranks")
        self.check_layouts()
        for rank, prog in enumerate(s.programs):
            for idx, step in enumerate(prog):
                self.check_step(rank, idx, step)
            self.check_races(rank, prog)
        matches = self.match()
        self.execute(matches)

    def check_layouts(self) -> None:
        """The send and recv layouts must cover exactly the call's buffers (on every rank:
        a vector call's differ per rank, see polycast.schedule.vector)."""
        s = self.s
        if s.counts is not None:
            try:
                counts = check_counts(s.collective, self.P, s.counts)
            except InvalidArgument as exc:
                self.fail(str(exc))
            sizes = vector_sizes(s.collective, self.P, counts)
            what = f"a {s.collective} of counts {counts}"
        else:
            sizes = [s.collective.buffer_counts(self.P, s.count)] * self.P
            what = f"a {s.collective} of count {s.count} over {self.P} ranks"
        for rank, (nsend, nrecv) in enumerate(sizes):
            for name, want in (("send", nsend), ("recv", nrecv)):
                lay = s.layouts.get(name)
                if lay is not None and lay.on(rank).nelems != want:
                    self.fail(f"the {name!r} layout covers {lay.on(rank).nelems} elements "
                              f"on rank {rank} but {what} has {want}")

    def check_step(self, rank: int, idx: int, st: Step) -> None:
        for d in st.deps:
            if not 0 <= d < idx:
                self.fail(f"depends on step {d}, which is not an earlier step", rank, idx)
        if st.kind in (Kind.SEND, Kind.RECV, Kind.MRECV):
            if not 0 <= st.peer < self.P or st.peer == rank:
                self.fail(f"peer {st.peer} is not another rank of {self.P}", rank, idx)
        wr = st.writes()
        if wr and wr[0] == "send":
            self.fail("writes into its input buffer 'send', which is read-only", rank, idx)
        if (self.root_only_recv and rank != self.s.root
                and "recv" in (st.buf if st.blocks else "", st.dst if st.dst_blocks else "")):
            self.fail(f"uses 'recv', which a {self.s.collective} has only at the root "
                      "(use 'tmp' for partial results)", rank, idx)
        if st.reduce:
            if not self.s.collective.has_op:
                self.fail(f"reduces, but {self.s.collective} has no reduction op", rank, idx)
            if st.kind not in (Kind.RECV, Kind.COPY):
                self.fail("only RECV and COPY may reduce", rank, idx)
        for buf, blocks in ((st.buf, st.blocks), (st.dst, st.dst_blocks)):
            if not blocks:
                continue
            lay = self.s.layouts.get(buf)
            if lay is None:
                self.fail(f"names buffer {buf!r}, which has no layout", rank, idx)
            for b in blocks:
                if not 0 <= b < lay.nblocks:
                    self.fail(f"block {b} of {buf!r} out of range 0..{lay.nblocks - 1}",
                              rank, idx)
        if st.kind is Kind.COPY:
            if len(st.blocks) != len(st.dst_blocks):
                self.fail("copy with different numbers of source and destination blocks",
                          rank, idx)
            src, dst = self.s.layout(st.buf, rank), self.s.layout(st.dst, rank)
            for a, b in zip(st.blocks, st.dst_blocks):
                if src.block_len(a) != dst.block_len(b):
                    self.fail(f"copy of block {a} ({src.block_len(a)} elements) into block "
                              f"{b} ({dst.block_len(b)} elements)", rank, idx)
        elif st.kind in (Kind.MCAST, Kind.MRECV) and not st.blocks:
            self.fail("a multicast must carry data", rank, idx)

    def check_races(self, rank: int, prog: tuple[Step, ...]) -> None:
        anc: list[int] = []          # bit i set: step i happens before this step
        for st in prog:
            a = 0
            for d in st.deps:
                a |= anc[d] | (1 << d)
            anc.append(a)

        def ordered(i: int, j: int) -> bool:      # i < j in program order
            return bool(anc[j] >> i & 1)

        last_write: dict[tuple[str, int], int] = {}
        readers: dict[tuple[str, int], list[int]] = {}
        for idx, st in enumerate(prog):
            rd, wr = st.reads(), st.writes()
            if rd:
                for b in rd[1]:
                    key = (rd[0], b)
                    w = last_write.get(key)
                    if w is not None and not ordered(w, idx):
                        self.fail(f"reads block {b} of {rd[0]!r} concurrently with step {w} "
                                  "writing it (add a dependency)", rank, idx)
            if wr:
                for b in wr[1]:
                    key = (wr[0], b)
                    w = last_write.get(key)
                    if w is not None and not ordered(w, idx):
                        self.fail(f"writes block {b} of {wr[0]!r} concurrently with step {w} "
                                  "writing it", rank, idx)
                    for r in readers.get(key, ()):
                        if r != idx and not ordered(r, idx):
                            self.fail(f"writes block {b} of {wr[0]!r} while step {r} may "
                                      "still be reading it", rank, idx)
                    last_write[key] = idx
                    readers[key] = []
            if rd:
                for b in rd[1]:
                    readers.setdefault((rd[0], b), []).append(idx)

    # ------------------------------------------------------------------------------------
    def match(self) -> dict[Node, Node]:
        """Check that every message step is matched, with equal sizes; return the pairing."""
        m = match_messages(self.s)
        for pair in set(m.sends) | set(m.recvs):
            a, b = pair
            ss, rr = m.sends.get(pair, []), m.recvs.get(pair, [])
            if len(ss) != len(rr):
                where = (b, rr[len(ss)]) if len(rr) > len(ss) else (a, ss[len(rr)])
                self.fail(f"{len(ss)} sends {a}->{b} but {len(rr)} receives: this message is "
                          "never matched", *where)
        for (root, rank), rr in m.mrecvs.items():
            if len(m.mcasts.get(root, [])) != len(rr):
                self.fail(f"{len(rr)} multicast receives from root {root} but it multicasts "
                          f"{len(m.mcasts.get(root, []))} times", rank, rr[0])
        for root, ms in m.mcasts.items():
            for rank in range(self.P):
                if rank != root and len(m.mrecvs.get((root, rank), [])) != len(ms):
                    self.fail(f"does not receive the {len(ms)} multicasts of root {root}",
                              rank, None)
        for (a, _), idxs in m.sends.items():
            self.check_tags(a, idxs)
        for (_, b), idxs in list(m.recvs.items()) + list(m.mrecvs.items()):
            self.check_tags(b, idxs)
        for root, idxs in m.mcasts.items():
            self.check_tags(root, idxs)
        for rnode, snode in m.sender.items():
            self.check_sizes(snode, rnode)
        return m.sender

    def check_tags(self, rank: int, idxs: list[int]) -> None:
        """The engine matches messages by tag, the verifier by program order: they agree only
        if the k-th message of each stream carries tag k."""
        prog = self.s.programs[rank]
        for k, idx in enumerate(idxs):
            if prog[idx].tag != k:
                self.fail(f"carries tag {prog[idx].tag} but is message {k} of its stream "
                          "(tags must number the messages between two ranks in program "
                          "order)", rank, idx)


    def check_sizes(self, snode: tuple[int, int], rnode: tuple[int, int]) -> None:
        s = self.s
        st, rt = s.programs[snode[0]][snode[1]], s.programs[rnode[0]][rnode[1]]
        if len(st.blocks) != len(rt.blocks):
            self.fail(f"receives {len(rt.blocks)} blocks but the matching send from rank "
                      f"{snode[0]} step {snode[1]} carries {len(st.blocks)}", *rnode)
        if st.blocks:
            sl, rl = s.layout(st.buf, snode[0]), s.layout(rt.buf, rnode[0])
            for a, b in zip(st.blocks, rt.blocks):
                if sl.block_len(a) != rl.block_len(b):
                    self.fail(f"block {b} has {rl.block_len(b)} elements but the matching "
                              f"send's block {a} has {sl.block_len(a)}", *rnode)

    # ------------------------------------------------------------------------------------
    def initial_values(self) -> list[dict[str, list]]:
        s, c = self.s, self.s.collective
        has_input = (lambda r: r == s.root) if c in (Collective.BROADCAST,
                                                     Collective.SCATTER) else (lambda r: True)
        values = []
        for rank in range(self.P):
            bufs = {}
            for name, lay in s.layouts.items():
                if name == "send" and has_input(rank):
                    bufs[name] = [(b, 1 << rank) for b in range(lay.nblocks)]
                else:
                    bufs[name] = [None] * lay.nblocks
            values.append(bufs)
        return values

    def execute(self, sender: dict[Node, Node]) -> None:
        s, progs = self.s, self.s.programs
        order, stuck = global_order(s, sender)
        if stuck:
            rank, idx = stuck[0]
            others = ", ".join(f"rank {r} step {i}" for r, i in stuck[1:6])
            self.fail("deadlock: this step can never start (a cycle of dependencies and "
                      f"messages); also stuck: {others or 'nothing else'}", rank, idx)
        values = self.initial_values()
        know = [[0] * len(prog) for prog in progs]   # ranks causally before each step
        sent: dict[Node, list] = {}
        combine = self.combine
        for node in order:
            rank, idx = node
            st = progs[rank][idx]
            k = 1 << rank
            for d in st.deps:
                k |= know[rank][d]
            vals = values[rank]
            kind = st.kind
            if kind is Kind.SEND or kind is Kind.MCAST:
                snap = []
                for b in st.blocks:
                    v = vals[st.buf][b]
                    if v is None:
                        self.fail(f"sends block {b} of {st.buf!r}, which it does not hold",
                                  rank, idx)
                    snap.append(v)
                sent[node] = snap
            elif kind is Kind.COPY:
                src, dst = vals[st.buf], vals[st.dst]
                snap = [src[b] for b in st.blocks]
                for b, v in zip(st.dst_blocks, snap):
                    if v is None:
                        self.fail(f"copies block of {st.buf!r} that it does not hold", rank, idx)
                    dst[b] = combine(dst[b], v, rank, idx) if st.reduce else v
            else:           # RECV / MRECV
                snode = sender[node]
                k |= know[snode[0]][snode[1]]
                if st.blocks:
                    dst = vals[st.buf]
                    for b, v in zip(st.blocks, sent[snode]):
                        dst[b] = combine(dst[b], v, rank, idx) if st.reduce else v
            know[rank][idx] = k
        self.check_result(values, know)

    def combine(self, old, new, rank: int, idx: int):
        if old is None:
            self.fail("reduces into a block that holds no data yet", rank, idx)
        if old[0] != new[0]:
            self.fail(f"combines input block {old[0]} with input block {new[0]}", rank, idx)
        if old[1] & new[1]:
            dup = [r for r in range(self.P) if (old[1] & new[1]) >> r & 1]
            self.fail(f"counts the contribution of rank(s) {dup} twice", rank, idx)
        if self.ordered and not (_run(new[1]) and _run(old[1])
                                 and new[1].bit_length() == (old[1] & -old[1]).bit_length() - 1):
            self.fail(f"combines {_show(new, self.P)} (incoming, the left operand) with "
                      f"{_show(old, self.P)}: not the next run of ranks to its left, so a "
                      "non-commutative op would come out of rank order", rank, idx)
        return (old[0], old[1] | new[1])

    # ------------------------------------------------------------------------------------
    def check_result(self, values, know) -> None:
        s, P, c = self.s, self.P, self.s.collective
        full = (1 << P) - 1
        if c is Collective.BARRIER:
            for rank in range(P):
                k = 1 << rank
                for kk in know[rank]:
                    k |= kk
                if k != full:
                    missing = [r for r in range(P) if not k >> r & 1]
                    self.fail(f"can leave the barrier before rank(s) {missing[:8]} entered",
                              rank)
            return
        lay_s, lay_r = s.layouts.get("send"), s.layouts.get("recv")
        if lay_r is None:
            self.fail("has no recv layout")
        want = self.expected(lay_s, lay_r)
        check_ranks = [s.root] if c in (Collective.REDUCE, Collective.GATHER) else range(P)
        if c is Collective.EXSCAN:
            check_ranks = range(1, P)       # rank 0's recv is not written (MPI: undefined)
        for rank in check_ranks:
            got = values[rank]["recv"]
            mine = lay_r.on(rank)
            for b in range(lay_r.nblocks):
                exp = want(rank, b)
                n = mine.block_len(b)
                origin = (exp[1] & -exp[1]).bit_length() - 1     # lowest contributing rank
                if lay_s.on(origin).block_len(exp[0]) != n:
                    self.fail(f"recv block {b} has {n} elements but the data it must hold "
                              f"(block {exp[0]} of rank {origin}'s send) has "
                              f"{lay_s.on(origin).block_len(exp[0])}", rank)
                if got[b] != exp:
                    if n == 0 and got[b] is None:
                        continue        # empty blocks need not move
                    self.fail(f"recv block {b} ends holding {_show(got[b], P)} instead of "
                              f"{_show(exp, P)}", rank)

    def expected(self, lay_s: Layout | None, lay_r: Layout):
        P, c, root = self.P, self.s.collective, self.s.root
        full = (1 << P) - 1
        if lay_s is None:
            self.fail("has no send layout")

        def need(ok: bool, what: str) -> None:
            if not ok:
                self.fail(f"layouts do not fit {c}: {what} (send {lay_s}, recv {lay_r})")

        if c is Collective.BROADCAST:
            need(_alike(lay_s, lay_r), "send and recv must be cut alike")
            return lambda r, b: (b, 1 << root)
        if c in (Collective.REDUCE, Collective.ALLREDUCE):
            need(_alike(lay_s, lay_r), "send and recv must be cut alike")
            return lambda r, b: (b, full)
        if c is Collective.SCAN:
            need(_alike(lay_s, lay_r), "send and recv must be cut alike")
            return lambda r, b: (b, (2 << r) - 1)
        if c is Collective.EXSCAN:
            need(_alike(lay_s, lay_r), "send and recv must be cut alike")
            return lambda r, b: (b, (1 << r) - 1)
        if c in (Collective.ALLGATHER, Collective.GATHER):
            nb = lay_s.nblocks
            need(lay_r.sub == lay_s.sub and lay_r.parts == P * lay_s.parts,
                 "recv must be P copies of send's cut")
            return lambda r, b: (b % nb, 1 << (b // nb))
        if c is Collective.REDUCE_SCATTER:
            nb = lay_r.nblocks
            need(lay_s.sub == lay_r.sub and lay_s.parts == P * lay_r.parts,
                 "send must be P copies of recv's cut")
            return lambda r, b: (r * nb + b, full)
        if c is Collective.SCATTER:
            nb = lay_r.nblocks
            need(lay_s.sub == lay_r.sub and lay_s.parts == P * lay_r.parts,
                 "send must be P copies of recv's cut")
            return lambda r, b: (r * nb + b, 1 << root)
        if c is Collective.ALLTOALL:
            need(_shape(lay_s) == _shape(lay_r) and lay_s.parts % P == 0,
                 "send and recv in the same blocks, P parts")
            per = lay_r.nblocks // P
            return lambda r, b: (r * per + b % per, 1 << (b // per))
        self.fail(f"no expectation for {c}")


def _run(mask: int) -> bool:
    """The ranks of ``mask`` are consecutive."""
    x = mask >> ((mask & -mask).bit_length() - 1)
    return mask > 0 and x & (x + 1) == 0


def _shape(lay) -> tuple[int, int]:
    return lay.parts, lay.sub


def _alike(a, b) -> bool:
    """Cut into the same blocks of the same sizes on every rank."""
    if isinstance(a, PerRank) or isinstance(b, PerRank):
        n = len(a.layouts) if isinstance(a, PerRank) else len(b.layouts)
        return all(a.on(r) == b.on(r) for r in range(n))
    return a == b


def _show(v, P: int) -> str:
    if v is None:
        return "nothing"
    ranks = [r for r in range(P) if v[1] >> r & 1]
    if len(ranks) == P and P > 1:
        who = "all ranks"
    elif len(ranks) > 6:
        who = f"{len(ranks)} ranks"
    else:
        who = f"rank(s) {ranks}"
    return f"input block {v[0]} of {who}"
