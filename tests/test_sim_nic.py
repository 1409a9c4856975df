"""``polycast sim --nic``: receivers behind a NIC of bounded chunk rate and a bounded receive
queue (polycast.sim.nic); the engines' real protocol recovers what the queue drops."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polycast.cli.main import main
from polycast.models.nic import parse_nic
from polycast.sim.network import Flow
from polycast.sim.nic import ReceiveQueues
from polycast.sim.simulate import simulate
from polycast.sim.topology import single_switch

LAT, SW = 0.5e-6, 0.3e-6
ALPHA = 2 * LAT + SW
MIB = 1 << 20
# 1 GHz, 1000 cycles per 4 KiB chunk: 4.096 GB/s = 32.8 Gbit/s, far below a 400 Gbit/s link
SLOW = "clock=1GHz,cores=1,cycles=1000,chunk=4KiB"


def _switch(P: int, link: str = "400Gbps"):
    # closed forms of the ideal link (no headers)
    return single_switch(P, link=link, latency_s=LAT, switch_latency_s=SW, framing="none")


# -- the queue alone ------------------------------------------------------------------

def _flow(fid: int, nbytes: int, rate: float) -> Flow:
    f = Flow(fid, np.array([0]), nbytes, 0.0, None, remaining=float(nbytes), rate=rate)
    return f


def test_fluid_queue_drops_the_excess_beyond_its_capacity():
    m = parse_nic("clock=1GHz,cores=1,cycles=1000,chunk=1000B,queue=50")   # 1e9 B/s, 50 kB
    q = ReceiveQueues(m, 3)
    lam, T = 3e9, 1e-3                         # 3 GB/s for 1 ms = 3 MB at each receiver
    f = _flow(0, int(lam * T), lam)
    q.add(f, root=0)
    for t in np.linspace(0, T, 11)[1:]:        # several events while it streams
        q.advance(float(t))
    expect = (lam - m.bytes_per_s()) * T - 50_000             # per receiver
    sizes = np.full(100, 30_000)                                # 100 datagrams of 30 kB
    keep, delay = q.take(0, 0, sizes)
    assert keep is not None and keep[:, 0].all()                # the root keeps its own
    for r in (1, 2):
        assert (~keep[:, r]).sum() * 30_000 == pytest.approx(expect, abs=30_000)
        assert keep[:2, r].all()     # full after Q / (lam - mu) = 25 us: 75 kB arrived
    assert q.dropped_nbytes == pytest.approx(2 * expect, abs=60_000)
    assert delay[1] == pytest.approx(50_000 / 1e9) and delay[0] == 0   # a full queue ahead
    q.advance(T + 1.0)                          # it drains
    assert not q.q.any()
    keep, delay = q.take(None, 0, np.zeros(3, dtype=np.int64))   # EOS markers: room now
    assert keep is None and delay[1] == pytest.approx(3 * 1000 / 1e9)


def test_markers_back_to_back_at_a_full_queue_share_one_chance():
    m = parse_nic("clock=1GHz,cores=1,cycles=1000,chunk=1000B,queue=50")   # 1e9 B/s
    P = 401
    q = ReceiveQueues(m, P, seed=5)
    q.add(_flow(0, 10**7, 2e9), root=0)        # twice what the NIC takes: queues stay full
    q.advance(1e-3)
    keep, _ = q.take(None, 0, np.zeros(3, dtype=np.int64))     # three EOS back to back
    got = keep[:, 1:].sum(axis=0)
    assert got.max() == 1                       # never two of the three
    assert 0.4 < got.mean() < 0.6               # one chance at rate / arrivals = 1/2 each
    q.advance(1e-3 + 0.5e-6)                    # half a chunk's processing time later
    keep, _ = q.take(None, 0, np.zeros(1, dtype=np.int64))
    assert not keep[0, 1:].any()                # no room freed for markers yet
    q.advance(1e-3 + 2e-6)                      # a chunk's time after the first chance
    keep, _ = q.take(None, 0, np.zeros(1, dtype=np.int64))
    assert 0.4 < keep[0, 1:].mean() < 0.6       # a fresh chance


def test_queue_that_keeps_up_drops_nothing():
    m = parse_nic("clock=1GHz,cores=1,cycles=100,chunk=1000B,queue=4")   # 1e10 B/s
    q = ReceiveQueues(m, 4)
    f = _flow(7, 10**6, 5e9)
    q.add(f, root=2)
    q.advance(2e-4)
    keep, delay = q.take(7, 2, np.full(10, 100_000))
    assert keep is None and not delay.any() and q.dropped_nbytes == 0


# -- in the simulator -----------------------------------------------------------------

def test_nic_off_by_default_and_a_fast_nic_changes_nothing():
    topo = _switch(8)
    base = simulate("allgather", "mcast", 8, 8 * MIB, topo)
    fast = simulate("allgather", "mcast", 8, 8 * MIB, topo, nic="bf3-dpa")
    assert base.nic is None and fast.nic == "bf3-dpa"
    # (float round-off apart: base runs on the fast path, the NIC model on the engines)
    assert fast.time_s == pytest.approx(base.time_s, rel=1e-12)
    assert fast.nic_dropped_nbytes == 0
    assert fast.nic_gbps == pytest.approx(1635.5, abs=0.1)


def test_slow_nic_with_room_is_the_bottleneck_and_loses_nothing():
    P, N = 8, 16 * MIB
    m = parse_nic(SLOW + ",queue=100000")
    r = simulate("broadcast", "mcast", P, N, _switch(P), nic=m)
    assert r.nic_dropped_nbytes == 0 and r.recovered_nbytes == 0
    assert r.time_s == pytest.approx(N / m.bytes_per_s(), rel=0.01)
    assert r.nic_peak_queue_nbytes > N / 2            # the link outran the NIC
    ring = simulate("allgather", "ring", P, N, _switch(P), nic=m)   # flow-controlled
    assert ring.time_s == pytest.approx((P - 1) * (ALPHA + N / P / m.bytes_per_s()), rel=0.01)
    assert ring.nic_dropped_nbytes == 0


@pytest.mark.parametrize("algo,coll", [("mcast", "broadcast"), ("mcast", "allgather")])
def test_overflowing_queue_drops_and_the_protocol_recovers_exactly_that(algo, coll):
    P, N = 8, 16 * MIB
    m = parse_nic(SLOW + ",queue=256")                     # 1 MiB of queue
    r = simulate(coll, algo, P, N, _switch(P), nic=m)
    assert r.nic_dropped_nbytes > 0
    assert r.recovered_nbytes == r.nic_dropped_nbytes      # every dropped byte came back
    assert r.nic_peak_queue_nbytes == 256 * 4096
    if coll == "broadcast":
        # at link rate 50 GB/s for S/B seconds the NIC takes mu*S/B, the queue 1 MiB
        B, mu = 50e9, m.bytes_per_s()
        per_rank = N - mu * N / B - 256 * 4096
        assert r.nic_dropped_nbytes == pytest.approx((P - 1) * per_rank, rel=0.02)


def test_loss_and_nic_drops_together_still_complete():
    P = 6
    r = simulate("allgather", "mcast", P, 6 * MIB, _switch(P), nic=SLOW + ",queue=64",
                 loss=0.05, seed=3)
    assert r.lost_nbytes > 0 and r.nic_dropped_nbytes > 0
    assert r.recovered_nbytes >= r.nic_dropped_nbytes


def test_cli_sim_nic_json_and_bad_input(capsys):
    assert main(["sim", "allgather", "--algo", "mcast", "--nodes", "4", "--size", "4MiB",
                 "--nic", SLOW + ",queue=64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nic"] == SLOW + ",queue=64" and out["nic_dropped_nbytes"] > 0
    assert out["recovered_nbytes"] == out["nic_dropped_nbytes"]
    assert main(["sim", "allgather", "--algo", "mcast", "--nodes", "4", "--size", "4MiB",
                 "--nic", "bf3-dpa"]) == 0
    assert "NIC bf3-dpa (1635.5 Gbit/s): 0 datagram" in capsys.readouterr().out
    for bad in ("dpu", "bf3-dpa:cores=0", "clock=1GHz,cores=1", "bf3-dpa:queue=-1",
                "clock=1.8,cores=1,cycles=9"):
        assert main(["sim", "allgather", "--nodes", "4", "--nic", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("polycast sim:")


def test_sweep_bench_shows_where_a_nic_stops_keeping_up(tmp_path):
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    try:
        import nic_sweep
    finally:
        sys.path.pop(0)
    rows = nic_sweep.sweep(4, 4 * MIB, [10, 3200], [SLOW + ",queue=64"], "switch")
    by = {(r["link_gbps"], r["nic"] != "none (keeps up)"): r for r in rows}
    assert by[(10, True)]["dropped_nbytes"] == 0
    assert by[(10, True)]["time_vs_ideal"] == pytest.approx(1, rel=1e-12)   # (round-off)
    slow = by[(3200, True)]
    assert not slow["model_keeps_up"] and slow["recovered_share"] > 0.5
    assert slow["recovered_nbytes"] == slow["dropped_nbytes"] and slow["time_vs_ideal"] > 10
    # "as a plot": the figure the bench writes (time and recovered share vs link rate)
    pytest.importorskip("matplotlib", reason="the sweep plot needs matplotlib (extra 'plot')")
    png = tmp_path / "sweep.png"
    nic_sweep.plot(rows, str(png), "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# -- sim sweep and sim fsdp -----------------------------------------------------------

def test_sweep_has_link_and_nic_dimensions_and_rows_say_which_nic(tmp_path, capsys):
    slow = SLOW + ",queue=64"
    path = tmp_path / "sweep.csv"
    assert main(["sim", "sweep", "--algos", "mcast", "--nodes", "4", "--sizes", "4MiB",
                 "--topologies", "switch", "--link", "10Gbps,400Gbps", "--nic",
                 f"none;{slow}", "--workers", "1", "--json", "--out", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["link"], r["nic"]) for r in rows] == [
        ("10Gbps", "none"), ("10Gbps", slow), ("400Gbps", "none"), ("400Gbps", slow)]
    by = {(r["link"], r["nic"]): r for r in rows}
    assert by[("400Gbps", "none")]["nic_gbps"] == "" and by[("400Gbps", slow)]["nic_gbps"] \
        == pytest.approx(32.768)
    assert by[("10Gbps", slow)]["nic_dropped_nbytes"] == 0        # the NIC keeps up at 10 G
    fast_link = by[("400Gbps", slow)]
    assert fast_link["nic_dropped_nbytes"] > 0
    assert fast_link["recovered_nbytes"] == fast_link["nic_dropped_nbytes"]
    assert fast_link["time_s"] > 5 * by[("400Gbps", "none")]["time_s"]
    head, *lines = path.read_text().splitlines()
    assert "nic" in head.split(",") and len(lines) == 4 and f'"{slow}"' in lines[1]
    for bad in ("bf3-dpa;dpu", ";", "bf3-dpa:cores=0"):
        assert main(["sim", "sweep", "--nodes", "4", "--nic", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("polycast sim:")
    assert main(["sim", "sweep", "--nodes", "4", "--link", "10Gbps,fast"]) == 2
    assert "fast" in capsys.readouterr().err


def test_fsdp_with_a_slow_nic_recovers_what_its_queue_drops(capsys):
    from polycast.sim.fsdp import compare_fsdp
    P, N = 8, 4 * MIB
    kw = dict(topology=_switch(P), layers=3, layer_bytes=N, compute_per_layer_s=1e-5)
    base = compare_fsdp("llama2-7b", P, **kw)
    slow = compare_fsdp("llama2-7b", P, nic=SLOW + ",queue=64", **kw)
    for b, s in zip(base, slow):
        assert b.nic is None and s.nic == SLOW + ",queue=64"
        assert s.step_s > 5 * b.step_s               # 32.8 Gbit/s receivers on 400 G links
        assert s.step_recovered_nbytes == s.step_nic_dropped_nbytes
        assert (s.step_nic_dropped_nbytes > 0) == (s.ag == "mcast")   # p2p: flow control
    assert main(["sim", "fsdp", "-n", "4", "--topology", "switch", "--layers", "2",
                 "--layer-bytes", "1MiB", "--ag", "mcast", "--nic", "bf3-dpa", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nic"] == "bf3-dpa" and out["step_nic_dropped_nbytes"] == 0
    assert main(["sim", "fsdp", "-n", "4", "--nic", "clock=1GHz"]) == 2
    assert "missing cores, cycles" in capsys.readouterr().err
