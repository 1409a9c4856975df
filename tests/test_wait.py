"""The one wait policy (polycast/runtime/transport/wait.py, wait.h): built from the
configuration, its phases, the compiled and the Python waiters following it alike, and
POLYCAST_WAIT_SPIN_US=0 reaching every waiter of a real job."""

from __future__ import annotations

import time

import numpy as np
import pytest

from polycast import config
from polycast.errors import InvalidArgument
from polycast.runtime.symm import barrier as B
from polycast.runtime.transport.wait import (SLEEP, SPIN, YIELD, Waiter, WaitPolicy, policy,
                                             usable_cores)

from test_runtime_helpers import rank_results, spawn_ranks


def test_the_policy_is_built_once_from_the_configuration():
    cfg = config.load({})
    p = policy(cfg)
    assert p is policy(config.load({}))             # one per configuration
    assert (p.spin_seconds, p.yield_seconds, p.yield_wall_seconds, p.futex) == \
        (0.0, pytest.approx(50e-6), pytest.approx(200e-6), True)
    q = policy(config.load({"POLYCAST_WAIT_SPIN_US": "200",
                            "POLYCAST_TEST_HOOKS": "wait_busy_us=5,wait_yield_wall_us=5000,"
                                                   "futex=0"}), ranks_on_host=1)
    assert (q.spin_seconds, q.yield_seconds, q.yield_wall_seconds, q.futex) == \
        (pytest.approx(5e-6), pytest.approx(200e-6), pytest.approx(5e-3), False)
    # 0: sleep at once, no spin and no yields either
    z = policy(config.load({"POLYCAST_WAIT_SPIN_US": "0"}))
    assert (z.spin_seconds, z.yield_seconds, z.yield_wall_seconds) == (0.0, 0.0, 0.0)
    assert z == p.passive()
    assert p.c_args == (p.spin_seconds, p.yield_seconds, p.yield_wall_seconds,
                        p.sleep_slice_seconds, True)


def test_only_ranks_that_fit_the_cores_spin_before_yielding():
    """The symmetric-memory barrier names its ranks on the host: as many as the cores (or
    fewer), it spins first (a peer answers within microseconds, a yield would only add its
    system call); more ranks than cores, or a waiter that does not say, yields at once."""
    cfg = config.load({})
    cores = usable_cores()
    assert policy(cfg, ranks_on_host=cores).spin_seconds == pytest.approx(3e-6)
    assert policy(cfg, ranks_on_host=1).spin_seconds == pytest.approx(3e-6)
    assert policy(cfg, ranks_on_host=cores + 1).spin_seconds == 0.0
    assert policy(cfg).spin_seconds == 0.0
    # the other phases do not depend on it; POLYCAST_WAIT_SPIN_US=0 still sleeps at once
    assert policy(cfg, ranks_on_host=1).yield_seconds == policy(cfg).yield_seconds
    z = policy(config.load({"POLYCAST_WAIT_SPIN_US": "0"}), ranks_on_host=1)
    assert (z.spin_seconds, z.yield_seconds, z.yield_wall_seconds) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("var", ["POLYCAST_DRIVE_SPIN_US", "POLYCAST_REPLAY_SPIN_WALL_US",
                                 "POLYCAST_SPIN_US"])
def test_the_per_waiter_knobs_are_gone_and_say_what_replaced_them(var):
    with pytest.raises(InvalidArgument, match="POLYCAST_WAIT_SPIN_US"):
        config.load({var: "5"})
    with pytest.raises(InvalidArgument, match="POLYCAST_WAIT_SPIN_US='-1': must be a number >= 0"):
        config.load({"POLYCAST_WAIT_SPIN_US": "-1"})


def test_the_phases_spin_then_yield_then_sleep():
    p = WaitPolicy(spin_seconds=1e-3, yield_seconds=2e-3, yield_wall_seconds=10e-3)
    w = Waiter(p, now=100.0)
    assert w.phase(100.0005) == SPIN
    assert w.phase(100.002) == YIELD
    w.own = 2e-3                                    # its own CPU spent: sleep
    assert w.phase(100.002) == SLEEP
    w.own = 0.0                                     # yields that ran others: the wall bound
    assert w.phase(100.0109) == YIELD and w.phase(100.0111) == SLEEP
    assert Waiter(p.passive(), now=0.0).phase(0.0) == SLEEP


