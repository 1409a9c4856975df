"""torch across hosts (root, slow): `polycast lab run` gives torch the variables of the
placement (MASTER_ADDR = rank 0's host, LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK, gloo's
interface), so DDP, FSDP1 and FSDP2 — with ring and multicast all-gathers — train across 4
hosts on 2 leaves with the losses of the same job on one host; a MASTER_ADDR no other host
can reach is refused before any rank starts, naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polycast.errors import InvalidArgument
from netns import lab_plan
from torch_helpers import ROOT, env, needs_torch, polycast_run, results

pytestmark = [needs_torch, pytest.mark.root, pytest.mark.slow]
REL = 1e-6


@pytest.fixture(scope="module")
def lab():
    with lab_plan(name=f"pctt{os.getpid() % 10000}", hosts=4, leaves=2,
                  link="1Gbps") as plan:
        yield plan


def test_ddp_fsdp_across_hosts_equal_one_host(lab, tmp_path):
    worker = ROOT / "tests" / "torch_train_worker.py"
    across = tmp_path / "lab"
    across.mkdir()
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "lab", "run", "--name",
                        lab.name, "-n", "4", "--timeout", "800", "--", sys.executable,
                        str(worker)], env=env(RESULT_DIR=across, POLYCAST_TIMEOUT=60),
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    got = results(across)
    assert p.returncode == 0 and len(got) == 4, p.stdout[-3000:] + p.stderr[-3000:]
    one = tmp_path / "one"
    one.mkdir()
    q = polycast_run(4, worker, timeout=900, RESULT_DIR=one)
    ref = results(one)
    assert q.returncode == 0 and len(ref) == 4, q.stdout[-3000:] + q.stderr[-3000:]
    for r, h in zip(got, ref):
        assert r["mcast_error"] is None, r["mcast_error"]
        assert r["mcast_datagrams_out"] > 0                # multicast between the hosts
        assert set(r["runs"]) == set(h["runs"]) >= {"ddp/ring", "fsdp2/ring", "fsdp2/mcast",
                                                    "fsdp1/mcast"}
        for name, losses in r["runs"].items():
            for a, b in zip(losses, h["runs"][name]):      # across hosts = one host
                assert abs(a - b) <= REL * abs(b), (name, losses, h["runs"][name])
            for a, b in zip(losses, r["runs"][name.split("/")[0] + "/gloo"]):
                assert abs(a - b) <= REL * abs(b), (name, losses)


def test_master_addr_no_other_host_reaches_is_refused_first(lab):
    from polycast.lab import runner
    for addr, words in (("127.0.0.1", "loopback"), (lab.addr(2), "not an address of rank 0")):
        with pytest.raises(InvalidArgument, match=words) as e:
            runner.run([sys.executable, "-c", "raise SystemExit(3)"], name=lab.name,
                       nranks=4, extra_env={"MASTER_ADDR": addr})
        assert addr in str(e.value)
