"""Chakra execution traces in and out (polycast.workload.chakra, ``polycast sim workload``):
traces made by Chakra's own generator and text converter, polycast's FSDP/HSDP written and
read back, and bad traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2",
                    reason="needs the chakra extra: pip install 'polycast[chakra]' "
                           "(mlc-chakra)")

from polycast.algorithms import build                                # noqa: E402
from polycast.cli.main import main                                   # noqa: E402
from polycast.sim import Simulation                                  # noqa: E402
from polycast.sim.fsdp import simulate_fsdp                          # noqa: E402
from polycast.sim.pipeline import run_workload                       # noqa: E402
from polycast.sim.topology import single_switch                      # noqa: E402
from polycast.workload.chakra import read_chakra, write_chakra       # noqa: E402
from polycast.workload.fsdp import build_fsdp                        # noqa: E402
from polycast.workload.graph import (COLLECTIVE, COMPUTE, Node, Workload,  # noqa: E402
                                     WorkloadError)

MIB = 1 << 20
P = 4


def _switch(n=P):
    return single_switch(n, link="400Gbps")


def _alone(coll, algo, count, n=P, itemsize=1):
    sim = Simulation(_switch(n))
    req = sim.post(build(coll, algo, n, count), itemsize)
    sim.run()
    return sim.completion_time(req)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Chakra's own microbenchmark generator (chakra_generator), 4 NPUs."""
    d = tmp_path_factory.mktemp("gen")
    subprocess.run([sys.executable, "-m", "chakra.src.generator.generator", "--num_npus",
                    str(P), "--default_comm_size", "65536", "--default_runtime", "5"],
                   cwd=d, check=True, timeout=120, capture_output=True)
    return d


@pytest.mark.parametrize("name,seconds", [("one_comp_node", 5e-6),
                                          ("two_comp_nodes_independent", 10e-6),
                                          ("two_comp_nodes_dependent", 10e-6),
                                          ("one_metadata_node_all_types", 0.0),
                                          ("one_remote_mem_load_node", 0.0),
                                          ("one_remote_mem_store_node", 0.0)])
def test_generator_compute_and_metadata_traces(generated, name, seconds):
    w = read_chakra(str(generated / name), P)
    res = run_workload(w, _switch())
    assert res.step_s == pytest.approx(seconds, abs=1e-15)


