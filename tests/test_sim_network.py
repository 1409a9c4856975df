"""The network model alone: the incremental settle gives the max-min fair rates of every
active flow, after any sequence of flows starting and draining (checked against a plain
progressive filling written here, independent of polycast.sim.network), in both of its
implementations -- the compiled one (polycast/sim/_network*.c) and the Python one -- and
the two agree flow for flow on the same random sequences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polycast.sim import network
from polycast.sim.network import Network, same_time_bound
from polycast.sim.topology import fat_tree, leaf_spine, single_switch

_NATIVE = [pytest.param(True, id="compiled"), pytest.param(False, id="python")]


def _model(native: bool) -> None:
    if native and network.compiled is None:
        pytest.skip(f"the compiled network model is not in use: {network.why_not}")


def _max_min(flows, capacity) -> dict[int, float]:
    """Progressive filling from scratch: raise every unfrozen flow's rate together; a link
    that fills (or a flow's own cap) freezes the flows it carries."""
    rate = {f.fid: 0.0 for f in flows}
    open_ = {f.fid for f in flows}
    left = {}
    for f in flows:
        for l in f.links.tolist():
            left[l] = float(capacity[l])
    while open_:
        # the smallest increment that fills a link or reaches a cap
        cnt: dict[int, int] = {}
        for f in flows:
            if f.fid in open_:
                for l in f.links.tolist():
                    cnt[l] = cnt.get(l, 0) + 1
        inc = min(left[l] / c for l, c in cnt.items())
        inc = min([inc] + [f.cap - rate[f.fid] for f in flows if f.fid in open_])
        inc = max(inc, 0.0)
        for f in flows:
            if f.fid in open_:
                rate[f.fid] += inc
        for l, c in cnt.items():
            left[l] -= inc * c
        full = {l for l in cnt if left[l] <= capacity[l] * 1e-12}
        for f in flows:
            if f.fid in open_ and (rate[f.fid] >= f.cap * (1 - 1e-12)
                                   or full.intersection(f.links.tolist())):
                open_.discard(f.fid)
    return rate


def _topologies():
    return {
        "switch": single_switch(12, link="100Gbps"),
        "leaf-spine 4:1": leaf_spine(24, hosts_per_leaf=8, oversub=4.0, link="100Gbps"),
        "fattree": fat_tree(16, radix=4, link="100Gbps"),
    }


@pytest.mark.parametrize("native", _NATIVE)
@pytest.mark.parametrize("name", list(_topologies()))
@pytest.mark.parametrize("seed", range(4))
def test_settle_is_max_min_after_any_sequence(name, seed, native):
    _model(native)
    topo = _topologies()[name]
    P = topo.nranks
    rng = np.random.default_rng(seed)
    net = Network(topo, host_bw=(topo.host_link_bw * 0.7 if seed % 2 else None), native=native)
    assert net.native == native
    now, started, checked = 0.0, 0, 0
    while started < 160 or net.flows:
        # a batch of new flows: unicast on its route, or a multicast stream on a tree
        for _ in range(int(rng.integers(0, 6)) if started < 160 else 0):
            src = int(rng.integers(P))
            if rng.random() < 0.25:
                links = topo.mcast_tree(src)[0]
                rx = [r for r in range(P) if r != src]
            else:
                dst = int((src + 1 + rng.integers(P - 1)) % P)
                links = topo.route(src, dst)[0]
                rx = [dst]
            if net.host_bw is not None:
                links = np.concatenate([links, [net.send_port(src)],
                                        [net.recv_port(r) for r in rx]]).astype(links.dtype)
            cap = topo.host_link_bw * float(rng.choice([0.3, 0.55])) \
                if rng.random() < 0.3 else math.inf
            net.add_flow(links, int(rng.integers(1, 50)) * 10**6, now, started, cap=cap)
            started += 1
        net.settle(now)
        flows = list(net.flows.values())
        if flows:
            ref = _max_min(flows, net.capacity)
            for f in flows:
                assert f.rate == pytest.approx(ref[f.fid], rel=1e-9), (name, seed, f.fid)
            checked += 1
        nxt = net.next_time()
        if nxt == math.inf:
            if started >= 160:
                break
            continue
        # drain the next batch, sometimes before it (new flows start in between)
        if rng.random() < 0.3 and started < 160:
            now = now + (nxt - now) * float(rng.random())
        else:
            now = nxt
            net.pop_drained(same_time_bound(now))
    assert checked > 50 and not net.flows
    assert net.flows_started >= 160


@pytest.mark.parametrize("native", _NATIVE)
def test_settle_is_exact_for_two_paced_streams_and_a_message(native):
    _model(native)
    # one 1e9 B/s switch: a stream paced at 0.3e9 and a message share rank 2's port
    t = single_switch(4, link="8Gbps", latency_s=0, switch_latency_s=0)
    net = Network(t, native=native)
    a = net.add_flow(t.route(0, 2)[0], 600_000, 0.0, "a", cap=0.3e9)
    b = net.add_flow(t.route(1, 2)[0], 1_400_000, 0.0, "b")
    net.settle(0.0)
    assert (a.rate, b.rate) == (pytest.approx(0.3e9), pytest.approx(0.7e9))
    done = {}
    while (now := net.next_time()) != math.inf:
        for f in net.pop_drained(same_time_bound(now)):
            done[f.data] = now
        net.settle(now)
    assert done == pytest.approx({"a": 2e-3, "b": 2e-3})


def _random_links(topo, net, rng, P):
    """A unicast route, a multicast tree or a reverse (in-network reduction) tree, plus the
    host ports when the host model is on."""
    src = int(rng.integers(P))
    kind = rng.random()
    if kind < 0.2:
        links, rx = topo.mcast_tree(src)[0], [r for r in range(P) if r != src]
    elif kind < 0.3:
        links, rx = topo.mcast_tree(src)[0] ^ 1, [src]       # the aggregation tree
        src = (src + 1) % P
    else:
        dst = int((src + 1 + rng.integers(P - 1)) % P)
        links, rx = topo.route(src, dst)[0], [dst]
    if net.host_bw is not None:
        links = np.concatenate([links, [net.send_port(src)],
                                [net.recv_port(r) for r in rx]]).astype(np.int64)
    return links


@pytest.mark.parametrize("seed", [1, 3] + [pytest.param(s, marks=pytest.mark.slow)
                                          for s in (0, 2, *range(4, 16))])
def test_compiled_model_matches_the_python_one(seed):
    """Both models driven with the same random flows (unicast, multicast trees, reverse
    trees, paced caps, host ports) on random topologies: the same flows active after every
    settle at the same rates, the same drain times and batches, the same link bytes and
    counters of started flows."""
    _model(True)
    rng = np.random.default_rng(1000 + seed)
    topo = [single_switch(int(rng.integers(3, 20)), link="100Gbps"),
            leaf_spine(32, hosts_per_leaf=8, oversub=float(rng.choice([1.0, 2.0, 4.0])),
                       link="100Gbps"),
            fat_tree(16, radix=4, link="100Gbps"),
            fat_tree(64, radix=8, link="400Gbps")][seed % 4]
    P = topo.nranks
    host_bw = topo.host_link_bw * float(rng.choice([0.4, 0.9])) if seed % 3 == 1 else None
    nets = [Network(topo, host_bw=host_bw, native=True),
            Network(topo, host_bw=host_bw, native=False)]
    assert [n.native for n in nets] == [True, False]
    now, started, batches = 0.0, 0, 0
    nflows = 300
    while started < nflows or nets[1].flows:
        for _ in range(int(rng.integers(0, 8)) if started < nflows else 0):
            links = _random_links(topo, nets[1], rng, P)
            cap = topo.host_link_bw * float(rng.uniform(0.1, 0.9)) \
                if rng.random() < 0.25 else math.inf
            nbytes = int(rng.integers(1, 4000)) * 1000
            goodput = float(rng.choice([1.0, 0.95]))
            for n in nets:
                f = n.add_flow(links, nbytes, now, ("tag", started), cap=cap, goodput=goodput)
                assert (f.fid, f.nbytes, f.start, f.data, f.goodput) == \
                    (started, nbytes, now, ("tag", started), goodput)
            started += 1
        for n in nets:
            n.settle(now)
        a, b = nets
        assert list(a.flows) == list(b.flows)
        # rate, drain time, and bytes left now (remaining is brought up to date when a
        # settle touches the flow)
        got = [np.array([(f.rate, f.finish, f.remaining - f.rate * (now - f.t_last))
                         for f in n.flows.values()]).reshape(-1, 3) for n in nets]
        np.testing.assert_allclose(got[0][:, :2], got[1][:, :2], rtol=1e-9)
        np.testing.assert_allclose(got[0][:, 2], got[1][:, 2], rtol=1e-9, atol=1e-3)
        np.testing.assert_allclose(a.load, b.load, rtol=1e-9, atol=1e-6 * topo.host_link_bw)
        ta, tb = a.next_time(), b.next_time()
        assert ta == pytest.approx(tb, rel=1e-12)
        if tb == math.inf:
            if started >= nflows:
                break
            continue
        if rng.random() < 0.3 and started < nflows:
            now = now + (tb - now) * float(rng.random())
        else:
            now = tb
            out = [n.pop_drained(same_time_bound(now)) for n in nets]
            assert [f.fid for f in out[0]] == [f.fid for f in out[1]]
            assert out[0] and all(f.remaining == 0.0 for f in out[0])
            batches += 1
    assert batches > 30 and not nets[0].flows and not nets[1].flows
    np.testing.assert_array_equal(nets[0].link_bytes, nets[1].link_bytes)
    assert nets[0].flows_started == nets[1].flows_started == started >= nflows
    assert nets[0].recomputes > 0 and nets[0].next_time() == math.inf


@pytest.mark.parametrize("native", _NATIVE)
def test_records_counters_and_the_rate_check_hook(native, monkeypatch):
    """record=True keeps a FlowRecord per drained flow, check_rates compares every settle
    with a from-scratch water-filling (and fails on a wrong rate), and flows_started
    counts what callers add to it."""
    _model(native)
    t = fat_tree(16, radix=4, link="100Gbps")
    monkeypatch.setattr(Network, "check_rates", True)
    net = Network(t, record=True, native=native)
    for src in range(8):
        net.add_flow(t.route(src, 15 - src)[0], 10**6, 0.0, src)
    net.add_flow(t.mcast_tree(3)[0], 10**6, 0.0, "tree", cap=3e9)
    net.settle(0.0)                     # (check_rates: compared with the water-filling)
    while (now := net.next_time()) != math.inf:
        net.pop_drained(same_time_bound(now))
        net.settle(now)
    assert len(net.records) == 9 and all(r.finish > r.start == 0.0 for r in net.records)
    assert sum(sum(r.layer_links) for r in net.records) == \
        sum(len(t.route(s, 15 - s)[0]) for s in range(8)) + len(t.mcast_tree(3)[0])
    net.flows_started += 5
    assert net.flows_started == 14
    # the hook fails on a wrong allocation: a flow left at another rate than max-min
    net2 = Network(t, native=native)
    net2.add_flow(t.route(0, 5)[0], 10**6, 0.0, "a")
    net2.settle(0.0)
    net2.add_flow(t.route(1, 5)[0], 10**6, 0.0, "b")  # shares rank 5's port with "a"
    with pytest.raises(AssertionError, match="max-min"):
        net2._check_all()               # before the settle that halves "a"


def test_bad_flows_are_refused():
    _model(True)
    t = single_switch(4, link="8Gbps")
    net = Network(t, native=True)
    with pytest.raises(ValueError, match="at least one byte"):
        net.add_flow(t.route(0, 1)[0], 0, 0.0, None)
    with pytest.raises(ValueError, match="not among"):
        net.add_flow(np.array([0, 99]), 10, 0.0, None)
    with pytest.raises(TypeError):
        net.add_flow(np.array([0.5]), 10, 0.0, None)
    assert not net.flows and net.flows_started == 0
    f = net.add_flow([int(l) for l in t.route(0, 1)[0]], 10, 0.0, None)   # a list works
    net.settle(0.0)
    assert f.rate == pytest.approx(1e9) and net.flows_started == 1


@pytest.mark.parametrize("path", ["engine", "auto"])
def test_whole_runs_agree_between_the_models(path):
    """Every registered algorithm at 8 ranks on an oversubscribed leaf-spine with the host
    model, on the engines and on the fast path: the compiled and the Python model give
    the same completion times and link bytes (the module docstring's one model twice)."""
    _model(True)
    from polycast import config
    from polycast.algorithms import algorithms
    from polycast.sim.simulate import simulate
    P, topo = 8, "leafspine:hosts_per_leaf=4,oversub=4"
    cases = [(a.collective, a.name) for a in algorithms() if a.unsupported_reason(P) is None]
    assert len(cases) > 20
    for coll, algo in cases:
        runs = []
        for native in (True, False):
            with config.override(hooks={"sim_native": native}):
                r = simulate(coll, algo, P, 48 * 1024 * P + 4, topo, path=path,
                             host_gbps=100.0, host_latency_s=2e-6)
            assert r.simulation.net.native == native
            runs.append(r)
        a, b = runs
        where = f"{coll} {algo} {path}"
        assert a.time_s == pytest.approx(b.time_s, rel=1e-9), where
        assert a.rank_times_s == pytest.approx(b.rank_times_s, rel=1e-9), where
        assert (a.link_bytes, a.link_bytes_by_layer, a.events) == \
            (b.link_bytes, b.link_bytes_by_layer, b.events), where


class _Links:
    """A topology of ``n`` links of one capacity and nothing else (the network model reads
    only these fields)."""

    def __init__(self, n: int, nranks: int = 2):
        self.nlinks, self.nranks = n, nranks
        self.bandwidth = np.full(n, 1e9)
        self.layer_index = np.zeros(n, np.int64)


@pytest.mark.parametrize("native", _NATIVE)
def test_empty_and_huge_link_sets_and_flows_without_links(native):
    """No links at all, a flow without links or with an unknown link: a clear ValueError
    and nothing left behind; two million links: a flow on the last one runs."""
    _model(native)
    net = Network(_Links(0), native=native)
    with pytest.raises(ValueError, match="at least one link"):
        net.add_flow(np.zeros(0, np.int64), 10, 0.0, None)
    net.settle(0.0)
    assert not net.flows and net.flows_started == 0 and net.next_time() == math.inf
    n = 2_000_000 if native else 100_000        # (the Python model makes two sets a link)
    big = Network(_Links(n), native=native)
    with pytest.raises(ValueError, match="at least one link"):
        big.add_flow(np.zeros(0, np.int64), 10, 0.0, None)
    with pytest.raises((ValueError, IndexError)):
        big.add_flow(np.array([n]), 10, 0.0, None)
    f = big.add_flow(np.array([n - 1, 0]), 10**6, 0.0, "last")
    big.settle(0.0)
    assert big.next_time() == pytest.approx(1e-3) and f.rate == pytest.approx(1e9)
    assert [g.data for g in big.pop_drained(same_time_bound(1e-3))] == ["last"]
    assert big.link_bytes[n - 1] == 10**6 and big.flows_started == 1


def test_interrupted_runs_leave_nothing_behind():
    """KeyboardInterrupt at any point of a run (here: from another thread, wherever the
    main thread is) leaves no crash, and the next run gives the same answer as a fresh one;
    a network dropped with flows in flight is freed."""
    _model(True)
    import _thread
    import gc
    import signal
    import threading

    from polycast.sim.simulate import simulate

    def run():
        return simulate("alltoall", "pairwise", 32, "4MiB", "fattree:radix=8", "400Gbps")

    want = run()
    interrupted = 0
    # interrupt_main does nothing where SIGINT is ignored, as in a job started in the
    # background by a non-interactive shell (a CI runner may start pytest so): Python's own
    # handler for the duration of the test
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for delay in (0.01, 0.05, 0.1, 0.2):
            timer = threading.Timer(delay, _thread.interrupt_main)
            timer.start()
            try:
                for _ in range(50):                 # (bounded: the timer fires during one)
                    run()
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                timer.cancel()
            gc.collect()
    finally:
        signal.signal(signal.SIGINT, old)
    assert interrupted == 4
    again = run()
    assert (again.time_s, again.link_bytes) == (want.time_s, want.link_bytes)
    t = fat_tree(16, radix=4, link="100Gbps")
    net = Network(t, native=True)
    tag = object()
    for s in range(16):
        net.add_flow(t.route(s, 15 - s)[0], 10**6, 0.0, tag)
    net.settle(0.0)
    net.pop_drained(same_time_bound(net.next_time()))
    before = len(net.flows)
    assert before > 0
    del net
    gc.collect()
    import sys
    assert sys.getrefcount(tag) == 2            # (the name and the call's argument)
