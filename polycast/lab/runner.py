"""``polycast lab run``: ranks in the lab's host namespaces, with the launcher's environment.

**Placement.** ``--ranks-per-host R`` (default 1) puts R consecutive ranks on each host, as
torchrun and SLURM's block distribution do (ranks ``g*R .. g*R+R-1`` form node ``g``); the
placement spec orders the hosts the nodes go to: ``linear`` (host g), ``interleave``
(alternate leaves, so ring neighbours across hosts sit on different leaves, as a
topology-blind scheduler may put them), ``random:SEED``, or an explicit comma-separated
list of hosts, one per node. ``-n`` must then be a multiple of R (every host runs the same
number of ranks, which the hierarchical algorithms and torch's launcher assume).

**Environment of rank r** (what :meth:`Placement.env` sets, on top of what ``polycast run``
gives every rank: POLYCAST_RANK, SIZE, JOB_ID, MASTER_PORT, and torch's RANK, WORLD_SIZE,
MASTER_PORT):

=========================== ==================================================================
POLYCAST_MASTER_ADDR,       node 0's host address inside the lab (rank 0 serves the
MASTER_ADDR                 rendezvous store there; torch's TCPStore too)
POLYCAST_LOCAL_RANK,        ``r % R``: the rank's index among the ranks of its host
LOCAL_RANK
POLYCAST_LOCAL_SIZE,        R
LOCAL_WORLD_SIZE
GROUP_RANK                  ``r // R``: the node's index (torchrun's name)
GROUP_WORLD_SIZE            the number of nodes
GLOO_SOCKET_IFNAME          the host's interface, unless set in the environment (gloo binds
                            to what its hostname resolves to: loopback, in every namespace)
POLYCAST_PACING_GBPS        host link rate / 2, unless set in the environment (below)
=========================== ==================================================================

Which ranks share a host is not an environment variable: the runtime tells hosts apart by
:func:`polycast.runtime.bootstrap.env.host_id` (hostname, boot id and **network namespace**), so the
R ranks of one host namespace find each other as one host (shared-memory rings, one offload
process per host) and talk TCP and multicast to the others, exactly as on real machines.

Pacing: unless POLYCAST_PACING_GBPS is set in the environment, multicast is paced at host
link rate / 2, so the default two concurrent allgather streams fill, and do not overflow, a
receiver's shaped link. Set to the empty string it means unpaced (as everywhere else), so a
run can overflow the lab's queues on purpose. An unshaped host link gets no default.

Counter marks: with ``marks=True`` the ranks find POLYCAST_LAB_MARKS (a directory) in their
environment; :func:`polycast.lab.marks.mark` there makes the runner read every link's
counters at that point of the program (all ranks in a barrier), so a benchmark gets the
bytes of exactly one collective.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from .. import config
from ..errors import InvalidArgument
from . import counters
from .netns import LabError, current, unavailable_reason
from .plan import HOST_IFNAME, LabPlan

PLACEMENTS = ("linear", "interleave", "random:SEED", "H0,H1,...")


@dataclass(frozen=True)
class Placement:
    """Where the ranks of a lab run sit: node ``g`` (ranks ``g*R .. g*R+R-1``) on host
    ``nodes[g]``."""
    nodes: tuple[int, ...]           # node (group rank) -> host index
    ranks_per_host: int = 1

    @property
    def nranks(self) -> int:
        return len(self.nodes) * self.ranks_per_host

    @property
    def hosts(self) -> list[int]:
        """rank -> host index."""
        return [self.host(r) for r in range(self.nranks)]

    def host(self, rank: int) -> int:
        return self.nodes[rank // self.ranks_per_host]

    def env(self, plan: LabPlan, rank: int) -> dict[str, str]:
        """What rank ``rank`` gets on top of the launcher's per-rank variables (the table
        in this module's docstring)."""
        R = self.ranks_per_host
        master = plan.addr(self.nodes[0])
        local, group = rank % R, rank // R
        env = {"POLYCAST_MASTER_ADDR": master, "MASTER_ADDR": master,
               "POLYCAST_LOCAL_RANK": str(local), "LOCAL_RANK": str(local),
               "POLYCAST_LOCAL_SIZE": str(R), "LOCAL_WORLD_SIZE": str(R),
               "GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(len(self.nodes))}
        # gloo (torch's CPU backend, and any job's default group) binds to the address its
        # hostname resolves to, loopback in every namespace alike: name the host's link.
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = HOST_IFNAME
        # Present but empty means "unpaced": only an absent variable gets the lab's default.
        if plan.link_bps and not config.current().is_set("pacing_gbps"):
            env["POLYCAST_PACING_GBPS"] = f"{plan.link_bps / 2e9:g}"
        return env


def placement(plan: LabPlan, spec: str | list[int] | None, nranks: int | None = None,
              ranks_per_host: int = 1) -> Placement:
    """The placement of ``nranks`` ranks (default: every host, ``ranks_per_host`` each) from
    a spec (see :data:`PLACEMENTS`); raises :class:`InvalidArgument` naming what is wrong."""
    R = ranks_per_host
    if not isinstance(R, int) or isinstance(R, bool) or not 1 <= R <= 64:
        raise InvalidArgument(f"--ranks-per-host {R!r}: 1..64")
    n = plan.hosts * R if nranks is None else nranks
    if not isinstance(n, int) or not 1 <= n <= plan.hosts * R:
        raise InvalidArgument(f"-n {n}: the lab has {plan.hosts} hosts x {R} rank"
                              f"{'s' if R > 1 else ''} per host (--ranks-per-host)")
    if n % R:
        raise InvalidArgument(f"-n {n} with --ranks-per-host {R}: every host runs the same "
                              f"number of ranks; give -n a multiple of {R}")
    k = n // R                                  # nodes
    if spec is None or spec == "linear":
        return Placement(tuple(range(k)), R)
    if isinstance(spec, (list, tuple)):
        hosts = [int(h) for h in spec]
    elif spec == "interleave":
        per, L = plan.hosts_per_leaf, plan.leaves
        order = [i * per + j for j in range(per) for i in range(L) if i * per + j < plan.hosts]
        hosts = order[:k]
    elif spec.startswith("random"):
        _, _, seed = spec.partition(":")
        try:
            rng = random.Random(int(seed or 0))
        except ValueError:
            raise InvalidArgument(f"placement {spec!r}: random:SEED with an integer seed") from None
        hosts = rng.sample(range(plan.hosts), k)
    else:
        try:
            hosts = [int(x) for x in spec.split(",")]
        except ValueError:
            raise InvalidArgument(f"unknown placement {spec!r}; valid: "
                                  f"{', '.join(PLACEMENTS)}") from None
    if len(hosts) != k or len(set(hosts)) != k or not all(0 <= h < plan.hosts for h in hosts):
        raise InvalidArgument(f"placement {spec!r}: {k} distinct hosts in 0..{plan.hosts - 1}"
                              + (f" (one per {R} ranks)" if R > 1 else ""))
    return Placement(tuple(hosts), R)


class _MarkServer(threading.Thread):
    """Answers the ranks' counter marks: reads the counters when a request file appears."""

    def __init__(self, plan: LabPlan, directory: str) -> None:
        super().__init__(daemon=True)
        self.plan, self.dir = plan, directory
        self.snaps: list[tuple[str, counters.Snapshot, float]] = []
        self._halt = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                reqs = sorted(f for f in os.listdir(self.dir) if f.endswith(".req"))
                for f in reqs:
                    path = os.path.join(self.dir, f)
                    with open(path) as fh:
                        label = fh.read()
                    snap = counters.read(self.plan, drops=self.plan.shaped)
                    self.snaps.append((label, snap, time.monotonic()))
                    os.unlink(path)
                    with open(path[:-4] + ".ack", "w"):
                        pass
            except Exception as e:        # reported by run(); the rank's wait is bounded
                self.error = e
                return
            self._halt.wait(0.002)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def _check_master(plan: LabPlan, where_: Placement, addr: str | None) -> None:
    """Before any rank starts: torch's store (rank 0's, at MASTER_ADDR) must be on node 0's
    host and routable from every other host, else every other rank would wait for it
    until torch's timeout (30 minutes by default) and say nothing."""
    if not addr:
        return
    from .netns import ip
    ns0 = plan.host_ns(where_.host(0))
    if len(set(where_.hosts)) > 1 and (addr.startswith("127.") or addr in ("::1",
                                                                          "localhost")):
        raise InvalidArgument(f"MASTER_ADDR {addr} is loopback: every host has its own, and "
                              f"torch's store is on rank 0's host {ns0} "
                              f"({plan.addr(where_.host(0))}); unset it to get that")
    mine = ip("-n", ns0, "-o", "addr", "show", check=False).stdout
    if f" {addr}/" not in mine:
        raise InvalidArgument(f"MASTER_ADDR {addr} is not an address of rank 0's host {ns0} "
                              f"({plan.addr(where_.host(0))}): torch's store, which rank 0 "
                              "serves, would be unreachable from the other hosts")
    for h in sorted(set(where_.hosts)):
        if ip("-n", plan.host_ns(h), "route", "get", addr, check=False).returncode != 0:
            raise InvalidArgument(f"host {plan.host_ns(h)} has no route to MASTER_ADDR "
                                  f"{addr} (rank 0's host, torch's store)")


def run(command: list[str], name: str = "pclab", nranks: int | None = None,
        where: str | list[int] | None = None, timeout_s: float | None = None,
        extra_env: dict | None = None, marks: bool = False, state_dir: str | None = None,
        prefix: bool = True, stdout=None, stderr=None, ranks_per_host: int = 1
        ) -> tuple[int, list]:
    """Run ``command`` (a full argv, e.g. ``["python", "script.py"]``) as ``nranks`` ranks
    placed on the hosts of lab ``name`` (see :func:`placement`); return (exit status,
    marks [(label, Snapshot, time)])."""
    from ..tools import launch
    if not command:
        raise InvalidArgument("nothing to run: `polycast lab run -- python script.py ARGS`")
    reason = unavailable_reason(shaped=False)
    if reason:
        raise LabError(reason)
    plan = current(name, state_dir)
    where_ = placement(plan, where, nranks, ranks_per_host)
    exe = command[0]
    if shutil.which(exe) is None and not os.path.exists(exe):
        raise InvalidArgument(f"command {exe!r} not found")
    env = dict(extra_env or {})
    server = None
    tmp = None
    if marks:
        tmp = tempfile.mkdtemp(prefix=f"polycast-lab-{plan.name}-")
        env["POLYCAST_LAB_MARKS"] = tmp
        server = _MarkServer(plan, tmp)
        server.start()
    _check_master(plan, where_, {**where_.env(plan, 0), **env}.get("MASTER_ADDR"))
    port = 20000 + random.randrange(30000)       # inside rank 0's namespace: free
    try:
        # The caller's variables win over the placement's (a benchmark sets its pacing).
        status = launch.launch(where_.nranks, list(command), port=port,
                               timeout_seconds=timeout_s, extra_env=env, prefix=prefix,
                               stdout=stdout, stderr=stderr,
                               env_for=lambda r: {**where_.env(plan, r), **env},
                               argv_for=lambda r: ["ip", "netns", "exec",
                                                   plan.host_ns(where_.host(r)), *command])
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if server is not None and server.error is not None:
        raise LabError(f"reading counters at a mark failed: {server.error}")
    return status, (server.snaps if server else [])
