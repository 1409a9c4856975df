"""Workload graphs on the simulator (polycast.sim.pipeline) and the FSDP/HSDP pipeline
(polycast.sim.fsdp): graph semantics against a reference scheduler, the FSDP checks of
issue 27 (no network, no compute, one layer), the memo against the full run, bad input."""

from __future__ import annotations

import json
import random

import pytest

from polycast.algorithms import build
from polycast.sim import SimConfig, Simulation
from polycast.sim.fsdp import compare_fsdp, simulate_fsdp
from polycast.sim.pipeline import run_workload
from polycast.sim.topology import parse_topology, single_switch
from polycast.workload.graph import (COLLECTIVE, COMPUTE, NOOP, RECV, SEND, Node, Workload,
                                     WorkloadError, validate)

MIB = 1 << 20


def _switch(P):
    # no framing: exact bytes and closed forms (the framing's own tests pin its overheads)
    return single_switch(P, link="400Gbps", framing="none")


def _alone(P, coll, algo, count, itemsize=2):
    sim = Simulation(_switch(P))
    req = sim.post(build(coll, algo, P, count), itemsize)
    sim.run()
    times = {tl.completed[req] for tl in sim.timelines}
    assert max(times) - min(times) < 1e-15        # every rank ends together (ring, 1 switch)
    return max(times)


# -- graph semantics ---------------------------------------------------------------------

COLLS = [("allgather", "ring", 1), ("reduce_scatter", "ring", 2), ("allreduce", "ring", 1)]


def _random_spmd(seed: int, P: int = 4, n: int = 24):
    """One random program every rank runs: compute nodes chained (one stream), collectives
    chained (never two in flight on a rank), random extra dependencies on earlier nodes;
    collectives on the world or on halves, so no two in flight share a link on one switch."""
    rng = random.Random(seed)
    prog: list[Node] = []
    last_c = last_x = None
    for i in range(n):
        deps = {d for d in (rng.sample(range(i), k=min(i, rng.randint(0, 2))) if i else [])}
        if rng.random() < 0.5:
            if last_c is not None:
                deps.add(last_c)
            prog.append(Node(i, COMPUTE, f"c{i}", tuple(sorted(deps)),
                             duration_s=rng.uniform(0, 2e-4), phase="compute"))
            last_c = i
        else:
            if last_x is not None:
                deps.add(last_x)
            coll, algo, div = rng.choice(COLLS)
            comm = rng.choice(["", "half"])
            size = 2 * div * rng.choice([1, 2]) * 16384
            prog.append(Node(i, COLLECTIVE, f"x{i}", tuple(sorted(deps)), collective=coll,
                             algorithm=algo, nbytes=size, comm=comm, phase="comm",
                             stream=coll))
            last_x = i
    half = P // 2
    return Workload(P, [prog] * P, {"half": [tuple(range(half)), tuple(range(half, P))]})


@pytest.mark.parametrize("seed", range(4))
def test_random_dags_match_a_longest_path_and_never_break_a_dependency(seed):
    P = 4
    w = _random_spmd(seed, P)
    res = run_workload(w, _switch(P), record_ranks=range(P))
    prog = w.programs[0]
    durations = {}
    for n in prog:                        # each collective's time alone, from the simulator
        if n.kind == COLLECTIVE:
            k = len(w.group_of(0, n.comm))
            count = n.nbytes // 2 // (k if n.collective == "reduce_scatter" else 1)
            key = (n.collective, k, count)
            if key not in durations:
                durations[key] = _alone(k, n.collective, n.algorithm, count)
    # the reference: every node starts when its dependencies end; no other limit
    end = {}
    for n in prog:
        start = max((end[d] for d in n.deps), default=0.0)
        if n.kind == COMPUTE:
            end[n.id] = start + n.duration_s
        else:
            k = len(w.group_of(0, n.comm))
            count = n.nbytes // 2 // (k if n.collective == "reduce_scatter" else 1)
            end[n.id] = start + durations[(n.collective, k, count)]
    assert res.step_s == pytest.approx(max(end.values()), rel=1e-9)
    for r in range(P):
        times = {p: (s, e) for p, s, e in res.timelines[r]}
        assert len(times) == len(prog)
        for p, n in enumerate(prog):
            for d in n.deps:
                assert times[p][0] >= times[d][1] - 1e-15, (r, n.id, d)


