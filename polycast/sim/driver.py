"""The simulator's API: :class:`Simulation`, an event clock running one real
:class:`~polycast.engine.engine.Engine` per rank on the modelled network
(:mod:`polycast.sim.network`) -- its configuration, communicators, posting, the choice of
path (:mod:`polycast.sim.fast` or the engines) and the results.

How the engines' actions become flows and events in simulated time (messages, multicast
streams, loss, the NIC model, in-network reduction) is the event loop's,
:mod:`polycast.sim.engine_loop`; what a run records per rank is :mod:`polycast.sim.records`.
Every run is bounded by an event count and a simulated-time limit.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .. import debug
from ..config import current
from .engine_loop import _CALL, _POST, EngineLoop
from .errors import SimulationError
from .network import Network, describe
from .records import Interval, RankTimeline

__all__ = ["Interval", "RankTimeline", "SimConfig", "Simulation", "SimulationError",
           "default_engine_config", "pacing_gbps_for"]


_logged: set = set()                     # network models named at POLYCAST_DEBUG=INFO


@dataclass
class SimConfig:
    loss: float = 0.0                  # probability a datagram is lost at one receiver
    seed: int = 0
    max_events: int = 50_000_000
    max_time_s: float = 3600.0         # simulated seconds
    record: bool = False               # keep per-message timelines and flow records
    placement: tuple[int, ...] | None = None   # rank -> topology rank slot (None: identity)
    engine: dict = field(default_factory=dict)   # EngineConfig overrides
    nic: object | None = None          # NicModel: receivers' chunk rate + queue (None: off)
    # The hosts (off by default: ideal hosts that keep up with any link, zero software time).
    # host_gbps: a rank's send path and its receive path each move at most this many
    # Gbit/s, shared by its flows (network.py's host ports). host_latency_s: software time
    # per message and per datagram batch, from its last byte on the wire to the engine
    # seeing it (driver wake-up, syscalls, copies), added to the path latency.
    host_gbps: float | None = None
    host_latency_s: float = 0.0
    # Which account of the protocol's timing runs (polycast/sim/fast.py): "auto" takes the
    # fast path where its checks pass and the engines elsewhere; "engine" always steps the
    # engines (the reference); "fast" fails where the fast path cannot run.
    path: str = "auto"


def default_engine_config(**overrides):
    """The engine configuration the simulator uses: datagrams as large as a whole block
    (the flow model needs no fragmentation; loss is then per large datagram), no pacing
    below the link rate unless asked, and timeouts far beyond any simulated run."""
    from ..engine.engine import EngineConfig
    # The engine caps mtu_nbytes at a UDP payload (65000): the largest it allows. The
    # driver coalesces a stream's back-to-back datagrams into one flow anyway.
    # Every send is eager: the simulated early buffer is unbounded (max_early_nbytes), so
    # the RTS/CTS rendezvous, which exists only to bound that buffer on real ranks, would
    # protect nothing here and add a round trip per large message to every modelled time
    # (the closed-form alpha-beta checks assume the IR's eager sends).
    base = {"mtu_nbytes": 65000, "op_timeout_s": 600.0, "max_early_nbytes": 1 << 50,
            "eager_max_nbytes": 1 << 50}
    base.update(overrides)
    return EngineConfig(**base)


def pacing_gbps_for(schedules, link_gbps: float, framing=None) -> float:
    """The multicast pacing the simulator gives the engines: the host link rate split over
    the streams that run at once (specs/mcast-protocol.md: link rate / roots), so a
    stream's MCAST step completes, and hands its token on, when its datagrams could have
    left, and concurrent streams do not flood the receivers. The engine paces its
    datagrams' payload and own header; with ``framing`` (the topology's) the rate is
    lowered so that a stream of full datagrams takes exactly link rate / roots on the
    wire, headers of every packet included."""
    roots = 1
    for s in schedules:
        if s.uses_multicast:
            roots = max(roots, int(s.options.get("roots", 1) or 1))
    rate = link_gbps / roots
    if framing is not None and not framing.ideal:
        from ..engine.wire import HEADER_NBYTES
        mtu = default_engine_config().mtu_nbytes
        rate *= (mtu + HEADER_NBYTES) / framing.datagram_wire(mtu)
    return rate


class Simulation(EngineLoop):
    """Engines on a :class:`~polycast.sim.topology.Topology`: one per (rank, communicator).

    ``post(schedule, itemsize, at=0.0)`` queues a collective on every rank; ``run()``
    advances the clock until every posted request completed on every rank.

    Workloads (:mod:`polycast.sim.pipeline`) use four more calls:

    * ``add_comm(group) -> comm``: a communicator over the global ranks ``group``; a
      schedule posted on it has ``len(group)`` ranks and its rank i is ``group[i]``. Each
      member gets its own engine for it (as a real rank has one per communicator); the
      engines of one rank share its links and host ports. Communicator 0 is the world.
    * ``post(schedule, itemsize, at=..., comm=c)``: ``at`` is one time for every member, a
      sequence of per-member times (local rank order), or ``None`` for none yet.
    * ``post_rank(req, rank, at)``: post request ``req`` on one member (global ``rank``) at
      simulated time ``at`` (not in the past); callable from callbacks while ``run()`` runs.
      Every member must post a communicator's requests in the same order (the engine
      numbers them by order, as MPI and NCCL require).
    * ``call_at(t, fn)``: ``fn(t)`` at simulated time ``t`` (a compute kernel ending);
      ``on_complete(req, rank, now)``, if set, is called when ``rank`` completes ``req``.
    ``run()`` returns when every (rank, request) pair posted or announced is complete and no
    callback is due; callbacks may post more before that."""

    def __init__(self, topology, config: SimConfig | None = None) -> None:
        self.topo = topology
        self.cfg = config or SimConfig()
        self.P = topology.nranks
        ecfg = self._ecfg = default_engine_config(**self.cfg.engine)
        # Endpoints: one engine per (rank, communicator); the world's endpoint of rank r is
        # r. Events name endpoints; channels are per (endpoint, peer).
        self._ep_engine = _Engines(ecfg, self.P)
        self._ep_rank = list(range(self.P))
        self._ep_comm = [0] * self.P
        self._comm_group: list[tuple[int, ...]] = [tuple(range(self.P))]
        self._comm_eps: list[list[int]] = [list(range(self.P))]    # comm -> local -> ep
        self._calls = 0                          # call_at callbacks not yet run
        cfg = self.cfg
        if cfg.host_gbps is not None and not cfg.host_gbps > 0:
            raise SimulationError(f"host_gbps must be > 0 (or None), got {cfg.host_gbps!r}")
        if not cfg.host_latency_s >= 0:
            raise SimulationError(f"host_latency_s must be >= 0, got {cfg.host_latency_s!r}")
        settings = current()              # the test hooks and POLYCAST_DEBUG, read once here
        native = settings.hooks.sim_native
        if settings.debug_level >= debug.INFO and native not in _logged:
            _logged.add(native)
            print(f"polycast INFO {describe(native)}", file=sys.stderr, flush=True)
        self.net = Network(topology, record=cfg.record, native=native,
                           host_bw=None if cfg.host_gbps is None else cfg.host_gbps * 1e9 / 8)
        self._host_links: dict = {}              # (src, dst|-1) -> links incl. host ports
        self._framing = topology.framing         # wire bytes per message / datagrams
        self.rng = np.random.default_rng(self.cfg.seed)
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple] = []
        self._seq = 0
        self._channels: dict[tuple[int, int], deque] = {}   # (src, dst|-1) -> pending
        self._busy: set[tuple[int, int]] = set()
        self._timers: dict[tuple[int, int], float] = {}
        self._reqs: list[tuple] = []             # req -> (schedule, itemsize, comm)
        self._unposted: dict[int, set] = {}      # req -> members not posted yet
        self._innet: dict[int, dict] = {}        # req -> {(dst, tag): senders expected}
        self._innet_of: dict[int, tuple] = {}    # id(schedule) -> (schedule, its groups)
        self._combine: dict[tuple, list] = {}    # innet: (dst, seq, tag) -> waiting sends
        self._pending = 0                        # (rank, req) pairs not yet complete
        self.timelines = [RankTimeline() for _ in range(self.P)]
        self.lost_datagrams = 0                  # data datagrams lost (x receivers)
        self.lost_eos = 0                        # end-of-stream datagrams lost
        self.lost_nbytes = 0                     # payload bytes lost, summed over receivers
        self._seq_req: dict[tuple, int] = {}     # (comm, engine seq number) -> request
        self.datagrams = 0
        self.on_complete = None                  # optional hook(req, rank, now)
        self.path: str | None = None             # "fast" or "engine" once run() chose
        self.path_reason = ""                    # why not the fast path (engine runs)
        self.fast_mode = ""                      # fast path: "walk" or "events" (fast.py)
        self._fast_stats: dict | None = None
        self._tree_groups: dict[int, list] = {}  # root endpoint -> receivers by latency
        self._comm_trees: dict[int, tuple] = {}  # root endpoint (not the world's) -> tree
        pl = self.cfg.placement
        if pl is not None and sorted(pl) != list(range(self.P)):
            raise SimulationError(f"placement must be a permutation of 0..{self.P - 1}")
        self._node = list(pl) if pl is not None else list(range(self.P))
        self.nic = None                          # the receivers' queues (SimConfig.nic)
        self._rx_cap = math.inf                  # point-to-point bytes/s into a receiver
        if self.cfg.nic is not None:
            from .nic import ReceiveQueues
            self.nic = ReceiveQueues(self.cfg.nic, self.P, self.cfg.seed)
            self._rx_cap = self.nic.rate

    # -- public ----------------------------------------------------------------------
    def add_comm(self, group) -> int:
        """A communicator over the global ranks ``group`` (in its local rank order); returns
        its id for :meth:`post`."""
        try:
            members = tuple(int(r) for r in group)
        except (TypeError, ValueError):
            raise SimulationError(f"a communicator is a sequence of ranks, got {group!r}") \
                from None
        bad = [r for r in members if not 0 <= r < self.P]
        if not members or bad or len(set(members)) != len(members):
            raise SimulationError(
                f"communicator {list(members)[:16]}: " + (
                    f"rank {bad[0]} does not exist (ranks 0..{self.P - 1})" if bad else
                    "no ranks" if not members else "a rank is listed twice"))
        cid = len(self._comm_group)
        self._comm_group.append(members)
        eps = []
        for local, rank in enumerate(members):
            eps.append(len(self._ep_engine))
            self._ep_engine.add(local, len(members), cid)
            self._ep_rank.append(rank)
            self._ep_comm.append(cid)
        self._comm_eps.append(eps)
        return cid

    @property
    def engines(self) -> list:
        """The world communicator's engines (rank order)."""
        return [self._ep_engine[r] for r in range(self.P)]

    def comm_group(self, comm: int) -> tuple[int, ...]:
        """The global ranks of communicator ``comm`` (local rank order)."""
        return self._comm_group[comm]

    def post(self, schedule, itemsize: int, at=0.0, comm: int = 0) -> int:
        """Queue a collective on communicator ``comm`` (default: the world). ``at``: the
        time every member posts it, a sequence of per-member times (``None`` entries: later,
        by :meth:`post_rank`), or ``None`` (every member later)."""
        if not 0 <= comm < len(self._comm_group):
            raise SimulationError(f"no communicator {comm!r} (add_comm makes them)")
        group = self._comm_group[comm]
        if schedule.nranks != len(group):
            raise SimulationError(
                f"schedule for {schedule.nranks} ranks on a topology of {self.P}" if comm == 0
                else f"schedule for {schedule.nranks} ranks on communicator {comm} of "
                     f"{len(group)}")
        if at is None or isinstance(at, (int, float)):
            times = [at] * len(group)
        else:
            times = list(at)
            if len(times) != len(group):
                raise SimulationError(f"{len(times)} post times for a communicator of "
                                      f"{len(group)} ranks")
        req = len(self._reqs)
        self._reqs.append((schedule, itemsize, comm))
        from ..algorithms import get
        if get(schedule.collective, schedule.algorithm).innet:
            hit = self._innet_of.get(id(schedule))
            if hit is None or hit[0] is not schedule:
                hit = self._innet_of[id(schedule)] = (schedule, _innet_groups(schedule))
            self._innet[req] = hit[1]
        self._unposted[req] = set(group)
        self._pending += len(group)
        for rank, t in zip(group, times):
            if t is not None:
                self.post_rank(req, rank, t)
        return req

    def post_rank(self, req: int, rank: int, at: float) -> None:
        """Member ``rank`` (global) posts request ``req`` at simulated time ``at``."""
        waiting = self._unposted.get(req)
        if waiting is None or rank not in waiting:
            raise SimulationError(f"rank {rank} cannot post request {req}: "
                                  + ("no such request" if not 0 <= req < len(self._reqs) else
                                     "already posted" if rank in self._comm_group[
                                         self._reqs[req][2]] else "not a member of its "
                                     "communicator"))
        if not at >= self.now:
            raise SimulationError(f"rank {rank} posts request {req} at t={at!r}, before now "
                                  f"(t={self.now:.6g}s)")
        waiting.discard(rank)
        if not waiting:
            del self._unposted[req]
        comm = self._reqs[req][2]
        ep = rank if comm == 0 else self._comm_eps[comm][self._comm_group[comm].index(rank)]
        self._push(at, _POST, ep, req, None)

    def call_at(self, t: float, fn) -> None:
        """Call ``fn(t)`` at simulated time ``t`` (>= now), in the batch of that instant."""
        if not t >= self.now:
            raise SimulationError(f"call_at t={t!r} is before now (t={self.now:.6g}s)")
        self._calls += 1
        self._push(t, _CALL, fn, None, None)

    def run(self) -> None:
        """Run every posted request to completion, on the path ``SimConfig.path`` picks
        (``self.path`` says which ran, ``self.path_reason`` why not the fast one)."""
        if self.path is None:
            self.path = self._dispatch()
        elif self.path == "fast" and (self._heap or self._pending):
            raise SimulationError("this simulation ran on the fast path: post everything "
                                  "before run(), or use SimConfig(path='engine')")
        if self.path == "fast":
            return
        self._run_engines()

    def _dispatch(self) -> str:
        """The one place that picks the path: the fast one when asked for or allowed and
        its checks pass (polycast/sim/fast.py), else the engines."""
        from . import fast
        mode = self.cfg.path
        if mode not in ("auto", "engine", "fast"):
            raise SimulationError(f"SimConfig.path must be auto, engine or fast, got {mode!r}")
        if mode == "engine":
            self.path_reason = "asked for the engines"
            return "engine"
        try:
            self.fast_mode = fast.run(self)
        except fast.Refused as e:
            if mode == "fast":
                raise SimulationError(f"the fast path cannot run this simulation: {e}") \
                    from None
            self.path_reason = str(e)
            return "engine"
        return "fast"

    def completion_time(self, req: int) -> float:
        """When the last member completed ``req``."""
        tls = self.timelines
        return max(tls[r].completed[req] for r in self._comm_group[self._reqs[req][2]])

    def engine_stats(self) -> dict:
        """The engines' stats, summed over ranks and communicators (numeric fields); on
        the fast path, the counts it kept (completed, messages, datagrams)."""
        if self._fast_stats is not None:
            return dict(self._fast_stats)
        out: dict = {}
        for e in self._ep_engine.made():
            st = e.stats
            items = st.items() if isinstance(st, dict) else vars(st).items()
            for k, v in items:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        return out


