"""The simulator: closed forms without contention, traffic, loss recovery, topologies,
in-network reduction, outputs and the CLI (FSDP: test_sim_pipeline.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polycast.algorithms import algorithms, build
from polycast.errors import InvalidArgument, PolycastError, UnknownName
from polycast.sim.network import Network, same_time_bound
from polycast.sim.simulate import simulate
from polycast.sim.topology import fat_tree, leaf_spine, parse_topology, single_switch

LAT, SW = 0.5e-6, 0.3e-6
ALPHA = 2 * LAT + SW                  # one switch: two links and one switch hop
MIB = 1 << 20


def _switch(P: int, framing: str = "none"):
    # Closed forms and exact byte counts are of the ideal link: no headers (framing none).
    return single_switch(P, link="400Gbps", latency_s=LAT, switch_latency_s=SW,
                         framing=framing)


def _registered(collective: str, name: str) -> None:
    if name not in {a.name for a in algorithms(collective)}:
        pytest.skip(f"{collective} {name!r} is not registered yet")


# -- closed forms (specs/measures.md), one switch, no contention ---------------------------

@pytest.mark.parametrize("P", [2, 5, 8])
def test_ring_allgather_closed_form(P):
    N = 16 * MIB - (16 * MIB) % (4 * P)
    topo = _switch(P)
    r = simulate("allgather", "ring", P, N, topo)
    S, B = r.nbytes / P, topo.host_link_bw
    assert r.time_s == pytest.approx((P - 1) * (ALPHA + S / B), rel=0.01)


@pytest.mark.parametrize("P", [3, 8])
def test_ring_allreduce_closed_form(P):
    _registered("allreduce", "ring")
    topo = _switch(P)
    N = 4 * P * 65536
    r = simulate("allreduce", "ring", P, N, topo)
    assert r.time_s == pytest.approx(2 * (P - 1) * (ALPHA + N / (P * topo.host_link_bw)),
                                     rel=0.01)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_pipelined_chain_broadcast_closed_form(k):
    _registered("broadcast", "chain")
    P, N = 8, 64 * MIB
    topo = _switch(P)
    r = simulate("broadcast", "chain", P, N, topo, nchunks=k)
    depth = P - 1
    assert r.time_s == pytest.approx((depth + k - 1) * (ALPHA + N / (k * topo.host_link_bw)),
                                     rel=0.01)


@pytest.mark.parametrize("P", [2, 8, 16])
def test_multicast_broadcast_closed_form(P):
    _registered("broadcast", "mcast")
    N = 16 * MIB
    topo = _switch(P)
    r = simulate("broadcast", "mcast", P, N, topo)
    # alpha + N/B, plus the completion handshake: one FIN to the ring neighbour (alpha).
    assert r.time_s == pytest.approx(ALPHA + N / topo.host_link_bw + ALPHA, rel=0.01)
    assert r.time_s == pytest.approx(ALPHA + N / topo.host_link_bw, rel=0.01)


@pytest.mark.parametrize("P", [8, 32])
def test_multicast_allgather_is_receive_bound(P):
    N = 64 * MIB
    topo = _switch(P)
    r = simulate("allgather", "mcast", P, N, topo)
    S, B = N / P, topo.host_link_bw
    # Receive-bound: (P-1)S/B. With `roots` streams at a time, each paced at B/roots, a
    # root's own downlink carries only the other streams while it sends: P S/B; plus one
    # token hand-off per stream of a sequence and the final handshake.
    handoffs = (P // 2 + 2) * ALPHA
    assert (P - 1) * S / B <= r.time_s <= 1.01 * (P * S / B + handoffs)


# -- traffic -----------------------------------------------------------------------------

@pytest.mark.parametrize("P", [2, 3, 5, 8, 12])
def test_switch_allgather_traffic_ratio_exact(P):
    N = 4 * P * 3000
    ring = simulate("allgather", "ring", P, N, _switch(P))
    mcast = simulate("allgather", "mcast", P, N, _switch(P))
    S = N // P
    assert ring.link_bytes == 2 * (P - 1) * S * P
    assert mcast.link_bytes == P * S + P * (P - 1) * S
    assert ring.link_bytes * P == mcast.link_bytes * 2 * (P - 1)   # ratio 2(P-1)/P exactly
    assert set(ring.link_bytes_by_layer) == {"host-leaf"}


def test_fat_tree_traffic_by_layer_and_multicast_saving():
    P = 64          # radix 8: 16 hosts per pod, 4 pods, so traffic crosses the cores
    topo = fat_tree(P, radix=8)
    ring = simulate("allgather", "ring", P, 8 * MIB, topo)
    mcast = simulate("allgather", "mcast", P, 8 * MIB, topo)
    for r in (ring, mcast):
        assert sum(r.link_bytes_by_layer.values()) == r.link_bytes
        assert r.link_bytes_by_layer["spine-core"] > 0
    assert 1.8 < ring.link_bytes / mcast.link_bytes < 2.2


# -- loss ----------------------------------------------------------------------------------

@pytest.mark.parametrize("collective,algo,P", [("allgather", "mcast", 8),
                                               ("broadcast", "mcast", 6)])
@pytest.mark.parametrize("seed", [1, 2])
def test_loss_is_recovered_exactly(collective, algo, P, seed):
    _registered(collective, algo)
    r = simulate(collective, algo, P, 8 * MIB, _switch(P), loss=0.05, seed=seed)
    assert r.lost_datagrams > 0
    assert r.recovered_nbytes == r.lost_nbytes
    assert r.engine_stats["completed"] == P
    assert r.engine_stats["failed"] == 0
    clean = simulate(collective, algo, P, 8 * MIB, _switch(P))
    assert r.time_s > clean.time_s


def test_loss_is_seeded():
    a = simulate("allgather", "mcast", 8, 4 * MIB, _switch(8), loss=0.1, seed=7)
    b = simulate("allgather", "mcast", 8, 4 * MIB, _switch(8), loss=0.1, seed=7)
    assert (a.time_s, a.lost_nbytes) == (b.time_s, b.lost_nbytes)


# -- in-network reduction ------------------------------------------------------------------

def test_innet_reduce_scatter_traffic():
    P, N = 8, 8 * MIB
    topo = _switch(P)
    innet = simulate("reduce_scatter", "innet", P, N, topo)
    ring = simulate("reduce_scatter", "ring", P, N, topo)
    # every rank sends P-1 blocks up; each destination's downlink carries its block once
    assert innet.link_bytes == (P - 1) * N + N
    assert ring.link_bytes == 2 * (P - 1) * N
    down = [innet.simulation.net.link_bytes[l ^ 1] for r in range(P) for l in topo.up[r]]
    assert all(d == N // P for d in down)


def test_innet_allreduce_verifies_and_moves_less():
    from polycast.schedule.verify import verify
    for P in (2, 3, 8):
        verify(build("allreduce", "innet", P, 6 * P, nchunks=2))
        verify(build("reduce_scatter", "innet", P, 6, nchunks=2))
    P, N = 8, 8 * MIB
    innet = simulate("allreduce", "innet", P, N, _switch(P))
    ring = simulate("allreduce", "ring", P, N, _switch(P))
    assert innet.link_bytes == 2 * P * N
    assert ring.link_bytes == 4 * (P - 1) * N


# -- topologies ----------------------------------------------------------------------------

def test_fat_tree_shape_and_routes():
    t = fat_tree(16, radix=4)              # full k=4 fat tree
    assert t.nswitches == 20
    assert t.nlinks == 2 * 48
    links, lat = t.route(0, 15)
    assert len(links) == 6                 # host-edge-agg-core-agg-edge-host
    assert lat == pytest.approx(6 * t.link_lat[0] + 5 * t.switch_latency_s)
    assert t.route(0, 15)[0] is links       # cached and deterministic
    fresh = fat_tree(16, radix=4)
    assert np.array_equal(fresh.route(0, 15)[0], links)
    assert len(t.route(0, 1)[0]) == 2       # same edge switch


def test_multicast_tree_reaches_everyone_once():
    for t in (fat_tree(40, radix=8), leaf_spine(24, hosts_per_leaf=8, oversub=2),
              parse_topology("fattree:radix=4,ranks_per_host=2,nics=2", 16)):
        for root in (0, t.nranks - 1, t.nranks // 2):
            links, lat = t.mcast_tree(root)
            dsts = [t.link_dst[l] for l in links]
            assert len(dsts) == len(set(dsts))          # every node entered once: a tree
            assert set(range(t.nranks)) - {root} <= set(dsts)
            assert lat[root] == 0 and (np.delete(lat, root) > 0).all()


def test_ecmp_spreads_over_uplinks():
    t = leaf_spine(64, hosts_per_leaf=16, oversub=1)
    first_up = {int(t.route(s, d)[0][1]) for s in range(16) for d in range(16, 64)}
    assert len(first_up) >= 12              # 16 spines, hash-spread


def test_leaf_spine_oversubscription():
    t = leaf_spine(32, hosts_per_leaf=16, oversub=2, link="400Gbps")
    up = [l for l in range(t.nlinks) if t.link_layer[l] == "leaf-spine"
          and t.node_name[t.link_src[l]] == "leaf0"]
    assert sum(t.link_bw[l] for l in up) == pytest.approx(16 * 50e9 / 2)


def test_multi_rank_hosts_use_intra_host_links():
    t = parse_topology("switch:ranks_per_host=4,nvlink=3600Gbps", 8)
    assert t.route(0, 1)[0].size == 2 and {t.link_layer[l] for l in t.route(0, 1)[0]} \
        == {"intra-host"}
    r = simulate("allgather", "ring", 8, 8 * MIB, t)
    assert r.link_bytes_by_layer["intra-host"] > r.link_bytes_by_layer["host-leaf"]


@pytest.mark.parametrize("topo", [
    single_switch(12), single_switch(16, ranks_per_host=4, nics=2),
    leaf_spine(64, hosts_per_leaf=8, oversub=2.0),
    leaf_spine(96, hosts_per_leaf=4, oversub=3.0, ranks_per_host=2, nics=3),
    fat_tree(128, radix=8), fat_tree(256, radix=8, ranks_per_host=4, nics=2),
], ids=lambda t: t.description)
def test_routes_of_many_pairs_are_route_bit_for_bit(topo):
    """Topology.routes (all pairs at once, arrays) == route() pair by pair: links and
    latency sums, on every topology kind (ECMP over spines, cores and parallel NICs)."""
    P = topo.nranks
    src, dst = np.nonzero(~np.eye(P, dtype=bool))
    order = np.random.default_rng(1).permutation(len(src))      # any order of pairs
    src, dst = src[order], dst[order]
    ptr, links, lat = topo.routes(src, dst)
    assert len(ptr) == len(src) + 1
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        want, want_lat = topo.route(s, d)
        assert np.array_equal(links[ptr[i]:ptr[i + 1]], want), (s, d)
        assert lat[i] == want_lat, (s, d)
    with pytest.raises(InvalidArgument, match="no route 3 -> 3"):
        topo.routes(np.array([0, 3]), np.array([1, 3]))


@pytest.mark.parametrize("cfg", [dict(host_gbps=200.0), dict(host_latency_s=2e-6),
                                 dict(host_gbps=100.0, host_latency_s=1e-6), {}])
def test_plan_routes_are_the_drivers(cfg):
    """The fast path's routes of many rank pairs (with the host model's ports and latency)
    are the engine loop's _route, pair by pair, with ranks placed on other nodes."""
    from polycast.sim import SimConfig, Simulation
    from polycast.sim.fast_plan import _routes
    topo = leaf_spine(32, hosts_per_leaf=4, oversub=2.0, ranks_per_host=2, nics=2)
    P = topo.nranks
    placement = tuple(np.random.default_rng(2).permutation(P).tolist())
    sim = Simulation(topo, SimConfig(placement=placement, **cfg))
    src, dst = np.nonzero(~np.eye(P, dtype=bool))
    routes, lat = _routes(sim, src, dst)
    assert len(routes) == len(src)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        want, want_lat = sim._route(s, d)
        assert np.array_equal(routes[i], want) and lat[i] == want_lat, (s, d)


