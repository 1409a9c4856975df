"""Rank script for tests/test_faults.py: every multicast algorithm of every collective
(selftest's mcast suite: exact results), on the world and on a duplicate communicator (so
replays can cross communicators), under whatever POLYCAST_FAULTS injects. Prints one
``FAULTS {json}`` line: the faults injected here and the engine's drops."""

from __future__ import annotations

import json

import polycast
from polycast.tools.selftest import Checker, suite_mcast


def main() -> None:
    world = polycast.init()
    dup = world.Dup()
    failed, n = [], 0
    for comm in (world, dup):
        ck = Checker(comm)
        suite_mcast(ck)
        failed += ck.failed
        n += ck.n
    faults = world._driver.mcast.faults
    drops: dict = {}
    for comm in (world, dup):
        for k, v in comm.stats().drops.items():
            drops[k] = drops.get(k, 0) + v
    print("FAULTS " + json.dumps({"rank": world.rank, "checks": n, "failed": failed,
                                  "injected": faults.counts if faults else None,
                                  "drops": drops}), flush=True)
    dup.Free()


if __name__ == "__main__":
    main()
