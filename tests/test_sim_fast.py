"""The equality grid: the fast path (polycast/sim/fast.py, fast_stream.py, fast_events.py) gives
the engines' answer -- completion time within 0.1 %, link bytes exact -- for every registered algorithm
of every collective, on a switch, an oversubscribed leaf-spine and a fat tree, with and
without the host model; and it must take every case it covers (a fallback to the engines
fails the grid). A quick subset runs by default, the full grid (more ranks, odd sizes,
random placement, several collectives at once, P up to 1024) is marked slow."""

from __future__ import annotations

import pytest

from polycast.algorithms import algorithms, build
from polycast.errors import InvalidArgument
from polycast.sim import SimConfig, Simulation
from polycast.sim.driver import SimulationError, pacing_gbps_for
from polycast.sim.simulate import simulate
from polycast.sim.topology import parse_topology

TOPOLOGIES = ("switch", "leafspine:hosts_per_leaf=4,oversub=4", "fattree:radix=4")
HOST = {"host_gbps": 100.0, "host_latency_s": 2e-6}


def _same(collective, algo, P, size, topology, **kw):
    ref = simulate(collective, algo, P, size, topology, path="engine", **kw)
    fast = simulate(collective, algo, P, size, topology, path="auto", **kw)
    where = f"{collective} {algo} P={P} {topology} {kw}"
    assert fast.path == "fast", f"{where} fell back to the engines: {fast.path_reason}"
    assert fast.link_bytes == ref.link_bytes, where
    assert fast.link_bytes_by_layer == ref.link_bytes_by_layer, where
    assert fast.time_s == pytest.approx(ref.time_s, rel=1e-3, abs=1e-12), where
    for a, b in zip(fast.rank_times_s, ref.rank_times_s):
        assert a == pytest.approx(b, rel=1e-3, abs=1e-12), where
    return fast


def _cases(P):
    return [(a.collective, a.name) for a in algorithms() if a.unsupported_reason(P) is None]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_algorithm_equal_quick(topology):
    P = 8
    modes = set()
    for coll, algo in _cases(P):
        modes.add(_same(coll, algo, P, 64 * 1024 * P, topology).fast_mode)
    assert modes == {"stream", "walk", "events"}          # every mode ran


def test_host_model_equal_quick():
    P = 8
    for coll, algo in _cases(P):
        _same(coll, algo, P, 48 * 1024 * P + 4, "fattree:radix=4", **HOST)


# a receiver NIC slower than the link with room for everything (no drops), and one that
# keeps up (the paper's DPA)
ROOMY_NIC = "clock=1GHz,cores=1,cycles=1000,chunk=4KiB,queue=100000"


@pytest.mark.parametrize("nic", ["bf3-dpa", ROOMY_NIC])
def test_nic_model_without_drops_equal_quick(nic):
    P = 8
    for coll, algo in _cases(P):
        r = _same(coll, algo, P, 1 << 20, "fattree:radix=4", nic=nic)
        assert r.nic_dropped_nbytes == 0


def test_nic_that_drops_runs_the_engines():
    r = simulate("allgather", "mcast", 8, 8 << 20, "switch",
                 nic="clock=1GHz,cores=1,cycles=1000,chunk=4KiB,queue=64")
    assert r.path == "engine" and "dropped" in r.path_reason and r.nic_dropped_nbytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("P", [5, 16, 64])
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("host", [False, True])
def test_every_algorithm_equal_grid(P, topology, host):
    kw = HOST if host else {}
    if P > 16 and topology.startswith("fattree"):
        topology = "fattree:radix=8"            # radix 4 holds 16 hosts
    for coll, algo in _cases(P):
        _same(coll, algo, P, 123457 * P, topology, **kw)


@pytest.mark.slow
def test_hosts_of_several_ranks_and_random_placement_equal():
    for topo in ("switch:ranks_per_host=4,nics=2", "fattree:radix=4,ranks_per_host=2,nics=2"):
        for coll, algo in _cases(12):
            _same(coll, algo, 12, 65536 * 12, topo, placement="random", seed=3)
    for coll, algo in _cases(5):
        _same(coll, algo, 5, 99999, "leafspine:hosts_per_leaf=2,oversub=2", nchunks=3)


@pytest.mark.slow
@pytest.mark.timeout(1800)          # the engines take 1-2 minutes of CPU each here
@pytest.mark.parametrize("algo", ["ring", "mcast"])
def test_1024_ranks_equal(algo):
    _same("allgather", algo, 1024, 64 << 20, "fattree:radix=32")


