"""Vector (uneven) layouts in the schedule IR, the vector forms of the algorithms
(Allgatherv, Gatherv, Scatterv, Alltoallv, Reduce_scatter with counts) and scan/exscan:
every one verified for P = 1..9 with random counts including zeros, and exact traffic (no
padding to the largest count)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polycast.algorithms import algorithms, build
from polycast.collectives import Collective
from polycast.errors import InvalidArgument, ScheduleError
from polycast.schedule.ir import Kind, Layout, PerRank
from polycast.schedule.traffic import traffic
from polycast.schedule.verify import verify

VECTOR = [a for a in algorithms() if "counts" in a.options]
SCANS = [a for a in algorithms() if a.collective.ordered]


def test_the_vector_algorithms_the_issue_names_exist():
    names = {(str(a.collective), a.name) for a in VECTOR}
    for want in [("allgather", "ring"), ("gather", "linear"), ("scatter", "linear"),
                 ("gather", "binomial"), ("scatter", "binomial"), ("alltoall", "pairwise"),
                 ("reduce_scatter", "ring"), ("reduce_scatter", "direct")]:
        assert want in names
    assert {(str(a.collective), a.name) for a in SCANS} >= {
        ("scan", "recdoubling"), ("exscan", "recdoubling")}


def test_uneven_layout_cuts_exactly():
    lay = Layout.uneven([3, 0, 5], sub=2)
    assert lay.nelems == 8 and lay.nblocks == 6
    assert [lay.block_range(b) for b in range(6)] == [(0, 1), (1, 3), (3, 3), (3, 3),
                                                        (3, 5), (5, 8)]
    assert lay.runs((0, 1, 2, 3, 4)) == [(0, 5)]
    assert lay.with_sub(1).block_range(2) == (3, 8)
    with pytest.raises(ValueError):
        Layout(9, 3, 1, (3, 0, 5))
    with pytest.raises(ValueError, match="share parts"):
        PerRank((Layout(3, 1, 1), Layout(3, 1, 2)))


def _counts(draw, coll, P):
    c = st.integers(0, 9) | st.just(0)
    if coll is Collective.ALLTOALL:
        return [[draw(c) for _ in range(P)] for _ in range(P)]
    return [draw(c) for _ in range(P)]


def _exact_sent(coll, algo, P, counts, root):
    """Elements the whole schedule sends for algorithms whose volume has a closed form."""
    if coll is Collective.ALLGATHER and algo in ("ring", "direct"):
        return (P - 1) * sum(counts)
    if coll is Collective.GATHER and algo == "linear":
        return sum(counts) - counts[root]
    if coll is Collective.SCATTER and algo == "linear":
        return sum(counts) - counts[root]
    if coll is Collective.ALLTOALL and algo == "pairwise":
        return sum(counts[i][j] for i in range(P) for j in range(P) if i != j)
    if coll is Collective.REDUCE_SCATTER and algo in ("ring", "direct"):
        return (P - 1) * sum(counts)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_vector_algorithms_verify_with_random_counts(data):
    algo = data.draw(st.sampled_from(VECTOR), label="algorithm")
    P = data.draw(st.integers(1, 9), label="P")
    if algo.unsupported_reason(P):
        return
    coll = algo.collective
    counts = _counts(data.draw, coll, P)
    root = data.draw(st.integers(0, P - 1)) if coll.rooted else 0
    nchunks = data.draw(st.integers(1, 3))
    channels = data.draw(st.sampled_from([1, 1, 2]))
    s = build(coll, algo.name, P, 0, root=root, nchunks=nchunks, channels=channels,
              counts=counts)
    verify(s)
    sent = sum(traffic(s).sent_nbytes)
    exact = _exact_sent(coll, algo.name, P, counts, root)
    if exact is not None:
        assert sent == exact, (sent, exact)


@pytest.mark.parametrize("algo", SCANS, ids=lambda a: f"{a.collective}-{a.name}")
def test_scans_verify(algo):
    for P in range(1, 18):
        for count, nchunks in ((5, 1), (7, 2), (1, 3), (0, 1)):
            verify(build(algo.collective, algo.name, P, count, nchunks=nchunks))


def test_recdoubling_scan_moves_log_p_messages_of_count():
    t = traffic(build("scan", "recdoubling", 8, 100))
    assert t.depth == 3 and t.max_sent == 3 * 100      # rank 0 sends to 1, 2, 4


def test_verifier_catches_a_recv_layout_that_does_not_match_the_counts():
    s = build("allgather", "ring", 4, 0, counts=[1, 0, 3, 5])
    with pytest.raises(ScheduleError, match="elements"):
        verify(replace(s, layouts={**s.layouts, "recv": Layout.uneven([1, 3, 0, 5])}))
    with pytest.raises(ScheduleError, match="covers 9 elements"):
        verify(replace(s, options={**s.options, "counts": (1, 0, 3, 4)}))


def _exscan3(swapped: bool):
    """exscan on 3 ranks by a chain; ``swapped`` builds rank 1's window as x_1 op x_0."""
    from polycast.schedule.builder import Builder
    one = Layout(4, 1, 1)
    b = Builder(Collective.EXSCAN, 3, 0, 4, "chain", {"send": one, "recv": one, "tmp": one})
    b.send(0, 1, "send", (0,))
    b.recv(1, 0, "recv", (0,))
    first, second = ("recv", "send") if swapped else ("send", "recv")
    b.copy(1, first, (0,), "tmp", (0,))
    b.copy(1, second, (0,), "tmp", (0,), reduce=True)     # tmp = second op tmp
    b.send(1, 2, "tmp", (0,))
    b.recv(2, 1, "recv", (0,))
    return b.build()


