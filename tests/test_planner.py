"""The planner: the cost model read from schedules (against closed forms and the
simulator), choose() and its reasons, new algorithms costed for free, extrapolation,
profiles (missing, corrupt, stale), POLYCAST_DEBUG, Comm's use of it, and polycast tune."""

from __future__ import annotations

import json
import warnings

import pytest

from polycast.algorithms import algorithms, build
from polycast.algorithms.registry import _REGISTRY, register
from polycast.cli.main import main
from polycast.collectives import Collective
from polycast.planner import CommShape, choose, estimate, from_topology, modelled
from polycast.planner import cost as _cost
from polycast import debug
from polycast.planner import profile
from polycast.planner.analyze import analyze, collision
from polycast.planner.local import local_fabric
from polycast.schedule import Layout
from polycast.sim.simulate import simulate
from polycast.sim.topology import parse_topology, single_switch

MIB = 1 << 20
LAT, SW = 0.5e-6, 0.3e-6
ALPHA = 2 * LAT + SW


def _switch_fabric(P: int):
    # closed forms of the ideal link (no headers)
    topo = single_switch(P, link="400Gbps", latency_s=LAT, switch_latency_s=SW,
                         framing="none")
    return topo, from_topology(topo)


# -- the model against closed forms and the simulator ------------------------------------

@pytest.mark.parametrize("P", [2, 5, 8])
def test_ring_allgather_closed_form(P):
    topo, fab = _switch_fabric(P)
    t = analyze(build("allgather", "ring", P, P * 64), fab)
    B = topo.host_link_bw
    assert t.latency_s == pytest.approx((P - 1) * ALPHA)
    assert t.seconds_per_byte == pytest.approx((P - 1) / P / B)
    S = 16 * MIB
    assert t.time(S, fab) == pytest.approx((P - 1) * (ALPHA + S / P / B))


def test_pipelined_chain_hides_latency_behind_transfers():
    # chain broadcast, k chunks: (P-1) latencies and (P+k-2) chunk transfers.
    P, k = 6, 8
    topo, fab = _switch_fabric(P)
    t = analyze(build("broadcast", "chain", P, 64 * k, nchunks=k), fab)
    S, B = 8 * MIB, topo.host_link_bw
    assert t.time(S, fab) == pytest.approx((P - 1) * ALPHA + (P + k - 2) * S / k / B,
                                           rel=1e-6)


def test_direct_shares_the_port():
    P = 8
    topo, fab = _switch_fabric(P)
    t = analyze(build("allgather", "direct", P, P * 64), fab)
    assert t.latency_s == pytest.approx(ALPHA)                   # one hop
    assert t.seconds_per_byte == pytest.approx((P - 1) / P / topo.host_link_bw)


@pytest.mark.parametrize("topology", ["fattree:radix=8", "leafspine:hosts_per_leaf=4,oversub=4"])
@pytest.mark.parametrize("coll,algo,k,rel", [
    ("allgather", "ring", 1, 0.05), ("allgather", "mcast", 1, 0.05),
    ("allreduce", "dbtree", 4, 0.15), ("allreduce", "rabenseifner", 1, 0.15),
    ("broadcast", "binomial", 1, 0.05), ("reduce_scatter", "innet", 1, 0.05),
    # every rank of a leaf crossing it at once: static ECMP collisions, whose expected
    # busiest link the model takes, while the simulator's hash gives one draw of them
    ("allgather", "recdoubling", 1, 0.3)])
def test_estimates_match_the_simulator(topology, coll, algo, k, rel):
    """On fabrics with several leaves (uplinks, ECMP, oversubscription) the estimate of a
    schedule is close to the simulated time, small and large."""
    P = 16
    topo = parse_topology(topology, P)
    fab = from_topology(topo)
    for S in (4096, 4 * MIB):
        r = simulate(coll, algo, P, S, topo, nchunks=k)
        e = estimate(Collective.parse(coll), algo, r.nbytes, CommShape(P), fab, nchunks=k)
        assert e.seconds == pytest.approx(r.time_s, rel=rel), (S, e.describe(), r.time_s)