def _both(P, topology, posts, comms=()):
    """Several collectives at once (communicators, per-rank post times) on both paths."""
    out = []
    for path in ("engine", "auto"):
        topo = parse_topology(topology, P)
        eng = {"line_rate_gbps": 400.0,
               "pacing_gbps": pacing_gbps_for([s for s, _, _ in posts], 400.0, topo.framing)}
        sim = Simulation(topo, SimConfig(engine=eng, path=path))
        cids = [0] + [sim.add_comm(g) for g in comms]
        reqs = [sim.post(s, 4, at=at, comm=cids[c]) for s, at, c in posts]
        sim.run()
        out.append((sim, [sim.completion_time(r) for r in reqs]))
    (ref, t_ref), (fast, t_fast) = out
    assert fast.path == "fast", fast.path_reason
    assert fast.net.link_bytes.sum() == ref.net.link_bytes.sum()
    assert t_fast == pytest.approx(t_ref, rel=1e-3)
    for r in range(P):
        assert fast.timelines[r].completed == pytest.approx(ref.timelines[r].completed,
                                                             rel=1e-3)
    return fast


def test_collectives_at_once_equal():
    P = 16
    _both(P, "fattree:radix=4", [(build("allgather", "ring", P, 4096), 0.0, 0),
                                 (build("reduce_scatter", "ring", P, 4096), 0.0, 0)])
    _both(P, "leafspine:hosts_per_leaf=4,oversub=2",
          [(build("allgather", "mcast", P, 4096), [i * 1e-7 for i in range(P)], 0),
           (build("allreduce", "dbtree", P, 4096 * P), 5e-6, 0)])
    half = P // 2
    _both(P, "fattree:radix=4", [(build("allgather", "ring", half, 4096), 0.0, 1),
                                 (build("allgather", "mcast", half, 4096), 0.0, 2),
                                 (build("reduce_scatter", "ring", P, 4096), 1e-6, 0)],
          comms=(list(range(0, P, 2)), list(range(1, P, 2))))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_collectives_at_once_equal_256():
    P = 256
    _both(P, "fattree:radix=32", [(build("allgather", "mcast", P, 16384), 0.0, 0),
                                  (build("reduce_scatter", "ring", P, 16384), 0.0, 0)])
    _both(P, "fattree:radix=32", [(build("allgather", "ring", P, 16384), 0.0, 0),
                                  (build("reduce_scatter", "ring", P, 16384), 0.0, 0)])


def test_what_runs_on_the_engines():
    P = 8
    r = simulate("allgather", "mcast", P, 1 << 20, "switch", loss=0.05, seed=1)
    assert r.path == "engine" and "loss" in r.path_reason
    r = simulate("allgather", "ring", P, 1 << 20, "switch", record=True)
    assert r.path == "engine" and "record" in r.path_reason
    r = simulate("allgather", "ring", P, 1 << 20, "switch", path="engine")
    assert r.path == "engine"
    with pytest.raises(SimulationError, match="fast path cannot"):
        simulate("allgather", "ring", P, 1 << 20, "switch", path="fast", loss=0.1)
    with pytest.raises((SimulationError, InvalidArgument), match="path"):
        simulate("allgather", "ring", P, 1 << 20, "switch", path="quick")
    r = simulate("allgather", "ring", P, 1 << 20, "switch")
    assert r.to_json()["path"] == "fast" and r.to_json()["fast_mode"] == "stream"
    r = simulate("allgather", "mcast", P, 1 << 20, "switch")
    assert r.to_json()["path"] == "fast" and r.to_json()["fast_mode"] == "stream"


# -- the stream mode (polycast/sim/fast_stream.py) against the walk ---------------------------

STREAMED = [("allgather", "ring"), ("reduce_scatter", "ring"), ("allreduce", "ring"),
            ("allgather", "mcast")]


