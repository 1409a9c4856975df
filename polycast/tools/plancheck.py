"""The planner's check on simulated fabrics: is ``auto`` within 10 % of the best algorithm?

For every cell (collective, ranks, size, topology) every algorithm the collective has at
that rank count is simulated -- each at the pipelining depth the planner would give it --
and the planner's choice is compared with the fastest. Hierarchical algorithms whose
schedule is, with one rank per host, the very same as their flat form (``hring`` and
``ring``) are simulated once: the simulator is deterministic, so their times are equal.
Algorithms that are not candidates because a rank would send to more than
:data:`~polycast.planner.choose.MAX_FANOUT` ranks at once (a direct allgather above 128
ranks) are not simulated either -- the flow model's cost grows with the square of the
flows in flight, and one 1024-rank direct allgather takes hours.

Runs go through :mod:`polycast.sim.sweep` (local processes or Ray); results are cached in
a JSON-lines file keyed by everything a run depends on, so a grid grows incrementally.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

from ..algorithms import algorithms, build, get
from ..collectives import Collective
from ..sim.simulate import count_for, resolve_topology
from ..sim.sweep import Point
from ..planner.choose import MAX_FANOUT, choose
from ..planner.cost import estimate
from ..planner.fabric import CommShape, from_topology

TOLERANCE = 1.10          # "within 10 % of the best"


@dataclass(frozen=True)
class Cell:
    collective: str
    nodes: int
    nbytes: int
    topology: str
    link: str = "400Gbps"


@dataclass
class Verdict:
    cell: Cell
    choice: str               # algorithm (nchunks k)
    choice_s: float           # simulated time of the choice
    best: str
    best_s: float
    ratio: float              # choice / best
    estimate_s: float         # the planner's estimate of its choice
    times: dict               # every simulated candidate -> seconds
    pruned: dict = field(default_factory=dict)   # not simulated: candidate -> lower bound s
    failed: dict = field(default_factory=dict)   # could not be simulated: candidate -> why

    @property
    def ok(self) -> bool:
        return self.ratio <= TOLERANCE


def twin(coll: Collective, name: str, P: int) -> str | None:
    """The flat algorithm whose schedule equals hierarchical ``name``'s with one rank per
    host (compared at min(P, 32) ranks), if any."""
    q = min(P, 32)
    try:
        mine = build(coll, name, q, q * 8, hosts=q, ranks_per_host=1).programs
    except Exception:           # noqa: BLE001 - not comparable: simulate it
        return None
    for algo in algorithms(coll):
        if algo.hierarchical or algo.unsupported_reason(P) or algo.unsupported_reason(q):
            continue
        if build(coll, algo.name, q, q * 8).programs == mine:
            return algo.name
    return None


def plan_cell(cell: Cell) -> tuple[list[Point], dict]:
    """The simulation points of one cell, and the planner's view of it."""
    coll = Collective.parse(cell.collective)
    topo = resolve_topology(cell.topology, cell.nodes, cell.link)
    nbytes = coll.total_elements(cell.nodes, count_for(coll, cell.nodes, cell.nbytes, 4)) * 4
    rph = topo.ranks_per_host if cell.nodes % topo.ranks_per_host == 0 else 1
    shape = CommShape(cell.nodes, rph)
    fabric = from_topology(topo)
    choice = choose(coll, nbytes, shape, fabric)
    points, alias = [], {}
    for algo in algorithms(coll):
        if algo.unsupported_reason(cell.nodes, None) is not None:
            continue
        if algo.hierarchical and rph == 1:
            same = twin(coll, algo.name, cell.nodes)
            if same is not None:
                alias[algo.name] = same
                continue
        est = estimate(coll, algo.name, nbytes, shape, fabric)
        if est.fanout > MAX_FANOUT:
            alias[algo.name] = None         # not a candidate (choose.MAX_FANOUT)
            continue
        k = est.nchunks
        points.append(Point(str(coll), algo.name, cell.nodes, cell.nbytes, cell.topology,
                            cell.link, nchunks=k))
    return points, {"choice": choice, "alias": alias, "nbytes": nbytes}


def _plan_group(cells: list[Cell]) -> list:
    return [plan_cell(c) for c in cells]


