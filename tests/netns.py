"""An emulated LAN of H "hosts" for multi-host runtime tests, made by :mod:`polycast.lab`
(the one implementation of namespaces, bridges, shaped veths and their cleanup).

A one-leaf lab (no spine)::

    <tag>-h0 (eth0 10.77.0.1/24) --veth-- h0 \\
    <tag>-h1 (eth0 10.77.0.2/24) --veth-- h1  }- br0 (in <tag>-leaf0, multicast snooping off)
    ...                                      /

``lan(..., leaves=2, uplink=...)`` makes a leaf-spine one. Each host namespace has ``lo``
up and (unless ``mcast_route=False``) a route for 224.0.0.0/4 on eth0, so UDP multicast
with TTL 1 crosses the bridges. With ``rate_mbit`` every link is shaped by ``tbf`` in both
directions.

The tag holds the pid and a counter, so parallel runs never collide; :meth:`Lan.close`
kills what was started in the namespaces (by pid) and removes the lab (``lab down``:
exactly the namespaces its state file records). Use :func:`lan` (a context manager) so
that happens on failure too; labs of test runs killed outright are reaped by the next.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys

from polycast.lab import LabPlan, netns as labnet

_counter = itertools.count()
TAG_PREFIX = "pct"


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no ``ip``, no kernel support)."""


def unavailable_reason(shaped: bool = False) -> str | None:
    """Why an emulated LAN cannot be made here, or None when it can."""
    reason = labnet.unavailable_reason(shaped=shaped)
    if reason:
        return reason
    name = f"pcprobe{os.getpid()}x{next(_counter)}"
    p = labnet.ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    labnet.ip("netns", "del", name, check=False)
    return None


