"""polycast.lab.counters without a lab: the kernel's answers (``ip -s -j link show`` per leaf,
``tc -s -j qdisc show`` per shaping namespace) are written here from a plan, so each link's
bytes, packets and drops are known and every reading rule is checked: which end of a link
is counted in which direction, per-layer sums, differences, and the one-line LabError when
the answer is not what a lab gives. tests/test_lab.py reads a real lab (root, slow set)."""
import json
import subprocess

import pytest

from polycast.lab import counters
from polycast.lab.netns import LabError
from polycast.lab.plan import LabPlan


def _plan(**kw):
    return LabPlan.parse(name="cnt", hosts=4, leaves=2, link="1Gbps", **kw)


class FakeKernel:
    """Answers ``ip``/``tc`` as the kernel would for ``plan``, with link i's counter set to
    (1000 * (i + 1) bytes, i + 1 packets) and shaped link i's tbf drops to 10 * i."""

    def __init__(self, plan, scale=1):
        self.plan, self.scale, self.calls = plan, scale, []
        self.links = plan.links()

    def want(self, i):
        return 1000 * (i + 1) * self.scale, (i + 1) * self.scale

    def ip(self, *args, check=True):
        self.calls.append(("ip",) + args)
        assert args[0] == "-n" and args[2:] == ("-s", "-j", "link", "show")
        devs = {}
        for i, ln in enumerate(self.links):
            if ln.count_ns != args[1]:
                continue
            nbytes, packets = self.want(i)
            st = devs.setdefault(ln.count_dev, {"rx": {"bytes": 7, "packets": 7},
                                                 "tx": {"bytes": 7, "packets": 7}})
            st[ln.count_dir] = {"bytes": nbytes, "packets": packets}
        doc = [{"ifname": "lo", "stats64": {}}]
        doc += [{"ifname": d, "stats64": st} for d, st in devs.items()]
        return subprocess.CompletedProcess(["ip"], 0, json.dumps(doc), "")

    def tc(self, *args, check=True):
        self.calls.append(("tc",) + args)
        doc = [{"kind": "noqueue", "dev": "lo"}]
        doc += [{"kind": "tbf", "dev": ln.shape_dev, "drops": 10 * i}
                for i, ln in enumerate(self.links) if ln.shape_ns == args[1] and ln.rate_bps]
        return subprocess.CompletedProcess(["tc"], 0, json.dumps(doc), "")


@pytest.fixture
def kernel(monkeypatch):
    def install(plan, scale=1):
        k = FakeKernel(plan, scale)
        monkeypatch.setattr(counters, "ip", k.ip)
        monkeypatch.setattr(counters, "tc", k.tc)
        return k
    return install


def test_each_link_is_read_from_its_counting_end_and_direction(kernel):
    plan = _plan()
    k = kernel(plan)
    snap = counters.read(plan, drops=True)
    links = plan.links()
    assert len(links) == 2 * 4 + 2 * 2                     # hosts up/down, leaves up/down
    for i, ln in enumerate(links):
        assert (snap.nbytes[ln.name], snap.packets[ln.name]) == k.want(i), ln.name
        assert snap.drops[ln.name] == 10 * i
    assert [c[2] for c in k.calls if c[0] == "ip"] == ["cnt-leaf0", "cnt-leaf1"]   # one per leaf
    assert snap.cpu_total >= snap.cpu_busy >= 0


def test_a_run_is_the_difference_of_two_snapshots_summed_per_layer(kernel):
    plan = _plan()
    kernel(plan)
    before = counters.read(plan)
    kernel(plan, scale=3)
    after = counters.read(plan)
    moved = counters.diff(after, before)
    links = plan.links()
    for i, ln in enumerate(links):
        assert moved.nbytes[ln.name] == 2000 * (i + 1) and moved.packets[ln.name] == 2 * (i + 1)
    layers = counters.by_layer(plan, moved)
    want = {"host-leaf": 0, "leaf-spine": 0}
    for i, ln in enumerate(links):
        want[ln.layer] += 2000 * (i + 1)
    assert layers == want
    one = LabPlan.parse(name="cnt", hosts=2, leaves=1, link="1Gbps")
    assert set(counters.by_layer(one, counters.Snapshot())) == {"host-leaf"}   # no spine


def test_unshaped_links_have_no_drops_to_read(kernel):
    plan = LabPlan.parse(name="cnt", hosts=4, leaves=2, link=None, uplink="1Gbps")
    k = kernel(plan)
    drops = counters.qdisc_drops(plan)
    assert set(drops) == {ln.name for ln in plan.links() if ln.rate_bps}
    assert drops and all(ln.layer == "leaf-spine" for ln in plan.links() if ln.name in drops)
    assert not [c for c in k.calls if c[0] == "tc" and c[2].endswith(("-h0", "-h1"))]


