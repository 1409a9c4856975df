"""The events mode's compiled loop (polycast/sim/_events.c) against its Python loop
(fast_events.py), both on the compiled network model: the same flows in the same order, so
the same answer to the bit -- completion times, link bytes, events. (The equality grid,
tests/test_sim_fast.py, holds both loops to the engines.)"""

from __future__ import annotations

import pytest

from polycast.algorithms import build
from polycast.collectives import Collective
from polycast.models.nic import parse_nic
from polycast.sim import SimConfig, Simulation, fast_events_native
from polycast.sim.driver import pacing_gbps_for
from polycast.sim.network import compiled
from polycast.sim.simulate import algorithm_options, count_for, resolve_topology

pytestmark = pytest.mark.skipif(getattr(compiled, "run_events", None) is None,
                                reason="the compiled network model is not built")


def _run(pairs, P, topology, size=256 * 1024, nic=None, mode="events"):
    """Post ``pairs`` ((collective, algorithm), ...) at once; the run's answer."""
    topo = resolve_topology(topology, P, "400Gbps")
    scheds = []
    for coll, algo in pairs:
        c = Collective.parse(coll)
        scheds.append(build(c, algo, P, count_for(c, P, size, 4), compact=True,
                            **algorithm_options(c, algo, topo, {})))
    if nic is not None:
        nic = parse_nic(nic)
    gbps = topo.host_link_bw * 8 / 1e9
    cfg = SimConfig(engine={"line_rate_gbps": gbps,
                            "pacing_gbps": pacing_gbps_for(scheds, gbps, topo.framing)},
                    nic=nic)
    sim = Simulation(topo, cfg)
    reqs = [sim.post(s, 4) for s in scheds]
    sim.run()
    assert sim.fast_mode == mode, sim.fast_mode
    times = [[sim.timelines[r].completed[q] for r in range(P)] for q in range(len(reqs))]
    return times, sim.net.link_bytes.tolist(), sim.events


CASES = [
    ((("allgather", "mcast"), ("reduce_scatter", "ring")), 16, "fattree:radix=4"),
    ((("allgather", "mcast"), ("reduce_scatter", "ring")), 12,
     "leafspine:hosts_per_leaf=4,oversub=4"),
    ((("alltoall", "pairwise"),), 12, "leafspine:hosts_per_leaf=4,oversub=4"),
    ((("alltoall", "pairwise"),), 16, "fattree:radix=4"),
    ((("allreduce", "dbtree"),), 16, "leafspine:hosts_per_leaf=4,oversub=2"),
]


@pytest.mark.parametrize("pairs,P,topology", CASES)
def test_compiled_loop_equals_the_python_loop(pairs, P, topology, monkeypatch):
    ran = []
    real = fast_events_native.run
    monkeypatch.setattr(fast_events_native, "run", lambda ev, a: ran.append(1) or real(ev, a))
    native = _run(pairs, P, topology)
    assert ran, "the compiled loop did not run"
    monkeypatch.setattr(fast_events_native, "why_not", lambda ev: "test: the Python loop")
    python = _run(pairs, P, topology)
    assert len(ran) == 1
    assert native == python


def test_a_nic_model_runs_the_python_loop(monkeypatch):
    reasons = []
    real = fast_events_native.why_not
    monkeypatch.setattr(fast_events_native, "why_not",
                        lambda ev: reasons.append(real(ev)) or reasons[-1])
    _run(((("allgather", "mcast"), ("reduce_scatter", "ring"))), 8, "fattree:radix=4",
         nic="clock=1GHz,cores=1,cycles=1000,chunk=4KiB,queue=100000")
    assert reasons and all(r and "NIC" in r for r in reasons)


def test_the_walk_refused_up_front_only_where_it_would_refuse(monkeypatch):
    """Walk.check_start sends a run to the events mode before any walk only where the
    walks and their checks would have sent it there too."""
    from polycast.sim.fast_kinds import Refused
    from polycast.sim.fast_walk import Walk
    seen = []
    real = Walk.check_start

    def check_start(self):
        try:
            real(self)
        except Refused:
            monkeypatch.setattr(Walk, "check_start", lambda w: None)
            try:
                times = self.settled_walk()
                self.check_contention(times)
                self.check_recovery(times)
            except Refused:
                seen.append("both")
            else:
                seen.append("only check_start")
            finally:
                monkeypatch.setattr(Walk, "check_start", check_start)
            raise
        seen.append("passed")

    monkeypatch.setattr(Walk, "check_start", check_start)
    for pairs, P, topology in CASES:
        _run(pairs, P, topology)
    _run(((("allgather", "ring"), ("reduce_scatter", "ring"))), 12,
         "leafspine:hosts_per_leaf=4,oversub=4", mode="walk")
    assert "both" in seen and "passed" in seen
    assert "only check_start" not in seen
