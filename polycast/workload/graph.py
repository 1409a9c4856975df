"""A workload: per rank, a graph of compute and communication nodes (Chakra's shape).

Each rank runs a *program*: nodes in issue order, each with the ids of the same rank's
nodes it waits for (Chakra's data and control dependencies, merged). Node kinds:

* ``compute``: takes ``duration_s`` on the rank's compute stream (one kernel at a time,
  as ASTRA-sim runs a rank's compute nodes; ``cpu`` nodes have a stream of their own);
* ``collective``: ``collective`` of ``nbytes`` per rank (Chakra's ``comm_size``: each rank's
  *input*, so an allgather gathers ``nbytes x group size``) on communicator ``comm`` with
  ``algorithm`` (empty: the caller's choice or the planner's);
* ``send`` / ``recv``: ``nbytes`` to / from global rank ``peer`` with ``tag``;
* ``noop``: metadata and memory nodes; they take no time.

Communicators are named *families* of disjoint groups (``Workload.comms``): a rank's node on
communicator ``"shard"`` runs on the one group of that family that holds the rank (torch's
DeviceMesh dimensions, HSDP's shard and replicate groups), so one program can serve every
rank. The name ``""`` is every rank. Every member of a group issues the group's collectives
in the same order (as NCCL and MPI require); :func:`validate` checks that and the rest.

This module is data and checks only: running a workload is :mod:`polycast.sim.pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..collectives import Collective
from ..errors import InvalidArgument

COMPUTE, COLLECTIVE, SEND, RECV, NOOP = "compute", "collective", "send", "recv", "noop"
KINDS = (COMPUTE, COLLECTIVE, SEND, RECV, NOOP)
WORLD = ""


class WorkloadError(InvalidArgument):
    """A workload that cannot run: the message names the file (or rank) and the node."""


@dataclass(slots=True)
class Node:
    id: int
    kind: str
    name: str = ""
    deps: tuple[int, ...] = ()
    duration_s: float = 0.0          # compute
    collective: str = ""             # a Collective value
    nbytes: int = 0                  # collective: each rank's input bytes; send/recv: message
    comm: str = WORLD                # communicator family
    algorithm: str = ""
    options: tuple = ()              # the algorithm's options: ((name, value), ...)
    root: int = 0                    # rooted collectives: the root's rank in the group
    peer: int = -1                   # send: destination; recv: source (global ranks)
    tag: int = 0
    phase: str = ""                  # forward / backward / optimizer / ... (reports)
    stream: str = ""                 # timeline track of a communication node
    cpu: bool = False                # compute on the host CPU (a stream of its own)


@dataclass
class Workload:
    nranks: int
    programs: list[list[Node]]       # per rank, in issue order (ranks may share a list)
    comms: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    itemsize: int = 2                # element size the collectives' schedules use
    name: str = "workload"
    sources: list[str] = field(default_factory=list)   # per rank: its file (messages)
    meta: dict = field(default_factory=dict)

    def where(self, rank: int) -> str:
        return self.sources[rank] if rank < len(self.sources) else f"rank {rank}"

    def group_of(self, rank: int, comm: str) -> tuple[int, ...]:
        """The group of family ``comm`` that holds ``rank``."""
        if comm == WORLD:
            return tuple(range(self.nranks))
        for g in self.comms.get(comm, ()):
            if rank in g:
                return g
        raise WorkloadError(f"{self.where(rank)}: communicator {comm!r} has no group with "
                            f"rank {rank}" if comm in self.comms else
                            f"{self.where(rank)}: unknown communicator {comm!r}")


def _node_text(n: Node) -> str:
    return f"node {n.id}" + (f" ({n.name})" if n.name else "")


def _coll_text(n: Node) -> str:
    return (f"{n.collective} of {n.nbytes} B" + (f" root {n.root}" if n.root else "")
            + (f" [{n.algorithm}]" if n.algorithm else ""))


def topo_order(program: list[Node], where: str) -> list[int]:
    """Positions of ``program`` in a dependency order; raises on a missing dependency, a
    duplicate id or a cycle (naming the node)."""
    pos: dict[int, int] = {}
    for i, n in enumerate(program):
        if n.id in pos:
            raise WorkloadError(f"{where}: {_node_text(n)} appears twice")
        pos[n.id] = i
    indeg = [0] * len(program)
    succ: list[list[int]] = [[] for _ in program]
    for i, n in enumerate(program):
        for d in n.deps:
            j = pos.get(d)
            if j is None:
                raise WorkloadError(f"{where}: {_node_text(n)} depends on node {d}, which "
                                    "this trace does not have")
            if j == i:
                raise WorkloadError(f"{where}: {_node_text(n)} depends on itself")
            succ[j].append(i)
            indeg[i] += 1
    order = [i for i, k in enumerate(indeg) if k == 0]
    head = 0
    while head < len(order):
        i = order[head]
        head += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    if len(order) < len(program):
        stuck = next(i for i, k in enumerate(indeg) if k > 0)
        raise WorkloadError(f"{where}: {_node_text(program[stuck])} is in a dependency "
                            f"cycle ({_cycle(program, pos, stuck, indeg)})")
    return order


def _cycle(program, pos, start, indeg) -> str:
    """A cycle among the nodes left unresolved (``indeg`` > 0): "node a waits on b waits on
    a". Each of them waits on another unresolved node, so following those waits repeats."""
    seen: dict[int, int] = {}
    path: list[int] = []
    i = start
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = next(pos[d] for d in program[i].deps if indeg[pos[d]] > 0)
    loop = path[seen[i]:] + [i]
    return "node " + " waits on ".join(str(program[k].id) for k in loop)