def test_collision_expectation():
    assert collision(1, 16) == 1.0
    assert collision(16, 1) == 16.0
    assert 2.0 < collision(16, 16) < 5.0          # the busiest of 16 links, up or down
    assert collision(32, 16) > collision(16, 16)
    big = collision(64 * 16 * 4, 16)              # many flows: close to the mean
    assert 256 <= big < 256 * 1.3


# -- choose --------------------------------------------------------------------------------

def test_choose_picks_the_fastest_and_says_why():
    fab = modelled("fattree:radix=32", 64)
    c = choose("allgather", 64 * MIB, CommShape(64), fab)
    assert c.algorithm == c.candidates[0].algorithm
    assert c.estimate_seconds == min(e.seconds for e in c.candidates)
    assert [e.seconds for e in c.candidates] == sorted(e.seconds for e in c.candidates)
    assert any("faster than" in r for r in c.reasons)
    text = c.explain()
    for e in c.candidates:
        assert e.algorithm in text
    # hierarchical algorithms with one rank per host are their flat form: said, not run
    assert dict(c.excluded)["hring"].startswith("hierarchical")
    js = c.to_json()
    assert js["algorithm"] == c.algorithm and len(js["candidates"]) == len(c.candidates)


def test_small_sizes_are_latency_bound_large_ones_bandwidth_bound():
    fab = modelled("fattree:radix=8", 16)           # 4 leaves of 4: small enough to be quick
    small = choose("allreduce", 1024, CommShape(16), fab)
    large = choose("allreduce", 256 * MIB, CommShape(16), fab)
    assert small.candidates[0].bound == "latency"
    assert large.candidates[0].bound != "latency"
    assert small.algorithm != large.algorithm


def test_fabric_capabilities_limit_the_candidates():
    fab = local_fabric(single_host=True, multicast=False, symm=False)
    c = choose("broadcast", MIB, CommShape(4, 4), fab)
    why = dict(c.excluded)
    assert "multicast" in why["mcast"] and all(e.algorithm != "mcast" for e in c.candidates)
    assert "symm" not in {e.algorithm for e in c.candidates}
    with_symm = local_fabric(single_host=True, multicast=True, symm=True)
    names = {e.algorithm for e in choose("broadcast", MIB, CommShape(4, 4),
                                         with_symm).candidates}
    assert {"mcast", "symm"} <= names
    # across hosts there is no symmetric memory
    multi = local_fabric(single_host=False, multicast=False, symm=True)
    assert "symm" not in {e.algorithm for e in choose("allreduce", MIB, CommShape(4),
                                                      multi).candidates}


def test_wide_fanout_is_not_a_candidate_at_scale():
    fab = modelled("fattree:radix=32", 256)
    small = choose("allgather", 1024, CommShape(64), modelled("fattree:radix=32", 64))
    assert "direct" in {e.algorithm for e in small.candidates}
    big = choose("allgather", 1024, CommShape(256), fab)
    why = dict(big.excluded)["direct"]
    assert "ranks at once" in why and "direct" not in {e.algorithm for e in big.candidates}


def test_choice_is_deterministic():
    fab = modelled("leafspine:hosts_per_leaf=8,oversub=4", 24)   # 3 oversubscribed leaves
    a = choose("allreduce", 3 * MIB, CommShape(24), fab)
    _cost._CACHE.clear()
    b = choose("allreduce", 3 * MIB, CommShape(24), fab)
    assert (a.algorithm, a.nchunks, a.estimate_seconds) == (b.algorithm, b.nchunks,
                                                          b.estimate_seconds)


@pytest.fixture
def myring():
    """A newly registered algorithm (the README's example), removed afterwards."""
    name = "test_planner_ring"

    @register("allgather", name, "the README's ring, registered by a test")
    def gen(spec):
        P, k = spec.nranks, spec.nchunks
        b = spec.builder(name, Layout(spec.count, 1, k), Layout(P * spec.count, P, k))
        for r in range(P):
            b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
            for i in range(P - 1):
                b.send(r, (r + 1) % P, "recv", b.blocks("recv", (r - i) % P))
                b.recv(r, (r - 1) % P, "recv", b.blocks("recv", (r - i - 1) % P))
        return b.build()
    yield name
    _REGISTRY.pop((Collective.ALLGATHER, name), None)
    _cost._CACHE.clear()


