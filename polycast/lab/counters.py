"""Byte counters of every link direction of a lab, read from the kernel.

Each directed link's bytes are the counters of its leaf end (see
:attr:`polycast.lab.plan.Link.count_dev`): the bytes that crossed the link (what its tbf
let through, Ethernet header included, FCS not). One ``ip -s -j link`` per leaf reads them
all. :func:`diff` of two snapshots gives what a run moved; :func:`by_layer` groups them as
the simulator does (``host-leaf``, ``leaf-spine``). :func:`qdisc_drops` reads the tbf queues'
drop counters (a full switch buffer).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .netns import LabError, ip, tc
from .plan import LabPlan


@dataclass
class Snapshot:
    """bytes and packets per directed link name (``h0->leaf0``, ``leaf0->spine``...), and
    (when read with ``drops=True``) packets dropped by each link's full tbf queue."""
    nbytes: dict[str, int] = field(default_factory=dict)
    packets: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    cpu_busy: int = 0                # the machine's busy and total CPU time (jiffies, all
    cpu_total: int = 0               # cores) when read: a lab's hosts share its cores

    def busy_cores(self, before: "Snapshot") -> float:
        """Cores the whole machine kept busy between ``before`` and this snapshot."""
        dt = self.cpu_total - before.cpu_total
        return (self.cpu_busy - before.cpu_busy) / dt * (os.cpu_count() or 1) if dt > 0 else 0.0


def _dev_stats(ns: str) -> dict[str, dict]:
    out = ip("-n", ns, "-s", "-j", "link", "show").stdout
    try:
        return {d["ifname"]: d.get("stats64", d.get("stats", {})) for d in json.loads(out)}
    except (ValueError, KeyError) as e:
        raise LabError(f"cannot read link counters in {ns}: {e}") from None


def _cpu() -> tuple[int, int]:
    try:
        with open("/proc/stat") as fh:
            vals = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)          # idle + iowait
    return sum(vals) - idle, sum(vals)


def read(plan: LabPlan, drops: bool = False) -> Snapshot:
    busy, total = _cpu()
    stats = {plan.leaf_ns(i): _dev_stats(plan.leaf_ns(i)) for i in range(plan.leaves)}
    snap = Snapshot(cpu_busy=busy, cpu_total=total)
    for link in plan.links():
        st = stats[link.count_ns].get(link.count_dev)
        if st is None:
            raise LabError(f"device {link.count_dev} missing in {link.count_ns}: is the lab "
                           "intact? (`polycast lab down` and up again)")
        snap.nbytes[link.name] = int(st[link.count_dir]["bytes"])
        snap.packets[link.name] = int(st[link.count_dir]["packets"])
    if drops:
        snap.drops = qdisc_drops(plan)
    return snap


def diff(after: Snapshot, before: Snapshot) -> Snapshot:
    return Snapshot({k: v - before.nbytes.get(k, 0) for k, v in after.nbytes.items()},
                    {k: v - before.packets.get(k, 0) for k, v in after.packets.items()},
                    {k: v - before.drops.get(k, 0) for k, v in after.drops.items()},
                    after.cpu_busy - before.cpu_busy, after.cpu_total - before.cpu_total)


def by_layer(plan: LabPlan, snap: Snapshot) -> dict[str, int]:
    """Bytes summed per layer (only the layers the lab has)."""
    out: dict[str, int] = {}
    for link in plan.links():
        out[link.layer] = out.get(link.layer, 0) + snap.nbytes.get(link.name, 0)
    return out


def qdisc_drops(plan: LabPlan) -> dict[str, int]:
    """Packets dropped by each shaped link's tbf queue (its buffer was full)."""
    out: dict[str, int] = {}
    per_ns: dict[str, dict[str, int]] = {}
    for link in plan.links():
        if link.rate_bps is None:
            continue
        if link.shape_ns not in per_ns:
            doc = tc("-n", link.shape_ns, "-s", "-j", "qdisc", "show").stdout
            try:
                per_ns[link.shape_ns] = {q["dev"]: int(q.get("drops", 0))
                                         for q in json.loads(doc) if q.get("kind") == "tbf"}
            except (ValueError, KeyError) as e:
                raise LabError(f"cannot read qdisc counters in {link.shape_ns}: {e}") from None
        out[link.name] = per_ns[link.shape_ns].get(link.shape_dev, 0)
    return out
