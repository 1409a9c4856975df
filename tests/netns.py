"""An emulated LAN of H "hosts" made of network namespaces, for multi-host runtime tests.

Layout (nothing is added to the root namespace, not even transiently: every veth is
created inside its namespaces with ``ip -n``)::

    <tag>-h0 (eth0 10.77.0.1/24) --veth-- p0 \\
    <tag>-h1 (eth0 10.77.0.2/24) --veth-- p1  }- br0 (in <tag>-sw, multicast snooping off)
    ...                                      /

Each host namespace has ``lo`` up and a route for 224.0.0.0/4 on eth0, so UDP multicast
with TTL 1 crosses the bridge. With ``rate_mbit`` every host link is shaped by ``tbf`` in
both directions (the host's eth0 egress and the switch port's egress).

The tag holds the pid and a counter, so parallel runs never collide; :meth:`Lan.close`
kills what was started in the namespaces (by pid) and deletes the namespaces, which
deletes their veths and the bridge. Use :func:`lan` (a context manager) so that happens on
failure too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field

SUBNET = "10.77.0"
_counter = itertools.count()


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no ``ip``, no kernel support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {p.stderr.strip()}")
    return p


def unavailable_reason() -> str | None:
    """Why an emulated LAN cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 `ip` is not installed"
    name = f"pcprobe{os.getpid()}-{next(_counter)}"
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


_OURS = re.compile(r"^pc(?:probe)?(\d+)-\d+(?:-(?:sw|h\d+))?$")


def reap_stale() -> list[str]:
    """Delete namespaces this module made in runs that died without cleaning up (killed
    with SIGKILL): names ``pc<pid>-...`` whose pid is gone. Returns the names deleted."""
    p = _ip("netns", "list", check=False)
    gone = []
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _OURS.match(name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue                    # its run is alive (maybe in parallel): leave it
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _ip("netns", "del", name, check=False)
        gone.append(name)
    return gone


def tc_available() -> bool:
    return shutil.which("tc") is not None


@dataclass
class Lan:
    tag: str
    nhosts: int
    rate_mbit: float | None = None
    mcast_route: bool = True          # add 224.0.0.0/4 dev eth0 in every host
    namespaces: list[str] = field(default_factory=list)    # made so far, for cleanup
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def host(self, k: int) -> str:
        return f"{self.tag}-h{k}"

    @staticmethod
    def addr(k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def build(self) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        self.namespaces.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        # Snooping off: the bridge floods multicast to every port, no IGMP querier needed.
        _ip("-n", sw, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", sw, "link", "set", "br0", "up")
        _ip("-n", sw, "link", "set", "lo", "up")
        for k in range(self.nhosts):
            ns = self.host(k)
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("-n", sw, "link", "add", f"p{k}", "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", sw, "link", "set", f"p{k}", "master", "br0")
            _ip("-n", sw, "link", "set", f"p{k}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(k)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            if self.mcast_route:
                _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
            if self.rate_mbit:
                self._shape(ns, "eth0")
                self._shape(sw, f"p{k}")

    def _shape(self, ns: str, dev: str) -> None:
        # burst must cover a tick's worth of bytes at the rate (and a 64 KiB GSO segment);
        # latency bounds the queue (drops beyond it, as a real switch buffer would).
        rate = f"{self.rate_mbit:g}mbit"
        burst = max(128 << 10, int(self.rate_mbit * 1e6 / 8 / 250))
        p = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                            "rate", rate, "burst", str(burst), "latency", "50ms"],
                           capture_output=True, text=True, timeout=20)
        if p.returncode != 0:
            raise RuntimeError(f"tc tbf on {ns}/{dev} failed: {p.stderr.strip()}")

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
        out = _ip("-n", self.host(k), "-s", "-j", "link", "show", "dev", "eth0").stdout
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
        # Deleting a namespace deletes its veths (and their peers) and the bridge.
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces.clear()


@contextlib.contextmanager
def lan(nhosts: int, rate_mbit: float | None = None, mcast_route: bool = True):
    """An emulated LAN of ``nhosts`` hosts, removed on exit (also on failure). Raises
    :class:`NetnsUnavailable` when namespaces cannot be made here."""
    reason = unavailable_reason()
    if reason:
        raise NetnsUnavailable(reason)
    if rate_mbit and not tc_available():
        raise NetnsUnavailable("`tc` is not installed (needed to shape links)")
    reap_stale()
    net = Lan(f"pc{os.getpid()}-{next(_counter)}", nhosts, rate_mbit, mcast_route)
    try:
        net.build()
        yield net
    finally:
        net.close()


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
