"""Sweeps: a grid of collective x algorithms x nodes x sizes x topologies x link rates x
receiver NICs, simulated in parallel on local processes (concurrent.futures) or on a Ray cluster (the ``ray`` extra,
imported lazily), gathered into one tidy table (one row per run) written as CSV or JSON.

A point that cannot run (an algorithm unsupported at that node count, a topology too small)
becomes a row with an ``error`` and no numbers, so one bad corner never loses the sweep.
"""

from __future__ import annotations

import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from ..errors import InvalidArgument, PolycastError
from .framing import DEFAULT_FRAMING

COLUMNS = ("collective", "algorithm", "nodes", "nbytes", "topology", "link", "framing", "nic",
           "time_s",
           "algbw", "busbw", "link_bytes", "link_bytes_host_leaf", "link_bytes_leaf_spine",
           "link_bytes_spine_core", "link_bytes_intra_host", "nic_gbps", "nic_dropped_nbytes",
           "recovered_nbytes", "events", "wall_s", "error")

NO_NIC = "none"     # a sweep point whose receivers keep up (no NIC model)


@dataclass(frozen=True)
class Point:
    collective: str
    algorithm: str
    nodes: int
    nbytes: int
    topology: str
    link: str
    nic: str = NO_NIC            # receivers' NIC (a ``--nic`` spec) or none
    nchunks: int = 1             # pipelining; with algorithm "auto" the planner's
    framing: str = DEFAULT_FRAMING   # per-packet headers (sim/framing.py) unless the
    #                                  topology string sets them


def grid(collective: str, algorithms, nodes, sizes, topologies, link="400Gbps",
         nics=(NO_NIC,), framing: str | None = None) -> list[Point]:
    """Every combination; ``link`` is a rate or a list of rates, ``nics`` ``--nic`` specs
    (``none``: receivers keep up), ``framing`` a framing preset (default tcp)."""
    links = [link] if isinstance(link, str) else list(link)
    fr = framing or DEFAULT_FRAMING
    pts = [Point(collective, a, n, s, t, ln, nic, framing=fr)
           for t in topologies for ln in links for nic in nics for n in nodes for s in sizes
           for a in algorithms]
    if not pts:
        raise InvalidArgument("the sweep grid is empty: give at least one algorithm, node "
                              "count, size and topology")
    return pts


def run_point(pt: Point | dict) -> dict:
    """Simulate one point; returns a row of ``COLUMNS``."""
    from .simulate import simulate
    if isinstance(pt, dict):
        pt = Point(**pt)
    row = {c: "" for c in COLUMNS}
    row.update(asdict(pt))
    try:
        algo, nchunks = pt.algorithm, pt.nchunks
        if algo == "auto":
            algo, nchunks = _auto(pt)
            row["algorithm"] = f"auto({algo})"
        r = simulate(pt.collective, algo, pt.nodes, pt.nbytes, pt.topology,
                     link=pt.link, nic=None if pt.nic == NO_NIC else pt.nic, nchunks=nchunks,
                     framing=pt.framing)
    except PolycastError as e:
        row["error"] = str(e)
        return row
    row.update(nbytes=r.nbytes, time_s=r.time_s, algbw=r.algbw, busbw=r.busbw,
               link_bytes=r.link_bytes, events=r.events, wall_s=r.wall_s,
               recovered_nbytes=r.recovered_nbytes)
    if r.nic:
        row.update(nic_gbps=r.nic_gbps, nic_dropped_nbytes=r.nic_dropped_nbytes)
    for layer, n in r.link_bytes_by_layer.items():
        row["link_bytes_" + layer.replace("-", "_")] = n
    return row


def _auto(pt: Point) -> tuple[str, int]:
    """The planner's choice for a point (``--algos auto``)."""
    from ..collectives import Collective
    from ..planner import choose_on_topology
    from .simulate import count_for, resolve_topology
    coll = Collective.parse(pt.collective)
    topo = resolve_topology(pt.topology, pt.nodes, pt.link, pt.framing)
    nbytes = coll.total_elements(pt.nodes, count_for(coll, pt.nodes, pt.nbytes, 4)) * 4
    c = choose_on_topology(coll, nbytes, topo)
    return c.algorithm, c.nchunks


def run_grid(points: list[Point], workers: int | None = None, ray: str | None = None
             ) -> list[dict]:
    """Run every point; rows in the grid's order."""
    if ray:
        return _run_ray(points, ray)
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise InvalidArgument(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(points) == 1:
        return [run_point(p) for p in points]
    with ProcessPoolExecutor(max_workers=min(workers, len(points))) as ex:
        return list(ex.map(run_point, points))


RAY_TIMEOUT_S = 3600.0


def _check_reachable(address: str) -> None:
    """Fail at once, in one line, when nothing listens at ``address`` (Ray itself retries
    for minutes)."""
    import socket
    host, _, port = address.rpartition(":")
    if host.startswith("ray://"):
        host = host[len("ray://"):]
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"--ray {address}: cannot connect to a Ray cluster there "
                              f"({e}); give HOST:PORT of a Ray head, or auto") from None


def _run_ray(points: list[Point], address: str) -> list[dict]:
    """One Ray task per point on the cluster at ``address`` (``auto``: the one this machine
    runs; ``local``: start a private one for this sweep). A driver this call connected is
    disconnected again at the end, so the caller's process holds no Ray state."""
    try:
        import ray
    except ImportError:
        raise InvalidArgument("--ray needs Ray: pip install 'polycast[ray]'") from None
    connected = not ray.is_initialized()
    if connected and address not in ("auto", "local"):
        _check_reachable(address)
    if connected:
        try:
            ray.init(address=None if address == "local" else address, log_to_driver=False)
        except ConnectionError as e:
            raise InvalidArgument(f"--ray {address}: cannot connect to a Ray cluster: {e}") from None
    try:
        remote = ray.remote(run_point)
        return ray.get([remote.remote(asdict(p)) for p in points], timeout=RAY_TIMEOUT_S)
    finally:
        if connected:
            ray.shutdown()


def write_table(rows: list[dict], path: str) -> None:
    """CSV or JSON by the file's extension."""
    if path.endswith(".json"):
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=1)
    elif path.endswith(".csv"):
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(COLUMNS))
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c, "") for c in COLUMNS})
    else:
        raise InvalidArgument(f"sweep output {path!r}: use a .csv or .json file name")
