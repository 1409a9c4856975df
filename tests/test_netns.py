"""polycast across "hosts": one network namespace per host on a bridged 10.77.0.0/24 LAN
(see tests/netns.py). Checks that ranks on different hosts talk TCP (never shm), that UDP
multicast with TTL 1 crosses the bridge, that 2 ranks per host use shm inside a host and
TCP across, and that a rank dying on one host makes the others raise PeerLost naming it.

Needs root (skipped otherwise). Every namespace is deleted at the end, also on failure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import netns  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow]     # ~11 s for the file

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns.py")
RUN_SECONDS = 90


@pytest.fixture
def lan_factory():
    """Yields a function making a LAN; every LAN made is torn down at the end (also when
    the test fails), and none of their namespaces may be left."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"emulated LAN unavailable: {reason}")
    tags = []
    with contextlib.ExitStack() as stack:
        def make(nhosts: int, rate_mbit: float | None = None,
                 mcast_route: bool = True) -> netns.Lan:
            net = stack.enter_context(netns.lan(nhosts, rate_mbit, mcast_route))
            tags.append(net.tag)
            return net
        yield make
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          timeout=20).stdout.split()
    assert not [ns for ns in left if any(ns.startswith(t + "-") for t in tags)], left


def _port() -> int:
    # Per-run port (the namespaces are private, but keep it readable in logs).
    return 30000 + (os.getpid() * 7) % 20000


def _launch(net: netns.Lan, ranks_per_host: int, argv: list[str], per_host=None,
            **extra: str):
    size = net.nhosts * ranks_per_host
    procs = []
    for r in range(size):
        host = r // ranks_per_host
        env = netns.rank_env(r, size, _port(), local_rank=r % ranks_per_host,
                             local_size=ranks_per_host, POLYCAST_TIMEOUT="30", **extra,
                             **(per_host(host) if per_host else {}))
        procs.append(net.popen(host, argv, env))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            net.close()
            pytest.fail("a rank did not finish within the bound")
        outs.append((p.returncode, out))
    return outs


def _results(outs) -> list[dict]:
    res = []
    for rc, out in outs:
        assert rc == 0, out[-3000:]
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, out[-3000:]
        res.append(json.loads(line[-1][len("RESULT "):]))
    return res


def test_selftest_algos_across_three_hosts(lan_factory):
    """Every collective and algorithm, exact results, one rank per host: TCP + multicast."""
    net = lan_factory(3)
    before = [net.link_stats(k)["rx_packets"] for k in range(3)]
    outs = _launch(net, 1, netns.python_argv("-m", "polycast.tools.selftest",
                                             "--suite", "algos"))
    for rc, out in outs:
        assert rc == 0 and "SELFTEST algos OK" in out, out[-3000:]
        # Different hosts: TCP chosen automatically, never shm; multicast joined.
        assert "transports=tcp " in out and "mcast=yes" in out, out[-500:]
    after = [net.link_stats(k)["rx_packets"] for k in range(3)]
    assert all(a > b for a, b in zip(after, before))


