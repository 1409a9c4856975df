"""Faults only a network has, on a real lab (root, slow): while every rank runs multicast
and ring collectives in a loop, an uplink is set down and brought back a second later
(``ip link set ... down/up``: unicast and multicast between the leaves both stop), or the
switch stops forwarding multicast to one host for a second (its leaf port's mcast_flood
off: that host's receive path loses every datagram meanwhile). Every rank ends exact or
raises a clear polycast error within the timeout; nothing hangs; nothing is left behind
(no process in the lab's namespaces, no shared memory of the job, no namespace)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from polycast.lab import LabPlan, netns
from netns import lab_plan

pytestmark = [pytest.mark.root, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "lab_fault_rank.py")
RUN_S = 90                       # lab run --timeout: a hang ends here (status 124)
OP_TIMEOUT_S = 20                # POLYCAST_TIMEOUT: each collective's bound


@pytest.fixture(scope="module")
def lab():
    with lab_plan(name=f"pct{os.getpid()}q", hosts=4, leaves=2, link="200Mbps",
                  uplink="2:1") as plan:
        yield plan


def _run_with_fault(plan: LabPlan, fault, restore, outage_s: float = 1.0) -> list[dict]:
    """Start the loop on every host, break the network once it runs, restore it
    ``outage_s`` later; return every rank's result."""
    env = dict(os.environ, POLYCAST_TIMEOUT=str(OP_TIMEOUT_S))
    p = subprocess.Popen([sys.executable, "-m", "polycast.cli.main", "lab", "run", "--name",
                          plan.name, "--timeout", str(RUN_S), "--", sys.executable, RANK, "6",
                          str(4 << 20)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in p.stdout], daemon=True)
    reader.start()
    out, broke = [], False
    deadline = time.monotonic() + RUN_S + 30
    try:
        while time.monotonic() < deadline and (p.poll() is None or not lines.empty()):
            try:
                ln = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            out.append(ln)
            if "LOOP STARTED" in ln and not broke:
                time.sleep(0.5)                 # mid-collective: the loop is running
                fault()
                broke = True
                try:
                    time.sleep(outage_s)
                finally:
                    restore()
        status = p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()                            # our own child, by pid
            p.wait(10)
        restore()
    text = "".join(out)
    assert broke, text[-3000:]
    assert status != 124, "a rank hung: " + text[-4000:]
    results = [json.loads(ln.split("RESULT ", 1)[1]) for ln in out if "RESULT " in ln]
    assert len(results) == plan.hosts, text[-4000:]
    for res in results:
        if res["error"] is None:
            assert res["exact"] == res["iterations"] > 0, res
        else:      # a polycast error (the rank catches only those) naming what failed
            assert res["error"].split(":", 1)[1].strip(), res
    # nothing left behind: no process in the hosts, no shared memory of the job
    for k in range(plan.hosts):
        pids = netns.ip("netns", "pids", plan.host_ns(k), check=False).stdout.split()
        assert pids == [], (plan.host_ns(k), pids)
    job = results[0]["job_id"]
    assert not [f for f in os.listdir("/dev/shm") if job in f]
    return results


def test_uplink_down_mid_collective_and_back(lab):
    """leaf0's uplink down for a second: the two leaves cannot reach each other (TCP
    retransmits, multicast datagrams are lost and recovered)."""
    ns = lab.leaf_ns(0)
    res = _run_with_fault(lab, lambda: netns.ip("-n", ns, "link", "set", "uplink", "down"),
                          lambda: netns.ip("-n", ns, "link", "set", "uplink", "up"))
    assert all(r["error"] is None for r in res), res
    assert sum(r["recovered_bytes"] for r in res) > 0, "the outage cost no datagram"


def test_a_hosts_multicast_cut_for_a_second(lab):
    """The switch stops forwarding multicast to host 2 for a second (unicast goes on): it
    pulls what it missed from its successor."""
    import shutil
    if shutil.which("bridge") is None:
        pytest.skip("iproute2's `bridge` is not installed (it cuts a switch port's multicast)")
    ns, port = lab.leaf_ns(lab.leaf_of(2)), "h2"

    def flood(on: str):
        return lambda: netns._run(["bridge", "-n", ns, "link", "set", "dev", port,
                                   "mcast_flood", on])
    res = _run_with_fault(lab, flood("off"), flood("on"))
    assert all(r["error"] is None for r in res), res
    assert [r for r in res if r["rank"] == 2][0]["recovered_bytes"] > 0, res