def test_a_new_algorithm_is_costed_for_free(myring):
    fab = modelled("fattree:radix=32", 32)
    c = choose("allgather", 16 * MIB, CommShape(32), fab)
    assert myring in {e.algorithm for e in c.candidates}
    # Unpipelined it is the very schedule of ring: the same estimate.
    mine, ring = (estimate(Collective.ALLGATHER, a, 16 * MIB, CommShape(32), fab, nchunks=1)
                  for a in (myring, "ring"))
    assert mine.seconds == pytest.approx(ring.seconds, rel=1e-9)


def test_extrapolation_beyond_the_budget(monkeypatch):
    """A schedule too big to analyse is estimated from smaller rank counts; on ring and
    recursive doubling at 64 ranks that stays within 20 % of the exact analysis."""
    fab = modelled("fattree:radix=32", 128)
    exact = {}
    for algo in ("ring", "recdoubling"):
        t = _cost.exact_terms(Collective.ALLGATHER, algo, 128, 1, {}, fab)
        exact[algo] = t
    monkeypatch.setattr(_cost, "STEP_BUDGET", 3000)
    _cost._CACHE.clear()
    for algo, t in exact.items():
        got, how = _cost.terms(Collective.ALLGATHER, algo, 128, 1, {}, fab)
        if algo == "ring":
            assert how.startswith("extrapolated")
        for S in (4096, 64 * MIB):
            assert got.time(S, fab) == pytest.approx(t.time(S, fab), rel=0.2), (algo, S, how)
    _cost._CACHE.clear()


# -- the check on simulated fabrics (the full grid: bench/tune.py) ---------------------------

def test_one_cell_of_the_grid_check():
    """The grid check itself (the 16-cell run below is slow): one cell, every candidate
    simulated, the planner's choice among them and within 10 % of the best."""
    from polycast.tools.plancheck import Cell, run_cells
    (v,) = run_cells([Cell("allgather", 8, 4096, "fattree:radix=8")], workers=1)
    assert len(v.times) >= 3 and v.choice in v.times and v.best in v.times
    assert v.times[v.best] == min(v.times.values())
    assert abs(v.ratio - v.times[v.choice] / v.times[v.best]) < 1e-9 and v.ok, v


def test_grid_check_leaves_out_only_candidates_whose_bound_is_above_the_best(tmp_path):
    """The bound is a floor under every simulated time, and leaving out the candidates
    whose floor is above their cell's best changes no verdict."""
    from polycast.tools.plancheck import Cell, lower_bound_s, plan_cell, run_cells
    cells = [Cell(c, 8, 4 * MIB, "fattree:radix=8") for c in ("allreduce", "broadcast")]
    full = run_cells(cells, workers=1, prune=False)
    counts: dict = {}
    cache = str(tmp_path / "sims.jsonl")
    quick = run_cells(cells, workers=1, prune=True, cache=cache, counts=counts)
    for cell, v in zip(cells, full):
        for pt in plan_cell(cell)[0]:
            label = pt.algorithm + (f"/{pt.nchunks}" if pt.nchunks > 1 else "")
            # 0 for compact schedules (no Steps to count), a true floor for the others
            assert 0 <= lower_bound_s(pt) <= v.times[label], (pt, v.times[label])
    assert counts["pruned"] > 0 and counts["simulated"] + counts["pruned"] == sum(
        len(v.times) for v in full)
    for a, b in zip(full, quick):
        assert (a.choice, a.best, a.ratio) == (b.choice, b.best, b.ratio)
        assert set(b.pruned) | set(b.times) == set(a.times)
        assert all(b.pruned[k] > a.times[a.best] for k in b.pruned)
    # judged again from the cache: nothing simulated, the same verdicts
    again: dict = {}
    assert [(v.choice, v.ratio) for v in run_cells(cells, workers=1, cache=cache,
                                                   counts=again)] == \
        [(v.choice, v.ratio) for v in quick]
    assert again["simulated"] == 0 and again["pruned"] == counts["pruned"]


