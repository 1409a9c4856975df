"""The simulator's workload hook: collectives on sub-communicators, per-rank post times,
callbacks at simulated times, completion callbacks (driver.Simulation)."""

from __future__ import annotations

import numpy as np
import pytest

from polycast.algorithms import build
from polycast.sim import SimConfig, Simulation, SimulationError
from polycast.sim.topology import fat_tree, single_switch

MIB = 1 << 20


def _switch(P):
    return single_switch(P, link="400Gbps")


def _alone(P, coll, algo, count, itemsize=4):
    sim = Simulation(_switch(P))
    req = sim.post(build(coll, algo, P, count), itemsize)
    sim.run()
    return sim.completion_time(req), sim.net.link_bytes.sum()


@pytest.mark.parametrize("coll,algo", [("allgather", "ring"), ("allgather", "mcast"),
                                       ("reduce_scatter", "ring"),
                                       ("reduce_scatter", "innet"),
                                       ("allreduce", "ring")])
def test_a_sub_communicator_runs_as_that_many_ranks_alone(coll, algo):
    count = 65536
    t4, bytes4 = _alone(4, coll, algo, count)
    sim = Simulation(_switch(8))
    a = sim.add_comm([5, 1, 6, 2])
    b = sim.add_comm([0, 3, 4, 7])
    assert sim.comm_group(a) == (5, 1, 6, 2)
    ra = sim.post(build(coll, algo, 4, count), 4, comm=a)
    rb = sim.post(build(coll, algo, 4, count), 4, comm=b)
    sim.run()
    # disjoint groups on a non-blocking switch share no link: each as fast as alone, and
    # only members' links carry anything
    assert sim.completion_time(ra) == pytest.approx(t4, rel=1e-9)
    assert sim.completion_time(rb) == pytest.approx(t4, rel=1e-9)
    assert sim.net.link_bytes.sum() == pytest.approx(2 * bytes4, rel=1e-12)
    for r in range(8):
        assert ra in sim.timelines[r].completed or rb in sim.timelines[r].completed


def test_multicast_on_a_group_reaches_only_its_members():
    topo = fat_tree(64, radix=8)              # 4 hosts per edge switch
    group = [0, 1, 2, 3, 40]                  # one edge switch and one far rank
    sim = Simulation(topo)
    c = sim.add_comm(group)
    req = sim.post(build("allgather", "mcast", 5, 65536), 4, comm=c)
    sim.run()
    assert sim.completion_time(req) > 0
    lb = sim.net.link_bytes
    # host links (rank node r's up link and its down link) carry bytes only for members
    for r in range(64):
        touched = any(lb[l] > 0 or lb[l ^ 1] > 0 for l in topo.up[r])
        assert touched == (r in group), r
    links, lat = topo.mcast_tree_within(0, group)
    full, _ = topo.mcast_tree(0)
    assert set(links.tolist()) < set(full.tolist())
    dst = {topo.link_dst[l] for l in links.tolist()}
    assert {r for r in dst if r < 64} == set(group) - {0}     # every other member once
    assert len(dst) == len(links)


def test_overlapping_communicators_share_ranks_and_links():
    # HSDP's shape: a reduce-scatter inside a group while an allreduce runs across groups;
    # each rank has one engine per communicator and they share its host link
    P, count = 8, 1 << 16
    sim = Simulation(_switch(P))
    shards = [sim.add_comm([0, 1, 2, 3]), sim.add_comm([4, 5, 6, 7])]
    replicas = [sim.add_comm([i, i + 4]) for i in range(4)]
    rs = [sim.post(build("reduce_scatter", "ring", 4, count), 4, comm=c) for c in shards]
    ar = [sim.post(build("allreduce", "ring", 2, 4 * count), 4, comm=c) for c in replicas]
    sim.run()
    t_rs, _ = _alone(4, "reduce_scatter", "ring", count)
    assert max(sim.completion_time(r) for r in rs) > t_rs       # slowed by the allreduces
    assert all(sim.completion_time(r) > 0 for r in ar)
    # 4-rank ring reduce-scatter: 3 messages a rank; 2-rank ring allreduce: 2 a rank
    assert sim.engine_stats()["messages_out"] == 8 * 3 + 8 * 2


