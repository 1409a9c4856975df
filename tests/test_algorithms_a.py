"""Verifier sweep over broadcast, reduce, scatter, gather, alltoall and barrier, plus the
shapes and traffic each algorithm promises and the errors the registry raises.

Every schedule is proven by :func:`polycast.schedule.verify.verify` (right data on every
rank, every message matched, no races, no deadlock); the tests add what the verifier does
not look at (input never written, no redundant traffic, the trees used)."""

from __future__ import annotations

import math
import os
import sys

import pytest

from polycast.algorithms import registry
from polycast.algorithms.registry import algorithms, build, register
from polycast.errors import InvalidArgument, UnknownName, Unsupported
from polycast.graph.trees import nccl_tree0, nccl_tree1
from polycast.schedule.ir import Kind
from polycast.schedule.verify import verify

sys.path.insert(0, os.path.dirname(__file__))
from world import World  # noqa: E402

MINE = {
    "broadcast": ["direct", "binomial", "chain", "bintree", "dbtree", "scatter_ring", "mcast"],
    "reduce": ["binomial", "chain", "dbtree"],
    "scatter": ["linear", "binomial"],
    "gather": ["linear", "binomial"],
    "alltoall": ["pairwise", "bruck"],
    "barrier": ["dissemination"],
}
# Schedules with ~P^2 steps (or blocks): their big-P part is the slow part of the sweep.
QUADRATIC = {("broadcast", "scatter_ring"), ("alltoall", "pairwise"), ("alltoall", "bruck")}
RANKS = list(range(1, 34)) + [48, 64]
ROOTED = {"broadcast", "reduce", "scatter", "gather"}