class Lan:
    """A lab that is up, and the processes a test started in it."""

    def __init__(self, plan: LabPlan) -> None:
        self.plan = plan
        self.procs: list[subprocess.Popen] = []
        self._up = False

    @property
    def tag(self) -> str:
        return self.plan.name

    @property
    def nhosts(self) -> int:
        return self.plan.hosts

    def host(self, k: int) -> str:
        return self.plan.host_ns(k)

    @staticmethod
    def addr(k: int) -> str:
        return LabPlan.addr(k)

    def build(self) -> None:
        labnet.up(self.plan)
        self._up = True

    def exec_argv(self, k: int) -> list[str]:
        """Prefix that runs a command on host ``k``."""
        return ["ip", "netns", "exec", self.host(k)]

    def popen(self, k: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` on host ``k`` (tracked: :meth:`close` kills it if still alive)."""
        p = subprocess.Popen(self.exec_argv(k) + argv, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def link_stats(self, k: int) -> dict[str, int]:
        """Counters of host ``k``'s eth0: tx/rx bytes and packets, rx multicast packets."""
        out = labnet.ip("-n", self.host(k), "-s", "-j", "link", "show", "dev", "eth0").stdout
        st = json.loads(out)[0]["stats64"]
        return {"tx_bytes": st["tx"]["bytes"], "tx_packets": st["tx"]["packets"],
                "rx_bytes": st["rx"]["bytes"], "rx_packets": st["rx"]["packets"],
                "rx_multicast": st["rx"].get("multicast", 0)}

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)    # our own session, by its pid
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
        if self._up:
            self._up = False
            labnet.down(self.plan.name)


@contextlib.contextmanager
def lan(nhosts: int, rate_mbit: float | None = None, mcast_route: bool = True,
        leaves: int = 1, uplink: str | None = None, mtu: int = 1500):
    """An emulated LAN of ``nhosts`` hosts, removed on exit (also on failure). Raises
    :class:`NetnsUnavailable` when namespaces cannot be made here."""
    reason = unavailable_reason(shaped=bool(rate_mbit))
    if reason:
        raise NetnsUnavailable(reason)
    labnet.reap_stale(TAG_PREFIX)
    plan = LabPlan.parse(name=f"{TAG_PREFIX}{os.getpid()}x{next(_counter)}", hosts=nhosts,
                         leaves=leaves, link=f"{rate_mbit}Mbps" if rate_mbit else None,
                         uplink=uplink, mtu=mtu)
    if not mcast_route:
        from dataclasses import replace
        plan = replace(plan, mcast_route=False)
    net = Lan(plan)
    try:
        net.build()
        yield net
    finally:
        net.close()


@contextlib.contextmanager
def lab_plan(**plan_args):
    """The lab ``LabPlan.parse(**plan_args)`` up for a test module, as ``polycast lab``
    makes it, and down afterwards with nothing of it left (checked); the test is skipped
    with the reason where namespaces cannot be made here (or POLYCAST_NO_NETNS=1)."""
    import pytest
    reason = labnet.unavailable_reason()
    if reason is not None or os.environ.get("POLYCAST_NO_NETNS") == "1":
        pytest.skip(f"lab unavailable: {reason or 'POLYCAST_NO_NETNS=1'}")
    name = plan_args["name"]
    labnet.up(LabPlan.parse(**plan_args))
    try:
        yield labnet.current(name)
    finally:
        labnet.down(name)
        left = [ns for ns in labnet.existing_namespaces() if ns.startswith(name + "-")]
        assert not left and labnet.read_state(name) is None, left


def rank_env(rank: int, size: int, master_port: int, local_rank: int | None = None,
             local_size: int | None = None, **extra: str) -> dict[str, str]:
    """torchrun-style environment for one rank, rendezvous on host 0 (10.77.0.1).

    polycast's own store listens on MASTER_PORT + 1 under torchrun."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POLYCAST_", "OMPI_", "PMI_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR=Lan.addr(0),
               MASTER_PORT=str(master_port), PYTHONUNBUFFERED="1")
    if local_rank is not None:
        env["LOCAL_RANK"] = str(local_rank)
    if local_size is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_size)
    env.update(extra)
    return env


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]



# -- a rank program for tests and bench/netns.py ---------------------------------------------
# ``python tests/netns.py worker --call allgather:mcast --nbytes N --iters K`` runs each call
# on the world communicator (rendezvous from the torchrun environment), checks the results
# exactly, and prints one line ``RESULT {json}`` with per-call times, the engine's counter
# deltas and this host's eth0 byte counters (read inside the namespace) around the calls.

def _eth0(field_name: str) -> int:
    try:
        with open(f"/sys/class/net/eth0/statistics/{field_name}") as fh:
            return int(fh.read())
    except OSError:
        return -1


def _worker(argv: list[str]) -> int:
    import argparse
    import time

    import numpy as np

    import polycast.comm as pc

    ap = argparse.ArgumentParser(prog="netns.py worker")
    ap.add_argument("--call", action="append", required=True,
                    help="collective:algorithm, allgather or broadcast (root 0)")
    ap.add_argument("--nbytes", type=int, default=1 << 20, help="total buffer bytes")
    ap.add_argument("--iters", type=int, default=1)
    args = ap.parse_args(argv)
    comm = pc.init()
    P, r = comm.size, comm.rank
    out = {"rank": r, "size": P, "transports": sorted(set(comm.transports().values())),
           "mcast_error": comm.mcast_error, "calls": []}
    count = args.nbytes // 4 // P * P          # float32 elements, a multiple of P
    for spec in args.call:
        coll, algo = spec.split(":")
        full = np.arange(count, dtype=np.float32) % 65521 + 1
        before = (vars(comm.stats()).copy(), _eth0("tx_bytes"), _eth0("rx_bytes"))
        seconds, ok = [], True
        for it in range(args.iters):
            comm.Barrier()
            if coll == "allgather":
                send = full.reshape(P, -1)[r].copy()
                recv = np.zeros(count, np.float32)
                t0 = time.perf_counter()
                comm.Allgather(send, recv, algorithm=algo)
                seconds.append(time.perf_counter() - t0)
                ok = ok and bool(np.array_equal(recv, full))
            elif coll == "broadcast":
                buf = full.copy() if r == 0 else np.zeros(count, np.float32)
                t0 = time.perf_counter()
                comm.Bcast(buf, 0, algorithm=algo)
                seconds.append(time.perf_counter() - t0)
                ok = ok and bool(np.array_equal(buf, full))
            else:
                raise SystemExit(f"unknown collective {coll!r}: allgather or broadcast")
        comm.Barrier()
        # Slowest rank's time per iteration is the collective's time.
        worst = comm.allgather(seconds)
        after = (vars(comm.stats()), _eth0("tx_bytes"), _eth0("rx_bytes"))
        delta = {k: after[0][k] - v for k, v in before[0].items()
                 if isinstance(v, int) and isinstance(after[0].get(k), int)}
        out["calls"].append({
            "call": spec, "nbytes": count * 4, "ok": ok,
            "seconds": [max(w[i] for w in worst) for i in range(args.iters)],
            "stats": delta, "eth0_tx_bytes": after[1] - before[1],
            "eth0_rx_bytes": after[2] - before[2]})
    print("RESULT " + json.dumps(out), flush=True)
    pc.finalize()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(_worker(sys.argv[2:]))
    sys.exit("usage: python tests/netns.py worker --call allgather:mcast [--nbytes N]")
