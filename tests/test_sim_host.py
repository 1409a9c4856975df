"""The simulator's host model (SimConfig.host_gbps, host_latency_s): closed forms with it
on, and no change at all with it off (the default)."""

from __future__ import annotations

import pytest

from polycast.sim.simulate import simulate
from polycast.sim.topology import single_switch

MIB = 1 << 20
LINK_LAT, SW_LAT = 1e-6, 0.5e-6
ALPHA = 2 * LINK_LAT + SW_LAT            # rank -> switch -> rank


def _switch(P: int):
    # closed forms of the ideal link (no headers); the host rate then bounds payload
    return single_switch(P, link="100Gbps", latency_s=LINK_LAT, switch_latency_s=SW_LAT,
                         framing="none")


@pytest.mark.parametrize("P", [3, 8])
def test_host_latency_adds_to_every_ring_step(P):
    N, h = 8 * MIB - (8 * MIB) % (4 * P), 20e-6
    topo = _switch(P)
    r = simulate("allgather", "ring", P, N, topo, host_latency_s=h)
    S, B = r.nbytes / P, topo.host_link_bw
    assert r.time_s == pytest.approx((P - 1) * (ALPHA + h + S / B), rel=0.01)


@pytest.mark.parametrize("P", [3, 8])
def test_host_rate_slower_than_the_link_bounds_a_ring(P):
    N, host_gbps = 8 * MIB - (8 * MIB) % (4 * P), 25.0       # a quarter of the link
    r = simulate("allgather", "ring", P, N, _switch(P), host_gbps=host_gbps)
    S = r.nbytes / P
    assert r.time_s == pytest.approx((P - 1) * (ALPHA + S / (host_gbps * 1e9 / 8)), rel=0.01)


def test_host_rate_is_shared_by_a_ranks_concurrent_sends():
    """direct allgather: every rank sends its part to all others at once. The link (100G)
    carries them in (P-1)S/B; a host at 50 Gbit/s needs twice as long, and a host faster
    than the link changes nothing."""
    P, N = 6, 6 * MIB
    base = simulate("allgather", "direct", P, N, _switch(P))
    slow = simulate("allgather", "direct", P, N, _switch(P), host_gbps=50.0)
    fast = simulate("allgather", "direct", P, N, _switch(P), host_gbps=400.0)
    S, B = base.nbytes / P, _switch(P).host_link_bw
    assert base.time_s == pytest.approx(ALPHA + (P - 1) * S / B, rel=0.01)
    assert slow.time_s == pytest.approx(ALPHA + (P - 1) * S / (B / 2), rel=0.01)
    assert fast.time_s == pytest.approx(base.time_s, rel=1e-9)


def test_multicast_goes_at_the_receivers_host_rate():
    P, N = 8, 16 * MIB
    base = simulate("broadcast", "mcast", P, N, _switch(P))
    slow = simulate("broadcast", "mcast", P, N, _switch(P), host_gbps=25.0)
    B = _switch(P).host_link_bw
    # The stream is bounded by the hosts (a quarter of the link); handshakes are tiny.
    assert base.time_s == pytest.approx(N / B, rel=0.05)
    assert slow.time_s == pytest.approx(N / (B / 4), rel=0.05)


@pytest.mark.parametrize("coll,algo", [("allgather", "ring"), ("allgather", "mcast"),
                                       ("broadcast", "chain")])
def test_host_model_moves_no_link_bytes_and_off_changes_nothing(coll, algo):
    P, N = 8, 4 * MIB
    topo = "leafspine:hosts_per_leaf=4,oversub=2"
    plain = simulate(coll, algo, P, N, topo)
    off = simulate(coll, algo, P, N, topo, host_gbps=None, host_latency_s=0.0)
    on = simulate(coll, algo, P, N, topo, host_gbps=10.0, host_latency_s=5e-6)
    assert off.time_s == plain.time_s and off.link_bytes_by_layer == plain.link_bytes_by_layer
    assert on.link_bytes_by_layer == plain.link_bytes_by_layer
    assert on.time_s > plain.time_s


def test_host_model_bad_values():
    from polycast.sim.driver import SimulationError
    with pytest.raises(SimulationError, match="host_gbps"):
        simulate("allgather", "ring", 4, MIB, _switch(4), host_gbps=0.0)
    with pytest.raises(SimulationError, match="host_latency_s"):
        simulate("allgather", "ring", 4, MIB, _switch(4), host_latency_s=-1.0)


def test_cli_host_model_flags(capsys):
    from polycast.cli.main import main
    assert main(["sim", "allgather", "--nodes", "4", "--size", "1MiB", "--topology", "switch",
                 "--host-latency", "soon"]) == 2
    assert "cannot parse time" in capsys.readouterr().err
    assert main(["sim", "allgather", "--nodes", "4", "--size", "1MiB", "--topology", "switch",
                 "--host-gbps", "-1"]) == 2
    assert "--host-gbps" in capsys.readouterr().err
    assert main(["sim", "allgather", "--nodes", "4", "--size", "1MiB", "--topology", "switch",
                 "--algo", "ring", "--host-gbps", "1", "--host-latency", "1ms", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    row = out[0] if isinstance(out, list) else out
    # 3 ring steps of 256 KiB at 1 Gbit/s (the host), each plus 1 ms of host latency.
    assert row["time_s"] == pytest.approx(3 * (1e-3 + (1 << 18) * 8 / 1e9), rel=0.02)
