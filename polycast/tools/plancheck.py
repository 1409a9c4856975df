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
import os
import time
from dataclasses import asdict, dataclass

from ..algorithms import algorithms, build
from ..collectives import Collective
from ..sim.simulate import count_for, resolve_topology
from ..sim.sweep import Point, run_grid
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


def _key(pt: Point) -> str:
    return json.dumps(asdict(pt), sort_keys=True)


def run_cells(cells: list[Cell], *, workers: int | None = 1, cache: str | None = None,
              progress=None, counts: dict | None = None) -> list[Verdict]:
    """Simulate every cell's candidates (reusing ``cache``) and judge the planner.
    ``counts`` (a dict) gets the points simulated now and those read from the cache."""
    plans = [plan_cell(c) for c in cells]
    known: dict[str, dict] = {}
    if cache and os.path.exists(cache):
        with open(cache) as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                known[row["key"]] = row
    todo = []
    for pts, _ in plans:
        for pt in pts:
            if _key(pt) not in known and pt not in todo:
                todo.append(pt)
    # Cheapest first (the simulator's cost grows with ranks): early cells finish early.
    todo.sort(key=lambda p: (p.nodes, p.nbytes))
    if counts is not None:
        needed = {_key(pt) for pts, _ in plans for pt in pts}
        counts.update(simulated=len(todo), cached=len(needed) - len(todo))
    batch = max(1, (workers or 1) * 2)
    for i in range(0, len(todo), batch):
        chunk = todo[i:i + batch]
        t0 = time.perf_counter()
        rows = run_grid(chunk, workers=workers)
        for pt, row in zip(chunk, rows):
            row = {"key": _key(pt), "time_s": row.get("time_s"), "error": row.get("error"),
                   "wall_s": row.get("wall_s")}
            known[row["key"]] = row
            if cache:
                with open(cache, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
        if progress:
            progress(min(i + batch, len(todo)), len(todo), time.perf_counter() - t0)
    out = []
    for cell, (pts, info) in zip(cells, plans):
        times = {}
        for pt in pts:
            row = known[_key(pt)]
            if row.get("error") or row.get("time_s") in (None, ""):
                continue
            times[f"{pt.algorithm}" + (f"/{pt.nchunks}" if pt.nchunks > 1 else "")] = \
                float(row["time_s"])
        ch = info["choice"]
        name = info["alias"].get(ch.algorithm, ch.algorithm)
        label = name + (f"/{ch.nchunks}" if ch.nchunks > 1 else "")
        if label not in times:
            # The planner gave the winner another depth than it gives the algorithm alone
            # (never, as both come from the same estimate); fall back to the name.
            label = next((k for k in times if k.split("/")[0] == name), label)
        best = min(times, key=times.get)
        chosen = times.get(label, float("inf"))
        out.append(Verdict(cell, label, chosen, best, times[best], chosen / times[best],
                           ch.estimate_seconds, times))
    return out
