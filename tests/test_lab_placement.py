"""``polycast lab run --ranks-per-host R`` on a real lab (root): every rank's local rank
and size, node (torch's GROUP_RANK) and master address as the placement says; the ranks of
one host namespace are one host to the runtime (shared-memory rings between them, TCP to
the others, one offload process per host); the hierarchical algorithms exact. The lab has
unshaped host links and shaped uplinks (the uplink alone is a tbf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polycast.lab import LabPlan, netns
from netns import lab_plan

pytestmark = [pytest.mark.root, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "lab_placement_rank.py")


@pytest.fixture(scope="module")
def lab():
    with lab_plan(name=f"pct{os.getpid()}p", hosts=2, leaves=2, link="none",
                  uplink="500Mbps") as plan:
        yield plan


def _run(plan: LabPlan, *args: str, rank_args: tuple[str, ...] = ()) -> list[dict]:
    env = dict(os.environ, POLYCAST_TIMEOUT="30")
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "lab", "run", "--name",
                        plan.name, "--timeout", "90", *args, "--", sys.executable, RANK,
                        *rank_args],
                       env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if "PLACEMENT " in ln]
    assert line, p.stdout[-3000:]
    return json.loads(line[-1].split("PLACEMENT ", 1)[1])


def _check(plan: LabPlan, ranks: list[dict], nodes: list[int], R: int) -> None:
    assert [m["rank"] for m in ranks] == list(range(len(nodes) * R))
    for m in ranks:
        r, env = m["rank"], m["env"]
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == str(len(ranks))
        assert env["LOCAL_RANK"] == str(r % R) and env["LOCAL_WORLD_SIZE"] == str(R)
        assert m["polycast_local"] == [str(r % R), str(R)]
        assert env["GROUP_RANK"] == str(r // R) and env["GROUP_WORLD_SIZE"] == str(len(nodes))
        assert env["MASTER_ADDR"] == m["addr_master"] == plan.addr(nodes[0])
        assert m["mcast_error"] is None and all(m["exact"].values()), m
        for peer, how in m["transports"].items():
            same = int(peer) // R == r // R
            assert how == ("shm" if same else "tcp"), (r, peer, how)
            assert (ranks[int(peer)]["host_id"] == m["host_id"]) == same


def test_two_ranks_per_host_placed_and_exact(lab):
    """Nodes on hosts 1, 0 (so the master is host 1's address): ring, multicast and the
    hierarchical allgathers exact; only the uplinks shaped."""
    ranks = _run(lab, "--ranks-per-host", "2", "--placement", "1,0")
    _check(lab, ranks, [1, 0], 2)
    tbf = []
    for ns in lab.namespaces():
        for q in json.loads(netns.tc("-n", ns, "-j", "qdisc", "show").stdout or "[]"):
            if q.get("kind") == "tbf":
                tbf.append((ns, q["dev"]))
    assert sorted(tbf) == sorted((link.shape_ns, link.shape_dev) for link in lab.links()
                                 if link.layer == "leaf-spine")


def test_two_ranks_per_host_offloaded(lab):
    """Offload mode: local rank 0 of each host starts that host's offload process and its
    local peer attaches to it (both need the right local rank and size)."""
    _check(lab, _run(lab, "--ranks-per-host", "2", rank_args=("--offload",)), [0, 1], 2)


def test_bad_ranks_per_host_one_line_exit_2(lab):
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "lab", "run", "--name",
                        lab.name, "-n", "3", "--ranks-per-host", "2", "--", sys.executable,
                        RANK], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "multiple of 2" in p.stderr, p.stderr