def validate(w: Workload, nranks: int | None = None) -> None:
    """Check everything a run needs before it starts (one clear error naming the file and
    node): the rank count, node kinds and fields, communicators, dependencies (missing,
    cycles), and that every group's members issue the same collectives in the same order
    and every send has its receive."""
    if nranks is not None and w.nranks != nranks:
        raise WorkloadError(f"the workload has {w.nranks} ranks, the topology {nranks}")
    if len(w.programs) != w.nranks:
        raise WorkloadError(f"{len(w.programs)} programs for {w.nranks} ranks")
    for name, groups in w.comms.items():
        seen: set[int] = set()
        for g in groups:
            bad = [r for r in g if not (isinstance(r, int) and 0 <= r < w.nranks)]
            if bad or not g:
                raise WorkloadError(
                    f"communicator {name!r} names rank {bad[0]!r}, which does not exist "
                    f"(ranks 0..{w.nranks - 1})" if bad else f"communicator {name!r} has "
                    "an empty group")
            if seen & set(g) or len(set(g)) != len(g):
                raise WorkloadError(f"communicator {name!r} lists rank "
                                    f"{sorted(seen & set(g) or [r for r in g if g.count(r) > 1])[0]}"
                                    " in two groups (or twice)")
            seen |= set(g)
    checked: set[int] = set()
    for rank, prog in enumerate(w.programs):
        where = w.where(rank)
        if id(prog) not in checked:
            _check_nodes(prog, where, w.nranks)
            topo_order(prog, where)
            checked.add(id(prog))
    _check_matching(w)


def _check_nodes(prog: list[Node], where: str, nranks: int) -> None:
    for n in prog:
        if n.kind not in KINDS:
            raise WorkloadError(f"{where}: {_node_text(n)} has unknown kind {n.kind!r}")
        if n.kind == COMPUTE and not (n.duration_s >= 0 and n.duration_s < float("inf")):
            raise WorkloadError(f"{where}: {_node_text(n)} has duration {n.duration_s!r}")
        if n.kind == COLLECTIVE:
            try:
                Collective.parse(n.collective)
            except InvalidArgument:
                raise WorkloadError(f"{where}: {_node_text(n)}: unknown collective "
                                    f"{n.collective!r}") from None
        if n.kind in (COLLECTIVE, SEND, RECV) and (not isinstance(n.nbytes, int)
                                                   or n.nbytes < 0):
            raise WorkloadError(f"{where}: {_node_text(n)} has size {n.nbytes!r}")
        if n.kind in (SEND, RECV) and not 0 <= n.peer < nranks:
            raise WorkloadError(f"{where}: {_node_text(n)} {'sends to' if n.kind == SEND else 'receives from'} "
                                f"rank {n.peer}, which does not exist (ranks 0..{nranks - 1})")


