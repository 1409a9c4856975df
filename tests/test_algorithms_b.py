"""Verifier sweep over allgather, reduce_scatter, allreduce and the hierarchical algorithms.

Every schedule is proven by :func:`polycast.schedule.verify.verify` (right data on every
rank, every message matched, no races, no deadlock, input never written)."""

from __future__ import annotations

import os
import sys

import pytest

from polycast.algorithms.registry import algorithms, build
from polycast.errors import InvalidArgument, UnknownName, Unsupported
from polycast.schedule.ir import Kind
from polycast.schedule.verify import verify

FLAT = {
    "allgather": ["ring", "mcast", "recdoubling", "bruck", "direct"],
    "reduce_scatter": ["ring", "rechalving", "direct"],
    "allreduce": ["ring", "dbtree", "binomial", "recdoubling", "rabenseifner", "mcast"],
}
HIER = {
    "hring": ["allreduce", "allgather"],
    "hdbtree": ["allreduce", "broadcast", "reduce"],
    "hmcast": ["allgather", "broadcast", "allreduce"],
    "ring2d": ["allreduce", "allgather"],
}
RANKS = list(range(1, 34)) + [48, 64]
# The README's command sweeps every P up to 17 and a few above; the slow set the rest of
# 18..33 (where three-chunk schedules make most of the sweep's time).
FAST_RANKS = list(range(1, 18)) + [24, 32, 33, 48, 64]
REST_RANKS = [P for P in RANKS if P not in FAST_RANKS]
GRIDS = [(1, 1), (1, 5), (6, 1), (2, 2), (2, 3), (3, 2), (4, 4), (5, 3), (3, 5), (7, 2),
         (8, 4)]


def _cases(P: int):
    """(nchunks, count) per P: a count below P (empty blocks), one that does not divide,
    and count 0 for small P; nchunks 3 only below 48 ranks to keep the sweep short."""
    yield 1, max(P - 1, 1) // 2
    if P < 48:
        yield 3, 2 * P + 1
    if P <= 8:
        yield 2, 0


def _no_send_writes(s) -> None:
    for rank, prog in enumerate(s.programs):
        for st in prog:
            w = st.writes()
            assert not w or w[0] != "send", f"rank {rank} writes its input: {st}"


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, names in FLAT.items() for a in names])
def test_flat_sweep(collective, algorithm):
    _sweep(collective, algorithm, FAST_RANKS)


@pytest.mark.slow
@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, names in FLAT.items() for a in names])
def test_flat_sweep_rest(collective, algorithm):
    _sweep(collective, algorithm, REST_RANKS)


def _sweep(collective, algorithm, ranks):
    for P in ranks:
        for k, count in _cases(P):
            s = build(collective, algorithm, P, count, nchunks=k)
            verify(s)
            _no_send_writes(s)


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, names in FLAT.items() for a in names])
def test_flat_channels(collective, algorithm):
    for P in (1, 5, 8, 13):
        s = build(collective, algorithm, P, 3 * P + 2, nchunks=2, channels=2)
        verify(s)
        _no_send_writes(s)


@pytest.mark.parametrize("algorithm,collective",
                         [(a, c) for a, colls in HIER.items() for c in colls])
