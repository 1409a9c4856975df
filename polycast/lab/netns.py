"""Building and removing a lab with ``ip`` and ``tc``; the state file that makes ``down``
exact.

Rules this module keeps:

* Nothing is added to the machine's own (root) network namespace, not even transiently:
  every veth is created inside the lab's namespaces with ``ip -n``; addresses exist only
  inside host namespaces. The machine's real interfaces are never touched.
* What is made is recorded **before** it is made, in a state file (one per lab, under
  :data:`STATE_DIR`), so ``down`` removes exactly that — also after the process that built
  the lab crashed or was killed — and nothing else.
* A failed ``up`` removes what it made and leaves no state: nothing half-built.
* ``up`` refuses when a lab of that name is up or any of its namespace names is taken;
  up/down hold a lock so two commands never race.

Deleting a namespace deletes its veth ends (and their peers) and its bridge; processes
still running inside a lab namespace (ranks of a crashed ``lab run``) are ended first, by
the pids the kernel lists for that namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time

from ..config import read_var
from ..errors import PolycastError
from .plan import HOST_IFNAME, LabPlan

STATE_DIR = read_var("POLYCAST_LAB_STATE_DIR")
_CMD_TIMEOUT_S = 20.0


class LabError(PolycastError):
    """A lab cannot be built, used or removed here (the message says why)."""


# -- commands -------------------------------------------------------------------------------

def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LabError(f"`{' '.join(argv)}` did not finish within {_CMD_TIMEOUT_S:g} s") from None
    if check and p.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check)


def tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["tc", *args], check)


def unavailable_reason(shaped: bool = True) -> str | None:
    """Why a lab cannot be made here (not root, ``ip``/``tc`` missing), or None."""
    if os.geteuid() != 0:
        return "polycast lab needs root (network namespaces, bridges, tc)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if shaped and shutil.which("tc") is None:
        return "iproute2's `tc` is not installed (needed to shape links; apt-get install iproute2)"
    return None


def existing_namespaces() -> set[str]:
    out = ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


# -- state ----------------------------------------------------------------------------------

def state_path(name: str, state_dir: str | None = None) -> str:
    return os.path.join(state_dir or STATE_DIR, f"{name}.json")


@contextlib.contextmanager
def _locked(state_dir: str):
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    with open(os.path.join(state_dir, ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_state(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


def read_state(name: str, state_dir: str | None = None) -> dict | None:
    try:
        with open(state_path(name, state_dir)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise LabError(f"lab state {state_path(name, state_dir)} unreadable: {e}") from None


def labs_up(state_dir: str | None = None) -> list[str]:
    d = state_dir or STATE_DIR
    try:
        return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))
    except FileNotFoundError:
        return []


# -- up / down ------------------------------------------------------------------------------

def up(plan: LabPlan, state_dir: str | None = None) -> dict:
    """Build ``plan``; return its state. Raises :class:`LabError` (nothing left) on failure."""
    plan.validate()
    reason = unavailable_reason(shaped=plan.shaped)
    if reason:
        raise LabError(reason)
    sdir = state_dir or STATE_DIR
    path = state_path(plan.name, sdir)
    with _locked(sdir):
        if os.path.exists(path):
            raise LabError(f"lab {plan.name!r} is already up (state {path}); "
                           f"`polycast lab down --name {plan.name}` first")
        taken = sorted(set(plan.namespaces()) & existing_namespaces())
        if taken:
            raise LabError(f"namespace name(s) already taken: {', '.join(taken[:4])}"
                           f"{' ...' if len(taken) > 4 else ''}; choose another --name")
        state = {"plan": plan.to_json(), "namespaces": [], "status": "building",
                 "pid": os.getpid(), "created": time.time()}
        _write_state(path, state)
        try:
            _build(plan, state, path)
        except BaseException as e:
            _teardown(state)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            if isinstance(e, LabError):
                raise LabError(f"lab {plan.name!r} not built (nothing left behind): {e}") from None
            raise
        state["status"] = "up"
        _write_state(path, state)
        return state


def down(name: str, state_dir: str | None = None) -> list[str]:
    """Remove lab ``name`` exactly as its state file records it; return the namespaces
    deleted. Raises :class:`LabError` when no such lab is recorded."""
    reason = unavailable_reason(shaped=False)
    if reason:
        raise LabError(reason)
    sdir = state_dir or STATE_DIR
    with _locked(sdir):
        state = read_state(name, sdir)
        if state is None:
            up_now = labs_up(sdir)
            raise LabError(f"no lab named {name!r} is up" +
                           (f" (up: {', '.join(up_now)})" if up_now else ""))
        gone = _teardown(state)
        os.unlink(state_path(name, sdir))
        return gone


def reap_stale(prefix: str, state_dir: str | None = None) -> list[str]:
    """Remove labs named ``prefix...`` whose building process is gone (a test run killed
    by SIGKILL). Only for labs owned by a process (tests); ``polycast lab up`` labs outlive
    the command by design and are never reaped. Returns the names removed."""
    sdir = state_dir or STATE_DIR
    gone = []
    for name in labs_up(sdir):
        if not name.startswith(prefix):
            continue
        state = read_state(name, sdir) or {}
        pid = int(state.get("pid", 0))
        if pid and os.path.exists(f"/proc/{pid}"):
            continue                        # its run is alive (maybe in parallel)
        with contextlib.suppress(LabError):
            down(name, sdir)
            gone.append(name)
    return gone


def _record(state: dict, path: str, ns: str) -> None:
    state["namespaces"].append(ns)
    _write_state(path, state)


def _teardown(state: dict) -> list[str]:
    made = list(state.get("namespaces", []))
    present = existing_namespaces()
    for ns in reversed(made):
        if ns in present:
            _end_processes(ns)
    gone = []
    for ns in reversed(made):
        if ns in present:
            ip("netns", "del", ns, check=False)
            gone.append(ns)
    left = sorted(set(made) & existing_namespaces())
    if left:
        raise LabError(f"could not delete namespace(s) {', '.join(left)}")
    return gone


def _end_processes(ns: str) -> None:
    """SIGKILL what still runs inside one of the lab's namespaces (a crashed run's ranks)."""
    pids = [int(x) for x in ip("netns", "pids", ns, check=False).stdout.split() if x.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.02)


def _build(plan: LabPlan, state: dict, path: str) -> None:
    def add_ns(ns: str) -> None:
        _record(state, path, ns)            # recorded first: down removes it even if we die
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")

    def bridge(ns: str) -> None:
        # Snooping off: the bridge floods multicast to every port (no IGMP querier needed).
        ip("-n", ns, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _quiet(ns, "br0")
        ip("-n", ns, "link", "set", "br0", "up")

    def port(ns: str, dev: str) -> None:
        ip("-n", ns, "link", "set", dev, "mtu", str(plan.mtu))
        _quiet(ns, dev)
        ip("-n", ns, "link", "set", dev, "master", "br0")
        ip("-n", ns, "link", "set", dev, "up")

    if plan.leaves > 1:
        add_ns(plan.spine_ns)
        bridge(plan.spine_ns)
    for i in range(plan.leaves):
        ns = plan.leaf_ns(i)
        add_ns(ns)
        bridge(ns)
        if plan.leaves > 1:
            ip("-n", ns, "link", "add", "uplink", "type", "veth", "peer", "name", f"leaf{i}",
               "netns", plan.spine_ns)
            port(ns, "uplink")
            port(plan.spine_ns, f"leaf{i}")
    for k in range(plan.hosts):
        ns, lns = plan.host_ns(k), plan.leaf_ns(plan.leaf_of(k))
        add_ns(ns)
        ip("-n", lns, "link", "add", f"h{k}", "type", "veth", "peer", "name", HOST_IFNAME,
           "netns", ns)
        port(lns, f"h{k}")
        ip("-n", ns, "link", "set", HOST_IFNAME, "mtu", str(plan.mtu))
        _quiet(ns, HOST_IFNAME)
        ip("-n", ns, "addr", "add", f"{plan.addr(k)}/24", "dev", HOST_IFNAME)
        ip("-n", ns, "link", "set", HOST_IFNAME, "up")
        if plan.mcast_route:
            # Multicast leaves through eth0 (the runtime finds its interface by this route).
            ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", HOST_IFNAME)
    for link in plan.links():
        if link.rate_bps is not None:
            shape(link.shape_ns, link.shape_dev, link.rate_bps, plan.mtu, plan.buffer_s)
    _wait_ready(plan)


def _wait_ready(plan: LabPlan, timeout_s: float = 10.0) -> None:
    """Wait until every link is up. The kernel reports a veth's carrier (and so a bridge
    port's forwarding) asynchronously, up to about a second after ``link set up``; a
    datagram sent before that is silently lost."""
    deadline = time.monotonic() + timeout_s
    pending = set(plan.namespaces())
    while pending:
        for ns in sorted(pending):
            try:
                devs = json.loads(ip("-n", ns, "-j", "link", "show").stdout)
            except ValueError:
                continue
            if all(d.get("operstate") == "UP" for d in devs
                   if d.get("ifname") not in ("lo",)):
                pending.discard(ns)
        if pending and time.monotonic() > deadline:
            raise LabError(f"links in {', '.join(sorted(pending)[:3])} not up after "
                           f"{timeout_s:g} s")
        if pending:
            time.sleep(0.05)


def _quiet(ns: str, dev: str) -> None:
    # No IPv6 link-local address: no router solicitations or MLD reports in the counters.
    ip("-n", ns, "link", "set", dev, "addrgenmode", "none", check=False)


def tbf_burst_nbytes(rate_bps: float, mtu: int) -> int:
    """tbf's bucket: a few frames, or 1 ms at the rate when that is more. Small, so a link
    never runs faster than its rate for long (the first burst goes at memory speed)."""
    return int(max(4 * (mtu + 14), rate_bps / 8 * 1e-3))


def shape(ns: str, dev: str, rate_bps: float, mtu: int, buffer_s: float,
          change: bool = False) -> None:
    """tbf at ``rate_bps`` on ``dev``'s egress; its queue holds ``buffer_s`` at the rate
    (beyond that the kernel drops, as a full switch buffer does)."""
    tc("-n", ns, "qdisc", "replace" if change else "add", "dev", dev, "root", "tbf",
       "rate", f"{int(rate_bps)}bit", "burst", str(tbf_burst_nbytes(rate_bps, mtu)),
       "latency", f"{int(buffer_s * 1e6)}us")


def reshape_uplinks(name: str, uplink_bps: float, state_dir: str | None = None) -> LabPlan:
    """Change a running lab's uplink rate (e.g. 1:1 -> 4:1) without rebuilding it."""
    sdir = state_dir or STATE_DIR
    with _locked(sdir):
        state = read_state(name, sdir)
        if state is None:
            raise LabError(f"no lab named {name!r} is up")
        plan = LabPlan.from_json(state["plan"])
        from dataclasses import replace
        new = replace(plan, uplink_bps=uplink_bps)
        new.validate()
        for link in new.links():
            if link.layer == "leaf-spine":
                shape(link.shape_ns, link.shape_dev, link.rate_bps, new.mtu, new.buffer_s,
                      change=True)
        state["plan"] = new.to_json()
        _write_state(state_path(name, sdir), state)
        return new


def current(name: str, state_dir: str | None = None) -> LabPlan:
    """The plan of lab ``name`` that is up (raises :class:`LabError` if none)."""
    state = read_state(name, state_dir)
    if state is None or state.get("status") != "up":
        raise LabError(f"no lab named {name!r} is up; `polycast lab up` first")
    return LabPlan.from_json(state["plan"])