@pytest.mark.slow                   # simulates every candidate of 16 cells
def test_auto_is_within_10_percent_of_the_best_on_a_small_grid():
    from polycast.tools.plancheck import Cell, run_cells
    # 16 cells (the full grid is bench/tune.py's): both topologies, a latency- and a
    # bandwidth-bound size, a small and a larger rank count
    cells = [Cell(c, n, s, t) for c in ("allgather", "allreduce", "broadcast", "reduce_scatter")
             for n, t in ((8, "fattree:radix=8"), (32, "leafspine:hosts_per_leaf=4,oversub=4"))
             for s in (4096, 4 * MIB)]
    verdicts = run_cells(cells, workers=1)
    ok = [v for v in verdicts if v.ok]
    assert len(ok) >= 0.95 * len(verdicts), [
        (v.cell, v.choice, v.best, round(v.ratio, 2)) for v in verdicts if not v.ok]
    # every candidate was simulated, the choice among them
    assert all(v.choice in v.times and v.best in v.times for v in verdicts)


# -- profiles --------------------------------------------------------------------------------

def _good_profile() -> dict:
    return {"links": profile.BUILTIN_LINKS, "symm": profile.BUILTIN_SYMM}


def test_profile_roundtrip(tmp_path):
    path = profile.save(_good_profile(), str(tmp_path / "p.json"))
    data = profile.load(path)
    assert data["format"] == profile.FORMAT and data["machine"] == profile.machine_identity()
    fab = local_fabric(single_host=True, prof=data)
    assert fab.source.startswith("profile")


