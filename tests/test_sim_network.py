"""The network model alone: the incremental settle gives the max-min fair rates of every
active flow, after any sequence of flows starting and draining (checked against a plain
progressive filling written here, independent of polycast.sim.network)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polycast.sim.network import Network, same_time_bound
from polycast.sim.topology import fat_tree, leaf_spine, single_switch


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


@pytest.mark.parametrize("name", list(_topologies()))
@pytest.mark.parametrize("seed", range(4))
def test_settle_is_max_min_after_any_sequence(name, seed):
    topo = _topologies()[name]
    P = topo.nranks
    rng = np.random.default_rng(seed)
    net = Network(topo, host_bw=(topo.host_link_bw * 0.7 if seed % 2 else None))
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


def test_settle_is_exact_for_two_paced_streams_and_a_message():
    # one 1e9 B/s switch: a stream paced at 0.3e9 and a message share rank 2's port
    t = single_switch(4, link="8Gbps", latency_s=0, switch_latency_s=0)
    net = Network(t)
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