def test_hierarchical_sweep(algorithm, collective):
    patterns = ["tree", "split", "balanced"] if algorithm == "hdbtree" else [None]
    for H, R in GRIDS:
        P = H * R
        roots = sorted({0, P - 1, P // 2}) if collective in ("broadcast", "reduce") else [0]
        for pattern in patterns:
            opts = {"hosts": H, "ranks_per_host": R}
            if pattern:
                opts["pattern"] = pattern
            for root in roots:
                for k, count in ((1, P // 2), (3, 2 * P + 1)):
                    s = build(collective, algorithm, P, count, root=root, nchunks=k, **opts)
                    verify(s)
                    _no_send_writes(s)
        verify(build(collective, algorithm, P, 4 * P + 1, nchunks=2, channels=2,
                     hosts=H, ranks_per_host=R))


def test_registered_names():
    for coll, names in FLAT.items():
        have = {a.name for a in algorithms(coll)}
        assert set(names) <= have, (coll, set(names) - have)
    for name, colls in HIER.items():
        for coll in colls:
            assert name in {a.name for a in algorithms(coll)}, (coll, name)


def test_hierarchical_defaults_and_one_option():
    # No option: one rank per host; one option: the other is derived.
    for kw in ({}, {"hosts": 3}, {"ranks_per_host": 2}):
        s = build("allreduce", "ring2d", 6, 13, **kw)
        verify(s)
        h, r = s.options["hosts"], s.options["ranks_per_host"]
        assert h * r == 6 and (kw.get("hosts", h), kw.get("ranks_per_host", r)) == (h, r)
    assert build("allreduce", "hdbtree", 6, 5).options["ranks_per_host"] == 1


@pytest.mark.parametrize("kw", [{"hosts": 4}, {"ranks_per_host": 4},
                                {"hosts": 2, "ranks_per_host": 2}, {"hosts": 0}])
def test_bad_grid(kw):
    with pytest.raises(InvalidArgument, match="hosts|ranks_per_host"):
        build("allreduce", "hring", 6, 6, **kw)


def test_bad_pattern_and_roots():
    with pytest.raises(UnknownName, match="balanced"):
        build("allreduce", "hdbtree", 4, 4, pattern="star")
    with pytest.raises(InvalidArgument, match="roots"):
        build("allreduce", "mcast", 4, 4, roots=0)
    with pytest.raises(InvalidArgument, match="pattern"):
        build("allreduce", "hring", 4, 4, pattern="tree")   # hring takes no pattern
    with pytest.raises(Unsupported):
        build("allreduce", "hring", 6, 6, hosts=4, ranks_per_host=2)


def _sent_nelems(s, rank: int) -> int:
    return sum(s.step_nelems(st) for st in s.programs[rank]
               if st.kind in (Kind.SEND, Kind.MCAST))


def test_traffic_matches_theory():
    P, n = 8, 8 * 64
    # ring allreduce: 2(P-1)/P of the buffer; recursive doubling: log2(P) full buffers
    assert _sent_nelems(build("allreduce", "ring", P, n), 3) == 2 * (P - 1) * n // P
    assert _sent_nelems(build("allreduce", "recdoubling", P, n), 3) == 3 * n
    assert _sent_nelems(build("allreduce", "rabenseifner", P, n), 3) == 2 * (P - 1) * n // P
    # multicast allreduce: ring reduce-scatter plus one multicast of the own part
    assert _sent_nelems(build("allreduce", "mcast", P, n), 3) == (P - 1) * n // P + n // P
    # allgather: every algorithm but mcast sends (P-1) shards of 64; Bruck and
    # recursive doubling too (P a power of two)
    for a in ("ring", "bruck", "recdoubling"):
        assert _sent_nelems(build("allgather", a, P, 64), 5) == (P - 1) * 64, a
    assert _sent_nelems(build("allgather", "direct", P, 64), 5) == (P - 1) * 64
    # reduce_scatter: (P-1) parts
    for a in ("ring", "rechalving", "direct"):
        assert _sent_nelems(build("reduce_scatter", a, P, 64), 2) == (P - 1) * 64, a


def test_dbtree_uses_nccl_trees():
    # P = 6: tree 0 is 0->4, 4->2,5, 2->1,3; tree 1 root 5 -> 1, 1->3,0, 3->4,2 (spec).
    s = build("allreduce", "dbtree", 6, 12)
    edges = {(r, st.peer, st.blocks[0] // 1) for r, prog in enumerate(s.programs)
             for st in prog if st.kind is Kind.SEND}
    half0 = {(a, c) for a, c, blk in edges if blk == 0}
    half1 = {(a, c) for a, c, blk in edges if blk == 1}
    tree0 = {(0, 4), (4, 2), (4, 5), (2, 1), (2, 3)}
    tree1 = {(5, 1), (1, 3), (1, 0), (3, 4), (3, 2)}
    assert half0 == tree0 | {(c, p) for p, c in tree0}
    assert half1 == tree1 | {(c, p) for p, c in tree1}


def test_hdbtree_patterns_differ():
    # 4 hosts x 2: with "split" the child-host links leave from local rank 1.
    def inter_host_senders(pattern):
        s = build("broadcast", "hdbtree", 8, 8, hosts=4, ranks_per_host=2, pattern=pattern)
        # (0 -> 6 hands half 1 to tree 1's root, host 3, before the tree starts.)
        return {r for r, prog in enumerate(s.programs) for st in prog
                if st.kind is Kind.SEND and st.peer // 2 != r // 2 and (r, st.peer) != (0, 6)}
    assert all(r % 2 == 0 for r in inter_host_senders("tree"))
    assert all(r % 2 == 1 for r in inter_host_senders("split"))
    both = inter_host_senders("balanced")
    assert any(r % 2 == 0 for r in both) and any(r % 2 == 1 for r in both)


# -- real data through the engine (tests/world.py: every rank's engine, an in-memory net) --

_ENGINE_CASES = [
    ("allreduce", "mcast", 5, {}),
    ("allgather", "hmcast", 6, {"hosts": 2, "roots": 1}),
    ("allreduce", "hmcast", 6, {"hosts": 3}),
    ("broadcast", "hmcast", 6, {"hosts": 2}),
    ("allreduce", "hring", 6, {"hosts": 2}),
    ("allgather", "hring", 6, {"hosts": 3}),
    ("allreduce", "ring2d", 8, {"hosts": 2}),
    ("allgather", "ring2d", 6, {"hosts": 2}),
    ("allreduce", "hdbtree", 8, {"hosts": 4, "pattern": "balanced"}),
    ("broadcast", "hdbtree", 8, {"hosts": 4, "pattern": "split"}),
    ("reduce", "hdbtree", 6, {"hosts": 3, "pattern": "balanced"}),
    ("reduce_scatter", "rechalving", 6, {}),
    ("allreduce", "rabenseifner", 7, {}),
]


@pytest.mark.parametrize("collective,algorithm,P,opts", _ENGINE_CASES,
                         ids=[f"{c}-{a}-P{P}" for c, a, P, _ in _ENGINE_CASES])
def test_engine_runs_exact(collective, algorithm, P, opts):
    sys.path.insert(0, os.path.dirname(__file__))
    from world import World

    root = P - 2 if collective in ("broadcast", "reduce") else 0
    s = build(collective, algorithm, P, 13, root=root, nchunks=2, **opts)
    w = World(P, seed=P)
    ops = ["sum", "avg"] if s.collective.has_op else [None]
    calls = [w.post_call(s, "float32", op=op, seed=i) for i, op in enumerate(ops)]
    w.run()
    for c in calls:
        w.check(c)
    assert all(not e.busy for e in w.engines)