def test_missing_profile_is_the_builtin_model_silently(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert profile.load(str(tmp_path / "nothing.json")) is None


@pytest.mark.parametrize("content,why", [
    ("{not json", "JSONDecodeError"),
    (json.dumps([1, 2]), "not a JSON object"),
    (json.dumps({"format": 99}), "format"),
    (json.dumps({"format": 1, "links": {"shm": {"latency_s": "fast"}}}), "latency_s"),
    (json.dumps({"format": 1, "links": {"shm": dict(profile.BUILTIN_LINKS["shm"],
                                                      port_gbps=-1)}}), "port_gbps"),
])
def test_corrupt_profile_warns_and_uses_the_builtin_model(tmp_path, content, why):
    path = tmp_path / f"bad{abs(hash(content))}.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match=why):
        assert profile.load(str(path)) is None


def test_stale_profile_warns(tmp_path):
    path = profile.save(_good_profile(), str(tmp_path / "p.json"))
    data = json.loads(open(path).read())
    data["machine"]["hostname"] = "another-host"
    data["machine"]["machine_id"] = "0" * 16
    with open(path, "w") as fh:
        json.dump(data, fh)
    with pytest.warns(RuntimeWarning, match="another machine"):
        assert profile.load(path) is None
    data["machine"] = profile.machine_identity()
    data["polycast"] = "0.0.0-old"
    with open(path, "w") as fh:
        json.dump(data, fh)
    with pytest.warns(RuntimeWarning, match="stale"):
        assert profile.load(path) is None


def test_tune_survives_a_corrupt_profile(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.warns(RuntimeWarning, match="built-in model"):
        code = main(["tune", "-n", "4", "--sizes", "1KiB,16MiB", "-c", "allreduce",
                     "--profile", str(bad)])
    out = capsys.readouterr().out
    assert code == 0 and "built-in model" in out and "allreduce" in out


# -- Comm asks the planner ---------------------------------------------------------------------

class _FakeDriver:
    rank = 0


def test_comm_symm_or_engine_is_the_planners_call(monkeypatch, tmp_path):
    from polycast.comm import Comm
    from polycast.dispatch import choice
    cheap = {c: {"4": [0.0, 0.0]} for c in ("allgather", "reduce_scatter", "allreduce",
                                           "broadcast")}
    dear = {c: {"4": [1.0, 1e-6]} for c in cheap}
    for table, want in ((cheap, True), (dear, False)):
        path = profile.save({"links": profile.BUILTIN_LINKS, "symm": table},
                            str(tmp_path / f"{want}.json"))
        monkeypatch.setenv("POLYCAST_PROFILE", path)
        comm = Comm(_FakeDriver(), 0, [0, 1, 2, 3], 60.0)
        assert choice.symm_wins(comm, Collective.ALLREDUCE, MIB) is want
        c = comm.plan("allreduce", MIB)
        assert (c.algorithm == "symm") is want
        # the engine's choice (symm refused) is among the engine's algorithms
        assert comm.choose_algorithm(Collective.ALLREDUCE, MIB, None) in {
            a.name for a in algorithms("allreduce")}


def test_comm_choices_per_size_class_and_nchunks(monkeypatch, tmp_path):
    from polycast.comm import Comm
    from polycast.dispatch import choice
    monkeypatch.setenv("POLYCAST_PROFILE", str(tmp_path / "none.json"))
    comm = Comm(_FakeDriver(), 0, [0, 1, 2, 3], 60.0)
    a = comm.choose_algorithm(Collective.ALLGATHER, 3 * MIB, None)
    assert comm.choose_algorithm(Collective.ALLGATHER, 3 * MIB + 4096, None) == a  # one class
    k = choice.pipeline_nchunks(comm, Collective.ALLGATHER, a, 3 * MIB)
    assert k == comm.plan("allgather", 3 * MIB, symm=False).nchunks
    monkeypatch.setenv("POLYCAST_NCHUNKS", "3")         # a communicator made now takes it
    comm = Comm(_FakeDriver(), 0, [0, 1, 2, 3], 60.0)
    assert choice.pipeline_nchunks(comm, Collective.ALLGATHER, a, 3 * MIB) == 3


def test_debug_info_once_per_class_trace_every_call(capsys):
    debug.reset()
    for n in (MIB, MIB + 8, 3 * MIB):
        debug.log_choice(2, 7, "allreduce", n, "ring", 4, "why", debug.INFO)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(x.startswith("[rank 2] polycast INFO") for x in err)
    assert "1MiB..2MiB: ring nchunks 4 (why)" in err[0]
    debug.log_choice(2, 7, "allreduce", MIB, "ring", 1, "", debug.TRACE)
    err = capsys.readouterr().err
    assert "polycast TRACE" in err
    debug.log_choice(2, 7, "allreduce", 5 * MIB, "ring", 1, "", 0)     # unset or WARN
    assert capsys.readouterr().err == ""


# -- polycast tune and sim --algo auto ---------------------------------------------------------

def test_tune_table_explain_json(capsys):
    argv = ["tune", "--nodes", "48", "--topology", "fattree:radix=32", "--link", "400Gbps",
            "--sizes", "1KiB,64MiB", "-c", "allgather,broadcast"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "polycast tune" in out and "allgather" in out and "broadcast" in out
    assert main(argv + ["--explain"]) == 0
    out = capsys.readouterr().out
    assert out.count(" * ") == 4 and "not a candidate" in out
    assert main(argv + ["--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert len(js["choices"]) == 4 and all(c["candidates"] for c in js["choices"])


@pytest.mark.parametrize("argv,what", [
    (["-c", "allgatter"], "allgatter"),
    (["--nodes", "0"], "--nodes"),
    (["--topology", "fattree:radix=3"], "radix"),
    (["--min", "1MiB", "--max", "1KiB"], "--min"),
    (["--sizes", "12 parsecs"], "parse size"),
    (["--topology", "fattree:radix=4", "--nodes", "100"], "radix"),
])
def test_tune_bad_input_is_one_line_exit_2(capsys, argv, what):
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0] and err[0].startswith("polycast tune: error:")


def test_sim_algo_auto(capsys):
    assert main(["sim", "allgather", "--algo", "auto", "--nodes", "16", "--size", "1KiB",
                 "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    fab = modelled("fattree:radix=32", 16)
    want = choose("allgather", js["nbytes"], CommShape(16), fab).algorithm
    assert js["algorithm"] == f"auto({want})"