@pytest.mark.parametrize("text,match", [
    ("fattree:radix=8", "radix >= 10"),            # 200 hosts > 128 ports
    ("torus", "fattree"),
    ("fattree:radx=8", "valid keys"),
    ("switch:link=0Gbps", "> 0"),
    ("leafspine:oversub=0", "oversub"),
    ("fattree:radix=7", "even"),
    ("switch:link=fast", "400Gbps"),
    ("switch:latency=1parsec", "1us"),
])
def test_bad_topologies(text, match):
    with pytest.raises(InvalidArgument, match=match):
        parse_topology(text, 200)


# -- the network model alone ---------------------------------------------------------------

def test_max_min_fair_sharing():
    t = single_switch(4, link="8Gbps", latency_s=0, switch_latency_s=0)   # 1e9 B/s links
    net = Network(t)
    net.add_flow(t.route(0, 2)[0], 1_000_000, 0.0, "a")
    net.add_flow(t.route(1, 2)[0], 2_000_000, 0.0, "b")
    net.add_flow(t.route(3, 1)[0], 1_000_000, 0.0, "c")
    net.settle(0.0)
    done = {}
    for _ in range(10):
        now = net.next_time()
        if now == float("inf"):
            break
        for f in net.pop_drained(same_time_bound(now)):
            done[f.data] = now
        net.settle(now)
    assert done == pytest.approx({"c": 1e-3, "a": 2e-3, "b": 3e-3})
    assert net.link_bytes.sum() == 8_000_000