@pytest.mark.parametrize("iface", ["route", "no-route", "explicit"])
def test_multicast_crosses_the_bridge(lan_factory, iface):
    """mcast allgather and broadcast: datagrams arrive from other hosts over eth0. The
    interface is chosen automatically (through the 224.0.0.0/4 route; with no multicast
    route, the only non-loopback interface) or given by POLYCAST_MCAST_IF."""
    net = lan_factory(3, mcast_route=iface != "no-route")
    argv = netns.python_argv(WORKER, "worker", "--nbytes", str(3 << 20),
                             "--call", "allgather:mcast", "--call", "broadcast:mcast",
                             "--call", "allgather:ring")
    per_host = (lambda k: {"POLYCAST_MCAST_IF": net.addr(k)}) if iface == "explicit" else None
    res = _results(_launch(net, 1, argv, per_host))
    for r in res:
        assert r["transports"] == ["tcp"] and r["mcast_error"] is None
        calls = {c["call"]: c for c in r["calls"]}
        assert all(c["ok"] for c in calls.values()), calls
        ag = calls["allgather:mcast"]
        # Each rank gets the other two ranks' 1 MiB parts as datagrams (plus any
        # recovered bytes) and they came in over this host's veth.
        chunk = ag["nbytes"] // 3
        assert ag["stats"]["datagram_bytes_in"] + ag["stats"]["recovered_bytes"] >= 2 * chunk
        assert ag["stats"]["datagrams_in"] > 0
        assert ag["eth0_rx_bytes"] >= 2 * chunk
        bc = calls["broadcast:mcast"]
        if r["rank"] != 0:
            assert bc["stats"]["datagrams_in"] > 0
            assert bc["eth0_rx_bytes"] >= bc["nbytes"]
    # Multicast: each host sends its own part about once (ring sends P-1 parts).
    for r in res:
        calls = {c["call"]: c for c in r["calls"]}
        chunk = calls["allgather:mcast"]["nbytes"] // 3
        ag = calls["allgather:mcast"]
        # Sent as multicast once; on the wire, that plus what went by unicast (recovery of
        # datagrams a receiver starved of CPU dropped, control messages).
        assert ag["stats"]["datagram_bytes_out"] < 1.5 * chunk
        assert ag["eth0_tx_bytes"] < 1.5 * chunk + ag["stats"]["message_bytes_out"]
        assert calls["allgather:ring"]["eth0_tx_bytes"] >= 2 * chunk


def test_selftest_algos_two_ranks_per_host(lan_factory):
    """Every collective and algorithm (the hierarchical ones group ranks by host) on
    2 hosts x 2 ranks: shm inside a host, TCP across, multicast across the bridge."""
    net = lan_factory(2)
    outs = _launch(net, 2, netns.python_argv("-m", "polycast.tools.selftest",
                                             "--suite", "algos"))
    for rc, out in outs:
        assert rc == 0 and "SELFTEST algos OK" in out, out[-3000:]
        assert "transports=shm,tcp " in out and "mcast=yes" in out, out[-500:]


def test_two_ranks_per_host_shm_inside_tcp_across(lan_factory):
    net = lan_factory(2)
    argv = netns.python_argv(WORKER, "worker", "--nbytes", str(1 << 20),
                             "--call", "allgather:ring", "--call", "allgather:mcast",
                             "--call", "broadcast:mcast")
    res = _results(_launch(net, 2, argv))
    for r in res:
        assert r["transports"] == ["shm", "tcp"], r
        assert r["mcast_error"] is None
        assert all(c["ok"] for c in r["calls"]), r["calls"]


@pytest.mark.parametrize("hosts,per_host", [(3, 1), (2, 2)])
def test_dead_rank_on_one_host_raises_peer_lost(lan_factory, hosts, per_host):
    """The last rank exits abruptly; the others (on its host via shm, on the other hosts
    via TCP) raise PeerLost naming it (selftest's death suite checks the name)."""
    net = lan_factory(hosts)
    outs = _launch(net, per_host, netns.python_argv("-m", "polycast.tools.selftest",
                                                    "--suite", "death"))
    victim = hosts * per_host - 1
    assert outs[victim][0] == 17
    for rc, out in outs[:victim]:
        assert rc == 0 and "SELFTEST death OK" in out, out[-3000:]
        assert f"rank {victim}" in out or f"PEERLOST {victim} " in out, out[-2000:]


def test_shaped_links_multicast_loss_is_recovered(lan_factory):
    """Unpaced multicast into 100 Mbit/s tbf links overflows the queues (datagrams are
    dropped); the results must still be exact (lost parts come by unicast recovery)."""
    net = lan_factory(3, rate_mbit=100)
    argv = netns.python_argv(WORKER, "worker", "--nbytes", str(2 << 20),
                             "--call", "broadcast:mcast", "--call", "allgather:mcast")
    res = _results(_launch(net, 1, argv))
    for r in res:
        assert all(c["ok"] for c in r["calls"]), r["calls"]
        if r["rank"] == 0:       # the root really multicast the buffer
            bc = r["calls"][0]["stats"]
            assert bc["datagram_bytes_out"] >= r["calls"][0]["nbytes"]