def _roots(collective: str, P: int) -> list[int]:
    return sorted({0, P - 1, P // 2}) if collective in ROOTED else [0]


def _cases(P: int):
    """(nchunks, count): a small odd count (fewer elements than blocks once P is large:
    empty blocks), a larger one that divides by nothing in particular, and count 0 for
    small P."""
    yield 1, 3
    yield 3, 4 * P + 5
    if P <= 8:
        yield 3, 0


def _check(s) -> None:
    verify(s)
    for rank, prog in enumerate(s.programs):
        for st in prog:
            w = st.writes()
            assert not w or w[0] != "send", f"rank {rank} writes its input: {st}"
            if s.collective.value in ("reduce", "gather") and rank != s.root:
                # a non-root's recv is nominal: not the schedule's to touch
                touches = (st.blocks and st.buf == "recv") or (
                    st.dst_blocks and st.dst == "recv")
                assert not touches, f"non-root rank {rank} uses its recv: {st}"


def _sweep(collective: str, algorithm: str, ranks, lighter: bool = False) -> int:
    """``lighter``: pipelining (nchunks 3) is tried with one root per P, in turn."""
    steps = 0
    for P in ranks:
        roots = _roots(collective, P)
        for root in roots:
            for k, count in _cases(P):
                if lighter and k > 1 and root != roots[P % len(roots)]:
                    continue
                s = build(collective, algorithm, P, count, root=root, nchunks=k)
                _check(s)
                steps += s.nsteps
    return steps


ALL = [(c, a) for c, names in MINE.items() for a in names]


@pytest.mark.parametrize("collective,algorithm", ALL)
def test_sweep(collective, algorithm):
    ranks = RANKS if (collective, algorithm) not in QUADRATIC else range(1, 25)
    assert _sweep(collective, algorithm, ranks) > 0


@pytest.mark.slow
@pytest.mark.parametrize("collective,algorithm", sorted(QUADRATIC))
def test_sweep_large(collective, algorithm):
    assert _sweep(collective, algorithm, [P for P in RANKS if P >= 25], lighter=True) > 0


@pytest.mark.parametrize("collective,algorithm", ALL)
def test_channels(collective, algorithm):
    for P in (1, 2, 5, 8, 13):
        for root in _roots(collective, P):
            s = build(collective, algorithm, P, 3 * P + 2, root=root, nchunks=2, channels=2)
            _check(s)
            assert s.options["channels"] == 2


def test_registered_names():
    for coll, names in MINE.items():
        have = {a.name for a in algorithms(coll)}
        assert set(names) <= have, (coll, set(names) - have)
    assert registry.get("broadcast", "mcast").multicast
    assert not any(registry.get(c, a).multicast for c, a in ALL if a != "mcast")


# ------------------------------------------------------------------------ shapes & traffic


def _sent(s, rank: int) -> int:
    return sum(s.step_nelems(st) for st in s.programs[rank]
               if st.kind in (Kind.SEND, Kind.MCAST))


def _received(s, rank: int) -> int:
    return sum(s.step_nelems(st) for st in s.programs[rank]
               if st.kind in (Kind.RECV, Kind.MRECV))


def _edges(s, part: int | None = None) -> set[tuple[int, int]]:
    """(sender, receiver) of every data message (of one part of the send layout)."""
    sub = s.layouts["recv"].sub
    return {(r, st.peer) for r, prog in enumerate(s.programs) for st in prog
            if st.kind is Kind.SEND and st.blocks
            and (part is None or st.blocks[0] // sub == part)}


def _tree_edges(links, n: int, shift: int = 0) -> set[tuple[int, int]]:
    out = set()
    for t in range(n):
        for c in links(t, n)[1:]:
            if c >= 0:
                out.add(((t + shift) % n, (c + shift) % n))
    return out


@pytest.mark.parametrize("P", [6, 7, 12, 13])
@pytest.mark.parametrize("root", [0, 2])
def test_dbtree_broadcast_is_nccls(P, root):
    s = build("broadcast", "dbtree", P, 4 * P, root=root, nchunks=2)
    t0 = _tree_edges(nccl_tree0, P, root)
    t1 = _tree_edges(nccl_tree1, P, root)
    assert _edges(s, 0) == t0
    # Tree 1 relabelled alike has its root elsewhere: the root is cut from its tree-1
    # parent and hands half 1 to tree 1's root instead.
    r1 = ((P - 1 if P % 2 == 0 else 1) + root) % P
    parent = next(a for a, c in t1 if c == root)
    assert _edges(s, 1) == (t1 - {(parent, root)}) | {(root, r1)}
    assert _edges(build("reduce", "dbtree", P, 4 * P, root=root), 0) == {
        (c, a) for a, c in t0}


def test_bintree_and_binomial_shapes():
    P = 14
    s = build("broadcast", "bintree", P, 100, root=3)
    assert _edges(s) == _tree_edges(nccl_tree0, P, 3)
    # binomial: ceil(log2 P) rounds, so the root sends to that many children
    for P in (5, 8, 33):
        s = build("broadcast", "binomial", P, 10, root=P // 2)
        assert len({c for a, c in _edges(s) if a == P // 2}) == math.ceil(math.log2(P))
        # each non-root receives exactly once per chunk
        assert all(_received(s, r) == 10 for r in range(P) if r != P // 2)


def test_chain_is_a_chain():
    P, root = 9, 4
    s = build("broadcast", "chain", P, 90, root=root, nchunks=3)
    assert _edges(s) == {((root + i) % P, (root + i + 1) % P) for i in range(P - 1)}
    s = build("reduce", "chain", P, 90, root=root, nchunks=3)
    assert _edges(s) == {((root + i + 1) % P, (root + i) % P) for i in range(P - 1)}
    assert all(_sent(s, r) <= 90 for r in range(P))


@pytest.mark.parametrize("P", [2, 7, 16])
def test_traffic(P):
    n = 12 * P
    # direct broadcast: the root sends (P-1)S; mcast: S once
    assert _sent(build("broadcast", "direct", P, n), 0) == (P - 1) * n
    m = build("broadcast", "mcast", P, n, root=1)
    assert m.uses_multicast and _sent(m, 1) == n
    assert all(_sent(m, r) == 0 and _received(m, r) == n for r in range(P) if r != 1)
    # scatter_ring: every non-root receives the buffer exactly once; the root sends
    # (P-1)/P of it in the scatter plus its own part on the ring
    s = build("broadcast", "scatter_ring", P, n, root=P - 1)
    assert all(_received(s, r) == n for r in range(P) if r != P - 1)
    assert _received(s, P - 1) == 0
    # dbtree: every rank sends at most about S (3 halves: the root, for odd P)
    d = build("broadcast", "dbtree", P, n, root=0)
    assert all(_sent(d, r) <= 3 * n // 2 for r in range(P))
    # pairwise alltoall: (P-1) parts each way; Bruck: ceil(log2 P) messages each way
    a = build("alltoall", "pairwise", P, 5)
    assert all(_sent(a, r) == (P - 1) * 5 == _received(a, r) for r in range(P))
    bk = build("alltoall", "bruck", P, 5)
    nmsg = sum(st.kind is Kind.SEND for st in bk.programs[0])
    assert nmsg == math.ceil(math.log2(P))
    # scatter/gather: the root moves (P-1) parts either way
    for algo in ("linear", "binomial"):
        assert _sent(build("scatter", algo, P, 5, root=1), 1) == (P - 1) * 5
        assert _received(build("gather", algo, P, 5, root=1), 1) == (P - 1) * 5


def test_pairwise_rounds_are_ordered():
    s = build("alltoall", "pairwise", 5, 2)
    prog = s.programs[0]
    sends = [i for i, st in enumerate(prog) if st.kind is Kind.SEND]
    recvs = [i for i, st in enumerate(prog) if st.kind is Kind.RECV]
    for prev_recv, send in zip(recvs, sends[1:]):
        assert prev_recv in prog[send].deps


def test_barrier_shape():
    for P in (1, 2, 5, 16, 17):
        s = build("barrier", "dissemination", P, 0)
        verify(s)
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        for r, prog in enumerate(s.programs):
            assert len(prog) == 2 * rounds
            assert all(st.is_control for st in prog)
            assert {st.peer for st in prog if st.kind is Kind.SEND} == {
                (r + (1 << k)) % P for k in range(rounds)}


@pytest.mark.parametrize("algorithm", [a for a in MINE["broadcast"] if a != "scatter_ring"])
def test_big_broadcast_builds(algorithm):
    # The simulator builds 1024-rank schedules; the tree ones stay linear in P (the ring
    # of scatter_ring has P^2 steps by nature).
    s = build("broadcast", algorithm, 1024, 1 << 20, root=1000)
    assert s.nranks == 1024 and s.nsteps <= 4 * 1024 + 2


@pytest.mark.parametrize("collective,algorithm", ALL)
def test_engine_runs_them(collective, algorithm):
    """The schedules run on the real engine (in-memory network) with real numpy data and
    give numpy's answer: non-contiguous block lists, empty blocks, any root."""
    op = {"reduce": "max"}.get(collective)
    for P, root, k, count, dtype in [(1, 0, 1, 5, "int64"), (2, 1, 2, 3, "float32"),
                                     (5, 3, 3, 17, "int32"), (8, 0, 2, 1, "float64"),
                                     (7, 6, 1, 0, "int64"), (13, 6, 3, 40, "float32")]:
        s = build(collective, algorithm, P, count, root=root, nchunks=k)
        w = World(P, seed=P)
        call = w.post_call(s, dtype=dtype, op=op, seed=count)
        w.run()
        w.check(call)


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize("root", [-1, 4, 100])
def test_root_out_of_range(root):
    with pytest.raises(InvalidArgument, match=r"root .* out of range.*0\.\.3"):
        build("broadcast", "binomial", 4, 10, root=root)


def test_unknown_algorithm_lists_choices():
    with pytest.raises(UnknownName) as err:
        build("broadcast", "fancy", 4, 10)
    msg = str(err.value)
    assert "fancy" in msg
    for name in MINE["broadcast"]:
        assert name in msg
    with pytest.raises(UnknownName, match="dissemination"):
        build("barrier", "ring", 4, 0)


def test_unsupported_rank_count(monkeypatch):
    # None of these algorithms refuses a P; the registry's check is shown on a stand-in.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register("alltoall", "pow2only", "test stand-in", power_of_two=True, min_ranks=2)(
        lambda spec: build("alltoall", "pairwise", spec.nranks, spec.count))
    assert build("alltoall", "pow2only", 4, 1).nranks == 4
    with pytest.raises(Unsupported, match="power-of-two.*asked for 6.*pairwise"):
        build("alltoall", "pow2only", 6, 1)
    with pytest.raises(Unsupported, match="at least 2 ranks"):
        build("alltoall", "pow2only", 1, 1)


def test_bad_arguments():
    with pytest.raises(InvalidArgument, match="nchunks"):
        build("reduce", "chain", 4, 10, nchunks=0)
    with pytest.raises(InvalidArgument, match="count"):
        build("scatter", "linear", 4, -1)
    with pytest.raises(InvalidArgument, match="takes no option"):
        build("broadcast", "chain", 4, 10, roots=2)
