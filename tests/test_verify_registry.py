"""Every registered algorithm is verified, whoever registered it and wherever.

The per-family tests (test_algorithms_a/b) sweep P = 1..33, 48, 64 for the algorithms they
know by name; this sweep is driven by the registry itself, so an algorithm registered later
(a new generator, the simulator's `innet`) is proven the moment it exists."""

import pytest

from polycast.algorithms import algorithms, build
from polycast.schedule.verify import verify

ALL = [(str(a.collective), a.name) for a in algorithms()]


def _options(algo, P):
    if not algo.hierarchical:
        return [{}]
    splits = [(h, P // h) for h in range(1, P + 1) if P % h == 0]
    return [{"hosts": h, "ranks_per_host": r} for h, r in splits[:3]]


@pytest.mark.parametrize("collective,name", ALL)
def test_registered_algorithm_verifies(collective, name):
    from polycast.algorithms import get
    algo = get(collective, name)
    checked = 0
    for P in (1, 2, 3, 4, 5, 7, 8, 12, 16):
        if algo.unsupported_reason(P):
            continue
        roots = sorted({0, P - 1, P // 2}) if algo.collective.rooted else [0]
        for opts in _options(algo, P):
            for root in roots:
                for count, nchunks in ((P + 3, 1), (3 * P + 1, 2), (1, 3)):
                    verify(build(collective, name, P, count, root=root, nchunks=nchunks,
                                 **opts))
                    checked += 1
    assert checked > 0, f"{collective} {name} supports none of the swept rank counts"


def test_the_shared_names_exist():
    # issue 2: every interface shares at least ring, dbtree and mcast
    assert {"ring", "dbtree", "mcast"} <= {a.name for a in algorithms("allreduce")}
    assert {"ring", "mcast"} <= {a.name for a in algorithms("allgather")}
    assert {"dbtree", "mcast"} <= {a.name for a in algorithms("broadcast")}