def _stream_and_walk(coll, algo, P, count, topology, nchunks=1, at=0.0, comm_of=None,
                     contended=False, **opts):
    """The same request timed by the stream mode and by the walk (its columns built first,
    which the stream mode leaves to the walk): equal bit for bit; where the walk finds
    flows contending (multicast streams that overlap; ``contended``: it must), against
    the events mode (max-min settling), equal to round-off."""
    out = []
    for mode in ("stream", "events" if contended else "walk or events"):
        topo = parse_topology(topology, P)
        n = P if comm_of is None else len(comm_of)
        s = build(coll, algo, n, count, nchunks=nchunks, compact=True, **opts)
        assert s.form is not None
        if mode != "stream":
            s.columns
        gbps = topo.host_link_bw * 8 / 1e9
        eng = {"line_rate_gbps": gbps, "pacing_gbps": pacing_gbps_for([s], gbps, topo.framing)}
        sim = Simulation(topo, SimConfig(engine=eng))
        comm = 0 if comm_of is None else sim.add_comm(comm_of)
        q = sim.post(s, 4, at=at, comm=comm)
        sim.run()
        assert sim.path == "fast" and sim.fast_mode in mode.split(" or "), \
            (mode, sim.path_reason)
        if sim.fast_mode == "events":
            contended = True
        out.append((sim.completion_time(q), sim.net.link_bytes.copy(),
                    [tl.completed.get(q) for tl in sim.timelines], sim.events,
                    sim.net.flows_started, sim.engine_stats()))
    (t1, lb1, rt1, ev1, f1, st1), (t2, lb2, rt2, ev2, f2, st2) = out
    where = (coll, algo, P, topology, nchunks)
    assert (lb1 == lb2).all() and f1 == f2, where
    if contended:
        assert t1 == pytest.approx(t2, rel=1e-9), where
        assert rt1 == pytest.approx(rt2, rel=1e-9), where
        return
    assert t1 == t2 and rt1 == rt2, where
    assert ev1 == ev2 and st1 == st2, where


@pytest.mark.parametrize("coll,algo", STREAMED)
def test_stream_equals_walk_quick(coll, algo):
    k = 16 if algo == "mcast" else 1         # streams of several datagrams: paced apart
    _stream_and_walk(coll, algo, 256, 1000 * k, "fattree:radix=16")
    _stream_and_walk(coll, algo, 37, 999 * k, "leafspine:hosts_per_leaf=4,oversub=4",
                     nchunks=3, at=[i * 1e-7 for i in range(37)])
    if algo != "mcast":                      # the world's multicast only
        _stream_and_walk(coll, algo, 16, 512, "fattree:radix=4",
                         comm_of=list(range(1, 16, 2)))


def test_stream_of_overlapping_streams_equals_the_events_mode():
    # one datagram per rank: a stream drains at line rate, faster than its pacer slot, so
    # the two token sequences' streams overlap and share every receiver's link
    _stream_and_walk("allgather", "mcast", 64, 2048, "fattree:radix=8", contended=True)
    _stream_and_walk("allgather", "mcast", 48, 2048, "leafspine:hosts_per_leaf=8,oversub=2",
                     contended=True)


GPUS = "ranks_per_host={R},nvlink=3600Gbps,nics={nics}"


def test_stream_over_hosts_equals_the_walk_and_the_events_mode():
    # hmcast: the locals' shards to their leader (R - 1 flows sharing the leader's port),
    # then the leaders' token ring; one stream at a time and R = 2: nothing contends, the
    # walk's numbers bit for bit
    gpus = GPUS.format(R=2, nics=2)
    _stream_and_walk("allgather", "hmcast", 32, 4096, f"fattree:radix=8,{gpus}",
                     hosts=16, ranks_per_host=2, roots=1)
    _stream_and_walk("allgather", "hmcast", 24, 999, f"switch:{gpus}", hosts=12,
                     ranks_per_host=2, roots=1)
    # R = 8: seven flows into each leader, and two streams sharing each host's NIC
    gpus = GPUS.format(R=8, nics=8)
    _stream_and_walk("allgather", "hmcast", 64, 65536, f"fattree:radix=8,{gpus}",
                     contended=True, hosts=8, ranks_per_host=8)
    _stream_and_walk("allgather", "hmcast", 96, 1000, f"leafspine:hosts_per_leaf=4,"
                     f"oversub=2,{GPUS.format(R=4, nics=2)}", contended=True, hosts=24,
                     ranks_per_host=4, roots=3)
    # hring: the gather and the broadcast's first messages share the ranks' ports, then
    # each block leaves the leader beside the ring's next flow (max-min: the events mode)
    _stream_and_walk("allgather", "hring", 64, 16384, f"fattree:radix=8,{gpus}",
                     contended=True, hosts=8, ranks_per_host=8)
    _stream_and_walk("allgather", "hring", 48, 999, f"leafspine:hosts_per_leaf=4,"
                     f"oversub=2,{GPUS.format(R=4, nics=2)}", contended=True, hosts=12,
                     ranks_per_host=4)
    _stream_and_walk("allgather", "hring", 32, 777, f"fattree:radix=8,"
                     f"{GPUS.format(R=4, nics=4)}", at=[(i % 4) * 3e-7 for i in range(32)],
                     contended=True, hosts=8, ranks_per_host=4)
    _stream_and_walk("allgather", "hring", 8, 4096, f"switch:{gpus}", contended=True,
                     hosts=1, ranks_per_host=8)
    # one rank per host: a ring of one-shard blocks, nothing shared (the walk's numbers)
    _stream_and_walk("allgather", "hring", 16, 4096, "fattree:radix=4", hosts=16,
                     ranks_per_host=1)