def test_compute_nodes_share_one_stream_and_noops_take_no_time():
    # two independent 1 ms kernels on one rank run one after the other
    prog = [Node(0, COMPUTE, "a", duration_s=1e-3), Node(1, COMPUTE, "b", duration_s=1e-3),
            Node(2, NOOP, "meta", (0, 1)), Node(3, COMPUTE, "cpu", (2,), duration_s=5e-4,
                                                  cpu=True)]
    res = run_workload(Workload(2, [prog, prog]), _switch(2), record_ranks=[0])
    assert res.step_s == pytest.approx(2.5e-3)
    assert res.bubble_s == pytest.approx(5e-4)        # the GPU stream idles during "cpu"
    t = {p: (s, e) for p, s, e in res.timelines[0]}
    assert t[1][0] == pytest.approx(1e-3) and t[2] == (2e-3, 2e-3)


def test_send_and_recv_take_one_message_time():
    P, nbytes = 2, 4 * MIB
    topo = _switch(P)
    send = [Node(0, SEND, "s", nbytes=nbytes, peer=1, tag=7)]
    recv = [Node(0, RECV, "r", nbytes=nbytes, peer=0, tag=7),
            Node(1, COMPUTE, "after", (0,), duration_s=1e-3)]
    res = run_workload(Workload(P, [send, recv]), topo, record_ranks=[0, 1])
    _, lat = topo.route(0, 1)
    t_msg = lat + nbytes / topo.host_link_bw
    assert res.rank_end_s[1] == pytest.approx(t_msg + 1e-3, rel=1e-6)
    assert res.rank_end_s[0] == pytest.approx(nbytes / topo.host_link_bw, rel=1e-6)
    assert res.exposed_s == {"step": pytest.approx(t_msg, rel=1e-6)}


# -- FSDP checks ---------------------------------------------------------------------------

def test_fsdp_with_no_network_time_is_pure_compute():
    P, L = 4, 3
    topo = parse_topology("switch:latency=0ns,switch_latency=0ns", P, link="1e12Gbps")
    r = simulate_fsdp("llama2-7b", P, topology=topo, layers=L, memo=False)
    compute = (L * (r.compute_fwd_s + r.compute_bwd_s) + 3 * r.head_fwd_s + r.optimizer_s)
    assert r.compute_s == pytest.approx(compute, rel=1e-12)
    assert r.step_s == pytest.approx(compute, rel=1e-6)
    assert r.bubble_pct < 1e-4


