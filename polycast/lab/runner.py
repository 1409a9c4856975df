"""``polycast lab run``: one rank per host namespace, with the launcher's environment.

Rank ``r`` runs on host ``placement[r]`` (``linear``: host r; ``interleave``: alternate
leaves, so ring neighbours sit on different leaves, as a topology-blind scheduler may put
them; ``random:SEED``; or an explicit comma-separated host list). Each rank gets what
``polycast run`` gives a rank (POLYCAST_RANK, SIZE, JOB_ID, MASTER_ADDR/PORT — the
master being rank 0's host address inside the lab), LOCAL_RANK 0 of LOCAL_SIZE 1 (one rank
per host), and, unless set in the environment, POLYCAST_PACING_GBPS = host link rate / 2:
multicast is paced so the default two concurrent allgather streams fill, and do not overflow,
a receiver's shaped link. Set to the empty string it means unpaced (as everywhere else), so a
run can overflow the lab's queues on purpose.

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

from ..errors import InvalidArgument
from . import counters
from .netns import LabError, current, unavailable_reason
from .plan import LabPlan

PLACEMENTS = ("linear", "interleave", "random:SEED", "H0,H1,...")


def placement(plan: LabPlan, spec: str | list[int] | None, nranks: int | None = None
              ) -> list[int]:
    """rank -> host index, from a placement spec (see :data:`PLACEMENTS`)."""
    n = plan.hosts if nranks is None else nranks
    if not 1 <= n <= plan.hosts:
        raise InvalidArgument(f"-n {n}: the lab has {plan.hosts} hosts (one rank per host)")
    if spec is None or spec == "linear":
        return list(range(n))
    if isinstance(spec, (list, tuple)):
        hosts = [int(h) for h in spec]
    elif spec == "interleave":
        per, L = plan.hosts_per_leaf, plan.leaves
        order = [i * per + j for j in range(per) for i in range(L) if i * per + j < plan.hosts]
        hosts = order[:n]
    elif spec.startswith("random"):
        _, _, seed = spec.partition(":")
        try:
            rng = random.Random(int(seed or 0))
        except ValueError:
            raise InvalidArgument(f"placement {spec!r}: random:SEED with an integer seed") from None
        hosts = rng.sample(range(plan.hosts), n)
    else:
        try:
            hosts = [int(x) for x in spec.split(",")]
        except ValueError:
            raise InvalidArgument(f"unknown placement {spec!r}; valid: "
                                  f"{', '.join(PLACEMENTS)}") from None
    if len(hosts) != n or len(set(hosts)) != n or not all(0 <= h < plan.hosts for h in hosts):
        raise InvalidArgument(f"placement {spec!r}: {n} distinct hosts in 0..{plan.hosts - 1}")
    return hosts


def rank_env(plan: LabPlan, hosts: list[int], extra: dict | None = None) -> dict[str, str]:
    """What every rank gets on top of the launcher's per-rank variables."""
    env = {"POLYCAST_MASTER_ADDR": plan.addr(hosts[0]), "POLYCAST_LOCAL_RANK": "0",
           "POLYCAST_LOCAL_SIZE": "1"}
    # Present but empty means "unpaced": only an absent variable gets the lab's default.
    if plan.link_bps and "POLYCAST_PACING_GBPS" not in os.environ:
        env["POLYCAST_PACING_GBPS"] = f"{plan.link_bps / 2e9:g}"
    env.update(extra or {})
    return env


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
                    snap = counters.read(self.plan, drops=self.plan.link_bps is not None)
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


def run(command: list[str], name: str = "pclab", nranks: int | None = None,
        where: str | list[int] | None = None, timeout_s: float | None = None,
        extra_env: dict | None = None, marks: bool = False, state_dir: str | None = None,
        prefix: bool = True, stdout=None, stderr=None) -> tuple[int, list]:
    """Run ``command`` (a full argv, e.g. ``["python", "script.py"]``) as one rank per
    host of lab ``name``; return (exit status, marks [(label, Snapshot, time)])."""
    from ..tools import launch
    if not command:
        raise InvalidArgument("nothing to run: `polycast lab run -- python script.py ARGS`")
    reason = unavailable_reason(shaped=False)
    if reason:
        raise LabError(reason)
    plan = current(name, state_dir)
    hosts = placement(plan, where, nranks)
    exe = command[0]
    if shutil.which(exe) is None and not os.path.exists(exe):
        raise InvalidArgument(f"command {exe!r} not found")
    env = rank_env(plan, hosts, extra_env)
    server = None
    tmp = None
    if marks:
        tmp = tempfile.mkdtemp(prefix=f"polycast-lab-{plan.name}-")
        env["POLYCAST_LAB_MARKS"] = tmp
        server = _MarkServer(plan, tmp)
        server.start()
    port = 20000 + random.randrange(30000)       # inside rank 0's namespace: free
    try:
        status = launch.launch(len(hosts), list(command), port=port,
                               timeout_seconds=timeout_s, extra_env=env, prefix=prefix,
                               stdout=stdout, stderr=stderr,
                               argv_for=lambda r: ["ip", "netns", "exec",
                                                   plan.host_ns(hosts[r]), *command])
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if server is not None and server.error is not None:
        raise LabError(f"reading counters at a mark failed: {server.error}")
    return status, (server.snaps if server else [])
