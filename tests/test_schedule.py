"""The schedule IR, the builder, the registry and traffic accounting."""

import dataclasses

import pytest

from polycast import Collective, InvalidArgument, ScheduleError, UnknownName, Unsupported
from polycast.algorithms import build, get, supported
from polycast.collectives import count_for_nbytes, parse_dtype
from polycast.schedule import Builder, Kind, Layout
from polycast.schedule.traffic import traffic
from polycast.schedule.verify import verify
from polycast.units import format_size, parse_rate, parse_size


# -- layouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("n,parts,sub", [(0, 1, 1), (7, 1, 3), (10, 4, 2), (3, 4, 3), (100, 7, 5)])
def test_layout_blocks_tile_the_buffer(n, parts, sub):
    lay = Layout(n, parts, sub)
    ranges = [lay.block_range(b) for b in range(lay.nblocks)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
        assert a1 == b0 and a0 <= a1
    sizes = [b - a for a, b in ranges]
    for p in range(parts):                       # pieces of one part differ by <= 1
        piece = sizes[p * sub:(p + 1) * sub]
        assert max(piece) - min(piece) <= 1


def test_layout_parts_align_with_shards():
    # recv of an allgather (P parts) cut like P copies of send: shard p starts at p*count
    count, P, k = 10, 3, 4
    send, recv = Layout(count, 1, k), Layout(P * count, P, k)
    for p in range(P):
        for s in range(k):
            a, b = send.block_range(s)
            assert recv.block_range(p * k + s) == (p * count + a, p * count + b)


def test_layout_runs_merge_adjacent_blocks():
    lay = Layout(12, 3, 2)
    assert lay.runs((0, 1, 2)) == [(0, 6)]
    assert lay.runs((0, 2)) == [(0, 2), (4, 6)]
    assert lay.nelems_of((0, 2)) == 4


# -- builder -------------------------------------------------------------------------------
def _builder(P=3):
    return Builder(Collective.ALLGATHER, P, 0, 6, "test",
                   {"send": Layout(6, 1, 2), "recv": Layout(6 * P, P, 2)})


def test_builder_infers_hazard_dependencies():
    b = _builder()
    r0 = b.recv(0, 1, "recv", (2,))          # writes block 2
    s0 = b.send(0, 2, "recv", (2,))          # reads it: RAW on r0
    w0 = b.recv(0, 2, "recv", (2,))          # writes again: WAW on r0, WAR on s0
    other = b.recv(0, 1, "recv", (4,))       # unrelated block: no deps
    prog = b._programs[0]
    assert prog[s0].deps == (r0,)
    assert prog[w0].deps == (r0, s0)
    assert prog[other].deps == ()


def test_builder_numbers_messages_per_pair():
    b = _builder()
    b.send(0, 1)
    b.send(0, 2)
    b.send(0, 1)
    b.recv(1, 0)
    b.recv(1, 0)
    b.recv(2, 0)
    s = b.build()
    assert [st.tag for st in s.program(0)] == [0, 0, 1]
    assert [st.tag for st in s.program(1)] == [0, 1]


@pytest.mark.parametrize("call,match", [
    (lambda b: b.send(0, 0), "bad rank pair"),
    (lambda b: b.send(0, 5), "bad rank pair"),
    (lambda b: b.send(0, 1, "recv", (99,)), "block 99"),
    (lambda b: b.send(0, 1, "nope", (0,)), "no layout"),
    (lambda b: b.send(0, 1, deps=(3,)), "not an earlier step"),
    (lambda b: b.copy(0, "send", (0, 1), "recv", (0,)), "2 source blocks"),
])
def test_builder_rejects_bad_steps(call, match):
    with pytest.raises(ScheduleError, match=match):
        call(_builder())


# -- registry ------------------------------------------------------------------------------
def test_registry_errors_name_the_choices():
    with pytest.raises(UnknownName, match="ring"):
        build("allgather", "nosuch", 4, 8)
    with pytest.raises(UnknownName, match="allgather"):
        build("allgathr", "ring", 4, 8)
    with pytest.raises(InvalidArgument, match="root 4 out of range"):
        build("allgather", "ring", 4, 8, root=4)
    with pytest.raises(InvalidArgument, match="count"):
        build("allgather", "ring", 4, -1)
    with pytest.raises(InvalidArgument, match="nchunks"):
        build("allgather", "ring", 4, 8, nchunks=0)
    with pytest.raises(InvalidArgument, match="takes no option"):
        build("allgather", "ring", 4, 8, roots=2)


def test_power_of_two_algorithms_say_so():
    for algo in (a for c in Collective for a in _algos(c) if a.power_of_two):
        with pytest.raises(Unsupported, match="power-of-two"):
            build(algo.collective, algo.name, 6, 12)
        assert algo.name not in supported(algo.collective, 6)


def _algos(c):
    from polycast.algorithms import algorithms
    return algorithms(c)


def test_every_collective_has_algorithms_and_registry_names_are_short_words():
    for c in Collective:
        names = [a.name for a in _algos(c)]
        assert names, f"no algorithm for {c}"
        for n in names:
            assert n.isidentifier() and n.islower() and len(n) <= 16
    assert get("allgather", "ring") and get("allgather", "mcast")


@pytest.mark.parametrize("channels", [2, 3])
def test_channels_split_every_part(channels):
    s = build("allgather", "ring", 5, 11, nchunks=2, channels=channels)
    verify(s)
    assert s.layouts["recv"].sub == 2 * channels
    base = build("allgather", "ring", 5, 11, nchunks=2)
    assert s.nsteps == channels * base.nsteps
    # channel instances are independent: bytes moved are the same
    assert traffic(s).max_sent == traffic(base).max_sent


def test_verifier_catches_a_dropped_receive():
    s = build("allgather", "ring", 4, 4)
    progs = list(s.programs)
    progs[1] = progs[1][:-1]
    with pytest.raises(ScheduleError, match="never matched"):
        verify(dataclasses.replace(s, programs=tuple(progs)))


# -- traffic -------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [2, 3, 8, 17])
def test_traffic_ring_vs_multicast_allgather(P):
    count, itemsize = 64, 4
    S = count * itemsize                                   # one shard
    ring = traffic(build("allgather", "ring", P, count), itemsize)
    mc = traffic(build("allgather", "mcast", P, count), itemsize)
    assert ring.sent_nbytes == ((P - 1) * S,) * P
    assert ring.recv_nbytes == ((P - 1) * S,) * P
    assert mc.sent_nbytes == (S,) * P
    assert mc.recv_nbytes == ((P - 1) * S,) * P
    assert ring.switch_link_nbytes * P == mc.switch_link_nbytes * 2 * (P - 1)
    assert ring.depth == P - 1
    assert ring.nbytes == mc.nbytes == P * S


# -- units and conventions -----------------------------------------------------------------
def test_units():
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1KB") == 1000
    assert parse_size("4096") == 4096
    assert format_size(64 << 20) == "64MiB"
    assert parse_rate("400Gbps") == 400e9
    assert parse_rate("1.6Tbit/s") == 1.6e12
    assert parse_rate("50GB/s") == 400e9
    for bad in ("64XB", "-3", "1.5"):
        with pytest.raises(InvalidArgument):
            parse_size(bad)
    with pytest.raises(InvalidArgument, match="Gbps"):
        parse_rate("fast")


def test_count_for_nbytes_and_dtypes():
    assert count_for_nbytes(Collective.ALLGATHER, 4, 64, 4) == 4
    assert count_for_nbytes(Collective.ALLREDUCE, 4, 64, 4) == 16
    with pytest.raises(InvalidArgument, match="multiple of 16 bytes"):
        count_for_nbytes(Collective.ALLGATHER, 4, 60, 4)
    assert parse_dtype("float16").itemsize == 2
    with pytest.raises(UnknownName, match="float32"):
        parse_dtype("str")
