"""Framing: per-packet headers on the simulated links (polycast/sim/framing.py)."""

from __future__ import annotations

import json

import pytest

from polycast.errors import InvalidArgument, UnknownName
from polycast.sim.framing import make_framing
from polycast.sim.simulate import simulate
from polycast.sim.topology import parse_topology, single_switch

LAT, SW = 0.5e-6, 0.3e-6
ALPHA = 2 * LAT + SW
MIB = 1 << 20


def test_presets_are_the_real_stacks():
    tcp = make_framing()                                  # the default
    assert (tcp.name, tcp.mtu_nbytes) == ("tcp", 9000)
    # Ethernet: 8 preamble + 14 header + 4 FCS + 12 gap; IPv4 20; TCP with timestamps 32
    assert (tcp.message_payload, tcp.message_overhead) == (8948, 38 + 20 + 32)
    assert (tcp.datagram_payload, tcp.datagram_overhead) == (8972, 38 + 20 + 8)
    ib = make_framing("ib")
    assert (ib.message_payload, ib.message_overhead, ib.datagram_overhead) == (4096, 26, 34)
    assert make_framing("udp", 1500).message_payload == 1472
    none = make_framing("none")
    assert none.ideal and none.message_wire(12345) == 12345
    assert tcp.message_wire(8948) == 8948 + 90 and tcp.message_wire(8949) == 8949 + 180
    assert tcp.message_wire(0) == 0


def test_message_wire_bytes_and_time_on_one_switch():
    # One message of S bytes: exactly ceil(S/8948) packets of 90 header bytes more on each
    # of its two links, and it drains at the link rate in wire bytes.
    P, N = 2, 4 * MIB
    topo = single_switch(P, link="400Gbps", latency_s=LAT, switch_latency_s=SW)
    r = simulate("allgather", "ring", P, N, topo)
    S = N // P
    wire = S + -(-S // 8948) * 90
    assert r.link_bytes == 2 * P * wire                 # two links per message, P messages
    assert r.time_s == pytest.approx(ALPHA + wire / topo.host_link_bw, rel=1e-9)
    ideal = simulate("allgather", "ring", P, N,
                     single_switch(P, latency_s=LAT, switch_latency_s=SW, framing="none"))
    assert ideal.link_bytes == 2 * P * S
    assert r.busbw < ideal.busbw < r.busbw * 1.02


def test_multicast_streams_fit_the_wire_with_headers():
    # Datagrams of 65000 B go as 8 packets of at most 8972 B: the engines are paced so
    # that `roots` streams of full datagrams fill the link on the wire and no more.
    P, N = 8, 64 * MIB
    topo = single_switch(P, link="400Gbps", latency_s=LAT, switch_latency_s=SW)
    r = simulate("allgather", "mcast", P, N, topo)
    fr = topo.framing
    per_root = N // P
    full, last = divmod(per_root, 65000)
    wire = full * fr.datagram_wire(65000) + fr.datagram_wire(last)
    assert r.link_bytes == P * wire * P                 # one up link + P-1 down links
    # receive-bound at the wire rate: (P-1) streams' wire bytes into every rank
    assert r.time_s >= (P - 1) * wire / topo.host_link_bw
    assert r.time_s <= 1.01 * (P * wire / topo.host_link_bw + (P // 2 + 2) * ALPHA)


def test_topology_options_and_cli(capsys):
    from polycast.cli.main import main
    t = parse_topology("switch:framing=ib,mtu=2048", 4)
    assert t.framing.mtu_nbytes == 2048 and "ib framing" in t.description
    assert parse_topology("switch", 4, framing="none").framing.ideal
    assert parse_topology("switch:framing=udp", 4, framing="none").framing.name == "udp"
    for bad, err in (("switch:framing=atm", UnknownName), ("switch:mtu=100", InvalidArgument),
                     ("switch:framing=none,mtu=9000", InvalidArgument)):
        with pytest.raises(err):
            parse_topology(bad, 4)
    args = ["sim", "allgather", "-n", "4", "--size", "1MiB", "--topology", "switch", "--json"]
    assert main(args + ["--framing", "none"]) == 0
    ideal = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    framed = json.loads(capsys.readouterr().out)
    assert ideal["link_bytes"] == 2 * 3 * (1 << 20) // 4 * 4
    assert framed["link_bytes"] > ideal["link_bytes"] and framed["time_s"] > ideal["time_s"]
    assert main(args + ["--framing", "fddi"]) == 2
    assert "framing" in capsys.readouterr().err


def test_planner_reads_goodput():
    from polycast.planner.fabric import from_topology
    framed = from_topology(parse_topology("fattree:radix=8", 64))
    ideal = from_topology(parse_topology("fattree:radix=8", 64, framing="none"))
    assert framed.port_gbps == pytest.approx(400 * 8948 / 9038)
    assert ideal.port_gbps == 400
    assert framed.key != ideal.key