def test_per_rank_post_times_and_post_rank():
    P, count = 4, 1 << 16
    t, _ = _alone(P, "allgather", "ring", count)
    late = 1e-3
    sim = Simulation(_switch(P))
    req = sim.post(build("allgather", "ring", P, count), 4, at=[0.0, 0.0, None, 0.0])
    sim.post_rank(req, 2, late)
    sim.run()
    assert sim.timelines[2].posted[req] == late
    assert sim.completion_time(req) == pytest.approx(late + t, rel=0.05)
    assert sim.completion_time(req) >= late + t * (P - 2) / (P - 1)
    # the same with every rank late is exactly the run shifted
    sim2 = Simulation(_switch(P))
    req2 = sim2.post(build("allgather", "ring", P, count), 4, at=late)
    sim2.run()
    assert sim2.completion_time(req2) == pytest.approx(late + t, rel=1e-9)


def test_callbacks_chain_collectives_and_compute():
    # each rank: allgather, then 1 ms of "compute" (call_at), then a reduce-scatter posted
    # from the callback; the run ends when the last posted request completes
    P, count, compute = 4, 1 << 16, 1e-3
    sim = Simulation(_switch(P))
    ag = sim.post(build("allgather", "ring", P, count), 4)
    rs = sim.post(build("reduce_scatter", "ring", P, count * P), 4, at=None)
    calls = []

    def done(req, rank, now):
        if req == ag:
            sim.call_at(now + compute, lambda t, r=rank: (calls.append(r),
                                                          sim.post_rank(rs, r, t)))

    sim.on_complete = done
    sim.run()
    assert sorted(calls) == list(range(P))
    t_ag, _ = _alone(P, "allgather", "ring", count)
    t_rs, _ = _alone(P, "reduce_scatter", "ring", count * P)
    for r in range(P):
        tl = sim.timelines[r]
        assert tl.posted[rs] == pytest.approx(tl.completed[ag] + compute, rel=1e-12)
    assert sim.completion_time(rs) == pytest.approx(t_ag + compute + t_rs, rel=0.02)


def test_compute_only_callbacks_run():
    sim = Simulation(_switch(2))
    seen = []
    sim.call_at(2e-3, seen.append)
    sim.run()
    assert seen == [2e-3] and sim.now == 2e-3


def test_bad_hook_calls_are_clear_errors():
    sim = Simulation(_switch(4))
    with pytest.raises(SimulationError, match="rank 4 does not exist"):
        sim.add_comm([0, 4])
    with pytest.raises(SimulationError, match="twice"):
        sim.add_comm([1, 1])
    with pytest.raises(SimulationError, match="no ranks"):
        sim.add_comm([])
    c = sim.add_comm([0, 1])
    with pytest.raises(SimulationError, match="communicator 1 of 2"):
        sim.post(build("allgather", "ring", 4, 8), 4, comm=c)
    with pytest.raises(SimulationError, match="no communicator 9"):
        sim.post(build("allgather", "ring", 2, 8), 4, comm=9)
    req = sim.post(build("allgather", "ring", 2, 8), 4, comm=c, at=None)
    with pytest.raises(SimulationError, match="not a member"):
        sim.post_rank(req, 3, 0.0)
    sim.post_rank(req, 0, 0.0)
    with pytest.raises(SimulationError, match="already posted"):
        sim.post_rank(req, 0, 0.0)
    with pytest.raises(SimulationError, match="3 post times"):
        sim.post(build("allgather", "ring", 2, 8), 4, comm=c, at=[0, 0, 0])
    # rank 1 never posts: a deadlock that names the request and the rank
    with pytest.raises(SimulationError, match=r"request 0 by rank\(s\) \[1\]"):
        sim.run()


def test_members_posting_in_different_orders_is_a_clear_error():
    sim = Simulation(_switch(2))
    a = sim.post(build("allgather", "ring", 2, 64), 4, at=None)
    b = sim.post(build("reduce_scatter", "ring", 2, 64), 4, at=None)
    sim.post_rank(a, 0, 0.0)
    sim.post_rank(b, 0, 1e-6)
    sim.post_rank(b, 1, 0.0)
    sim.post_rank(a, 1, 1e-6)
    with pytest.raises(SimulationError, match="same order"):
        sim.run()


def test_world_runs_unchanged_through_the_hook():
    # the world communicator keeps rank == endpoint; a recorded run still names ranks
    P = 6
    sim = Simulation(fat_tree(P, radix=4), SimConfig(record=True))
    req = sim.post(build("allgather", "mcast", P, 4096), 4)
    sim.run()
    assert sim.completion_time(req) > 0
    kinds = {iv.kind for tl in sim.timelines for iv in tl.intervals}
    assert {"mcast", "mrecv"} <= kinds
    peers = {iv.peer for tl in sim.timelines for iv in tl.intervals if iv.kind == "mrecv"}
    assert peers <= set(range(P))
    assert np.isfinite(sim.net.link_bytes).all()