class _Engines:
    """The engine of every endpoint, each made when first used: the fast path steps none,
    and a simulation of 65,536 ranks would otherwise build 65,536 engines (each with
    per-peer state) before anything runs."""

    def __init__(self, config, nranks: int) -> None:
        self._cfg = config
        self._spec: list[tuple[int, int, int]] = [(r, nranks, 0) for r in range(nranks)]
        self._made: dict[int, object] = {}

    def add(self, rank: int, nranks: int, comm: int) -> None:
        self._spec.append((rank, nranks, comm))

    def __len__(self) -> int:
        return len(self._spec)

    def __getitem__(self, ep: int):
        eng = self._made.get(ep)
        if eng is None:
            from ..engine.engine import Engine
            rank, n, comm = self._spec[ep]
            eng = self._made[ep] = Engine(rank, n, comm=comm, config=self._cfg)
        return eng

    def made(self) -> list:
        """The engines made so far (those never made have done nothing)."""
        return [self._made[ep] for ep in sorted(self._made)]


def _innet_groups(schedule) -> dict[tuple[int, int], int]:
    """(destination, tag) -> number of senders of data messages with that tag to it."""
    from ..schedule.ir import Kind
    out: dict[tuple[int, int], int] = {}
    for rank, prog in enumerate(schedule.programs):
        for st in prog:
            if st.kind is Kind.SEND and st.blocks:
                out[(st.peer, st.tag)] = out.get((st.peer, st.tag), 0) + 1
    return out
