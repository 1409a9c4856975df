"""Compact schedules: every vectorised generator gives exactly the columns of the
algorithm's own schedule (steps, peers, ordinals, element counts, inferred dependencies),
and a compact schedule builds its Step programs on demand, equal to the ordinary ones."""

from __future__ import annotations

import pytest

from polycast.algorithms import build
from polycast.algorithms.registry import _COMPACT   # (importing polycast.algorithms registers all)
from polycast.schedule.compact import CompactSchedule, columns_of

COMPACT = sorted((str(c), n) for c, n in _COMPACT)
ONE_PIECE = {("allgather", "hring")}          # compact for one piece (nchunks=1) only


@pytest.mark.parametrize("collective,algo", COMPACT)
def test_compact_columns_equal_the_generator(collective, algo):
    for P in list(range(2, 18)) + [31, 33, 64]:
        for k in (1, 3):
            for count in (P * 5 + 3, 7):
                full = build(collective, algo, P, count, nchunks=k)
                comp = build(collective, algo, P, count, nchunks=k, compact=True)
                if k > 1 and (collective, algo) in ONE_PIECE:
                    assert not isinstance(comp, CompactSchedule)
                    continue
                assert isinstance(comp, CompactSchedule)
                assert comp.columns.same_as(columns_of(full)), (collective, algo, P, k, count)
                assert comp.options == full.options
                assert comp.uses_multicast == full.uses_multicast


def test_compact_columns_over_hosts_equal_the_generator():
    # hierarchical algorithms: hosts of R ranks, leaders' token ring over the hosts
    for algo, more in (("hmcast", ({"roots": 1}, {"roots": 2}, {"roots": 3})),
                       ("hring", ({},))):
        for H, R in ((1, 4), (2, 2), (3, 4), (5, 3), (4, 8), (7, 2), (6, 1)):
            for extra in more:
                for count in (5, 64):
                    opts = dict(hosts=H, ranks_per_host=R, **extra)
                    where = (algo, H, R, extra, count)
                    full = build("allgather", algo, H * R, count, **opts)
                    comp = build("allgather", algo, H * R, count, compact=True, **opts)
                    assert comp.form is not None and comp.form.ranks_per_host == R, where
                    assert comp.nsteps == full.nsteps, where
                    assert comp.columns.same_as(columns_of(full)), where
                    assert comp.options == full.options, where
    # hring of several pieces: the algorithm's own schedule
    assert not isinstance(build("allgather", "hring", 8, 8, nchunks=2, compact=True,
                                hosts=2), CompactSchedule)


def test_compact_expands_to_the_ordinary_schedule():
    comp = build("allgather", "mcast", 6, 12, nchunks=2, compact=True, roots=3)
    assert "programs" not in vars(comp)
    full = build("allgather", "mcast", 6, 12, nchunks=2, roots=3)
    assert comp.programs == full.programs and comp.layouts == full.layouts
    assert comp.options["roots"] == 3
    # no compact form: the ordinary schedule
    assert not isinstance(build("allgather", "bruck", 6, 12, compact=True), CompactSchedule)
    assert not isinstance(build("allgather", "ring", 3, 6, compact=True, counts=[1, 2, 3]),
                          CompactSchedule)
