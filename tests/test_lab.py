"""polycast lab: the plan (pure), bad input (one line, exit 2, before any work), and — as
root — a real leaf-spine lab brought up, every multicast collective run on it (paced, and
with loss from overflowing switch buffers), torn down, with nothing left behind; a crashed
``up`` cleaned by ``down``; a failed ``up`` leaving nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polycast.cli.main import main as cli_main
from polycast.errors import InvalidArgument
from polycast.lab import LabError, LabPlan, netns, runner

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


# -- the plan ---------------------------------------------------------------------------------

def test_plan_leaf_spine_shape_and_links():
    p = LabPlan.parse(name="x", hosts=8, leaves=2, link="1Gbps", uplink="4:1")
    assert p.hosts_per_leaf == 4 and p.uplink_rate_bps == 1e9 and p.oversub == 4.0
    assert LabPlan.parse(name="x", hosts=8, leaves=2, link="1Gbps").oversub == 1.0
    assert p.namespaces()[:3] == ["x-spine", "x-leaf0", "x-leaf1"]
    assert [p.leaf_of(k) for k in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    links = p.links()
    assert len(links) == 2 * 8 + 2 * 2
    assert len({l.name for l in links}) == len(links)
    by = {l.name: l for l in links}
    assert by["h5->leaf1"].shape_ns == "x-h5" and by["h5->leaf1"].count_dir == "rx"
    assert by["spine->leaf0"].shape_ns == "x-spine" and by["spine->leaf0"].rate_bps == 1e9
    flat = LabPlan.parse(name="y", hosts=3, leaves=1, link=None)
    assert flat.namespaces() == ["y-leaf0", "y-h0", "y-h1", "y-h2"]
    assert {l.layer for l in flat.links()} == {"host-leaf"}


def test_plan_sim_topology_is_the_same_network():
    p = LabPlan.parse(name="x", hosts=8, leaves=2, link="100Mbps", uplink="4:1")
    topo = p.sim_topology(latency_s=1e-5)
    assert topo.nranks == 8 and topo.host_link_bw == 100e6 / 8
    links, lat = topo.route(0, 7)
    assert [topo.link_layer[l] for l in links] == ["host-leaf", "leaf-spine", "leaf-spine",
                                                    "host-leaf"]
    assert [topo.link_bw[l] for l in links] == [12.5e6] * 4         # 4:1: uplink = one link
    assert lat == pytest.approx(4e-5)
    tree, _ = topo.mcast_tree(0)     # up to the leaf, 3 local hosts, up, down, 4 hosts
    assert sorted(topo.link_layer[l] for l in tree).count("leaf-spine") == 2
    assert len(tree) == 1 + 3 + 2 + 4


def test_plan_sim_topology_several_ranks_per_host():
    """R rank slots per host joined through a host node (the lab's shared-memory rings);
    the hierarchical algorithms simulate on it; unshaped host links need a stand-in rate."""
    from polycast.algorithms import build
    from polycast.sim.driver import SimConfig, Simulation
    p = LabPlan.parse(name="x", hosts=4, leaves=2, link="100Mbps", uplink="2:1")
    topo = p.sim_topology(ranks_per_host=2, intra_host_bps=8e9)
    assert topo.nranks == 8 and topo.ranks_per_host == 2
    assert [topo.link_layer[l] for l in topo.route(0, 1)[0]] == ["intra-host"] * 2
    assert [topo.link_layer[l] for l in topo.route(1, 7)[0]] == [
        "intra-host", "host-leaf", "leaf-spine", "leaf-spine", "host-leaf", "intra-host"]
    sim = Simulation(topo, SimConfig(engine={"line_rate_gbps": 0.1}))
    req = sim.post(build("allgather", "hring", 8, 1 << 16, hosts=4, ranks_per_host=2), 4)
    sim.run()
    assert sim.completion_time(req) > 0
    with pytest.raises(InvalidArgument, match="intra_host_bps"):
        p.sim_topology(ranks_per_host=2)
    unshaped = LabPlan.parse(name="x", hosts=4, leaves=2, link="none", uplink="100Mbps")
    with pytest.raises(InvalidArgument, match="unshaped"):
        unshaped.sim_topology()
    up = unshaped.sim_topology(link_bps=1e9)
    assert {up.link_bw[l] for l in range(len(up.link_bw))
            if up.link_layer[l] == "leaf-spine"} == {100e6 / 8}


@pytest.mark.parametrize("kw,msg", [
    ({"link": "fast"}, "--link"),
    ({"uplink": "4:0"}, "oversubscription"),
    ({"uplink": "slow"}, "--uplink"),
    ({"hosts": 5, "leaves": 4}, "do not fill"),
    ({"hosts": 0}, "--hosts"),
    ({"leaves": 1, "uplink": "1Gbps"}, "--leaves >= 2"),
    ({"mtu": 100}, "--mtu"),
    ({"mtu": "big"}, "--mtu"),
    ({"name": "Bad-Name"}, "lab name"),
    ({"buffer": "forever"}, "time"),
])
def test_plan_bad_input(kw, msg):
    with pytest.raises(InvalidArgument, match=msg):
        LabPlan.parse(**{"name": "x", **kw})


def test_placements():
    p = LabPlan.parse(name="x", hosts=8, leaves=2, link="1Gbps")

    def hosts(*a):
        return runner.placement(p, *a).hosts
    assert hosts("linear") == list(range(8))
    assert hosts("interleave") == [0, 4, 1, 5, 2, 6, 3, 7]
    assert sorted(hosts("random:3")) == list(range(8))
    assert hosts("7,6,5,4,3,2,1,0") == [7, 6, 5, 4, 3, 2, 1, 0]
    assert hosts(None, 3) == [0, 1, 2]
    for bad in ("0,0,1,2,3,4,5,6", "spread", "random:x", "0,1"):
        with pytest.raises(InvalidArgument):
            runner.placement(p, bad)


def test_placements_several_ranks_per_host():
    """R consecutive ranks per host (block distribution); the spec orders the nodes."""
    p = LabPlan.parse(name="x", hosts=4, leaves=2, link="1Gbps")
    where = runner.placement(p, "interleave", None, 2)
    assert where.nranks == 8 and where.nodes == (0, 2, 1, 3)
    assert where.hosts == [0, 0, 2, 2, 1, 1, 3, 3]
    assert runner.placement(p, "3,1", 4, 2).hosts == [3, 3, 1, 1]
    assert runner.placement(p, None, None, 4).hosts == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    for args, msg in (((None, 5, 2), "multiple of 2"), ((None, 10, 2), "4 hosts x 2"),
                      (("0,1,2", 4, 2), "2 distinct hosts"), ((None, None, 0), "ranks-per-host"),
                      (("1,1", 4, 2), "distinct")):
        with pytest.raises(InvalidArgument, match=msg):
            runner.placement(p, *args)


def test_placement_env_per_rank(monkeypatch):
    """Each rank's local rank and size, node (torch's GROUP_RANK) and master address: node
    0's host, whichever host that is."""
    monkeypatch.delenv("POLYCAST_PACING_GBPS", raising=False)
    p = LabPlan.parse(name="x", hosts=4, leaves=2, link="1Gbps")
    where = runner.placement(p, "3,1", 4, 2)
    envs = [where.env(p, r) for r in range(where.nranks)]
    assert [e["POLYCAST_LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["POLYCAST_LOCAL_SIZE"] for e in envs} == {e["LOCAL_WORLD_SIZE"] for e in envs} \
        == {"2"}
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {e["POLYCAST_MASTER_ADDR"] for e in envs} \
        == {p.addr(3)}


def test_placement_env_paces_unless_the_user_chose(monkeypatch):
    """The lab paces multicast at half the host link by default; a value the user set,
    the empty string ("unpaced") included, is theirs (an unpaced run must stay unpaced).
    Unshaped host links get no default."""
    p = LabPlan.parse(name="x", hosts=2, leaves=1, link="1Gbps")
    where = runner.placement(p, None)
    monkeypatch.delenv("POLYCAST_PACING_GBPS", raising=False)
    assert where.env(p, 0)["POLYCAST_PACING_GBPS"] == "0.5"
    unshaped = LabPlan.parse(name="x", hosts=2, leaves=1, link="none")
    assert "POLYCAST_PACING_GBPS" not in where.env(unshaped, 0)
    for chosen in ("", "0.25"):
        monkeypatch.setenv("POLYCAST_PACING_GBPS", chosen)
        assert "POLYCAST_PACING_GBPS" not in where.env(p, 1)


def test_plan_uplink_shaped_alone():
    """Unshaped host links with a shaped uplink: the uplink is the only tbf; a ratio still
    needs a host link rate."""
    p = LabPlan.parse(name="x", hosts=8, leaves=2, link="none", uplink="500Mbps")
    assert p.shaped and p.uplink_rate_bps == 5e8 and p.oversub == float("inf")
    shaped = {l.name: l.rate_bps for l in p.links() if l.rate_bps is not None}
    assert shaped == {"leaf0->spine": 5e8, "spine->leaf0": 5e8, "leaf1->spine": 5e8,
                      "spine->leaf1": 5e8}
    assert "uplinks 500Mbps (the only shaped links)" in p.describe()
    assert not LabPlan.parse(name="x", hosts=2, leaves=2, link="none").shaped
    with pytest.raises(InvalidArgument, match="give the uplink a rate"):
        LabPlan.parse(name="x", hosts=8, leaves=2, link="none", uplink="4:1")


# -- bad input through the CLI: one line, exit 2, nothing made -------------------------------

@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = str(tmp_path / "state")
    monkeypatch.setattr(netns, "STATE_DIR", d)
    return d


@pytest.mark.parametrize("argv,msg", [
    (["lab", "up", "--link", "fast"], "--link"),
    (["lab", "up", "--hosts", "6", "--leaves", "4"], "do not fill"),
    (["lab", "up", "--uplink", "x:1"], "oversubscription"),
    (["lab", "run", "--name", "nosuchlab", "--", "python", "-c", "1"], "no lab named"),
    (["lab", "down", "--name", "nosuchlab"], "no lab named"),
    (["lab", "run", "--name", "nosuchlab"], "nothing to run"),
    (["lab", "up", "--link", "none", "--uplink", "4:1"], "give the uplink a rate"),
])
def test_cli_bad_input_one_line_exit_2(argv, msg, state_dir, capsys):
    if os.geteuid() != 0 and argv[1] == "down":
        msg = "needs root"
    before = set(netns.existing_namespaces()) if os.geteuid() == 0 else set()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polycast lab: error:") and msg in err[0], err
    assert not os.path.exists(state_dir) or not netns.labs_up(state_dir)
    if os.geteuid() == 0:
        assert set(netns.existing_namespaces()) <= before


def test_cli_not_root_and_tools_missing(state_dir, capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli_main(["lab", "up", "--hosts", "2", "--leaves", "1"]) == 2
    assert "needs root" in capsys.readouterr().err
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = netns.shutil.which
    monkeypatch.setattr(netns.shutil, "which", lambda x: None if x == "tc" else real_which(x))
    assert cli_main(["lab", "up", "--hosts", "2", "--leaves", "1"]) == 2
    assert "`tc` is not installed" in capsys.readouterr().err
    monkeypatch.setattr(netns.shutil, "which", lambda x: None)
    assert cli_main(["lab", "down"]) == 2
    assert "`ip` is not installed" in capsys.readouterr().err
    assert not netns.labs_up(state_dir)


# -- real labs (root) ---------------------------------------------------------------------------

_REASON = netns.unavailable_reason()
root = pytest.mark.skipif(_REASON is not None or os.environ.get("POLYCAST_NO_NETNS") == "1",
                          reason=f"lab unavailable: {_REASON}")


def _name(tag: str) -> str:
    return f"pct{os.getpid()}{tag}"


def _ours(name: str) -> list[str]:
    return [ns for ns in netns.existing_namespaces() if ns.startswith(name + "-")]


def _run_selftest(name: str, **extra) -> list[dict]:
    """The mcast selftest on every host of lab ``name``; per-rank engine stats."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "lab", "run", "--name", name,
                        "--timeout", "60", "--", sys.executable, "-m", "polycast.tools.selftest",
                        "--suite", "mcast"], env={**env, **extra}, capture_output=True,
                       text=True, timeout=90)
    out = p.stdout
    assert p.returncode == 0, out[-3000:] + p.stderr[-2000:]
    oks = [ln for ln in out.splitlines() if "SELFTEST mcast OK" in ln]
    assert len(oks) == 4 and all("mcast=yes" in ln and "transports=tcp" in ln for ln in oks), out
    return [json.loads(ln.split("MCAST_STATS ", 1)[1]) for ln in out.splitlines()
            if "MCAST_STATS " in ln]


@root
@pytest.mark.root
@pytest.mark.slow
def test_lab_up_every_mcast_collective_paced_and_lossy_then_down():
    """4 hosts on 2 leaves (uplinks 4:1), every port's queue 1 ms of its rate (a few frames).
    Paced, every multicast algorithm is exact and crosses the spine; unpaced, a sender's
    burst overflows the queues (real drops, counted by tbf) and the recovery still gives
    exact results. ``down`` leaves nothing."""
    from polycast.lab import counters
    name = _name("a")
    assert cli_main(["lab", "up", "--name", name, "--hosts", "4", "--leaves", "2",
                     "--link", "100Mbps", "--uplink", "4:1", "--buffer", "1ms"]) == 0
    try:
        plan = netns.current(name)
        assert len(_ours(name)) == 7
        # A second `up` of the same lab is a clear error and changes nothing.
        with pytest.raises(LabError, match="already up"):
            netns.up(plan)
        before = counters.read(plan)
        stats = _run_selftest(name)
        moved = counters.by_layer(plan, counters.diff(counters.read(plan), before))
        assert moved["leaf-spine"] > 4 * 1_000_000 and moved["host-leaf"] > moved["leaf-spine"]
        drops0 = sum(counters.qdisc_drops(plan).values())
        # Unpaced: bursts at memory speed into 100 Mbit/s links with 1 ms queues.
        lossy = _run_selftest(name, POLYCAST_PACING_GBPS="")
        drops = sum(counters.qdisc_drops(plan).values()) - drops0
        assert drops > 0, "no queue overflowed: the lossy run tested nothing"
        assert sum(s["recovered_bytes"] for s in lossy) > 0
        assert sum(s["failed"] for s in stats + lossy) == 0
        # A rank a crashed `lab run` left behind in a host: `down` ends it.
        orphan = subprocess.Popen(["ip", "netns", "exec", plan.host_ns(1), "sleep", "120"],
                                  start_new_session=True)
    finally:
        assert cli_main(["lab", "down", "--name", name]) == 0
    assert orphan.wait(timeout=10) == -9
    assert _ours(name) == [] and netns.read_state(name) is None


@root
@pytest.mark.root
def test_names_taken_and_failed_build_leave_nothing(monkeypatch):
    name = _name("b")
    foreign = f"{name}-h1"                 # someone else's namespace with one of our names
    netns.ip("netns", "add", foreign)
    try:
        with pytest.raises(LabError, match="already taken"):
            netns.up(LabPlan.parse(name=name, hosts=2, leaves=1, link="100Mbps"))
        assert _ours(name) == [foreign] and netns.read_state(name) is None   # untouched
    finally:
        netns.ip("netns", "del", foreign)
    # A build failing half-way (here: tc refuses) removes what it made and its state.
    real = netns.shape

    def failing(ns, dev, *a, **k):
        if dev == "h1":
            raise LabError("tc: simulated failure")
        return real(ns, dev, *a, **k)
    monkeypatch.setattr(netns, "shape", failing)
    with pytest.raises(LabError, match="nothing left behind"):
        netns.up(LabPlan.parse(name=name, hosts=2, leaves=1, link="100Mbps"))
    assert _ours(name) == [] and netns.read_state(name) is None


@root
@pytest.mark.root
def test_down_after_a_crash_mid_build():
    """The process building a lab is SIGKILLed half-way: the state file recorded what was
    made, and `lab down` removes exactly that."""
    name = _name("c")
    code = ("import os, signal\n"
            "from polycast.lab import netns, LabPlan\n"
            "real = netns.shape\n"
            "def shape(ns, dev, *a, **k):\n"
            "    if dev == 'h1': os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return real(ns, dev, *a, **k)\n"
            "netns.shape = shape\n"
            f"netns.up(LabPlan.parse(name={name!r}, hosts=3, leaves=1, link='100Mbps'))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    state = netns.read_state(name)
    assert state["status"] == "building" and len(_ours(name)) == 4
    assert sorted(_ours(name)) == sorted(state["namespaces"])
    assert cli_main(["lab", "down", "--name", name]) == 0
    assert _ours(name) == [] and netns.read_state(name) is None


@root
@pytest.mark.root
@pytest.mark.slow
def test_every_mcast_collective_with_injected_faults():
    """The runtime's fault hook (POLYCAST_FAULTS: loss, duplicates, reordering, replays
    where datagrams are read) on every host of a 2-leaf lab: every multicast collective
    still exact, and the recovery really ran."""
    import importlib.util
    if importlib.util.find_spec("polycast.runtime.transport.faults") is None:
        pytest.skip("the runtime's POLYCAST_FAULTS hook (polycast.runtime.transport.faults) is not in "
                    "this tree")
    name = _name("f")
    netns.up(LabPlan.parse(name=name, hosts=4, leaves=2, link="200Mbps", uplink="2:1"))
    try:
        stats = _run_selftest(name, POLYCAST_FAULTS="loss=0.05,dup=0.02,reorder=0.05,seed=3")
        assert sum(s["recovered_bytes"] for s in stats) > 0
        assert sum(s["failed"] for s in stats) == 0
    finally:
        netns.down(name)
    assert _ours(name) == [] and netns.read_state(name) is None
