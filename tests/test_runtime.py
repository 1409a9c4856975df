"""The runtime across real processes: every collective and every registered algorithm on
2, 3, 4 and 5 ranks over shared memory and TCP (multicast algorithms over loopback UDP
multicast in both), exact results against polycast.reference; plus the API (in place,
non-blocking, objects, Split/Dup, local argument errors) and the error paths.

One group of processes runs many checks (polycast.tools.selftest); each group is bounded
by a timeout and killed by pid if it overruns."""

from __future__ import annotations

import re

import pytest

from polycast.algorithms import get, supported
from polycast.collectives import Collective

from test_runtime_helpers import selftest

OK = re.compile(r"SELFTEST (\w+) OK (\d+) checks .* transports=(\S+) mcast=(\w+) algos=(\d+)")


def _expected_algos(P: int, mcast: bool) -> int:
    n = 0
    for coll in Collective:
        for name in supported(coll, P):
            a = get(coll, name)
            if (a.multicast or "mcast" in name) and not mcast:
                continue
            n += 1
    return n


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nranks", [2, 3, 4, pytest.param(5, marks=pytest.mark.slow)])
def test_every_collective_and_algorithm(nranks, transport):
    results = selftest(nranks, "all", env={"POLYCAST_TRANSPORT": transport})
    for r in results:
        m = OK.search(r.out)
        assert r.returncode == 0 and m, (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")
        assert m.group(3) == transport
        # Multicast on the loopback interface works on this machine: the mcast algorithms
        # must have run, not been skipped.
        assert m.group(4) == "yes", r.out[-2000:]
        assert int(m.group(5)) == _expected_algos(nranks, True)
        assert int(m.group(2)) > 2 * int(m.group(5))


def test_mismatched_size_raises_everywhere():
    results = selftest(3, "mismatch", env={"POLYCAST_TIMEOUT": "20"}, timeout=60)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank}\n{r.out}\n{r.err}"
        # every rank raised MismatchError, and the message says what differs
        assert "MISMATCH" in r.out and "called collectives differently" in r.out, r.out


def test_dead_rank_raises_peer_lost_in_time():
    results = selftest(3, "death", env={"POLYCAST_TIMEOUT": "10"}, timeout=60)
    assert results[2].returncode == 17              # the victim
    for r in results[:2]:
        assert r.returncode == 0, f"rank {r.rank}\n{r.out}\n{r.err}"
        assert "PEERLOST" in r.out and "rank 2" in r.out, r.out


@pytest.mark.parametrize("futex", ["1", "0"])
def test_tiny_shm_rings_fragment_and_flow_control(futex):
    """64 KiB rings: every big message travels in pieces and writers wait for space;
    sleepers woken by futex counters, and (the futex=0 test hook) by doorbell frames."""
    results = selftest(3, "api", env={"POLYCAST_TRANSPORT": "shm",
                                      "POLYCAST_TEST_HOOKS": f"futex={futex}",
                                      "POLYCAST_SHM_RING_NBYTES": "65536"})
    for r in results:
        assert r.returncode == 0 and "SELFTEST api OK" in r.out, (
            f"rank {r.rank}\n{r.out[-3000:]}\n{r.err[-3000:]}")
