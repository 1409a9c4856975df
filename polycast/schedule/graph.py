"""The global graph of a schedule: which step sends what each receiving step gets, and an
order in which all steps of all ranks can run (dependencies plus message edges).

Shared by the verifier (which proves things along this order) and traffic accounting
(which measures the critical path along it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .ir import Kind, Schedule

Node = tuple[int, int]          # (rank, step index)


@dataclass
class Matching:
    """Message steps grouped for matching; ``sender`` maps a receiving node to its sender.

    Lists are in program order, so the k-th SEND of ``sends[(a, b)]`` is received by the
    k-th RECV of ``recvs[(a, b)]``; the k-th MCAST of ``mcasts[root]`` by the k-th MRECV of
    ``mrecvs[(root, rank)]``. Unmatched surplus steps have no ``sender`` entry."""

    sends: dict[tuple[int, int], list[int]]
    recvs: dict[tuple[int, int], list[int]]
    mcasts: dict[int, list[int]]
    mrecvs: dict[tuple[int, int], list[int]]
    sender: dict[Node, Node]


def match_messages(s: Schedule) -> Matching:
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    mcasts: dict[int, list[int]] = {}
    mrecvs: dict[tuple[int, int], list[int]] = {}
    for rank, prog in enumerate(s.programs):
        for idx, st in enumerate(prog):
            if st.kind is Kind.SEND:
                sends.setdefault((rank, st.peer), []).append(idx)
            elif st.kind is Kind.RECV:
                recvs.setdefault((st.peer, rank), []).append(idx)
            elif st.kind is Kind.MCAST:
                mcasts.setdefault(rank, []).append(idx)
            elif st.kind is Kind.MRECV:
                mrecvs.setdefault((st.peer, rank), []).append(idx)
    sender: dict[Node, Node] = {}
    for (a, b), rr in recvs.items():
        for si, ri in zip(sends.get((a, b), ()), rr):
            sender[(b, ri)] = (a, si)
    for (root, rank), rr in mrecvs.items():
        for mi, ri in zip(mcasts.get(root, ()), rr):
            sender[(rank, ri)] = (root, mi)
    return Matching(sends, recvs, mcasts, mrecvs, sender)


def global_order(s: Schedule, sender: dict[Node, Node]) -> tuple[list[Node], list[Node]]:
    """Kahn's order over every step of every rank, with an edge from each step to its
    dependants and from each sender to its receiver (sends are eager, so nothing else
    orders them). Returns ``(order, stuck)``: ``stuck`` lists, per rank, the first step that
    can never run (empty when there is no deadlock)."""
    progs = s.programs
    indeg = [[len(st.deps) for st in prog] for prog in progs]
    succ: dict[Node, list[Node]] = {}
    for rank, prog in enumerate(progs):
        for idx, st in enumerate(prog):
            for d in st.deps:
                succ.setdefault((rank, d), []).append((rank, idx))
    for rnode, snode in sender.items():
        succ.setdefault(snode, []).append(rnode)
        indeg[rnode[0]][rnode[1]] += 1
    queue = deque((r, i) for r in range(len(progs)) for i, n in enumerate(indeg[r]) if n == 0)
    order: list[Node] = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for nxt in succ.get(node, ()):
            row = indeg[nxt[0]]
            row[nxt[1]] -= 1
            if row[nxt[1]] == 0:
                queue.append(nxt)
    stuck: list[Node] = []
    if len(order) != s.nsteps:
        for rank, row in enumerate(indeg):
            first = next((i for i, n in enumerate(row) if n > 0), None)
            if first is not None:
                stuck.append((rank, first))
    return order, stuck