@pytest.mark.parametrize("name,coll,algo,count", [
    ("ALL_GATHER", "allgather", "ring", 65536),
    ("ALL_REDUCE", "allreduce", "ring", 65536),
    ("REDUCE_SCATTER", "reduce_scatter", "ring", 65536 // P),
    ("ALL_TO_ALL", "alltoall", "pairwise", 65536 // P),
    ("BROADCAST", "broadcast", "binomial", 65536),
])
def test_generator_collectives_run_as_the_collective_alone(generated, name, coll, algo,
                                                           count):
    # comm_size is each rank's input, as ASTRA-sim reads it
    w = read_chakra(str(generated / name), P)
    res = run_workload(w, _switch(), algorithms={coll: algo})
    assert res.algorithms == {coll: [algo]}
    assert res.step_s == pytest.approx(_alone(coll, algo, count), rel=1e-12)
    auto = run_workload(w, _switch())                  # no --algo: the planner's choice
    assert auto.step_s > 0 and len(auto.algorithms[coll]) == 1


def test_generator_barrier_and_send_without_a_peer(generated):
    assert run_workload(read_chakra(str(generated / "BARRIER"), P), _switch()).step_s > 0
    with pytest.raises(WorkloadError, match=r"one_comm_send_node\.0\.et: node \d+ "
                                            r"\(COMM_SEND_NODE\): a send with no comm_dst"):
        read_chakra(str(generated / "one_comm_send_node"), P)


TEXT = """DATA
3
embed -1 40 NONE 0 30 NONE 0 20 ALLREDUCE 1048576 10
mlp -1 80 NONE 0 60 NONE 0 50 ALLREDUCE 4194304 10
head -1 20 NONE 0 10 NONE 0 10 ALLREDUCE 262144 10
"""


def _data_parallel_reference(layers) -> list[Node]:
    """The graph ASTRA-sim's DATA type means (Chakra's text converter, one pass), built by
    hand: forward chain; backward per layer (reversed) weight-gradient compute, its
    allreduce, then input-gradient compute (not for the first layer)."""
    prog: list[Node] = []

    def add(kind, deps, **kw):
        prog.append(Node(len(prog), kind, deps=tuple(deps), **kw))
        return len(prog) - 1

    f = None
    for name, fwd, ig, wg, size in layers:
        f = add(COMPUTE, [] if f is None else [f], duration_s=fwd * 1e-6)
    ig_prev = None
    for idx, (name, fwd, ig, wg, size) in enumerate(reversed(layers)):
        w = add(COMPUTE, [f] if idx == 0 else [ig_prev], duration_s=wg * 1e-6)
        add(COLLECTIVE, [w], collective="allreduce", nbytes=size)
        if idx != len(layers) - 1:
            ig_prev = add(COMPUTE, [w], duration_s=ig * 1e-6)
    return prog


def test_text_converter_traces_run_as_the_graph_they_describe(tmp_path):
    (tmp_path / "dp.txt").write_text(TEXT)
    subprocess.run([sys.executable, "-m", "chakra.src.converter.converter", "--log-filename",
                    str(tmp_path / "conv.log"), "Text", "--input", str(tmp_path / "dp.txt"),
                    "--output", str(tmp_path / "dp"), "--num-npus", str(P), "--num-passes",
                    "1"], cwd=tmp_path, check=True, timeout=120, capture_output=True)
    w = read_chakra(str(tmp_path / "dp"), P)
    assert w.sources[3].endswith("dp.3.et")
    got = run_workload(w, _switch(), algorithms={"allreduce": "ring"})
    layers = [("embed", 40, 30, 20, 1048576), ("mlp", 80, 60, 50, 4194304),
              ("head", 20, 10, 10, 262144)]
    ref = _data_parallel_reference(layers)
    want = run_workload(Workload(P, [ref] * P, itemsize=1), _switch(),
                        algorithms={"allreduce": "ring"})
    assert got.step_s == pytest.approx(want.step_s, rel=1e-12)
    assert got.compute_s == pytest.approx(sum(a + b + c for _, a, b, c, _ in layers[1:]) * 1e-6
                                          + (40 + 20) * 1e-6, rel=1e-12)
    assert got.link_bytes == want.link_bytes
    assert main(["sim", "workload", str(tmp_path / "dp"), "-t", "switch", "--algo",
                 "allreduce=ring", "--json"]) == 0


def test_fsdp_and_hsdp_round_trip_within_a_tenth_of_a_percent(tmp_path):
    P8, kw = 8, dict(layers=4, layer_bytes=16 * MIB, compute_per_layer_s=3.3e-4,
                     memo=False)
    for ag, rs, shard in (("mcast", "innet", None), ("ring", "ring", 4)):
        topo = _switch(P8)
        r = simulate_fsdp(None, P8, ag=ag, rs=rs, shard=shard, topology=topo, **kw)
        w, _ = build_fsdp(r.spec)
        prefix = write_chakra(w, str(tmp_path / f"{ag}{shard}"), "fsdp")
        back = read_chakra(prefix, P8)
        assert back.itemsize == 2 and len(back.programs[0]) == len(w.programs[0]) + (
            1 if shard else 0)                                   # + the groups' metadata
        res = run_workload(back, topo)
        assert res.step_s == pytest.approx(r.step_s, rel=1e-3)
        assert res.link_bytes == r.step_link_bytes
        assert res.algorithms["allgather"] == [ag]
        if shard:
            groups = json.loads((tmp_path / f"{ag}{shard}" / "fsdp.comm_groups.json")
                                .read_text())
            assert sorted(map(tuple, groups.values())) == [(0, 1, 2, 3), (0, 4), (1, 5),
                                                          (2, 6), (3, 7), (4, 5, 6, 7)]
            # ASTRA-sim's communicator file gives the same groups as the metadata node
            res2 = run_workload(read_chakra(prefix, P8, comm_groups=str(
                tmp_path / f"{ag}{shard}" / "fsdp.comm_groups.json")), topo)
            assert res2.step_s == res.step_s


def test_cli_writes_and_reads_back(tmp_path, capsys):
    out = tmp_path / "ck"
    args = ["-n", "8", "-t", "switch", "--layers", "3", "--layer-bytes", "8MiB",
            "--compute-per-layer", "0.2ms", "--ag", "mcast", "--rs", "innet", "--json"]
    assert main(["sim", "fsdp", *args, "--write-chakra", str(out), "--no-memo"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["sim", "workload", str(out / "fsdp"), "-t", "switch", "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["step_s"] == pytest.approx(first["step_s"], rel=1e-3)
    assert back["algorithms"] == {"allgather": ["mcast"], "reduce_scatter": ["innet"]}
    # --algo forces another algorithm than the trace's own
    assert main(["sim", "workload", str(out / "fsdp"), "-t", "switch", "--json", "--algo",
                 "allgather=ring,reduce_scatter=ring"]) == 0
    ring = json.loads(capsys.readouterr().out)
    assert ring["algorithms"] == {"allgather": ["ring"], "reduce_scatter": ["ring"]}
    assert ring["link_bytes"] > back["link_bytes"]


def _one_line_error(capsys, argv, text):
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_bad_traces_are_one_line_before_any_simulation(tmp_path, capsys):
    from chakra.schema.protobuf import et_def_pb2 as pb
    w = Workload(2, [[Node(0, COMPUTE, "c", duration_s=1e-6),
                      Node(1, COLLECTIVE, "x", (0,), collective="allreduce", nbytes=64)]] * 2)
    prefix = write_chakra(w, str(tmp_path), "ok")
    base = ["sim", "workload", "-t", "switch"]
    _one_line_error(capsys, base + [prefix, "-n", "3"], "2 traces (")
    _one_line_error(capsys, base + [str(tmp_path / "none")], "no trace")
    _one_line_error(capsys, base + [prefix, "--algo", "allgather"], "COLLECTIVE=ALGORITHM")
    _one_line_error(capsys, base + [prefix, "--algo", "allgather=bogus"], "bogus")
    # corrupt: cut the last node short
    data = (tmp_path / "ok.1.et").read_bytes()
    (tmp_path / "cut.0.et").write_bytes((tmp_path / "ok.0.et").read_bytes())
    (tmp_path / "cut.1.et").write_bytes(data[:-3])
    _one_line_error(capsys, base + [str(tmp_path / "cut")], "cut.1.et: corrupt")
    (tmp_path / "junk.0.et").write_bytes(b"\x05\xff\xff\xff\xff\xff")
    _one_line_error(capsys, base + [str(tmp_path / "junk"), "-n", "1"], "junk.0.et: corrupt")

    def trace(name, nodes_per_rank):
        for rank, nodes in enumerate(nodes_per_rank):
            with open(tmp_path / f"{name}.{rank}.et", "wb") as fh:
                for msg in [pb.GlobalMetadata(version="0.0.4")] + nodes:
                    data = msg.SerializeToString()
                    from polycast.workload.chakra import _varint
                    fh.write(_varint(len(data)) + data)
        return str(tmp_path / name)

    def coll(i, ct, deps=(), pg=None):
        n = pb.Node(id=i, name=f"c{i}", type=pb.COMM_COLL_NODE)
        n.data_deps.extend(deps)
        n.attr.extend([pb.AttributeProto(name="comm_type", int64_val=ct),
                       pb.AttributeProto(name="comm_size", int64_val=64)])
        if pg:
            n.attr.append(pb.AttributeProto(name="pg_name", string_val=pg))
        return n

    _one_line_error(capsys, base + [trace("kind", [[coll(0, 42)]] * 2)],
                    "kind.0.et: node 0 (c0): unknown collective comm_type 42")
    _one_line_error(capsys, base + [trace("cyc", [[coll(0, 0, [1]), coll(1, 0, [0])]] * 2)],
                    "dependency cycle")
    _one_line_error(capsys, base + [trace("miss", [[coll(0, 0, [7])]] * 2)],
                    "depends on node 7")
    _one_line_error(capsys, base + [trace("pg", [[coll(0, 0, pg="3")]] * 2)],
                    "process group '3', which no metadata node")
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps({"3": [0, 5]}))
    _one_line_error(capsys, base + [trace("pg", [[coll(0, 0, pg="3")]] * 2),
                                    "--comm-groups", str(groups)], "names rank 5")
    assert not os.path.exists(tmp_path / "debug.log")