def test_a_waiter_says_sleep_within_its_bound():
    p = WaitPolicy(spin_seconds=1e-3, yield_seconds=1.0, yield_wall_seconds=20e-3)
    t0 = time.monotonic()           # before the waiter's own start: took >= its waited
    w = Waiter(p)
    n = 0
    while not w.idle():
        n += 1
        assert n < 10_000_000
    took = time.monotonic() - t0
    assert 0.021 <= took < 1.0, took                # spin + the yields' wall bound
    assert Waiter(p.passive()).idle()               # passive: sleep at the first look


@pytest.mark.skipif(B.compiled is None, reason=f"no compiled symm helper ({B.compiled_why_not})")
def test_the_compiled_wait_follows_the_same_policy():
    """wait.h's phases in the symm helper: a peer that never comes is waited for as long as
    the policy says (spin, then yield to the wall bound), then the helper returns."""
    ctrl = [np.zeros(B.CTRL_NBYTES // 8, np.uint64) for _ in range(2)]
    bar = B.compiled.Barrier(0, [c.ctypes.data for c in ctrl])
    p = WaitPolicy(spin_seconds=1e-3, yield_seconds=1.0, yield_wall_seconds=20e-3, futex=False)
    before = B.compiled.stats()
    t0 = time.monotonic()
    assert bar.wait(1, B.EPOCH, 1, p.c_args, 0.0) == 1
    took = time.monotonic() - t0
    after = B.compiled.stats()
    assert 0.021 <= took < 1.0, took
    assert after["polls"] > before["polls"] and after["yields"] > before["yields"]
    # passive: no spin, no yields; one bounded nap
    t0 = time.monotonic()
    assert bar.wait(1, B.EPOCH, 1, p.passive().c_args, 0.01) == 1
    assert 0.009 <= time.monotonic() - t0 < 1.0
    assert B.compiled.stats()["yields"] == after["yields"]
    ctrl[1][B.EPOCH] = 1                            # the peer came: no wait at all
    assert bar.wait(1, B.EPOCH, 1, p.c_args, 0.0) == 0
    with pytest.raises(TypeError):
        bar.wait(1, B.EPOCH, 1, (1e-3, 1.0), 0.0)   # not a WaitPolicy.c_args


_PASSIVE_RANK = """
import json
import numpy as np
import polycast
from polycast.runtime.symm import barrier as B
comm = polycast.init()
r, P = comm.Get_rank(), comm.Get_size()
before = B.compiled.stats() if B.compiled is not None else None
ok = True
for i in range(300):
    x = np.full(4, r + i, np.float32)
    y = np.zeros(4, np.float32)
    comm.Allreduce(x, y)                            # auto: symm, kept and compiled
    ok &= bool((y == sum(range(P)) + P * i).all())
    z = np.zeros(4, np.float32)
    comm.Allreduce(x, z, algorithm="ring")          # the engine: driven, then replayed
    ok &= bool((z == y).all())
after = B.compiled.stats() if B.compiled is not None else None
yields = None if before is None else after["yields"] - before["yields"]
polls = None if before is None else after["polls"] - before["polls"]
print("RESULT " + json.dumps({"ok": ok, "yields": yields, "polls": polls,
                              "spin": comm.config.wait_spin_us}), flush=True)
polycast.finalize()
"""


def test_wait_spin_us_zero_reaches_every_waiter_of_a_job():
    """POLYCAST_WAIT_SPIN_US=0: the calls are right, and the compiled symm waits never
    polled or yielded (they slept at once)."""
    res = rank_results(spawn_ranks(2, ["-c", _PASSIVE_RANK],
                                   env={"POLYCAST_WAIT_SPIN_US": "0"}, timeout=120),
                       exit_ok=True)
    for r in res:
        assert r["ok"] and r["spin"] == 0.0
        if r["yields"] is not None:
            assert r["yields"] == 0 and r["polls"] == 0, r