def test_verifier_catches_a_scan_out_of_rank_order():
    """The same ranks combined, but a non-commutative op would give the wrong answer."""
    verify(_exscan3(False))
    with pytest.raises(ScheduleError, match="rank order"):
        verify(_exscan3(True))


def test_bad_counts_are_clear_errors():
    with pytest.raises(InvalidArgument, match="4 non-negative"):
        build("allgather", "ring", 4, 0, counts=[1, 2, 3])
    with pytest.raises(InvalidArgument, match="row 0 must be 3"):
        build("alltoall", "pairwise", 3, 0, counts=[1, 2, 3])
    with pytest.raises(InvalidArgument, match="takes no option"):
        build("alltoall", "bruck", 3, 0, counts=[[1] * 3] * 3)
    with pytest.raises(InvalidArgument, match="takes no option"):
        build("allreduce", "ring", 3, 0, counts=[1, 2, 3])


def test_the_engine_plan_and_memory_use_each_ranks_own_sizes():
    """Rank r's plan of an Allgatherv reads counts[r] elements of its send buffer."""
    from polycast.engine.plan import make_plan
    counts = [2, 0, 5]
    s = build("allgather", "ring", 3, 0, counts=counts)
    for r in range(3):
        p = make_plan(s, r)
        copy = next(i for i, stp in enumerate(s.program(r)) if stp.kind is Kind.COPY)
        assert p.nelems[copy] == counts[r]
        assert p.dst_runs[copy] == (((sum(counts[:r]), sum(counts[:r + 1])),)
                                    if counts[r] else ())


def test_vector_schedules_run_on_the_simulated_engine():
    """The simulator posts a vector schedule on its engines like any other; on one switch
    every byte sent crosses two links, so its link bytes are the exact volume (the padded
    uniform call moves far more). The link is the ideal one (framing none): no headers."""
    from polycast.sim.simulate import simulate
    counts = [[1, 1, 1, 1000]] * 3 + [[1000, 0, 0, 1]]
    exact = 4 * sum(counts[i][j] for i in range(4) for j in range(4) if i != j)
    res = simulate("alltoall", "pairwise", 4, 4 * 4 * 1000, topology="switch",
                   options={"counts": counts}, framing="none")
    assert res.time_s > 0 and res.link_bytes == 2 * exact
    padded = simulate("alltoall", "pairwise", 4, 4 * 4 * 1000, topology="switch",
                      framing="none")
    assert padded.link_bytes == 2 * 4 * 12 * 1000 > 2 * res.link_bytes
    res = simulate("allgather", "ring", 4, 1024, topology="switch",
                   options={"counts": [1, 1, 1, 1000]}, framing="none")
    assert res.link_bytes == 2 * 4 * 3 * 1003
    res = simulate("scan", "recdoubling", 5, 4000, topology="switch", framing="none")
    assert res.time_s > 0 and res.link_bytes == 2 * 4000 * (4 + 3 + 1)


def test_sim_cli_takes_counts(capsys):
    import json as _json

    from polycast.cli.main import main
    assert main(["sim", "alltoall", "-n", "3", "-t", "switch", "--algo", "pairwise",
                 "--counts", "0,1,500;2,0,500;3,4,0", "--framing", "none", "--json"]) == 0
    res = _json.loads(capsys.readouterr().out)
    assert res["link_bytes"] == 2 * 4 * (1 + 500 + 2 + 500 + 3 + 4)
    assert main(["sim", "alltoall", "-n", "3", "--algo", "pairwise",
                 "--counts", "1,2"]) == 2
    assert "3 rows of 3 integers" in capsys.readouterr().err
    assert main(["algos", "-n", "4", "-c", "alltoall", "--json"]) == 0
    rows = {r["algorithm"]: r for r in _json.loads(capsys.readouterr().out)}
    assert rows["pairwise"]["vector"] and not rows["bruck"]["vector"]