# -- every algorithm runs in the simulator ---------------------------------------------------

def test_every_registered_algorithm_simulates():
    P = 8
    topo = parse_topology("switch:ranks_per_host=2", P)
    for algo in algorithms():
        r = simulate(algo.collective, algo.name, P, 64 * 1024, topo)
        assert r.time_s > 0 or str(algo.collective) == "barrier", algo.name
        assert r.engine_stats["completed"] == P


# -- outputs and CLI -----------------------------------------------------------------------

def test_chrome_trace(tmp_path):
    from polycast.sim.trace import chrome_trace
    r = simulate("allgather", "ring", 4, MIB, _switch(4), record=True)
    tr = chrome_trace(r)
    spans = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    assert sum(1 for e in spans if e["cat"] == "send") == 4 * 3
    with pytest.raises(InvalidArgument, match="record=True"):
        chrome_trace(simulate("allgather", "ring", 4, MIB, _switch(4)))


def test_cli_json_compare(capsys, tmp_path):
    from polycast.cli.main import main
    trace = tmp_path / "t.json"
    rc = main(["sim", "allgather", "--compare", "ring,mcast", "--nodes", "8", "--size",
               "1MiB", "--topology", "switch", "--framing", "none", "--json", "--trace",
               str(trace)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["algorithm"] for o in out] == ["ring", "mcast"]
    for o in out:
        for key in ("collective", "algorithm", "nodes", "nbytes", "time_s", "busbw",
                    "link_bytes", "link_bytes_by_layer"):
            assert key in o
    assert out[0]["link_bytes"] * 8 == out[1]["link_bytes"] * 14
    assert json.loads(trace.read_text())["traceEvents"]


def test_cli_single_json_and_table(capsys):
    from polycast.cli.main import main
    assert main(["sim", "reduce_scatter", "--algo", "innet", "-n", "4", "--size", "64KiB",
                 "--json"]) == 0
    o = json.loads(capsys.readouterr().out)
    assert o["algorithm"] == "innet" and o["nodes"] == 4 and o["busbw"] > 0
    assert main(["sim", "allgather", "-n", "4", "--size", "64KiB"]) == 0
    assert "busbw" in capsys.readouterr().out


def test_cli_bad_input(capsys):
    from polycast.cli.main import main
    assert main(["sim", "allgather", "--algo", "nope", "-n", "4"]) == 2
    assert "valid choices" in capsys.readouterr().err
    assert main(["sim", "allgather", "-n", "4", "--size", "lots"]) == 2
    assert "MiB" in capsys.readouterr().err
    assert main(["sim", "allgather", "-n", "300", "--topology", "fattree:radix=8"]) == 2
    assert "radix" in capsys.readouterr().err


def test_sweep_rows(tmp_path):
    from polycast.sim.sweep import grid, run_grid, write_table
    pts = grid("allgather", ["ring", "mcast"], [4], [MIB], ["switch"])
    pts += grid("allgather", ["ring"], [300], [MIB], ["fattree:radix=8"])
    rows = run_grid(pts, workers=1)
    assert [r["algorithm"] for r in rows] == ["ring", "mcast", "ring"]
    assert rows[0]["link_bytes"] > rows[1]["link_bytes"] > 0
    assert "radix" in rows[2]["error"] and rows[2]["time_s"] == ""
    path = tmp_path / "s.csv"
    write_table(rows, str(path))
    assert path.read_text().splitlines()[0].startswith("collective,algorithm")
    with pytest.raises(InvalidArgument, match="csv"):
        write_table(rows, str(tmp_path / "s.txt"))


def test_simulation_errors_are_polycast_errors():
    with pytest.raises(PolycastError):
        simulate("allgather", "ring", 4, MIB, "switch", loss=1.5)


def test_plot_file(tmp_path):
    pytest.importorskip("matplotlib")
    from polycast.cli.main import main
    out = tmp_path / "sim.png"
    assert main(["sim", "allgather", "--compare", "ring,mcast", "-n", "8", "--size", "1MiB",
                 "--topology", "leafspine:hosts_per_leaf=4,oversub=2", "--plot",
                 str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_event_bound_is_a_clear_error():
    from polycast.sim import SimulationError
    with pytest.raises(SimulationError, match="max_events"):
        simulate("allgather", "ring", 8, MIB, _switch(8), max_events=10)


def test_several_collectives_share_the_network():
    from polycast.sim import SimConfig, Simulation
    P = 8
    topo = _switch(P)
    ag = build("allgather", "ring", P, 65536)
    alone = Simulation(topo, SimConfig())
    a = alone.post(ag, 4)
    alone.run()
    both = Simulation(topo, SimConfig())
    a2 = both.post(ag, 4)
    both.post(build("reduce_scatter", "ring", P, 65536), 4)
    both.run()
    # the ring allgather and reduce-scatter share every link: about twice as long
    assert both.completion_time(a2) > 1.5 * alone.completion_time(a)


def test_oversubscribed_fabric_multicast_wins_in_time():
    # specs/measures.md: with ranks scattered over leaves (as a scheduler places them), ring
    # hops cross the 4:1 oversubscribed uplinks; a multicast shard crosses each uplink once.
    topo = leaf_spine(64, hosts_per_leaf=8, oversub=4)
    ring = simulate("allgather", "ring", 64, 8 * MIB, topo, placement="random", seed=1)
    mcast = simulate("allgather", "mcast", 64, 8 * MIB, topo, placement="random", seed=1)
    assert ring.time_s > 2 * mcast.time_s
    assert ring.link_bytes_by_layer["leaf-spine"] > 10 * mcast.link_bytes_by_layer["leaf-spine"]
    linear = simulate("allgather", "ring", 64, 8 * MIB, topo)
    assert linear.time_s < ring.time_s
    with pytest.raises(UnknownName, match="random"):
        simulate("allgather", "ring", 4, MIB, "switch", placement="scattered")


def test_sweep_auto_is_the_planners_choice_simulated(tmp_path):
    import json
    from polycast.collectives import Collective
    from polycast.planner import choose_on_topology
    from polycast.sim.simulate import resolve_topology
    from polycast.sim.sweep import Point, grid, run_grid, run_point, write_table
    pt = Point("allgather", "auto", 8, MIB, "switch", "400Gbps")
    row = run_point(pt)
    coll = Collective.parse("allgather")
    want = choose_on_topology(coll, 8 * MIB, resolve_topology("switch", 8, "400Gbps",
                                                             pt.framing))
    assert row["algorithm"] == f"auto({want.algorithm})" and row["error"] == ""
    same = run_point(Point("allgather", want.algorithm, 8, MIB, "switch", "400Gbps",
                           nchunks=want.nchunks))
    assert row["time_s"] == same["time_s"] > 0
    with pytest.raises(InvalidArgument, match="workers must be >= 1, got -1"):
        run_grid(grid("allgather", ["ring"], [4], [MIB], ["switch"]), workers=-1)
    path = tmp_path / "s.json"
    write_table([row], str(path))
    assert json.loads(path.read_text())[0]["algorithm"] == row["algorithm"]