def test_fsdp_with_no_compute_is_its_exposed_communication():
    P, L, N = 8, 4, 8 * MIB
    topo = _switch(P)
    r = simulate_fsdp(None, P, topology=topo, layers=L, layer_bytes=N,
                      compute_per_layer_s=0.0, optimizer_s=0.0, memo=False)
    assert r.compute_s == 0.0
    assert sum(r.exposed_s.values()) == pytest.approx(r.step_s, rel=1e-12)
    # forward: the L allgathers one after the other, each as long as alone
    t_ag = _alone(P, "allgather", "ring", N // 2 // P)
    assert r.exposed_s["forward"] == pytest.approx(L * t_ag, rel=1e-9)
    assert r.exposed_s["backward"] > (L - 1) * t_ag


def test_fsdp_single_layer_is_allgather_compute_reduce_scatter():
    P, N, c = 8, 8 * MIB, 1e-3
    r = simulate_fsdp(None, P, topology=_switch(P), layers=1, layer_bytes=N,
                      compute_per_layer_s=c, optimizer_s=0.0, memo=False)
    t_ag = _alone(P, "allgather", "ring", N // 2 // P)
    t_rs = _alone(P, "reduce_scatter", "ring", N // 2 // P)
    assert r.step_s == pytest.approx(t_ag + c + 2 * c + t_rs, rel=1e-9)
    assert r.exposed_s == {"forward": pytest.approx(t_ag), "backward": pytest.approx(t_rs),
                           "optimizer": 0.0}


@pytest.mark.parametrize("ag,rs,shard", [("ring", "ring", None), ("mcast", "innet", None),
                                         ("ring", "innet", None), ("ring", "ring", 4)])
def test_memo_of_repeated_layers_equals_the_full_run(ag, rs, shard):
    P, L = 8, 9
    kw = dict(topology=_switch(P), layers=L, layer_bytes=4 * MIB, compute_per_layer_s=3e-4,
              ag=ag, rs=rs, shard=shard)
    full = simulate_fsdp(None, P, memo=False, **kw)
    memo = simulate_fsdp(None, P, memo=True, **kw)
    assert memo.memo is not None and L not in memo.memo["blocks_simulated"]
    assert memo.step_s == pytest.approx(full.step_s, rel=1e-9)
    assert memo.bubble_s == pytest.approx(full.bubble_s, rel=1e-9)
    for ph, v in full.exposed_s.items():
        assert memo.exposed_s[ph] == pytest.approx(v, rel=1e-9, abs=1e-15)
    assert memo.step_link_bytes == full.step_link_bytes
    assert memo.link_bytes_by_layer == full.link_bytes_by_layer
    assert memo.collectives == full.collectives
    assert [c["count"] for c in memo.rank_classes] == [c["count"] for c in full.rank_classes]


def test_memo_that_never_fits_simulates_no_more_blocks_than_the_full_run(monkeypatch):
    # a pipeline that is never affine: the memo falls back to the full run, having tried
    # fewer blocks than the full run simulates, and gives the full run's answer
    import polycast.sim.fsdp as fsdp
    monkeypatch.setattr(fsdp, "_second_difference", lambda a, b, c: 2.0)
    P, L = 8, 16
    kw = dict(topology=_switch(P), layers=L, layer_bytes=4 * MIB, compute_per_layer_s=3e-4)
    memo = simulate_fsdp(None, P, memo=True, **kw)
    full = simulate_fsdp(None, P, memo=False, **kw)
    assert memo.memo["fell_back"] and memo.memo["blocks_simulated"][-1] == L
    assert sum(memo.memo["blocks_simulated"][:-1]) <= L, memo.memo
    assert len(memo.memo["tries"]) >= 1
    assert memo.step_s == pytest.approx(full.step_s, rel=1e-12)
    assert memo.step_link_bytes == full.step_link_bytes


@pytest.mark.slow
def test_memo_on_a_fat_tree_is_within_its_tolerance_of_the_full_run():
    # 32 ranks over two pods of a radix-8 fat tree: ECMP routes and unequal latencies, so
    # per-rank times wobble by microseconds from block to block (module docstring)
    P, L = 32, 12
    topo = parse_topology("fattree:radix=8", P, link="400Gbps")
    kw = dict(topology=topo, layers=L, layer_bytes=32 * MIB, compute_per_layer_s=4e-4)
    full = simulate_fsdp(None, P, memo=False, **kw)
    memo = simulate_fsdp(None, P, memo=True, **kw)
    assert memo.memo["period_s"] is not None and L not in memo.memo["blocks_simulated"]
    added = L - max(memo.memo["blocks_simulated"])
    # off by at most the block-to-block wobble (a path latency or two) per added block
    assert abs(memo.step_s - full.step_s) <= added * 2e-6
    for ph, v in full.exposed_s.items():
        assert abs(memo.exposed_s[ph] - v) <= added * 4e-6
    assert memo.step_link_bytes == full.step_link_bytes
    assert memo.link_bytes_by_layer == full.link_bytes_by_layer


def test_hsdp_allreduces_across_replicas():
    P, S, N = 8, 4, 4 * MIB
    kw = dict(topology=_switch(P), layers=3, layer_bytes=N, compute_per_layer_s=1e-4,
              memo=False)
    fsdp = simulate_fsdp(None, P, **kw)
    hsdp = simulate_fsdp(None, P, shard=S, **kw)
    assert (hsdp.shard, hsdp.replicas, hsdp.ar) == (4, 2, "ring")
    prog = hsdp.pipeline.workload.programs[0]
    assert sum(n.collective == "allreduce" for n in prog) == 3
    assert hsdp.collectives == 2 * (3 + 2 + 3) + 4 * 3      # per shard group AG, AG', RS
    # a 4-rank ring moves 3/4 of a block per rank where the 8-rank ring moves 7/8, the
    # replica allreduce adds 2 x 1/2 x N/4
    assert hsdp.step_link_bytes != fsdp.step_link_bytes


def test_compare_has_four_rows_with_the_formula_beside():
    P = 8
    rows = compare_fsdp(None, P, topology=_switch(P), layers=6, layer_bytes=8 * MIB,
                        compute_per_layer_s=2e-5)     # communication-bound
    got = {(r.ag, r.rs): r for r in rows}
    assert list(got) == [("ring", "ring"), ("mcast", "ring"), ("ring", "innet"),
                         ("mcast", "innet")]
    f = (P - 1) / P
    N = 8 * MIB
    for key, sent, recv in [(("ring", "ring"), 2 * f, 2 * f), (("mcast", "ring"), 1.0, 2 * f),
                            (("ring", "innet"), 2 * f, 1.0), (("mcast", "innet"), 1.0, 1.0)]:
        r = got[key]
        assert r.sent_per_rank_nbytes / N == pytest.approx(sent, rel=1e-6)
        assert r.recv_per_rank_nbytes / N == pytest.approx(recv, rel=1e-6)
        assert r.formula_step_s > 0 and r.step_s >= r.compute_s
    ring, best = got[("ring", "ring")], got[("mcast", "innet")]
    # backward time per block: ring/ring about 2(P-1)/P N/B as composed; mcast/innet's
    # about 1.2 N/B, above the formula's 1.0: the prefetched allgather starts a backward
    # compute ahead of the reduce-scatter it overlaps (docs/pipeline.md)
    assert ring.window_over_n_b == pytest.approx(ring.formula_window_over_n_b, rel=0.01)
    assert best.window_over_n_b < 0.75 * ring.window_over_n_b
    assert best.formula_window_over_n_b < best.window_over_n_b
    assert best.step_s < ring.step_s and best.step_link_bytes < ring.step_link_bytes


# -- bad input -----------------------------------------------------------------------------

def _w(progs, comms=None):
    return Workload(len(progs), progs, comms or {}, sources=[f"t.{r}.et"
                                                             for r in range(len(progs))])


def test_bad_graphs_name_the_file_and_node():
    c = lambda i, deps=(): Node(i, COMPUTE, f"n{i}", tuple(deps), duration_s=1e-6)
    cases = [
        ([[c(0, [2]), c(1, [0]), c(2, [1])]] * 2, r"t\.0\.et: node \d \(n\d\) is in a "
                                                  r"dependency cycle \(node \d waits on"),
        ([[c(0), c(1, [9])]] * 2, r"t\.0\.et: node 1 \(n1\) depends on node 9, which"),
        ([[Node(0, COLLECTIVE, "x", collective="allscatter", nbytes=8)]] * 2,
         r"t\.0\.et: node 0 \(x\): unknown collective 'allscatter'"),
        ([[c(0), c(0)]] * 2, r"node 0 \(n0\) appears twice"),
        ([[Node(0, SEND, "s", nbytes=8, peer=5)]] * 2, r"sends to rank 5, which does not"),
        ([[Node(0, SEND, "s", nbytes=8, peer=1)], []],
         r"t\.0\.et: node 0 \(s\) sends 8 B to rank 1 \(tag 0\), which has no matching"),
        ([[Node(0, COLLECTIVE, "a", collective="allgather", nbytes=8)],
          [Node(0, COLLECTIVE, "b", collective="allreduce", nbytes=8)]],
         r"t\.1\.et: node 0 \(b\): collective 1 on communicator '' .* is allreduce of 8 B "
         r"at rank 1 but allgather of 8 B at rank 0"),
        ([[Node(0, COLLECTIVE, "a", collective="allgather", nbytes=8)], []],
         r"rank 1 issues 0 collectives, rank 0 1"),
    ]
    for progs, pattern in cases:
        with pytest.raises(WorkloadError, match=pattern):
            validate(_w(progs))
    with pytest.raises(WorkloadError, match=r"communicator 'g' names rank 7, which does not"):
        validate(_w([[c(0)]] * 2, {"g": [(0, 7)]}))
    with pytest.raises(WorkloadError, match="the workload has 2 ranks, the topology 4"):
        run_workload(_w([[c(0)]] * 2), _switch(4))


# -- the CLI -------------------------------------------------------------------------------

def test_cli_fsdp_compare_json(capsys):
    from polycast.cli.main import main
    assert main(["sim", "fsdp", "--nodes", "8", "--topology", "switch", "--layers", "8",
                 "--layer-bytes", "8MiB", "--compute-per-layer", "20us", "--compare",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["ag"], r["rs"]) for r in rows] == [("ring", "ring"), ("mcast", "ring"),
                                                 ("ring", "innet"), ("mcast", "innet")]
    assert rows[3]["step_s"] < rows[0]["step_s"]
    for r in rows:
        assert r["formula_step_s"] > 0 and abs(r["formula_diff_pct"]) < 50
        assert r["memo"]["blocks_simulated"] == [2, 4, 6]
        assert r["exposed_s"]["forward"] > 0 and r["bubble_pct"] > 0
    assert main(["sim", "fsdp", "--model", "gpt5", "-n", "4"]) == 2
    assert "llama2-7b" in capsys.readouterr().err


def test_cli_fsdp_bad_input_is_one_line_before_work(capsys, tmp_path):
    from polycast.cli.main import main
    for argv, text in [(["--shard", "3"], "--shard 3 must divide --nodes 8"),
                       (["--shard", "4", "--ar", "bogus"], "bogus"),
                       (["--ag", "innet"], "innet"),
                       (["--layers", "0"], "--layers must be"),
                       (["--trace", str(tmp_path / "t.txt")], "--trace"),
                       (["--plot", str(tmp_path / "no" / "p.png")], "does not exist"),
                       (["--optimizer", "fast"], "cannot parse time"),
                       (["--shard", "4", "--ag", "mcast", "--nic", "bf3-dpa"],
                        "world communicator only")]:
        assert main(["sim", "fsdp", "-n", "8", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and text in err, (argv, err)


def test_cli_fsdp_trace_and_plot(tmp_path, capsys):
    from polycast.cli.main import main
    trace, plot = tmp_path / "t.json", tmp_path / "p.png"
    assert main(["sim", "fsdp", "-n", "4", "-t", "switch", "--layers", "3", "--layer-bytes",
                 "4MiB", "--compute-per-layer", "50us", "--ag", "mcast", "--rs", "innet",
                 "--trace", str(trace), "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:4] == b"\x89PNG"
    events = json.loads(trace.read_text())["traceEvents"]
    procs = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert procs == {f"{row}: rank {r}" for row in ("ring/ring", "mcast/innet")
                     for r in range(4)}
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {"compute", "allgather", "reduce_scatter"}
    slices = [e for e in events if e["ph"] == "X" and e["pid"] == 4]     # mcast/innet rank 0
    names = {e["name"] for e in slices}
    assert {"AG 0", "F 0", "AG' 1", "B 2", "RS 0", "optimizer"} <= names
    assert all(e["dur"] >= 0 for e in slices)
    out = capsys.readouterr().out
    assert "ring" in out and "mcast" in out