def _check_matching(w: Workload) -> None:
    """Collectives: per group, every member's sequence is the same. Point to point: per
    (sender, receiver), the k-th send and the k-th receive agree on size and tag."""
    seqs: dict[tuple, dict[int, list[Node]]] = {}
    sends: dict[tuple[int, int], list[Node]] = {}
    recvs: dict[tuple[int, int], list[Node]] = {}
    for rank, prog in enumerate(w.programs):
        for n in prog:
            if n.kind == COLLECTIVE:
                g = w.group_of(rank, n.comm)
                if n.kind == COLLECTIVE and not 0 <= n.root < len(g):
                    raise WorkloadError(f"{w.where(rank)}: {_node_text(n)}: root {n.root} "
                                        f"outside its group of {len(g)}")
                seqs.setdefault((n.comm, g), {}).setdefault(rank, []).append(n)
            elif n.kind == SEND:
                if n.peer == rank:
                    raise WorkloadError(f"{w.where(rank)}: {_node_text(n)} sends to itself")
                sends.setdefault((rank, n.peer), []).append(n)
            elif n.kind == RECV:
                if n.peer == rank:
                    raise WorkloadError(f"{w.where(rank)}: {_node_text(n)} receives from "
                                        "itself")
                recvs.setdefault((n.peer, rank), []).append(n)
    for (comm, g), per_rank in seqs.items():
        first = g[0]
        ref = per_rank.get(first, [])
        ref_keys = [(n.collective, n.nbytes, n.root, n.algorithm) for n in ref]
        for r in g:
            mine = per_rank.get(r, [])
            if mine is ref:
                continue
            keys = [(n.collective, n.nbytes, n.root, n.algorithm) for n in mine]
            if keys == ref_keys:
                continue
            k = next((i for i, (a, b) in enumerate(zip(keys, ref_keys)) if a != b),
                     min(len(keys), len(ref_keys)))
            name = f"communicator {comm!r} {list(g)[:8]}{'...' if len(g) > 8 else ''}"
            if k >= min(len(keys), len(ref_keys)):
                which, extra = ("next", ref[k]) if k >= len(keys) else ("extra", mine[k])
                raise WorkloadError(f"{w.where(r)}: {name}: rank {r} issues {len(keys)} "
                                    f"collectives, rank {first} {len(ref_keys)} (the {which} is "
                                    f"{_node_text(extra)}: {_coll_text(extra)})")
            raise WorkloadError(f"{w.where(r)}: {_node_text(mine[k])}: collective {k + 1} "
                                f"on {name} is {_coll_text(mine[k])} at rank {r} but "
                                f"{_coll_text(ref[k])} at rank {first}")
    for key in set(sends) | set(recvs):
        s, r = sends.get(key, []), recvs.get(key, [])
        src, dst = key
        for k in range(max(len(s), len(r))):
            if k >= len(r):
                raise WorkloadError(f"{w.where(src)}: {_node_text(s[k])} sends "
                                    f"{s[k].nbytes} B to rank {dst} (tag {s[k].tag}), which "
                                    f"has no matching receive")
            if k >= len(s):
                raise WorkloadError(f"{w.where(dst)}: {_node_text(r[k])} receives from rank "
                                    f"{src} (tag {r[k].tag}), which sends no matching message")
            if (s[k].nbytes, s[k].tag) != (r[k].nbytes, r[k].tag):
                raise WorkloadError(f"{w.where(dst)}: {_node_text(r[k])} receives "
                                    f"{r[k].nbytes} B tag {r[k].tag} from rank {src}, whose "
                                    f"matching send ({_node_text(s[k])}) is {s[k].nbytes} B "
                                    f"tag {s[k].tag}")