def test_stream_over_hosts_refuses_what_it_does_not_model():
    # ranks posting late: a host still gathers when the first streams start (hmcast) or
    # when its ring or broadcast starts (hring); the path taken still gives the answer
    for algo, P, R, posts in (("hmcast", 64, 8, [0.0] * 63 + [1e-3]),
                              ("hring", 24, 3, [i * 1e-7 for i in range(24)])):
        topo = f"fattree:radix=8,{GPUS.format(R=R, nics=R)}"
        for path in ("engine", "auto"):
            t = parse_topology(topo, P)
            s = build("allgather", algo, P, 4096, compact=True, ranks_per_host=R)
            eng = {"line_rate_gbps": 400.0,
                   "pacing_gbps": pacing_gbps_for([s], 400.0, t.framing)}
            sim = Simulation(t, SimConfig(engine=eng, path=path))
            q = sim.post(s, 4, at=posts)
            sim.run()
            if path == "engine":
                ref = sim.completion_time(q)
                continue
            assert sim.path == "fast" and sim.fast_mode != "stream", algo
            assert "gathers" in sim.fast_stream_refused, algo
            assert sim.completion_time(q) == pytest.approx(ref, rel=1e-3), algo


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("algo", ["hmcast", "hring"])
def test_stream_over_hosts_equals_the_events_mode_1024_gpus(algo):
    _stream_and_walk("allgather", algo, 1024, 16384,
                     f"fattree:radix=32,{GPUS.format(R=8, nics=8)}", contended=True,
                     hosts=128, ranks_per_host=8)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("coll,algo", STREAMED)
def test_stream_equals_walk_1024(coll, algo):
    _stream_and_walk(coll, algo, 1024, 16384, "fattree:radix=32")
    _stream_and_walk(coll, algo, 512, 16384, "fattree:radix=16", nchunks=2)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stream_of_overlapping_streams_equals_the_events_mode_512():
    _stream_and_walk("allgather", "mcast", 512, 2048, "fattree:radix=16", contended=True)


def test_stream_refused_falls_to_the_walk_or_is_refused_for_memory():
    from polycast.config import override
    from polycast.algorithms.estimate import TooLarge
    # random placement: ring neighbours collide on uplinks -> the walk's checks, then events
    r = simulate("allgather", "ring", 64, 1 << 20, "fattree:radix=8", placement="random",
                 seed=1)
    assert r.path == "fast" and r.fast_mode == "events"
    assert "capacity" in r.simulation.fast_stream_refused
    # ... and where the walk's columns would not fit, refused before the walk starts
    with override(max_schedule_gib=0.05):
        with pytest.raises(TooLarge, match="stream mode refused .*capacity.* at most about"):
            simulate("allgather", "ring", 512, 64 << 20, "fattree:radix=16",
                     placement="random", seed=1)
    # an algorithm without a compact form, simulated: its Steps and the walk's columns and
    # graph on top of them
    from polycast.algorithms.estimate import estimate
    walked = estimate("allgather", "ring2d", 4096, compact=True, hosts=512, ranks_per_host=8)
    steps = estimate("allgather", "ring2d", 4096, hosts=512, ranks_per_host=8)
    assert walked.walked and walked.nbytes > steps.nbytes
    # a template whose times would not fit memory: refused at build, the largest P named
    with override(max_schedule_gib=0.5):
        with pytest.raises(TooLarge, match="at most about 5,[0-9]{3} ranks with ring"):
            build("allreduce", "ring", 8192, 2048, compact=True)


@pytest.mark.timeout(120)
def test_stream_mode_ends_when_tiny_streams_overlap():
    """1024 multicast streams of 1 B each overlap: the one that drains first leaves a
    rounding residue on the others, which drains in less than the clock's float
    resolution; it used to loop forever (the planner grid's 1 KiB cell). The 512-rank
    run, which never hung, takes about half as long (one more ring of token hops)."""
    big = simulate("allgather", "mcast", 1024, 1024, "fattree:radix=32", link="400Gbps")
    half = simulate("allgather", "mcast", 512, 1024, "fattree:radix=32", link="400Gbps")
    assert (big.path, big.fast_mode) == ("fast", "stream")
    assert 1.5 < big.time_s / half.time_s < 2.5, (big.time_s, half.time_s)
