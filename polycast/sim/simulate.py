"""One simulated collective call: schedule -> engines on a network -> :class:`SimResult`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from ..algorithms import build, get
from ..collectives import Collective, parse_dtype
from ..schedule.vector import total_elements as vector_elements
from ..errors import InvalidArgument, UnknownName
from ..units import parse_size
from .driver import RankTimeline, SimConfig, Simulation, pacing_gbps_for
from .topology import LAYERS, Topology, parse_topology

DEFAULT_TOPOLOGY = "fattree:radix=32"


@dataclass
class SimResult:
    collective: str
    algorithm: str
    nodes: int
    nbytes: int                      # nccl-tests' S (total size), after rounding to elements
    time_s: float                    # last rank's completion
    algbw: float                     # GB/s (1e9 bytes/s): nbytes / time_s
    busbw: float                     # GB/s: algbw x the collective's bus factor
    link_bytes: int                  # over every link direction
    link_bytes_by_layer: dict[str, int]
    topology: str
    link_gbps: float                 # host link rate, Gbit/s
    loss: float
    seed: int
    datagrams: int                   # datagrams sent (all roots)
    lost_datagrams: int              # data datagram receptions dropped by the loss model
    lost_nbytes: int                 # their payload bytes
    recovered_nbytes: int            # multicast bytes the engines recovered (engine stats)
    events: int
    flows: int
    wall_s: float
    engine_stats: dict = field(default_factory=dict)
    rank_times_s: list[float] = field(default_factory=list)   # completion per rank
    nic: str | None = None           # receivers' NIC model (sim --nic), None: keeps up
    nic_gbps: float | None = None    # ... its sustainable multicast receive rate
    nic_dropped_datagrams: int = 0   # datagram receptions its receive queues dropped
    nic_dropped_nbytes: int = 0      # ... their payload bytes, summed over receivers
    nic_peak_queue_nbytes: int = 0   # the largest backlog of one receiver
    path: str = "engine"             # "fast" or "engine": which account of the timing ran
    path_reason: str = ""            # why not the fast path, when the engines ran
    fast_mode: str = ""              # on the fast path: "walk" (graph walk) or "events"
    timelines: list[RankTimeline] = field(default_factory=list, repr=False)
    simulation: Simulation | None = field(default=None, repr=False, compare=False)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self, full: bool = False) -> dict:
        """The JSON object ``polycast sim --json`` prints (``full``: per-rank times too)."""
        # (without the simulation: asdict would deep-copy all of it, and the compiled
        # network model's state is not copyable)
        out = {k: v for k, v in asdict(replace(self, timelines=[], simulation=None)).items()
               if k not in ("timelines", "simulation", "rank_times_s")}
        out["events_per_s"] = self.events_per_s
        if full:
            out["rank_times_s"] = list(self.rank_times_s)
        return out


def resolve_topology(topology: Topology | str | None, nodes: int, link=None,
                     framing: str | None = None) -> Topology:
    if isinstance(topology, Topology):
        if topology.nranks != nodes:
            raise InvalidArgument(f"topology has {topology.nranks} ranks, asked for {nodes}")
        return topology
    return parse_topology(topology or DEFAULT_TOPOLOGY, nodes, link=link, framing=framing)


def count_for(collective: Collective, nodes: int, nbytes: int, itemsize: int) -> int:
    """Elements per call whose total size is nbytes, rounded down to whole elements per
    rank (at least one when nbytes > 0): simulations accept any size."""
    unit = collective.total_elements(nodes, 1) * itemsize
    if collective is Collective.BARRIER or nbytes == 0:
        return 0
    return max(1, nbytes // unit)


PLACEMENTS = ("linear", "random")


def make_placement(kind: str, nodes: int, seed: int = 0) -> tuple[int, ...] | None:
    if kind == "linear":
        return None
    if kind == "random":
        import numpy as np
        return tuple(int(x) for x in np.random.default_rng(seed + 0x5EED).permutation(nodes))
    raise UnknownName("placement", kind, PLACEMENTS)


def algorithm_options(collective: Collective, algorithm: str, topo: Topology,
                      options: dict | None) -> dict:
    opts = dict(options or {})
    algo = get(collective, algorithm)
    if algo.hierarchical and "hosts" not in opts and "ranks_per_host" not in opts:
        rph = topo.ranks_per_host
        if topo.nranks % rph == 0:
            opts.update(hosts=topo.nranks // rph, ranks_per_host=rph)
    return opts


def simulate(collective: str | Collective, algorithm: str, nodes: int, size: int | str,
             topology: Topology | str | None = None, link=None, *, dtype: str = "float32",
             root: int = 0, nchunks: int = 1, channels: int = 1, options: dict | None = None,
             loss: float = 0.0, seed: int = 0, record: bool = False,
             engine: dict | None = None, max_events: int = 50_000_000,
             placement: str = "linear", nic=None, host_gbps: float | None = None,
             host_latency_s: float = 0.0, framing: str | None = None,
             path: str = "auto") -> SimResult:
    """Simulate one call of ``collective`` with ``algorithm`` on ``nodes`` ranks.

    ``size`` is nccl-tests' S (total bytes: for allgather the gathered buffer). ``topology``
    is a :class:`Topology` or a ``--topology`` string (default a radix-32 fat tree), ``link``
    the host link rate (default 400Gbps). ``placement``: ``linear`` puts rank r in slot r
    (ring neighbours share switches), ``random`` shuffles ranks over the slots (seeded by
    ``seed``), as a scheduler may. ``loss`` drops each datagram at each receiver with
    that probability (seeded). ``record`` keeps per-message timelines (traces, plots).
    ``nic`` (a :class:`~polycast.models.nic.NicModel` or a ``--nic`` string such as
    ``bf3-dpa``) makes every receiver process multicast chunks at that NIC's rate behind
    its bounded receive queue, dropping what overflows (:mod:`polycast.sim.nic`).
    ``host_gbps`` / ``host_latency_s``: the host model (:class:`SimConfig`; off by default).
    ``framing``: per-packet headers (:mod:`polycast.sim.framing`: ``tcp``, the default,
    ``udp``, ``ib`` or ``none``) when ``topology`` is a string that does not set them.
    ``path``: ``auto`` (the fast path where its checks pass, else the engines), ``engine``
    or ``fast`` (:class:`SimConfig`); the result says which ran."""
    coll = Collective.parse(collective)
    if not 0 <= loss < 1:
        raise InvalidArgument(f"loss must be a probability in [0, 1), got {loss!r}")
    nbytes = parse_size(size)
    if isinstance(nic, str):
        from ..models.nic import parse_nic
        nic = parse_nic(nic)
    itemsize = parse_dtype(dtype).itemsize
    topo = resolve_topology(topology, nodes, link, framing)
    count = count_for(coll, nodes, nbytes, itemsize)
    opts = algorithm_options(coll, algorithm, topo, options)
    # the fast path times a schedule from its columns: where the algorithm has a
    # vectorised generator, the Step objects are built only if the engines run
    sched = build(coll, algorithm, nodes, count, root=root, nchunks=nchunks,
                  channels=channels, compact=path != "engine", **opts)
    link_gbps = float(topo.host_link_bw * 8 / 1e9)
    eng = {"line_rate_gbps": link_gbps,
           "pacing_gbps": pacing_gbps_for([sched], link_gbps, topo.framing)}
    eng.update(engine or {})
    cfg = SimConfig(loss=loss, seed=seed, record=record, engine=eng, max_events=max_events,
                    placement=make_placement(placement, nodes, seed), nic=nic,
                    host_gbps=host_gbps, host_latency_s=host_latency_s, path=path)
    wall = time.perf_counter()
    sim = Simulation(topo, cfg)
    req = sim.post(sched, itemsize)
    sim.run()
    wall = time.perf_counter() - wall
    counts = opts.get("counts")
    total = coll.total_elements(nodes, count) if counts is None else \
        vector_elements(coll, nodes, sched.counts)
    return make_result(sim, [req], coll, algorithm, total * itemsize, wall)


def make_result(sim: Simulation, reqs: list[int], coll: Collective, algorithm: str,
                nbytes: int, wall_s: float) -> SimResult:
    topo = sim.topo
    P = topo.nranks
    t = max(sim.completion_time(r) for r in reqs)
    rank_times = [max(tl.completed[r] for r in reqs) for tl in sim.timelines]
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    lb = sim.net.link_bytes
    by_layer = {}
    for i, name in enumerate(LAYERS):
        mask = topo.layer_index == i
        if mask.any():
            by_layer[name] = int(round(lb[mask].sum()))
    stats = sim.engine_stats()
    q = sim.nic
    nic = {} if q is None else dict(
        nic=q.model.name, nic_gbps=q.rate * 8 / 1e9, nic_dropped_datagrams=q.dropped_datagrams,
        nic_dropped_nbytes=q.dropped_nbytes, nic_peak_queue_nbytes=int(q.peak_nbytes))
    return SimResult(
        collective=str(coll), algorithm=algorithm, nodes=P, nbytes=nbytes, time_s=t,
        algbw=algbw, busbw=algbw * coll.busbw_factor(P), link_bytes=int(round(lb.sum())),
        link_bytes_by_layer=by_layer, topology=topo.description,
        link_gbps=float(topo.host_link_bw * 8 / 1e9), loss=sim.cfg.loss, seed=sim.cfg.seed,
        datagrams=sim.datagrams, lost_datagrams=sim.lost_datagrams,
        lost_nbytes=sim.lost_nbytes, recovered_nbytes=int(stats.get("recovered_bytes", 0)),
        events=sim.events, flows=sim.net.flows_started, wall_s=wall_s, engine_stats=stats,
        rank_times_s=rank_times, timelines=sim.timelines, simulation=sim,
        path=sim.path or "engine", path_reason=sim.path_reason, fast_mode=sim.fast_mode,
        **nic)