def _plan_all(cells: list[Cell], workers: int) -> list:
    """:func:`plan_cell` of every cell, on ``workers`` processes: one task per collective
    (its cells share the planner's cached analyses)."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault(c.collective, []).append(i)
    if workers <= 1 or len(groups) <= 1:
        return [plan_cell(c) for c in cells]
    from concurrent.futures import ProcessPoolExecutor
    order = sorted(groups.values(), key=len, reverse=True)
    plans: list = [None] * len(cells)
    with ProcessPoolExecutor(max_workers=min(workers, len(order))) as ex:
        for idx, res in zip(order, ex.map(_plan_group, [[cells[i] for i in g]
                                                        for g in order])):
            for i, r in zip(idx, res):
                plans[i] = r
    return plans


def _key(pt: Point) -> str:
    return json.dumps(asdict(pt), sort_keys=True)


def lower_bound_s(pt: Point) -> float:
    """A floor under the simulated time of ``pt``, from its schedule alone: every byte a
    rank sends leaves through its up links and every byte it receives arrives through its
    down links (a multicast leaves its root once), and max-min sharing never runs a link
    above its capacity; headers and latency only add to it. 0.0 for a compact schedule. (With in-network reduction the
    switches combine what a rank receives, so only its sends count.) Builds the schedule (the
    simulation builds it again; the build is a small part of an events-mode run)."""
    from ..sim.simulate import algorithm_options
    from ..schedule.compact import CompactSchedule
    from ..schedule.ir import Kind
    coll = Collective.parse(pt.collective)
    topo = resolve_topology(pt.topology, pt.nodes, pt.link, pt.framing)
    opts = algorithm_options(coll, pt.algorithm, topo, None)
    # built as the simulation builds it: refused (TooLarge) where the simulation would be
    s = build(coll, pt.algorithm, pt.nodes, count_for(coll, pt.nodes, pt.nbytes, 4),
              nchunks=pt.nchunks, compact=True, **opts)
    if isinstance(s, CompactSchedule):
        return 0.0      # columns, no Steps: no bound (their stream mode is quick anyway)
    combined = get(coll, pt.algorithm).innet
    worst = 0.0
    for rank, prog in enumerate(s.programs):
        sent = recv = 0
        for st in prog:
            if st.kind in (Kind.SEND, Kind.MCAST):
                sent += s.step_nelems(st, rank)
            elif st.kind in (Kind.RECV, Kind.MRECV):
                recv += s.step_nelems(st, rank)
        up = sum(topo.link_bw[ln] for ln in topo.up[rank])
        down = 0 if combined else sum(topo.link_bw[ln] for ln in topo.down[rank])
        worst = max(worst, 4 * sent / up if up else 0.0, 4 * recv / down if down else 0.0)
    return worst


def simulate_point(pt: Point, bar_s: float = math.inf) -> dict:
    """One point of the grid: simulated, or -- when its :func:`lower_bound_s` is above
    ``bar_s`` (the best time already simulated in its cell) -- left out as one that cannot
    be the best. The row says which path and mode the simulation took."""
    from ..errors import PolycastError
    from ..sim.simulate import simulate
    t0, cpu0 = time.perf_counter(), time.process_time()
    row: dict = {"key": _key(pt)}
    try:
        if math.isfinite(bar_s):
            lb = lower_bound_s(pt)
            row["lower_bound_s"] = lb
            if lb * (1 - 1e-3) > bar_s:     # a margin over the fast path's 0.1 % rule
                row.update(pruned=True, bar_s=bar_s, wall_s=time.perf_counter() - t0,
                           cpu_s=time.process_time() - cpu0)
                return row
        r = simulate(pt.collective, pt.algorithm, pt.nodes, pt.nbytes, pt.topology,
                     link=pt.link, nchunks=pt.nchunks, framing=pt.framing)
        row.update(time_s=r.time_s, path=r.path, fast_mode=r.fast_mode,
                   path_reason=r.path_reason, events=r.events)
    except PolycastError as e:
        row["error"] = f"{type(e).__name__}: {e}"
    row.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - cpu0)
    return row


def _cost_guess(pt: Point) -> float:
    """Relative cost of simulating a point, to start the longest first (events grow with
    ranks, pipelining depth and the algorithm's messages per rank)."""
    many = 8.0 if pt.algorithm in ("mcast", "scatter_ring", "recdoubling", "rechalving",
                                   "bruck", "rabenseifner", "hmcast") else 1.0
    return pt.nodes * pt.nodes * pt.nchunks * many


def _run_all(jobs: list[tuple[Point, float]], workers: int, done) -> None:
    """Run ``jobs`` (point, bar) on ``workers`` processes (one pool, longest first) and call
    ``done(point, row)`` as each finishes."""
    jobs = sorted(jobs, key=lambda j: -_cost_guess(j[0]))
    if workers <= 1 or len(jobs) <= 1:
        for pt, bar in jobs:
            done(pt, simulate_point(pt, bar))
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as ex:
        futs = {ex.submit(simulate_point, pt, bar): pt for pt, bar in jobs}
        for f in as_completed(futs):
            done(futs[f], f.result())


def run_cells(cells: list[Cell], *, workers: int | None = 1, cache: str | None = None,
              progress=None, counts: dict | None = None, prune: bool = True) -> list[Verdict]:
    """Simulate every cell's candidates (reusing ``cache``) and judge the planner.

    Two rounds: first the planner's choice and the ring (when a candidate) of every cell,
    then the others, each told the best time its cell has so far -- a candidate whose
    :func:`lower_bound_s` is above it cannot be the best, so it is not simulated
    (``prune=False`` simulates everything). The verdict is the same either way.
    ``counts`` (a dict) gets the points simulated now, read from the cache, left out by
    their bound, failed, and the paths/modes the simulations took."""
    workers = workers or os.cpu_count() or 1
    plans = _plan_all(cells, workers)
    known: dict[str, dict] = {}
    if cache and os.path.exists(cache):
        with open(cache) as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if "time_s" in row or "error" in row or row["key"] not in known:
                    known[row["key"]] = row
    stats = {"simulated": 0, "cached": 0, "pruned": 0, "failed": 0, "modes": {}}
    total = [0, 0]

    def done(pt, row):
        if cache:
            with open(cache, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        known[row["key"]] = row
        stats["pruned" if row.get("pruned") else "simulated"] += 1
        if row.get("error"):
            stats["failed"] += 1
        elif not row.get("pruned"):
            mode = f"{row.get('path')}/{row.get('fast_mode') or '-'}"
            stats["modes"][mode] = stats["modes"].get(mode, 0) + 1
        total[0] += 1
        if progress:
            progress(total[0], total[1], row.get("wall_s") or 0.0)

    def complete(key):
        row = known.get(key)
        return row is not None and (row.get("time_s") is not None or bool(row.get("error")))

    def first(info, pt):
        return pt.algorithm in (info["choice"].algorithm, "ring") or not prune

    seen = {_key(pt) for pts, _ in plans for pt in pts}
    stats["cached"] = sum(complete(k) for k in seen)
    for round_ in (0, 1):
        jobs, queued = [], set()
        for pts, info in plans:
            times = [known[_key(p)]["time_s"] for p in pts if complete(_key(p))
                     and known[_key(p)].get("time_s") is not None]
            bar = min(times, default=math.inf) if round_ else math.inf
            for pt in pts:
                k = _key(pt)
                if complete(k) or k in queued or (round_ == 0 and not first(info, pt)):
                    continue
                lb = known.get(k, {}).get("lower_bound_s")
                if lb is not None and lb * (1 - 1e-3) > bar:
                    stats["pruned"] += 1            # its bound, from the cache
                    continue
                queued.add(k)
                jobs.append((pt, bar))
        total[1] += len(jobs)
        _run_all(jobs, workers, done)
    if counts is not None:
        counts.update(stats)
    out = []
    for cell, (pts, info) in zip(cells, plans):
        times, pruned, failed = {}, {}, {}
        for pt in pts:
            label = f"{pt.algorithm}" + (f"/{pt.nchunks}" if pt.nchunks > 1 else "")
            row = known.get(_key(pt), {})
            if row.get("time_s") is not None:
                times[label] = float(row["time_s"])
            elif row.get("error"):
                failed[label] = row["error"]
            else:
                pruned[label] = float(row["lower_bound_s"])
        ch = info["choice"]
        name = info["alias"].get(ch.algorithm, ch.algorithm)
        label = name + (f"/{ch.nchunks}" if ch.nchunks > 1 else "")
        if label not in times and label not in failed:
            # The planner gave the winner another depth than it gives the algorithm alone
            # (never, as both come from the same estimate); fall back to the name.
            label = next((k for k in times if k.split("/")[0] == name), label)
        best = min(times, key=times.get) if times else "-"
        best_s = times.get(best, math.inf)
        chosen = times.get(label, math.inf)
        out.append(Verdict(cell, label, chosen, best, best_s,
                           chosen / best_s if times else math.inf,
                           ch.estimate_seconds, times, pruned, failed))
    return out
