"""Run a workload graph (:mod:`polycast.workload`) on the simulated network.

Every node of every rank is an event of one simulation: collectives run on the real
engines (one per rank and communicator, :class:`~polycast.sim.driver.Simulation`), sharing
the network with whatever else is in flight; compute nodes take their time on the rank's
compute stream; each node starts when the rank's dependencies for it are done.

Semantics, as ASTRA-sim runs Chakra traces unless said otherwise:

* A rank's compute nodes run one at a time (one GPU stream; CPU nodes on a stream of their
  own); when the stream frees, the ready node with the lowest issue position starts.
* Communication nodes start when their dependencies are done, any number at once (NCCL
  runs collectives of different streams and communicators concurrently; ASTRA-sim allows one
  at a time per rank). A rank posts one communicator's collectives in issue order: a ready
  collective waits until the one before it on that communicator was posted.
* A point-to-point send/receive pair is a 2-rank broadcast from the sender on the pair's
  own communicator (one message on the reliable channel); the send completes when its last
  byte left, the receive when it arrived. Metadata and memory nodes take no time.

Results are measured from the run: step time (the last rank's last node), each rank's
compute-busy time, its *exposed communication* -- time its compute stream sat idle waiting
for a communication node -- per phase (the phase of the node it waited for), link bytes
per topology layer, and ranks grouped into classes that saw the same times.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import asdict, dataclass, field, replace

from ..algorithms import build, get
from ..collectives import Collective
from ..errors import InvalidArgument
from ..workload.graph import COLLECTIVE, COMPUTE, NOOP, RECV, SEND, Workload, validate
from .driver import SimConfig, Simulation, pacing_gbps_for
from .topology import LAYERS

CLASS_RTOL = 1e-5            # rank classes: times equal to this fraction of the step
# per-rank-input collectives whose schedule count is that input / group size
_DIVIDED = (Collective.REDUCE_SCATTER, Collective.ALLTOALL, Collective.SCATTER)


@dataclass
class RankClass:
    """Ranks that finished at the same time with the same busy and exposed times."""
    ranks: str                     # "0-15,32"
    count: int
    end_s: float
    compute_s: float
    exposed_s: dict


@dataclass
class PipelineResult:
    name: str
    nodes: int
    step_s: float                  # the last rank's last node
    compute_s: float               # compute-busy time of the rank that finished last
    bubble_s: float                # its compute stream's idle time: step - compute
    exposed_s: dict                # ... of which waiting on communication, per phase
    exposed_mean_s: dict           # per phase, mean over ranks
    rank_classes: list[RankClass]
    link_bytes: int                # every link direction, the whole step
    link_bytes_by_layer: dict
    collectives: int               # collective calls (requests) simulated
    algorithms: dict               # collective -> algorithms used
    events: int
    flows: int
    wall_s: float
    nic_dropped_nbytes: int = 0    # what the receivers' NIC queues dropped (SimConfig.nic)
    recovered_nbytes: int = 0      # multicast bytes the engines recovered
    # per rank: end, compute-busy, exposed per phase (what the aggregates come from)
    rank_end_s: list = field(default_factory=list, repr=False)
    rank_compute_s: list = field(default_factory=list, repr=False)
    rank_exposed_s: list = field(default_factory=list, repr=False)
    # per recorded rank: [(node position, start, end)] (record_ranks)
    timelines: dict = field(default_factory=dict, repr=False)
    workload: Workload | None = field(default=None, repr=False, compare=False)
    simulation: Simulation | None = field(default=None, repr=False, compare=False)

    @property
    def bubble_pct(self) -> float:
        return 100.0 * self.bubble_s / self.step_s if self.step_s > 0 else 0.0

    def to_json(self) -> dict:
        # (without the simulation: asdict would deep-copy all of it; simulate.SimResult's)
        light = replace(self, timelines=[], workload=None, simulation=None)
        out = {k: v for k, v in asdict(light).items()
               if k not in ("timelines", "workload", "simulation", "rank_end_s",
                            "rank_compute_s", "rank_exposed_s")}
        out["bubble_pct"] = self.bubble_pct
        return out

    @classmethod
    def from_ranks(cls, end: list, busy: list, exposed: list[dict], **rest) -> "PipelineResult":
        """The aggregates (step, the last rank's bubble, classes, means) of per-rank times."""
        P = len(end)
        phases = sorted({p for e in exposed for p in e})
        step = max(end) if P else 0.0
        crit = max(range(P), key=lambda r: (end[r], -r)) if P else 0
        # a class: ranks whose times agree to 1e-5 of the step (a rank a switch farther
        # away finishes a microsecond later; that is not a class of its own)
        grain = CLASS_RTOL * step if step > 0 else 1e-12
        classes: dict[tuple, list[int]] = {}
        for r in range(P):
            key = (round(end[r] / grain), round(busy[r] / grain)) + tuple(
                round(exposed[r].get(p, 0.0) / grain) for p in phases)
            classes.setdefault(key, []).append(r)
        rank_classes = sorted(
            (RankClass(_ranges(rs), len(rs), end[rs[0]], busy[rs[0]], dict(exposed[rs[0]]))
             for rs in classes.values()), key=lambda c: (-c.end_s, -c.count))
        return cls(step_s=step, compute_s=busy[crit] if P else 0.0,
                   bubble_s=step - (busy[crit] if P else 0.0),
                   exposed_s=dict(exposed[crit]) if P else {},
                   exposed_mean_s={p: sum(e.get(p, 0.0) for e in exposed) / P
                                   for p in phases},
                   rank_classes=rank_classes, rank_end_s=list(end),
                   rank_compute_s=list(busy), rank_exposed_s=[dict(e) for e in exposed],
                   nodes=P, **rest)


class _Template:
    """What every rank running one program shares: positions, successors, queues."""

    def __init__(self, prog) -> None:
        self.prog = prog
        pos = {n.id: i for i, n in enumerate(prog)}
        self.ndeps = [len(n.deps) for n in prog]
        self.succ: list[list[int]] = [[] for _ in prog]
        for i, n in enumerate(prog):
            for d in n.deps:
                self.succ[pos[d]].append(i)
        self.kind = [n.kind for n in prog]
        self.roots = [i for i, n in enumerate(prog) if not n.deps]
        # communication nodes per family in issue order (p2p: per peer and direction)
        self.queues: dict[tuple, list[int]] = {}
        self.qkey: list[tuple | None] = [None] * len(prog)
        for i, n in enumerate(prog):
            if n.kind == COLLECTIVE:
                key = ("c", n.comm)
            elif n.kind == SEND:
                key = ("s", n.peer)
            elif n.kind == RECV:
                key = ("r", n.peer)
            else:
                continue
            self.qkey[i] = key
            self.queues.setdefault(key, []).append(i)


def _ranges(ranks: list[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


class _Runner:
    def __init__(self, w: Workload, topo, cfg: SimConfig, algorithms: dict, options: dict,
                 record_ranks) -> None:
        self.w, self.topo = w, topo
        P = self.P = w.nranks
        self.algos = {str(Collective.parse(k)): v for k, v in (algorithms or {}).items()}
        self.options = {str(Collective.parse(k)): v for k, v in (options or {}).items()}
        self.itemsize = w.itemsize
        self.templates: dict[int, _Template] = {}
        self.tmpl = []
        for prog in w.programs:
            t = self.templates.get(id(prog))
            if t is None:
                t = self.templates[id(prog)] = _Template(prog)
            self.tmpl.append(t)
        self._sched: dict[tuple, object] = {}
        self._choice: dict[tuple, tuple] = {}
        self.used: dict[str, set] = {}
        plans = self._plan_requests()            # schedules chosen before any engine exists
        link_gbps = float(topo.host_link_bw * 8 / 1e9)
        engine = {"line_rate_gbps": link_gbps,
                  "pacing_gbps": pacing_gbps_for(list(self._sched.values()), link_gbps,
                                                 topo.framing)}
        engine.update(cfg.engine)
        self.sim = Simulation(topo, replace(cfg, engine=engine))
        self._post_requests(plans)
        # per rank state
        self.remaining = [list(t.ndeps) for t in self.tmpl]
        self.ready_q: list[dict] = [{} for _ in range(P)]      # stream -> heap of positions
        self.busy: list[dict] = [{} for _ in range(P)]         # stream -> running
        self.released_by: list[dict] = [{} for _ in range(P)]  # pos -> the dep done last
        self.qidx: list[dict] = [dict.fromkeys(t.queues, 0) for t in self.tmpl]
        self.qready: list[set] = [set() for _ in range(P)]
        self.gpu_end = [0.0] * P                   # when the compute stream last went idle
        self.busy_s = [0.0] * P
        self.end_s = [0.0] * P
        self.last_node = [-1] * P
        phases = sorted({n.phase or "step" for t in self.templates.values() for n in t.prog})
        self.phases = phases
        self.exposed = [dict.fromkeys(phases, 0.0) for _ in range(P)]
        self.record = set(record_ranks or ())
        self.starts: dict[int, dict] = {r: {} for r in self.record}
        self.timelines: dict[int, list] = {r: [] for r in self.record}
        self.sim.on_complete = self._on_complete

    # -- requests ---------------------------------------------------------------------
    def _plan_requests(self) -> list:
        """Per communicator instance, in issue order: (group, schedule, {rank: position})."""
        w, P = self.w, self.P
        plans = []
        done: set = set()
        for rank in range(P):
            t = self.tmpl[rank]
            for key, positions in t.queues.items():
                kind, arg = key
                if kind == "c":
                    group = w.group_of(rank, arg)
                    ckey = ("c", arg, group)
                    if ckey in done:
                        continue
                    done.add(ckey)
                    members = [(r, self.tmpl[r].queues[key]) for r in group]
                    for k, pos in enumerate(positions):
                        n = t.prog[pos]
                        sched = self._schedule(n, len(group), group)
                        plans.append((group, sched, {r: q[k] for r, q in members}, n))
                elif kind == "s":
                    dst = arg
                    ckey = ("p", rank, dst)
                    if ckey in done:
                        continue
                    done.add(ckey)
                    recvs = self.tmpl[dst].queues[("r", rank)]
                    for k, pos in enumerate(positions):
                        n = t.prog[pos]
                        sched = self._p2p_schedule(n.nbytes)
                        plans.append(((rank, dst), sched, {rank: pos, dst: recvs[k]}, n))
        return plans

    def _post_requests(self, plans) -> None:
        sim = self.sim
        comm_of: dict[tuple, int] = {}
        world = tuple(range(self.P))
        self.req_pos: list[dict] = []
        self.req_of = [dict() for _ in range(self.P)]            # rank -> pos -> req
        for group, sched, where, n in plans:
            cid = comm_of.get(group)
            if cid is None:
                cid = comm_of[group] = 0 if group == world else sim.add_comm(group)
            isz = 1 if n.kind in (SEND, RECV) else self.itemsize
            req = sim.post(sched, isz, at=None, comm=cid)
            self.req_pos.append(where)
            for r, pos in where.items():
                self.req_of[r][pos] = req

    def _choose(self, coll: Collective, nbytes: int, n: int):
        key = (coll, nbytes, n)
        hit = self._choice.get(key)
        if hit is None:
            from ..planner import CommShape, choose, from_topology
            c = choose(coll, nbytes, CommShape(n, 1), from_topology(self.topo))
            hit = self._choice[key] = (c.algorithm, c.nchunks)
        return hit

    def _schedule(self, node, n: int, group):
        coll = Collective.parse(node.collective)
        isz = self.itemsize
        count = node.nbytes // isz
        if coll in _DIVIDED:
            count //= n
        if node.nbytes > 0:
            count = max(1, count)
        if coll is Collective.BARRIER:
            count = 0
        algo = self.algos.get(str(coll)) or node.algorithm     # forced, else the trace's
        nchunks = 1
        if not algo or algo == "auto":
            algo, nchunks = self._choose(coll, coll.total_elements(n, count) * isz, n)
        spec = get(coll, algo)
        reason = spec.unsupported_reason(n)
        if reason is not None:
            raise InvalidArgument(f"{self.w.where(group[0])}: node {node.id} ({node.name}): "
                                  f"{coll} {algo} on {n} ranks: {reason}")
        opts = {k: v for k, v in {**self.options.get(str(coll), {}), **dict(node.options)
                                  }.items() if k in spec.options}
        if "roots" in spec.options and "roots" in opts:
            opts["roots"] = min(int(opts["roots"]), n)
        key = (coll, algo, n, count, node.root, nchunks, tuple(sorted(opts.items())))
        s = self._sched.get(key)
        if s is None:
            s = self._sched[key] = build(coll, algo, n, count, root=node.root,
                                         nchunks=nchunks, **opts)
        self.used.setdefault(str(coll), set()).add(algo)
        return s

    def _p2p_schedule(self, nbytes: int):
        key = ("p2p", nbytes)
        s = self._sched.get(key)
        if s is None:
            s = self._sched[key] = build(Collective.BROADCAST, "direct", 2, max(1, nbytes))
        return s

    # -- running ----------------------------------------------------------------------
    def run(self) -> None:
        for r in range(self.P):
            for pos in self.tmpl[r].roots:
                self._ready(r, pos, 0.0, -1)
        self.sim.run()
        stuck = [r for r in range(self.P) if any(self.remaining[r])]
        if stuck:
            r = stuck[0]
            prog = self.tmpl[r].prog
            i = next(i for i, k in enumerate(self.remaining[r]) if k)
            raise InvalidArgument(f"{self.w.where(r)}: node {prog[i].id} never became "
                                  "ready (a dependency never finished)")

    def _on_complete(self, req: int, rank: int, now: float) -> None:
        self._finish(rank, self.req_pos[req][rank], now)

    def _ready(self, r: int, pos: int, t: float, releaser: int) -> None:
        kind = self.tmpl[r].kind[pos]
        if releaser >= 0:
            self.released_by[r][pos] = releaser
        if kind == COMPUTE:
            n = self.tmpl[r].prog[pos]
            stream = "cpu" if n.cpu else "gpu"
            heapq.heappush(self.ready_q[r].setdefault(stream, []), pos)
            if not self.busy[r].get(stream):
                self._start_compute(r, stream, t)
        elif kind == NOOP:
            self._finish(r, pos, t, started=t)
        else:
            self.qready[r].add(pos)
            key = self.tmpl[r].qkey[pos]
            q = self.tmpl[r].queues[key]
            idx = self.qidx[r]
            i = idx[key]
            sim, reqs = self.sim, self.req_of[r]
            while i < len(q) and q[i] in self.qready[r]:
                p = q[i]
                self.qready[r].discard(p)
                if r in self.record:
                    self.starts[r][p] = t
                sim.post_rank(reqs[p], r, t)
                i += 1
            idx[key] = i

    def _start_compute(self, r: int, stream: str, t: float) -> None:
        heap = self.ready_q[r].get(stream)
        if not heap:
            self.busy[r][stream] = False
            return
        pos = heapq.heappop(heap)
        n = self.tmpl[r].prog[pos]
        self.busy[r][stream] = True
        if stream == "gpu":
            gap = t - self.gpu_end[r]
            if gap > 0:
                rel = self.released_by[r].get(pos, -1)
                if rel >= 0 and self.tmpl[r].kind[rel] not in (COMPUTE, NOOP):
                    ph = self.tmpl[r].prog[rel].phase or "step"
                    self.exposed[r][ph] += gap
            self.busy_s[r] += n.duration_s
        if r in self.record:
            self.starts[r][pos] = t
        self.sim.call_at(t + n.duration_s,
                         lambda now, r=r, pos=pos, s=stream: self._compute_done(r, pos, s, now))

    def _compute_done(self, r: int, pos: int, stream: str, now: float) -> None:
        if stream == "gpu":
            self.gpu_end[r] = now
        self._finish(r, pos, now)
        self._start_compute(r, stream, now)

    def _finish(self, r: int, pos: int, t: float, started: float | None = None) -> None:
        stack = [(pos, started)]
        tmpl, remaining = self.tmpl[r], self.remaining[r]
        while stack:
            p, st = stack.pop()
            if t >= self.end_s[r]:
                self.end_s[r], self.last_node[r] = t, p
            if r in self.record:
                self.timelines[r].append((p, self.starts[r].pop(p, t if st is None else st), t))
            for s in tmpl.succ[p]:
                remaining[s] -= 1
                if remaining[s] == 0:
                    if tmpl.kind[s] == NOOP:
                        self.released_by[r][s] = p
                        stack.append((s, t))
                    else:
                        self._ready(r, s, t, p)

    # -- results ----------------------------------------------------------------------
    def result(self, wall_s: float) -> PipelineResult:
        P, sim, topo = self.P, self.sim, self.topo
        # the tail: after the last compute, waiting on the node that ended last
        for r in range(P):
            tail = self.end_s[r] - self.gpu_end[r]
            last = self.last_node[r]
            if tail > 0 and last >= 0 and self.tmpl[r].kind[last] not in (COMPUTE, NOOP):
                ph = self.tmpl[r].prog[last].phase or "step"
                self.exposed[r][ph] += tail
        lb = sim.net.link_bytes
        by_layer = {name: int(round(lb[topo.layer_index == i].sum()))
                    for i, name in enumerate(LAYERS) if (topo.layer_index == i).any()}
        dropped = int(sim.nic.dropped_nbytes) if sim.nic is not None else 0
        return PipelineResult.from_ranks(
            self.end_s, self.busy_s, self.exposed, name=self.w.name,
            link_bytes=int(round(lb.sum())), link_bytes_by_layer=by_layer,
            collectives=len(self.req_pos), algorithms={k: sorted(v) for k, v in
                                                       self.used.items()},
            events=sim.events, flows=sim.net.flows_started, wall_s=wall_s,
            nic_dropped_nbytes=dropped,
            recovered_nbytes=int(sim.engine_stats().get("recovered_bytes", 0)),
            timelines=self.timelines, workload=self.w, simulation=sim)


def run_workload(workload: Workload, topology, *, algorithms: dict | None = None,
                 options: dict | None = None, config: SimConfig | None = None,
                 record_ranks=None) -> PipelineResult:
    """Simulate ``workload`` on ``topology`` (see the module docstring).

    ``algorithms``: collective -> algorithm, forced over what the nodes name (``--algo
    allgather=mcast``; ``auto``: the planner's); a node with neither gets the planner's
    choice for its size and group. ``options``: collective -> algorithm options (those the algorithm takes).
    ``record_ranks``: ranks whose node start/end times are kept (timelines, traces)."""
    wall = time.perf_counter()
    validate(workload, topology.nranks)
    runner = _Runner(workload, topology, config or SimConfig(), algorithms or {},
                     options or {}, record_ranks)
    runner.run()
    return runner.result(time.perf_counter() - wall)


def representative_ranks(P: int, n: int = 4) -> list[int]:
    """A few ranks spread over 0..P-1 (every rank when P <= n)."""
    if P <= n:
        return list(range(P))
    return sorted({round(i * (P - 1) / (n - 1)) for i in range(n)})


__all__ = ["PipelineResult", "RankClass", "run_workload", "representative_ranks"]