def test_busy_cores_is_the_share_of_the_machine_between_snapshots():
    a = counters.Snapshot(cpu_busy=100, cpu_total=400)
    b = counters.Snapshot(cpu_busy=300, cpu_total=800)
    ncpu = counters.os.cpu_count() or 1
    assert b.busy_cores(a) == pytest.approx(0.5 * ncpu)
    assert a.busy_cores(a) == 0.0                          # no time passed: nothing measured


def test_an_answer_a_lab_does_not_give_is_one_labError(kernel, monkeypatch):
    plan = _plan()
    k = kernel(plan)
    missing = plan.links()[0]
    real_ip = k.ip

    def without_a_device(*args, check=True):
        doc = [d for d in json.loads(real_ip(*args).stdout) if d["ifname"] != missing.count_dev]
        return subprocess.CompletedProcess(["ip"], 0, json.dumps(doc), "")

    monkeypatch.setattr(counters, "ip", without_a_device)
    with pytest.raises(LabError, match=f"device {missing.count_dev} missing in "
                                       f"{missing.count_ns}: is the lab intact"):
        counters.read(plan)
    monkeypatch.setattr(counters, "ip", lambda *a, **kw: subprocess.CompletedProcess(
        ["ip"], 0, "not json", ""))
    with pytest.raises(LabError, match="cannot read link counters in cnt-leaf0"):
        counters.read(plan)
    monkeypatch.setattr(counters, "tc", lambda *a, **kw: subprocess.CompletedProcess(
        ["tc"], 0, "[{\"kind\": \"tbf\"}]", ""))
    with pytest.raises(LabError, match="cannot read qdisc counters in cnt-"):
        counters.qdisc_drops(plan)


def test_the_link_table_shows_each_link_and_each_layers_total(kernel):
    from polycast.cli.lab import _link_table
    plan = _plan()
    kernel(plan)
    snap = counters.read(plan)
    drops = counters.qdisc_drops(plan)
    lines = _link_table(plan, snap, drops).splitlines()
    links = plan.links()
    assert lines[0].split() == ["link", "layer", "rate", "bytes", "packets", "drops"]
    assert len(lines) == 1 + len(links) + 2                # a row per link, a total per layer
    for i, (ln, row) in enumerate(zip(links, lines[1:])):
        cells = row.split()
        assert cells[0] == ln.name and cells[1] == ln.layer
        assert cells[3:] == [f"{1000 * (i + 1):,d}", f"{i + 1:,d}", str(10 * i)]
    assert lines[-2].split()[:2] == ["total", "host-leaf"]
    assert lines[-1].split()[-1] == f"{counters.by_layer(plan, snap)['leaf-spine']:,d}"
    no_drops = _link_table(plan, snap, None).splitlines()
    assert "drops" not in no_drops[0] and len(no_drops[1].split()) == 5


def test_lab_run_refuses_nothing_to_run_and_a_bad_timeout_before_any_work():
    import argparse
    from polycast import InvalidArgument
    from polycast.cli.lab import _run
    args = argparse.Namespace(command=["--"], timeout=None, name="cnt")
    with pytest.raises(InvalidArgument, match="nothing to run"):
        _run(args)
    args = argparse.Namespace(command=["--", "true"], timeout=0, name="cnt")
    with pytest.raises(InvalidArgument, match="--timeout 0: must be > 0 seconds"):
        _run(args)


def test_links_faster_than_the_cores_can_feed_get_a_note(capsys):
    from polycast.cli.lab import HOST_TRAFFIC_BPS_PER_CORE, _cpu_note
    ncpu = counters.os.cpu_count() or 1
    fast = LabPlan.parse(name="cnt", hosts=16, leaves=2, link="10Gbps")
    assert 16 * 10e9 / HOST_TRAFFIC_BPS_PER_CORE > 0.75 * ncpu or ncpu > 200
    _cpu_note(fast)
    err = capsys.readouterr().err
    assert err.startswith("note: 16 hosts x 10 Gbit/s would need about") and "lower --link" in err
    _cpu_note(LabPlan.parse(name="cnt", hosts=2, leaves=1, link="1Mbps"))
    _cpu_note(LabPlan.parse(name="cnt", hosts=2, leaves=1, link=None))
    assert capsys.readouterr().err == ""
